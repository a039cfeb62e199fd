/* The group's sticky error state and the poll every wait makes: one step
 * of transport progress (reaping point-to-point work), and the check of a
 * shared-memory wait.  Below run.c and progress.c, which both call here;
 * nothing here calls up.
 *
 * Any failure inside a collective (mismatch, dead peer, timeout) is fatal to
 * the group, as in torch: it becomes the group's sticky error, it is sent to
 * every peer, and every pending and later operation fails with it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include "../util/log.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

pd_status
pd_group_error(pd_group *g, char *buf, size_t cap)
{
    pd_status st = (pd_status)atomic_load_explicit(&g->err,
                                                    memory_order_acquire);
    if (st != PD_OK && cap > 0) {
        snprintf(buf, cap, "%s", g->errmsg);
    }
    return st;
}

/* Make st the group's sticky error (any thread; the first one wins) and tell
 * the ranks on this host through shared memory at once.  On return the
 * group's error is set (this one or the winner's), so a caller may report
 * pd_grp_err(g) and g->errmsg.  A thread that loses the claim waits for the
 * winner's store: the caller's own error (a mismatch its collective found)
 * must not turn into the group's error read before the winner wrote it,
 * PD_OK: a collective that failed returning as if it had worked (seen
 * once: the progress thread claimed the error a peer's abort brought while
 * the caller's thread was reporting the mismatch itself), and then for the
 * winner's flight-record dump (a caller raising the error may exit). */
void
pd_grp_record_fatal(pd_group *g, pd_status st, const char *msg)
{
    int zero = 0;
    if (!atomic_compare_exchange_strong(&g->err_claim, &zero, 1)) {
        /* the winner is a message copy away from its store */
        while (atomic_load_explicit(&g->err, memory_order_acquire) == PD_OK) {
            sched_yield();
        }
        /* and a file write away from its flight records (err_claim 2): a
         * caller that raises the error may end the process next, and the
         * ring must be on disk first.  Bounded: the winner takes no lock a
         * caller here holds, but a stuck disk must not hang the group. */
        double until = pd_now() + 10.0;
        while (atomic_load_explicit(&g->err_claim, memory_order_acquire) != 2 &&
               pd_now() < until) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        return;
    }
    if (st == PD_OK) {
        st = PD_EBACKEND; /* a failure without a status: still a failure */
    }
    snprintf(g->errmsg, sizeof(g->errmsg), "%s", msg);
    atomic_store_explicit(&g->err, (int)st, memory_order_release);
    PD_LOG(PD_LOG_WARN, "group", "rank %d: group failed (%s): %s", g->rank,
           pd_status_name(st), msg);
    if (g->shm != NULL) {
        pd_shm_abort(g->shm, st, g->errmsg);
    }
    char reason[PD_ERRMSG_MAX + 48];
    snprintf(reason, sizeof(reason), "group failed (%s): %s",
             pd_status_name(st), g->errmsg);
    /* a device backend's calls on this group's ring fail with it: its
     * watchdog aborts them when it sees the group's error */
    pd_fr_fail_open(&g->fr, st);
    if (pd_fr_dump(&g->fr, NULL, reason, 1) != PD_OK) {
        PD_LOG(PD_LOG_WARN, "group", "rank %d: %s", g->rank, pd_errmsg());
    }
    atomic_store_explicit(&g->err_claim, 2, memory_order_release);
}

void
pd_group_fail(pd_group *g, const char *msg)
{
    pd_grp_record_fatal(g, PD_EBACKEND, msg);
    if (g->t != NULL) {
        g->t->ops->wake(g->t); /* the progress thread tells the peers */
    }
}

/* Progress thread: stop the transport, tell every peer, fail p2p work. */
void
pd_grp_propagate_fatal(pd_group *g)
{
    pd_status st = pd_grp_err(g);
    if (g->propagated || st == PD_OK) {
        return;
    }
    g->propagated = 1;
    g->t->ops->fail(g->t, st, g->errmsg);
    g->t->ops->abort_peers(g->t, st, g->errmsg);
    /* p2p work in flight can no longer complete */
    pd_work *w = g->active;
    g->active = NULL;
    while (w != NULL) {
        pd_work *n = w->next;
        pd_grp_work_complete(w, st, g->errmsg);
        w = n;
    }
}

void
pd_grp_set_fatal(pd_group *g, pd_status st, const char *msg)
{
    pd_grp_record_fatal(g, st, msg);
    pd_grp_propagate_fatal(g);
}

static void
reap_p2p(pd_group *g)
{
    pd_work **pp = &g->active;
    double now = 0;
    while (*pp != NULL) {
        pd_work *w = *pp;
        if (w->req.state == PD_REQ_DONE) {
            *pp = w->next;
            w->src = w->req.peer;
            pd_grp_work_complete(w, PD_OK, NULL);
            continue;
        }
        if (now == 0) {
            now = pd_now();
        }
        if (now > w->deadline) {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg),
                     "rank %d: %s (peer %d, tag %d) timed out after %.1f s",
                     g->rank, w->op.name, w->op.root, w->op.tag,
                     w->op.timeout > 0 ? w->op.timeout : g->timeout);
            pd_grp_set_fatal(g, PD_ETIMEOUT, msg);
            return;
        }
        pp = &w->next;
    }
}

static double
nearest_deadline(pd_group *g, double d)
{
    for (pd_work *w = g->active; w != NULL; w = w->next) {
        if (w->deadline < d) {
            d = w->deadline;
        }
    }
    return d;
}

pd_status
pd_grp_progress_once(pd_group *g, double until)
{
    double left = nearest_deadline(g, until) - pd_now();
    int ms = left <= 0 ? 0 : left > 1.0 ? 1000 : (int)(left * 1000.0) + 1;
    pd_status st = g->t->ops->progress(g->t, ms);
    if (st != PD_OK) {
        pd_grp_set_fatal(g, st, pd_errmsg());
        return st;
    }
    reap_p2p(g);
    if (pd_grp_err(g) != PD_OK) {
        return pd_error(pd_grp_err(g), "%s", g->errmsg);
    }
    return PD_OK;
}

/* Shared-memory waits: stop for a failed or destroyed group; on the
 * progress thread also keep the transport moving, so that a dead peer's
 * closed connection is seen while a collective waits. */
pd_status
pd_grp_shm_check(void *arg)
{
    run_ctx *x = arg;
    pd_group *g = x->g;
    if (atomic_load(&g->stopping)) {
        return pd_error(PD_ECLOSED,
                        "the process group was destroyed while an operation "
                        "was in progress");
    }
    if (x->on_progress) {
        double now = pd_now();
        if (now >= x->next_poll) {
            x->next_poll = now + 0.02;
            pd_grp_progress_once(g, now);
        }
    }
    if (pd_grp_err(g) != PD_OK) {
        return pd_error(pd_grp_err(g), "%s", g->errmsg);
    }
    return PD_OK;
}
