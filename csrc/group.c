/* Process group: a FIFO of work run by one progress thread per group.
 *
 * The progress thread is the only user of the transport.  Collectives run
 * one at a time in submission order; point-to-point operations are posted
 * and then progress alongside whatever runs next.  When the thread has
 * nothing to do it still polls the transport, so a dead peer, an abort or a
 * sequence query from a peer is handled at once, not at the next call.
 *
 * Any failure inside a collective (mismatch, dead peer, timeout) is fatal to
 * the group, as in torch: it becomes the group's sticky error, it is sent to
 * every peer, and every pending and later operation fails with it.
 */
#include "group.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "group_internal.h"
#include "transport/tcp/tcp.h"
#include "util/log.h"
#include "util/sync.h"

/* How long a waiter polls before sleeping on its condition variable, when
 * the host has a core for every rank on it (oversubscribed: never). */
#define PD_WAIT_SPIN_S 50e-6

struct pd_work {
    atomic_int refs;
    pd_op op;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int done;
    pd_status status;
    char *msg;
    int src;
    double deadline;
    double spin_s;
    pd_req req;
    struct pd_work *next;
};

struct pd_group {
    int rank;
    int size;
    double timeout;
    double spin_s;
    pd_transport *t;
    pthread_t thr;
    int thr_started;
    pthread_mutex_t mu;
    pd_work *qh, *qt;
    atomic_int stopping;
    /* progress thread only */
    uint64_t seq;
    pd_work *active;
    pd_status err;
    char errmsg[PD_ERRMSG_MAX];
};

static const char *const kind_names[PD_NKINDS] = {
    "none", "broadcast", "all_reduce", "reduce", "all_gather", "gather",
    "scatter", "reduce_scatter", "all_to_all", "barrier",
    "monitored_barrier", "send", "recv",
};

const char *
pd_coll_kind_name(int kind)
{
    if (kind < 0 || kind >= PD_NKINDS) {
        return "unknown";
    }
    return kind_names[kind];
}

/* ------------------------------------------------------------------ work */

