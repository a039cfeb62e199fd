/* How fast data moves between two cores right now (probe.c says why). */
#ifndef PD_UTIL_PROBE_H
#define PD_UTIL_PROBE_H

/* Run two threads of this process for about `seconds`: *ns the one-way
 * handoff of a cache line between them (nanoseconds), *gbps the speed of
 * 1 MiB handed over through a shared buffer.  0 on success, -1 when no
 * complete round ran (out of memory, no thread, or too short).
 * Blocks the caller for the whole time: release the GIL around it. */
int pd_probe_handoff(double seconds, double *ns, double *gbps);

#endif
