/* The group's queue and its progress thread, and the inline path that runs
 * a blocking collective on the caller's thread (both through run.c; the
 * sticky error and the transport's poll are state.c's).
 *
 * The progress thread is the only user of the transport.  Collectives run
 * one at a time in submission order; point-to-point operations are posted
 * and then progress alongside whatever runs next.  When the thread has
 * nothing to do it still polls the transport, so a dead peer, an abort or a
 * sequence query from a peer is handled at once, not at the next call.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include "../util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
run_work(pd_group *g, pd_work *w)
{
    const pd_op *op = &w->op;
    double timeout = op->timeout > 0 ? op->timeout : g->timeout;
    if (pd_grp_err(g) != PD_OK) {
        pd_grp_work_complete(w, pd_grp_err(g), g->errmsg);
        return;
    }
    w->deadline = pd_now() + timeout;
    if (op->kind == PD_K_SEND || op->kind == PD_K_RECV) {
        pd_fr_start(&g->fr, w->fr_id, 0);
        pd_req *r = &w->req;
        memset(r, 0, sizeof(*r));
        r->peer = op->root;
        pd_status st;
        if (op->kind == PD_K_SEND) {
            r->hdr.type = PD_FRAME_P2P;
            r->hdr.tag = op->tag;
            r->hdr.dtype = (uint8_t)op->dtype;
            r->hdr.count = op->count;
            r->buf = op->in[0];
            r->len = op->in_len[0];
            st = g->t->ops->post_send(g->t, r);
        }
        else {
            r->expect.type = PD_FRAME_P2P;
            r->expect.tag = op->tag;
            /* the sender's dtype and element count must agree too, not just
             * the bytes: 10 float32 into 10 int32 is a mismatch */
            r->expect.dtype = (uint8_t)op->dtype;
            r->expect.count = op->count;
            r->buf = op->out[0];
            r->len = op->out_len[0];
            st = g->t->ops->post_recv(g->t, r);
        }
        if (st != PD_OK) {
            pd_grp_set_fatal(g, st, pd_errmsg());
            pd_grp_work_complete(w, st, g->errmsg);
            return;
        }
        if (r->state == PD_REQ_DONE) {
            w->src = r->peer;
            pd_grp_work_complete(w, PD_OK, NULL);
            return;
        }
        w->next = g->active;
        g->active = w;
        return;
    }

    uint64_t seq = w->seq ? w->seq : ++g->seq; /* handed over: taken */
    pd_fr_start(&g->fr, w->fr_id, seq);
    run_ctx x = {g, 1, 0.0, NULL, NULL, 0, 0};
    int published = 0;
    pd_status st = pd_grp_run_collective(&x, op, seq, w->resume, w->deadline,
                                  &published);
    w->path = x.path;
    w->algo = x.algo;
    if (st == PD_ECLOSED) {
        pd_grp_work_complete(w, st, pd_errmsg());
        return;
    }
    if (st != PD_OK) {
        /* before the dump that set_fatal writes */
        pd_fr_end(&g->fr, w->fr_id, st, w->path, w->algo);
        pd_grp_set_fatal(g, st, pd_errmsg());
        pd_grp_work_complete(w, pd_grp_err(g), g->errmsg);
        return;
    }
    pd_grp_work_complete(w, PD_OK, NULL);
}

uint64_t
pd_grp_cb_current_seq(void *ctx)
{
    return ((pd_group *)ctx)->seq;
}

void
pd_grp_cb_on_abort(void *ctx, int peer, int status, const char *msg)
{
    (void)ctx;
    (void)peer;
    (void)status;
    (void)msg;
}

void *
pd_grp_progress_main(void *arg)
{
    pd_group *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        pd_work *w = NULL;
        if (!g->running) {
            w = g->qh;
            if (w != NULL) {
                g->qh = w->next;
                if (g->qh == NULL) {
                    g->qt = NULL;
                }
                w->next = NULL;
                g->running = 1;
            }
        }
        pthread_mutex_unlock(&g->mu);
        pd_grp_propagate_fatal(g);
        if (atomic_load(&g->stopping)) {
            if (w != NULL) {
                pd_grp_work_complete(w, PD_ECLOSED,
                              "the process group was destroyed before this "
                              "operation ran");
                pthread_mutex_lock(&g->mu);
                g->running = 0;
                pthread_mutex_unlock(&g->mu);
                continue;
            }
            break;
        }
        if (w != NULL) {
            run_work(g, w);
            pthread_mutex_lock(&g->mu);
            g->running = 0;
            pthread_mutex_unlock(&g->mu);
            continue;
        }
        if (pd_grp_err(g) == PD_OK) {
            pd_grp_progress_once(g, pd_now() + 1.0);
        }
        else {
            /* failed group: nothing moves; answer peers, wait for work */
            g->t->ops->progress(g->t, 1000);
        }
    }
    pd_work *a = g->active;
    g->active = NULL;
    while (a != NULL) {
        pd_work *n = a->next;
        pd_grp_work_complete(a, PD_ECLOSED,
                      "the process group was destroyed while this operation "
                      "was in progress");
        a = n;
    }
    return NULL;
}