static void
work_complete(pd_work *w, pd_status st, const char *msg)
{
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

/* ----------------------------------------------------------- group state */

static void
set_fatal(pd_group *g, pd_status st, const char *msg)
{
    if (g->err != PD_OK) {
        return;
    }
    PD_LOG(PD_LOG_WARN, "group", "rank %d: group failed (%s): %s", g->rank,
           pd_status_name(st), msg);
    g->err = st;
    snprintf(g->errmsg, sizeof(g->errmsg), "%s", msg);
    g->t->ops->fail(g->t, st, g->errmsg);
    g->t->ops->abort_peers(g->t, st, g->errmsg);
    /* p2p work in flight can no longer complete */
    pd_work *w = g->active;
    g->active = NULL;
    while (w != NULL) {
        pd_work *n = w->next;
        work_complete(w, st, g->errmsg);
        w = n;
    }
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
            work_complete(w, PD_OK, NULL);
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
            set_fatal(g, PD_ETIMEOUT, msg);
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

static pd_status
progress_once(pd_group *g, double until)
{
    double left = nearest_deadline(g, until) - pd_now();
    int ms = left <= 0 ? 0 : left > 1.0 ? 1000 : (int)(left * 1000.0) + 1;
    pd_status st = g->t->ops->progress(g->t, ms);
    if (st != PD_OK) {
        set_fatal(g, st, pd_errmsg());
        return st;
    }
    reap_p2p(g);
    if (g->err != PD_OK) {
        return pd_error(g->err, "%s", g->errmsg);
    }
    return PD_OK;
}

pd_status
pd_group_progress_until(pd_group *g, double deadline)
{
    if (atomic_load(&g->stopping)) {
        return pd_error(PD_ECLOSED,
                        "the process group was destroyed while an operation "
                        "was in progress");
    }
    if (pd_now() >= deadline) {
        return pd_error(PD_ETIMEOUT, "timed out");
    }
    return progress_once(g, deadline);
}

/* ----------------------------------------------------------- collectives */

static pd_status
widen(pd_coll *c, char **dst, const char *src, size_t count)
{
    *dst = malloc(count * sizeof(float) + 1);
    if (*dst == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
    }
    pd_cast_to_f32((pd_dtype)c->base.dtype, (float *)*dst, src, count);
    return PD_OK;
}

static pd_status
run_reduction(pd_coll *c, const pd_op *op)
{
    pd_status st = PD_OK;
    int half = op->dtype == PD_FLOAT16 || op->dtype == PD_BFLOAT16;
    size_t count = op->count;
    size_t bytes = count * c->esz;
    int small = bytes <= PD_SMALL_BYTES || count < (size_t)c->size ||
                c->size == 1;
    char *w = NULL;
    char **wblocks = NULL;

    switch (op->kind) {
    case PD_K_ALLREDUCE:
        if (half) {
            PD_CHECK_GOTO(widen(c, &w, op->out[0], count), st, exit);
        }
        else {
            w = op->out[0];
            if (op->in[0] != op->out[0]) {
                memmove(w, op->in[0], bytes);
            }
        }
        st = small ? pd_allreduce_direct(c, w, count)
                   : pd_allreduce_ring(c, w, count);
        if (st == PD_OK && half) {
            pd_cast_from_f32((pd_dtype)op->dtype, op->out[0], (float *)w,
                             count);
        }
        break;
    case PD_K_REDUCE: {
        const char *in = op->in[0];
        char *out = op->out[0];
        char *wo = NULL;
        if (half) {
            PD_CHECK_GOTO(widen(c, &w, in, count), st, exit);
            in = w;
            if (c->rank == c->base.root) {
                wo = malloc(bytes + 1);
                if (wo == NULL) {
                    st = pd_error(PD_ENOMEM, "reduce: out of memory");
                    goto exit;
                }
                out = wo;
            }
        }
        st = small ? pd_reduce_direct(c, in, out, count)
                   : pd_reduce_ring(c, in, out, count);
        if (st == PD_OK && half && c->rank == c->base.root) {
            pd_cast_from_f32((pd_dtype)op->dtype, op->out[0], (float *)wo,
                             count);
        }
        free(wo);
        if (!half) {
            w = NULL;
        }
        break;
    }
    case PD_K_REDUCE_SCATTER: {
        char **in = op->in;
        char *out = op->out[0];
        if (half) {
            w = malloc(bytes * (size_t)(c->size + 1) + 1);
            wblocks = malloc(sizeof(char *) * (size_t)c->size);
            if (w == NULL || wblocks == NULL) {
                st = pd_error(PD_ENOMEM, "reduce_scatter: out of memory");
                goto exit;
            }
            for (int p = 0; p < c->size; p++) {
                wblocks[p] = w + bytes * (size_t)p;
                pd_cast_to_f32((pd_dtype)op->dtype, (float *)wblocks[p],
                               op->in[p], count);
            }
            in = wblocks;
            out = w + bytes * (size_t)c->size;
        }
        st = small ? pd_reduce_scatter_direct(c, in, out, count)
                   : pd_reduce_scatter_ring(c, in, out, count);
        if (st == PD_OK && half) {
            pd_cast_from_f32((pd_dtype)op->dtype, op->out[0], (float *)out,
                             count);
        }
        break;
    }
    default:
        break;
    }
exit:
    if (half || op->kind == PD_K_REDUCE_SCATTER) {
        if (w != op->out[0]) {
            free(w);
        }
    }
    free(wblocks);
    return st;
}

static pd_status
run_coll(pd_coll *c, const pd_op *op)
{
    size_t esz = pd_dtype_size(op->dtype);
    switch (op->kind) {
    case PD_K_ALLREDUCE:
    case PD_K_REDUCE:
    case PD_K_REDUCE_SCATTER:
        return run_reduction(c, op);
    case PD_K_BROADCAST: {
        size_t len = op->count * esz;
        if (c->size == 1) {
            return PD_OK;
        }
        return len <= PD_SMALL_BYTES ? pd_broadcast_flat(c, op->out[0], len)
                                     : pd_broadcast_chain(c, op->out[0], len);
    }
    case PD_K_ALLGATHER: {
        /* in[0] is this rank's input; out[p] the destination blocks */
        size_t len = op->count * esz;
        size_t *lens = malloc(sizeof(size_t) * (size_t)c->size);
        if (lens == NULL) {
            return pd_error(PD_ENOMEM, "all_gather: out of memory");
        }
        for (int p = 0; p < c->size; p++) {
            lens[p] = len;
        }
        if (op->out[c->rank] != op->in[0]) {
            memmove(op->out[c->rank], op->in[0], len);
        }
        pd_status st = PD_OK;
        if (c->size > 1) {
            st = len * (size_t)c->size <= PD_SMALL_BYTES
                     ? pd_allgather_direct(c, op->out, lens)
                     : pd_allgather_ring(c, op->out, lens);
        }
        free(lens);
        return st;
    }
    case PD_K_GATHER:
        return pd_gather_direct(c, op->in[0], op->count * esz, op->out);
    case PD_K_SCATTER:
        return pd_scatter_direct(c, op->in, op->out[0], op->count * esz);
    case PD_K_ALLTOALL:
        return pd_alltoall_pairwise(c, op->in, op->in_len, op->out,
                                    op->out_len);
    case PD_K_BARRIER:
        return pd_barrier_direct(c);
    case PD_K_MONITORED_BARRIER:
        return pd_monitored_barrier_star(
            c, op->timeout > 0 ? op->timeout : c->g->timeout, op->wait_all);
    default:
        return pd_error(PD_EINVAL, "unknown collective kind %d", op->kind);
    }
}

/* A collective timed out: ask the peers where they are and name the ranks
 * that never reached this collective. */
static void
explain_timeout(pd_group *g, const pd_op *op, uint64_t seq, double timeout)
{
    uint64_t *seqs = calloc((size_t)g->size, sizeof(uint64_t));
    char never[512] = "", silent[512] = "";
    size_t on = 0, os = 0;
    if (seqs != NULL) {
        g->t->ops->query_seqs(g->t, seqs, 1.0);
        for (int p = 0; p < g->size; p++) {
            if (p == g->rank) {
                continue;
            }
            if (seqs[p] == UINT64_MAX) {
                int k = snprintf(silent + os, sizeof(silent) - os, "%s%d",
                                 os ? ", " : "", p);
                if (k > 0 && (size_t)k < sizeof(silent) - os) {
                    os += (size_t)k;
                }
            }
            else if (seqs[p] < seq) {
                int k = snprintf(never + on, sizeof(never) - on,
                                 "%s%d (at sequence number %llu)",
                                 on ? ", " : "", p,
                                 (unsigned long long)seqs[p]);
                if (k > 0 && (size_t)k < sizeof(never) - on) {
                    on += (size_t)k;
                }
            }
        }
    }
    free(seqs);
    pd_error(PD_ETIMEOUT,
             "rank %d: %s (sequence number %llu) timed out after %.1f s; "
             "ranks that never arrived: [%s]%s%s%s",
             g->rank, op->name, (unsigned long long)seq, timeout, never,
             os ? "; ranks that did not answer: [" : "", silent,
             os ? "]" : "");
}

static void
run_work(pd_group *g, pd_work *w)
{
    const pd_op *op = &w->op;
    double timeout = op->timeout > 0 ? op->timeout : g->timeout;
    if (g->err != PD_OK) {
        work_complete(w, g->err, g->errmsg);
        return;
    }
    w->deadline = pd_now() + timeout;
    if (op->kind == PD_K_SEND || op->kind == PD_K_RECV) {
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
            r->buf = op->out[0];
            r->len = op->out_len[0];
            st = g->t->ops->post_recv(g->t, r);
        }
        if (st != PD_OK) {
            set_fatal(g, st, pd_errmsg());
            work_complete(w, st, g->errmsg);
            return;
        }
        if (r->state == PD_REQ_DONE) {
            w->src = r->peer;
            work_complete(w, PD_OK, NULL);
            return;
        }
        w->next = g->active;
        g->active = w;
        return;
    }

    uint64_t seq = ++g->seq;
    pd_coll c;
    memset(&c, 0, sizeof(c));
    c.g = g;
    c.t = g->t;
    c.rank = g->rank;
    c.size = g->size;
    c.op = op;
    c.deadline = w->deadline;
    c.base.magic = PD_FRAME_MAGIC;
    c.base.type = PD_FRAME_COLL;
    c.base.kind = (uint8_t)op->kind;
    c.base.dtype = (uint8_t)op->dtype;
    c.base.op = (uint8_t)op->op;
    c.base.root = op->root;
    c.base.seq = seq;
    c.base.count = op->kind == PD_K_ALLTOALL ? 0 : op->count;
    g->t->ops->set_coll(g->t, &c.base);
    c.rdt = pd_dtype_accum(op->dtype);
    c.esz = pd_dtype_size(c.rdt);
    PD_LOG(PD_LOG_TRACE, "group", "rank %d: %s #%llu start (dtype %s, count %zu)",
           g->rank, op->name, (unsigned long long)seq,
           pd_dtype_name(op->dtype), op->count);
    double t0 = pd_now();
    pd_status st = run_coll(&c, op);
    PD_LOG(PD_LOG_TRACE, "group", "rank %d: %s #%llu %s after %.1f us", g->rank,
           op->name, (unsigned long long)seq, st == PD_OK ? "done" : "failed",
           (pd_now() - t0) * 1e6);
    if (st != PD_OK) {
        if (st == PD_ETIMEOUT && op->kind != PD_K_MONITORED_BARRIER &&
            g->err == PD_OK) {
            explain_timeout(g, op, seq, timeout);
        }
        else if (st != PD_ECLOSED) {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
            /* name the call when the transport's message does not */
            if (strstr(msg, op->name) == NULL && g->err == PD_OK &&
                st == PD_ENETWORK) {
                pd_error(st, "%s (sequence number %llu): %s", op->name,
                         (unsigned long long)seq, msg);
            }
        }
        if (st == PD_ECLOSED) {
            work_complete(w, st, pd_errmsg());
            return;
        }
        set_fatal(g, st, pd_errmsg());
        work_complete(w, g->err, g->errmsg);
        return;
    }
    work_complete(w, PD_OK, NULL);
}

static uint64_t
cb_current_seq(void *ctx)
{
    return ((pd_group *)ctx)->seq;
}

static void
cb_on_abort(void *ctx, int peer, int status, const char *msg)
{
    (void)ctx;
    (void)peer;
    (void)status;
    (void)msg;
}

static void *
progress_main(void *arg)
{
    pd_group *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        pd_work *w = g->qh;
        if (w != NULL) {
            g->qh = w->next;
            if (g->qh == NULL) {
                g->qt = NULL;
            }
            w->next = NULL;
        }
        pthread_mutex_unlock(&g->mu);
        if (atomic_load(&g->stopping)) {
            if (w != NULL) {
                work_complete(w, PD_ECLOSED,
                              "the process group was destroyed before this "
                              "operation ran");
                continue;
            }
            break;
        }
        if (w != NULL) {
            run_work(g, w);
            continue;
        }
        if (g->err == PD_OK) {
            progress_once(g, pd_now() + 1.0);
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
        work_complete(a, PD_ECLOSED,
                      "the process group was destroyed while this operation "
                      "was in progress");
        a = n;
    }
    return NULL;
}

/* ------------------------------------------------------------- lifecycle */

pd_status
pd_group_create(int rank, int size, double timeout_s, const char *secret,
                pd_group **out, int *port_out)
{
    if (size < 1) {
        return pd_error(PD_EINVAL, "world_size must be >= 1, got %d", size);
    }
    if (rank < 0 || rank >= size) {
        return pd_error(PD_EINVAL,
                        "rank %d is out of range: expected 0 <= rank < %d",
                        rank, size);
    }
    pd_group *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return pd_error(PD_ENOMEM, "process group: out of memory");
    }
    g->rank = rank;
    g->size = size;
    g->timeout = timeout_s > 0 ? timeout_s : 1800.0;
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->stopping, 0);
    pd_transport_events ev = {g, cb_on_abort, cb_current_seq};
    pd_status st = pd_tcp_create(rank, size, secret, &ev, &g->t, port_out);
    if (st != PD_OK) {
        pd_group_destroy(g);
        return st;
    }
    *out = g;
    return PD_OK;
}

