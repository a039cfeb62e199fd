/* Condition variables on the monotonic clock, with absolute pd_now()
 * deadlines (a wall-clock jump never shortens or stretches a wait). */
#ifndef PD_UTIL_SYNC_H
#define PD_UTIL_SYNC_H

#include <pthread.h>

#include "status.h"

/* pthread_cond_init with CLOCK_MONOTONIC; what names the object in the
 * error message. */
pd_status pd_cond_init_monotonic(pthread_cond_t *cv, const char *what);

/* Wait on cv (mu held) until woken or deadline (<= 0: no deadline).
 * Returns 1 when the deadline has passed, else 0 (spurious wakeups return 0
 * too: callers re-check their condition). */
int pd_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
                       double deadline);

#endif