int
pd_group_inline(pd_group *g, const pd_op *op, int (*interrupted)(void *),
                void *ictx, pd_status *out, pd_work **handoff)
{
    *handoff = NULL;
    if (g->shm == NULL || !pd_kind_has(op->kind, PD_KF_SHM)) {
        return 0;
    }
    pthread_mutex_lock(&g->mu);
    int ok = g->thr_started && g->qh == NULL && !g->running &&
             !atomic_load(&g->stopping);
    if (ok) {
        g->running = 1;
        g->caller = 1;
    }
    pthread_mutex_unlock(&g->mu);
    if (!ok) {
        return 0;
    }
    pd_status st;
    if (pd_grp_err(g) != PD_OK) {
        st = pd_error(pd_grp_err(g), "%s", g->errmsg);
    }
    else {
        double timeout = op->timeout > 0 ? op->timeout : g->timeout;
        double deadline = pd_now() + timeout;
        uint64_t seq = ++g->seq;
        uint64_t fr_id = pd_fr_add(&g->fr, op, seq, g->size);
        run_ctx x = {g, 0, 0.0, interrupted, ictx, 0, 0};
        int published = 0;
        st = pd_grp_run_collective(&x, op, seq, 0, deadline, &published);
        if (st == PD_EINTR) {
            /* the progress thread finishes it; the caller may wait (the
             * caller's block arrays may live on its stack: copy them) */
            pd_work *w = pd_grp_work_new(g, op);
            if (w != NULL && pd_grp_work_own_blocks(g, w) != PD_OK) {
                pd_work_release(w);
                pd_work_release(w);
                w = NULL;
            }
            if (w != NULL) {
                /* published: resume after the first bump; else all again */
                w->resume = published;
                w->seq = seq;
                w->fr_id = fr_id; /* ends when the progress thread ends it */
                pthread_mutex_lock(&g->mu);
                w->next = g->qh;
                g->qh = w;
                if (g->qt == NULL) {
                    g->qt = w;
                }
                g->running = 0;
                g->caller = 0;
                pthread_mutex_unlock(&g->mu);
                g->t->ops->wake(g->t);
                *handoff = w;
                *out = pd_error(PD_EINTR, "interrupted");
                return 1;
            }
            st = pd_error(PD_ENOMEM, "%s: out of memory", op->name);
        }
        pd_fr_end(&g->fr, fr_id, st, x.path, x.algo);
        if (st != PD_OK && st != PD_ECLOSED) {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
            pd_grp_record_fatal(g, st, msg);
            st = pd_error(pd_grp_err(g), "%s", g->errmsg);
        }
    }
    pthread_mutex_lock(&g->mu);
    g->running = 0;
    g->caller = 0;
    int wake = g->qh != NULL || pd_grp_err(g) != PD_OK;
    pthread_mutex_unlock(&g->mu);
    if (wake) {
        g->t->ops->wake(g->t);
    }
    *out = st;
    return 1;
}

pd_status
pd_group_submit(pd_group *g, const pd_op *op, pd_work **out)
{
    if (!g->thr_started) {
        return pd_error(PD_ECLOSED, "the process group is not connected");
    }
    if (atomic_load(&g->stopping)) {
        return pd_error(PD_ECLOSED, "the process group has been destroyed");
    }
    pd_work *w = pd_grp_work_new(g, op);
    if (w == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", op->name);
    }
    w->fr_id = pd_fr_add(&g->fr, op, 0, g->size);
    pthread_mutex_lock(&g->mu);
    if (g->qt) {
        g->qt->next = w;
    }
    else {
        g->qh = w;
    }
    g->qt = w;
    pthread_mutex_unlock(&g->mu);
    g->t->ops->wake(g->t);
    *out = w;
    return PD_OK;
}
