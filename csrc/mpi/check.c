/* The signature check: every rank's (seq, kind, dtype, op, root, count)
 * combined on the aux communicator and compared (csrc/mpi/comm.h). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIG_TAG 11 /* the check's messages on aux (backends/mpi/backend.py: _TAG_CHECK) */

pd_status
pd_mpi_comm_init(pd_mpi_comm *c)
{
    c->sig = calloc(6 * PD_MPI_SIGN, sizeof(int64_t));
    if (c->sig == NULL) {
        return pd_error(PD_ENOMEM, "MpiComm: out of memory");
    }
    c->sigr = c->sig + 2 * PD_MPI_SIGN;
    c->sigp = c->sig + 4 * PD_MPI_SIGN;
    return PD_OK;
}

void
pd_mpi_comm_free(pd_mpi_comm *c)
{
    free(c->sig);
    c->sig = c->sigr = c->sigp = NULL;
}

/* Poll the n requests until all are done, the deadline, or an interruption:
 * spinning for the first 2 ms (MPI progresses only inside its calls, and a
 * peer descheduled for a moment on a busy host must not cost a sleep's
 * overshoot), then sleeping 10 us more per round up to 1 ms; every 50 ms
 * interrupted() is asked (the binding takes the GIL back there to run
 * signal handlers: Ctrl-C).
 * MPI_Test one request at a time: an MPI_Request array's element size
 * differs between the ABIs. */
static int
poll_reqs(pd_mpi_req *reqs, int n, double deadline, int *mpi_err,
          const pd_mpi_waiter *w)
{
    unsigned char status[256];
    int done[2] = {0, 0}, ndone = 0, out = PD_MPI_OK;
    long spins = 0;
    long sleep_ns = 0;
    double next_signals = 0, spin_until = 0;
    if (w != NULL) {
        w->enter(w->ctx);
    }
    for (int last = 0;; spins++) {
        for (int i = 0; i < n; i++) {
            if (done[i]) {
                continue;
            }
            int flag = 0;
            int rc = pd_mpi_test(&reqs[i], &flag, status);
            if (rc != 0) {
                *mpi_err = rc;
                out = PD_MPI_ERROR;
                goto end;
            }
            if (flag) {
                done[i] = 1;
                ndone++;
            }
        }
        if (ndone == n) {
            break;
        }
        if (last) {
            out = PD_MPI_TIMEOUT;
            break;
        }
        if ((spins & 63) != 63) {
            continue;
        }
        double now = pd_now();
        if (now > deadline) {
            last = 1; /* one more test of each */
            continue;
        }
        if (spin_until == 0) {
            spin_until = now + 2e-3;
        }
        if (now > spin_until) {
            if (next_signals == 0) {
                next_signals = now + 0.05;
            }
            sleep_ns = sleep_ns < 1000000 ? sleep_ns + 10000 : 1000000;
            struct timespec d = {0, sleep_ns};
            nanosleep(&d, NULL);
            if (now > next_signals) {
                next_signals = now + 0.05;
                if (w != NULL && w->interrupted(w->ctx)) {
                    out = PD_MPI_INTERRUPTED;
                    break;
                }
            }
        }
    }
end:
    if (w != NULL) {
        w->leave(w->ctx);
    }
    return out;
}

int
pd_mpi_check(pd_mpi_comm *c, int kind, int dtype, long op, long root,
             long long count, double timeout, int *mpi_err,
             const pd_mpi_waiter *w)
{
    c->seq++;
    int64_t f[PD_MPI_SIGN] = {c->seq, kind, dtype, op, root, count};
    for (int i = 0; i < PD_MPI_SIGN; i++) {
        c->sig[i] = f[i];
        c->sig[PD_MPI_SIGN + i] = -f[i];
    }
    /* A dissemination allreduce of MIN (idempotent: a value met twice does
     * no harm): in round k rank r sends what it has to r + 2^k and takes
     * the MIN with what r - 2^k sent; after ceil(log2 n) rounds every rank
     * has every rank's.  Point-to-point on aux: half the time of Open MPI's
     * nonblocking MPI_Iallreduce for two ranks. */
    memcpy(c->sigr, c->sig, 2 * PD_MPI_SIGN * sizeof(int64_t));
    double deadline = pd_now() + (timeout > 0 ? timeout : c->timeout);
    int n = c->size, s = PD_MPI_OK;
    for (int d = 1; d < n && s == PD_MPI_OK; d <<= 1) {
        pd_mpi_req reqs[2] = {0, 0};
        int rc = pd_mpi_irecv(c->sigp, 2 * PD_MPI_SIGN, c->sig_type,
                              (c->rank - d + n) % n, SIG_TAG, c->aux,
                              &reqs[0]);
        if (rc == 0) {
            rc = pd_mpi_isend(c->sigr, 2 * PD_MPI_SIGN, c->sig_type,
                              (c->rank + d) % n, SIG_TAG, c->aux,
                              &reqs[1]);
            s = rc != 0 ? PD_MPI_ERROR
                        : poll_reqs(reqs, 2, deadline, mpi_err, w);
        }
        else {
            s = PD_MPI_ERROR;
        }
        if (rc != 0) {
            *mpi_err = rc;
        }
        for (int i = 0; i < 2 * PD_MPI_SIGN && s == PD_MPI_OK; i++) {
            if (c->sigp[i] < c->sigr[i]) {
                c->sigr[i] = c->sigp[i];
            }
        }
    }
    if (s != PD_MPI_OK) {
        /* a request may still be MPI's: so are the buffers */
        int64_t *fresh = calloc(6 * PD_MPI_SIGN, sizeof(int64_t));
        if (fresh == NULL) {
            c->failed = 1; /* no more checks from C */
            return s;
        }
        memcpy(fresh, c->sig, 2 * PD_MPI_SIGN * sizeof(int64_t));
        c->sig = fresh;
        c->sigr = fresh + 2 * PD_MPI_SIGN;
        c->sigp = fresh + 4 * PD_MPI_SIGN;
        return s;
    }
    for (int i = 0; i < PD_MPI_SIGN; i++) {
        if (c->sigr[i] != -c->sigr[PD_MPI_SIGN + i]) {
            return PD_MPI_MISMATCH;
        }
    }
    return PD_MPI_OK;
}
