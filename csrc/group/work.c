/* Work handles: completion, waiting, references; a work's own copy of an
 * operation's block arrays (an inline collective handed over). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "../util/sync.h"

/* ------------------------------------------------------------------ work */

void
pd_grp_work_complete(pd_work *w, pd_status st, const char *msg)
{
    pd_fr_end(&w->g->fr, w->fr_id, st, w->path, w->algo);
    pthread_mutex_lock(&w->mu);
    w->status = st;
    if (st != PD_OK) {
        w->msg = strdup(msg && msg[0] ? msg : pd_status_name(st));
    }
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pd_work_release(w);
}

void
pd_work_release(pd_work *w)
{
    if (w == NULL) {
        return;
    }
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w->msg);
        free(w->owned);
        free(w);
    }
}

int
pd_work_done(pd_work *w)
{
    pthread_mutex_lock(&w->mu);
    int d = w->done;
    pthread_mutex_unlock(&w->mu);
    return d;
}

int
pd_work_source(pd_work *w)
{
    return w->src;
}

pd_status
pd_work_wait(pd_work *w, double timeout_s)
{
    /* Small operations finish within microseconds: look a few times, giving
     * the core away in between (oversubscribed hosts), before sleeping. */
    double spin_until = pd_now() + w->spin_s;
    while (!atomic_load_explicit(&w->done, memory_order_acquire) &&
           pd_now() < spin_until) {
        sched_yield();
    }
    pthread_mutex_lock(&w->mu);
    if (timeout_s < 0) {
        while (!w->done) {
            pthread_cond_wait(&w->cv, &w->mu);
        }
    }
    else {
        double deadline = pd_now() + timeout_s;
        while (!w->done) {
            if (pd_cond_wait_until(&w->cv, &w->mu, deadline)) {
                break;
            }
        }
    }
    pd_status st;
    if (!w->done) {
        st = pd_error(PD_ETIMEOUT,
                      "Work.wait(timeout=%.3g s) timed out: %s is still "
                      "running", timeout_s, w->op.name);
    }
    else if (w->status != PD_OK) {
        st = pd_error(w->status, "%s", w->msg);
    }
    else {
        st = PD_OK;
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

pd_work *
pd_grp_work_new(pd_group *g, const pd_op *op)
{
    pd_work *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return NULL;
    }
    atomic_init(&w->refs, 2); /* caller + queue */
    w->op = *op;
    w->src = -1;
    w->spin_s = g->spin_s;
    w->g = g;
    pthread_mutex_init(&w->mu, NULL);
    if (pd_cond_init_monotonic(&w->cv, op->name) != PD_OK) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
}

/* Give w its own copies of the op's block pointer and length arrays. */
pd_status
pd_grp_work_own_blocks(pd_group *g, pd_work *w)
{
    pd_op *o = &w->op;
    int k = o->kind;
    int bin = pd_kind_blocks(k, 0, g->rank, o->root, g->size);
    int bout = pd_kind_blocks(k, 1, g->rank, o->root, g->size);
    /* an absent side still has its one (aliased) slot */
    size_t nin = bin > 1 ? (size_t)bin : 1;
    size_t nout = bout > 1 ? (size_t)bout : 1;
    size_t in_lens = pd_kind_has(k, PD_KF_SPLITS) ? nin : 1;
    size_t out_lens = pd_kind_has(k, PD_KF_SPLITS) ? nout : 1;
    char *mem = malloc((nin + nout) * sizeof(char *) +
                       (in_lens + out_lens) * sizeof(size_t));
    if (mem == NULL) {
        return PD_ENOMEM;
    }
    char **in = (char **)mem, **out = in + nin;
    size_t *il = (size_t *)(out + nout), *ol = il + in_lens;
    memcpy(in, o->in, nin * sizeof(char *));
    memcpy(out, o->out, nout * sizeof(char *));
    memcpy(il, o->in_len, in_lens * sizeof(size_t));
    memcpy(ol, o->out_len, out_lens * sizeof(size_t));
    o->in = in;
    o->out = out;
    o->in_len = il;
    o->out_len = ol;
    w->owned = mem;
    return PD_OK;
}
