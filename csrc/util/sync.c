#include "sync.h"

#include <errno.h>
#include <time.h>

pd_status
pd_cond_init_monotonic(pthread_cond_t *cv, const char *what)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        return pd_error(PD_ESYS, "%s: pthread_condattr_init failed", what);
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int r = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    if (r != 0) {
        return pd_error(PD_ESYS, "%s: pthread_cond_init failed", what);
    }
    return PD_OK;
}

int
pd_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline)
{
    if (deadline <= 0) {
        pthread_cond_wait(cv, mu);
        return 0;
    }
    double now = pd_now();
    if (now >= deadline) {
        return 1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double left = deadline - now;
    time_t sec = (time_t)left;
    long nsec = ts.tv_nsec + (long)((left - (double)sec) * 1e9);
    ts.tv_sec += sec + nsec / 1000000000L;
    ts.tv_nsec = nsec % 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
    return pd_now() >= deadline;
}