pd_status
pd_group_connect(pd_group *g, const char *const *hosts, const int *ports,
                 uint64_t token)
{
    if (g->size > 1) {
        PD_CHECK(pd_tcp_connect(g->t, hosts, ports, token,
                                pd_now() + g->timeout));
    }
    /* Ranks sharing this host (same advertised address): spinning waiters
     * help only while every rank has a core of its own. */
    int local = 0;
    for (int p = 0; p < g->size; p++) {
        if (strcmp(hosts[p], hosts[g->rank]) == 0) {
            local++;
        }
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    g->spin_s = (ncpu > 0 && local <= ncpu) ? PD_WAIT_SPIN_S : 0.0;
    PD_LOG(PD_LOG_INFO, "group",
           "rank %d of %d connected (%d ranks on this host, waiters %s)",
           g->rank, g->size, local, g->spin_s > 0 ? "spin" : "sleep");
    int rc = pthread_create(&g->thr, NULL, progress_main, g);
    if (rc != 0) {
        return pd_error(PD_ESYS, "pthread_create: %s", strerror(rc));
    }
    g->thr_started = 1;
    return PD_OK;
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
    pd_work *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", op->name);
    }
    atomic_init(&w->refs, 2); /* caller + queue */
    w->op = *op;
    w->src = -1;
    w->spin_s = g->spin_s;
    pthread_mutex_init(&w->mu, NULL);
    pd_status cst = pd_cond_init_monotonic(&w->cv, op->name);
    if (cst != PD_OK) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return cst;
    }
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

void
pd_group_destroy(pd_group *g)
{
    if (g == NULL) {
        return;
    }
    PD_LOG(PD_LOG_INFO, "group", "rank %d: destroying the group", g->rank);
    atomic_store(&g->stopping, 1);
    if (g->thr_started) {
        g->t->ops->wake(g->t);
        pthread_join(g->thr, NULL);
    }
    if (g->t != NULL) {
        g->t->ops->close(g->t);
    }
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int
pd_group_rank(const pd_group *g)
{
    return g->rank;
}

int
pd_group_size(const pd_group *g)
{
    return g->size;
}
