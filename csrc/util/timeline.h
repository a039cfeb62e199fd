/* The timeline: a Chrome / Perfetto trace ("JSON array format") of one
 * process, written when PYDDP_TIMELINE names a file (Python opens it).
 * Every collective gives a "queued" and a "running" slice on its group's
 * track; Python adds DDP bucket and backward-pass events through
 * pd_tl_event.  The closing bracket is optional in that format, so a file
 * cut short by a crash still opens.  Off (the default), it costs one
 * relaxed atomic load per operation. */
#ifndef PD_UTIL_TIMELINE_H
#define PD_UTIL_TIMELINE_H

#include <stdatomic.h>

#include "status.h"

extern atomic_int pd_tl_on;

static inline int
pd_tl_enabled(void)
{
    return atomic_load_explicit(&pd_tl_on, memory_order_relaxed);
}

/* Open path for writing (truncating); pid: the track group (the rank). */
pd_status pd_tl_open(const char *path, int pid, const char *process_name);
void pd_tl_close(void);
void pd_tl_flush(void);
/* One event; name and cat are written as they are (JSON-escaped), args is a
 * JSON object's text or NULL.  ph "X" (complete: ts, dur), "i" (instant),
 * "M" (metadata).  Times in microseconds since the epoch. */
void pd_tl_event(const char *name, const char *cat, char ph, double ts_us,
                 double dur_us, int tid, const char *args);
int pd_tl_pid(void);

/* Wall clock, seconds since the epoch. */
double pd_wall(void);

#endif
