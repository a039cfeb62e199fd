/* Sync points between the ranks of a shared-memory group (shm.h): each
 * rank bumps its step flag and waits for its peers' (spinning, yielding,
 * then sleeping on a futex), eager variants that wait for one rank, the
 * abort and leave flags a wait checks, the wait at a collective's entry
 * that completes an eager one's identity check, and the phase probe.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Busy polling before sleeping, when every rank has a core of its own. */
#define SPIN_BUSY_S 100e-6
/* ... in slices this long, yielding the core between them: cheap on a core
 * of one's own (nothing else to run), and a wake-up placed on the peer's
 * core (the scheduler does that for a while after a futex wake) no longer
 * costs the peer the whole spin.  Measured, 2 ranks on 2 cores, broadcast
 * of 1 MiB: 70 us apart, 300-330 us in runs where they shared a core for a
 * while, 620 us pinned to one core. */
#define SPIN_SLICE_S 5e-6
/* Oversubscribed host, waiting for one rank (eager syncs): polling first. */
#define SPIN_EAGER_S 2e-6
/* Oversubscribed host: yields before sleeping on the futex. */
#define YIELDS 16
/* Longest futex sleep between checks (dead peer, deadline, signals). */
#define SLEEP_SLICE_NS 20000000L

static long
futex(_Atomic uint32_t *addr, int op, uint32_t val,
      const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* Peer p failed the group, or left it before reaching target. */
static pd_status
peer_aborted(pd_shm *s, int p, uint32_t target)
{
    pd_shm_ctrl *c = shm_ctrl(s, p);
    uint32_t a = atomic_load_explicit(&c->abort, memory_order_acquire);
    if (a == 0) {
        if (atomic_load_explicit(&c->left, memory_order_acquire) &&
            !reached(atomic_load_explicit(&c->step, memory_order_acquire),
                     target)) {
            return pd_error(PD_ENETWORK,
                            "rank %d cannot complete the collective: rank %d "
                            "has left the group (destroyed its process group "
                            "or exited)", s->rank, p);
        }
        return PD_OK;
    }
    char msg[PD_ERRMSG_MAX];
    memcpy(msg, c->abort_msg, sizeof(msg));
    msg[sizeof(msg) - 1] = '\0';
    pd_status st = a < PD_NSTATUS ? (pd_status)a : PD_EBACKEND;
    return pd_error(st, "%s", msg);
}

static pd_status
wait_checks(pd_shm *s, const pd_shm_waiter *w, int p, uint32_t target)
{
    pd_status st;
    for (int q = 0; q < s->size; q++) {
        if (q != s->rank && (st = peer_aborted(s, q, target)) != PD_OK) {
            return st;
        }
    }
    if (w->check != NULL && (st = w->check(w->ctx)) != PD_OK) {
        return st;
    }
    if (w->interrupted != NULL && w->interrupted(w->ctx)) {
        return pd_error(PD_EINTR, "interrupted");
    }
    if (w->deadline > 0 && pd_now() >= w->deadline) {
        s->waited_for = p;
        return pd_error(PD_ETIMEOUT, "timed out waiting for local rank %d",
                        p);
    }
    return PD_OK;
}

/* Poll word until it reaches target or `until` passes; 1 if reached. */
static int
poll_until(_Atomic uint32_t *word, uint32_t target, double until)
{
    do {
        for (int i = 0; i < 64; i++) {
            if (reached(atomic_load_explicit(word, memory_order_acquire),
                        target)) {
                return 1;
            }
            cpu_relax();
        }
    } while (pd_now() < until);
    return 0;
}

/* Wait until peer p's step reaches target.  source: p is the one source of
 * an eager sync's data.
 *
 * With a core per rank, poll for a while, then sleep on the peer's step
 * word (the futex).  On an oversubscribed host (more local ranks than
 * cores) poll only for a source, which is likely running right now on
 * another core, then yield the core a few times, then sleep.  Measured with
 * 4 ranks on 2 cores (median of max-over-ranks, us): 16 yields then sleep:
 * broadcast 0.8-2, allreduce 5-8; yielding for 200 us: broadcast 2-17,
 * allreduce 5-8; sleeping at once: 27 for both (futex wake-ups are slow). */
static pd_status
wait_peer(pd_shm *s, int p, uint32_t target, const pd_shm_waiter *w,
          int source)
{
    pd_shm_ctrl *pc = shm_ctrl(s, p);
    _Atomic uint32_t *word = &pc->step;
    if (reached(atomic_load_explicit(word, memory_order_acquire), target)) {
        return PD_OK;
    }
    int busy = s->spin && !w->nospin;
    double spin = busy ? SPIN_BUSY_S : source ? SPIN_EAGER_S : 0.0;
    if (spin > 0) {
        double end = pd_now() + spin;
        for (;;) {
            double now = pd_now();
            double slice = busy ? SPIN_SLICE_S : 10e-6;
            if (poll_until(word, target, now + slice < end ? now + slice : end)) {
                return PD_OK;
            }
            if (atomic_load_explicit(&pc->abort, memory_order_relaxed) ||
                atomic_load_explicit(&pc->left, memory_order_relaxed)) {
                return peer_aborted(s, p, target);
            }
            if (pd_now() >= end) {
                break;
            }
            if (busy) {
                /* the peer may be waiting for this very core (the
                 * scheduler put both ranks on one for a while) */
                sched_yield();
            }
        }
    }
    if (!busy) {
        /* give the core to the ranks we wait for (or to this rank's own
         * computing thread), a few times */
        for (int i = 0; i < YIELDS; i++) {
            sched_yield();
            if (reached(atomic_load_explicit(word, memory_order_acquire),
                        target)) {
                return PD_OK;
            }
        }
    }
    /* sleep on the peer's step word */
    pd_shm_ctrl *me = shm_ctrl(s, s->rank);
    for (;;) {
        PD_CHECK(wait_checks(s, w, p, target));
        atomic_store_explicit(&me->sleeping, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(word, memory_order_seq_cst);
        if (reached(v, target)) {
            atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
            return PD_OK;
        }
        struct timespec ts = {0, SLEEP_SLICE_NS};
        futex(word, FUTEX_WAIT, v, &ts);
        atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
        if (reached(atomic_load_explicit(word, memory_order_acquire),
                    target)) {
            return PD_OK;
        }
    }
}

static void
wake_sleepers(pd_shm *s)
{
    pd_shm_ctrl *me = shm_ctrl(s, s->rank);
    for (int p = 0; p < s->size; p++) {
        if (p != s->rank &&
            atomic_load_explicit(&shm_ctrl(s, p)->sleeping,
                                 memory_order_seq_cst)) {
            futex(&me->step, FUTEX_WAKE, INT_MAX, NULL);
            return;
        }
    }
}

pd_status
pd_shm_sync_wait(pd_shm *s, const pd_shm_waiter *w)
{
    /* Start with the next rank so that ranks do not all poll rank 0. */
    for (int i = 1; i < s->size; i++) {
        int p = (s->rank + i) % s->size;
        pd_status st = wait_peer(s, p, s->step, w, 0);
        if (st != PD_OK) {
            return st;
        }
    }
    return PD_OK;
}

static void
bump(pd_shm *s)
{
    pd_shm_ctrl *me = shm_ctrl(s, s->rank);
    s->step++;
    atomic_store_explicit(&me->step, s->step, memory_order_seq_cst);
    wake_sleepers(s);
}

pd_status
pd_shm_sync(pd_shm *s, const pd_shm_waiter *w)
{
    bump(s);
    return pd_shm_sync_wait(s, w);
}

/* Wait until some peer reaches target: poll them all for a moment (the
 * first one to arrive is likely running right now), then wait for the left
 * neighbour. */
static pd_status
wait_any(pd_shm *s, uint32_t target, const pd_shm_waiter *w)
{
    double until = pd_now() + (s->spin && !w->nospin ? SPIN_BUSY_S
                                                    : SPIN_EAGER_S);
    do {
        for (int i = 1; i < s->size; i++) {
            int p = (s->rank + s->size - i) % s->size;
            if (reached(atomic_load_explicit(&shm_ctrl(s, p)->step,
                                             memory_order_acquire),
                        target)) {
                return PD_OK;
            }
        }
        cpu_relax();
    } while (pd_now() < until);
    return wait_peer(s, (s->rank + s->size - 1) % s->size, target, w, 0);
}

pd_status
pd_shm_sync_wait_from(pd_shm *s, const pd_shm_waiter *w, int src, int data)
{
    if (src == PD_SHM_ANY) {
        return wait_any(s, s->step, w);
    }
    if (src < 0) {
        return pd_shm_sync_wait(s, w);
    }
    if (src == s->rank) {
        return PD_OK;
    }
    return wait_peer(s, src, s->step, w, data);
}

pd_status
pd_shm_sync_from(pd_shm *s, const pd_shm_waiter *w, int src, int data)
{
    bump(s);
    return pd_shm_sync_wait_from(s, w, src, data);
}

/* Before a collective, the deferred half of an eager one's identity check
 * (ident.c); here beside the wait it starts with, which it inlines. */
pd_status
pd_shm_entry(pd_shm *s, const pd_shm_waiter *w,
             const char *(*kind_name)(int))
{
    if (!s->unchecked) {
        return PD_OK;
    }
    /* every rank has entered the last collective: its identity is there,
     * and whatever it read of this rank's banks it has read */
    PD_CHECK(pd_shm_sync_wait(s, w));
    return pd_shm_check_ident_from(s, &s->cur, kind_name, -1);
}

int
pd_shm_waited_for(const pd_shm *s)
{
    return s->waited_for;
}

pd_status
pd_shm_peer_failure(pd_shm *s)
{
    for (int p = 0; p < s->size; p++) {
        if (p == s->rank || !s->mapped[p]) {
            continue;
        }
        pd_shm_ctrl *c = shm_ctrl(s, p);
        if (atomic_load_explicit(&c->abort, memory_order_acquire) != 0) {
            /* target 0 is always reached: only the abort speaks */
            return peer_aborted(s, p, 0);
        }
    }
    return PD_OK;
}

void
pd_shm_abort(pd_shm *s, int status, const char *msg)
{
    if (s == NULL || s->base == NULL || !s->mapped[s->rank]) {
        return;
    }
    pd_shm_ctrl *me = shm_ctrl(s, s->rank);
    if (atomic_load(&me->abort) == 0) {
        snprintf(me->abort_msg, sizeof(me->abort_msg), "%s", msg);
        atomic_store_explicit(&me->abort, (uint32_t)status,
                              memory_order_seq_cst);
    }
    pd_shm_wake_all(s);
}

void
pd_shm_leave(pd_shm *s)
{
    if (s == NULL || s->base == NULL || !s->mapped[s->rank]) {
        return;
    }
    atomic_store_explicit(&shm_ctrl(s, s->rank)->left, 1,
                          memory_order_seq_cst);
    pd_shm_wake_all(s);
}

void
pd_shm_wake_all(pd_shm *s)
{
    for (int p = 0; p < s->size; p++) {
        if (s->mapped[p]) {
            futex(&shm_ctrl(s, p)->step, FUTEX_WAKE, INT_MAX, NULL);
        }
    }
}

double
pd_shm_pingpong(pd_shm *s, uint64_t tag, int k, double deadline)
{
    if (s->rank > 1 || s->size < 2) {
        return 0;
    }
    _Atomic uint64_t *ping = &shm_ctrl(s, 0)->probe;
    _Atomic uint64_t *pong = &shm_ctrl(s, 1)->probe;
    double trip[64];
    k = k < 2 ? 2 : k > 64 ? 64 : k;
    for (int i = 1; i <= k; i++) {
        uint64_t v = (tag << 8) | (uint64_t)i;
        double t0 = pd_now();
        if (s->rank == 0) {
            atomic_store_explicit(ping, v, memory_order_release);
        }
        _Atomic uint64_t *wait = s->rank == 0 ? pong : ping;
        unsigned spins = 0;
        while (atomic_load_explicit(wait, memory_order_acquire) != v) {
            cpu_relax();
            if ((++spins & 63u) == 0 && pd_now() > deadline) {
                return s->rank == 0 ? -1.0 : 0.0;
            }
        }
        if (s->rank == 1) {
            atomic_store_explicit(pong, v, memory_order_release);
        }
        trip[i - 1] = pd_now() - t0;
    }
    if (s->rank != 0) {
        return 0;
    }
    /* the median trip after the first (which waits for rank 1 to come) */
    int m = k - 1;
    double *t = trip + 1;
    for (int i = 1; i < m; i++) {
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    }
    return t[m / 2] * 1e9 / 2.0;
}
