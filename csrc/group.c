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
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "group.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "coll/coll.h"
#include "group_internal.h"
#include "transport/shm/shm.h"
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
    uint64_t seq;      /* resume: the sequence number already taken */
    int resume;        /* an interrupted inline collective to finish */
    void *owned;       /* block arrays copied for a resumed collective */
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
    int running;       /* under mu: a collective runs (either thread) */
    int caller;        /* under mu: ... on a caller's thread (inline) */
    atomic_int stopping;
    pd_shm *shm;       /* every rank on this host: shared memory */
    pd_shm *lshm;      /* the ranks on this host (frames through rings) */
    uint64_t token;    /* the group's random id (segment names) */
    struct shm_buf *bufs;
    uint64_t nbufs;
    /* the thread that runs collectives (progress or inline caller) */
    uint64_t seq;
    /* progress thread only */
    pd_work *active;
    int propagated;
    /* sticky error: claimed once, message written before err is stored */
    atomic_int err_claim;
    _Atomic int err;
    char errmsg[PD_ERRMSG_MAX];
};

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

/* ----------------------------------------------------------- group state */

static pd_status
group_err(pd_group *g)
{
    return (pd_status)atomic_load_explicit(&g->err, memory_order_acquire);
}

/* Make st the group's sticky error (any thread; the first one wins) and tell
 * the ranks on this host through shared memory at once. */
static void
record_fatal(pd_group *g, pd_status st, const char *msg)
{
    int zero = 0;
    if (!atomic_compare_exchange_strong(&g->err_claim, &zero, 1)) {
        return;
    }
    PD_LOG(PD_LOG_WARN, "group", "rank %d: group failed (%s): %s", g->rank,
           pd_status_name(st), msg);
    snprintf(g->errmsg, sizeof(g->errmsg), "%s", msg);
    atomic_store_explicit(&g->err, (int)st, memory_order_release);
    if (g->shm != NULL) {
        pd_shm_abort(g->shm, st, g->errmsg);
    }
}

/* Progress thread: stop the transport, tell every peer, fail p2p work. */
static void
propagate_fatal(pd_group *g)
{
    pd_status st = group_err(g);
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
        work_complete(w, st, g->errmsg);
        w = n;
    }
}

static void
set_fatal(pd_group *g, pd_status st, const char *msg)
{
    record_fatal(g, st, msg);
    propagate_fatal(g);
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
    if (group_err(g) != PD_OK) {
        return pd_error(group_err(g), "%s", g->errmsg);
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
            /* reduced in float32 scratch, rounded once into out */
            PD_CHECK_GOTO(widen(c, &w, op->in[0], count), st, exit);
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

/* Buffers in the group's shared memory: allreduce without the copy-in. */
typedef struct shm_buf {
    char *own;
    size_t len;
    uint64_t id;
    char **peer;    /* peer[p]: rank p's buffer as mapped here (own too) */
    struct shm_buf *next;
} shm_buf;

static shm_buf *find_shm_buf(pd_group *g, const char *p, size_t len);

static pd_status
run_coll_shm(pd_coll *c, const pd_op *op)
{
    size_t esz = pd_dtype_size(op->dtype);
    size_t len = op->count * esz;
    switch (op->kind) {
    case PD_K_ALLREDUCE: {
        shm_buf *sb = find_shm_buf(c->g, op->in[0], len);
        if (sb != NULL) {
            size_t off = (size_t)(op->in[0] - sb->own);
            char *stack[16];
            char **peer = c->size <= 16
                              ? stack
                              : malloc(sizeof(char *) * (size_t)c->size);
            if (peer == NULL) {
                return pd_error(PD_ENOMEM, "all_reduce: out of memory");
            }
            for (int p = 0; p < c->size; p++) {
                peer[p] = sb->peer[p] + off;
            }
            pd_status st =
                op->out[0] == op->in[0]
                    ? pd_allreduce_shm_inplace(c, peer, op->count)
                    : pd_allreduce_shm_into(c, peer, op->out[0], op->count);
            if (peer != stack) {
                free(peer);
            }
            return st;
        }
        return pd_allreduce_shm(c, op->in[0], op->out[0], op->count);
    }
    case PD_K_REDUCE:
        return pd_reduce_shm(c, op->in[0], op->out[0], op->count);
    case PD_K_REDUCE_SCATTER:
        return pd_reduce_scatter_shm(c, op->in, op->out[0], op->count);
    case PD_K_BROADCAST:
        return pd_broadcast_shm(c, op->out[0], len);
    case PD_K_ALLGATHER:
        return pd_allgather_shm(c, op->in[0], op->out, len);
    case PD_K_GATHER:
        return pd_gather_shm(c, op->in[0], len, op->out);
    case PD_K_SCATTER:
        return pd_scatter_shm(c, op->in, op->out[0], len);
    case PD_K_ALLTOALL:
        return pd_alltoall_shm(c, op->in, op->in_len, op->out, op->out_len);
    case PD_K_BARRIER:
        return pd_barrier_shm(c);
    default:
        return pd_error(PD_EINVAL, "unknown collective kind %d", op->kind);
    }
}

/* A collective timed out: find out where the peers are (through shared
 * memory, or by asking them over the transport) and name the ranks that
 * never reached this collective. */
static void
explain_timeout(pd_group *g, const pd_op *op, uint64_t seq, double timeout,
                int on_progress)
{
    uint64_t *seqs = calloc((size_t)g->size, sizeof(uint64_t));
    char never[512] = "", silent[512] = "";
    size_t on = 0, os = 0;
    if (seqs != NULL) {
        if (g->shm != NULL) {
            for (int p = 0; p < g->size; p++) {
                seqs[p] = p == g->rank ? seq : pd_shm_entered(g->shm, p);
            }
        }
        else if (on_progress) {
            g->t->ops->query_seqs(g->t, seqs, 1.0);
        }
        else {
            for (int p = 0; p < g->size; p++) {
                seqs[p] = UINT64_MAX;
            }
        }
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

typedef struct run_ctx {
    pd_group *g;
    int on_progress;   /* running on the progress thread (owns transport) */
    double next_poll;
    int (*interrupted)(void *);
    void *ictx;
} run_ctx;

/* Shared-memory waits: stop for a failed or destroyed group; on the
 * progress thread also keep the transport moving, so that a dead peer's
 * closed connection is seen while a collective waits. */
static pd_status
shm_check(void *arg)
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
            progress_once(g, now);
        }
    }
    if (group_err(g) != PD_OK) {
        return pd_error(group_err(g), "%s", g->errmsg);
    }
    return PD_OK;
}

static int
shm_interrupted(void *arg)
{
    run_ctx *x = arg;
    return x->interrupted != NULL && x->interrupted(x->ictx);
}

/* Run one collective (sequence number seq) on this thread.  Returns its
 * status; on failure the message names the call.  PD_EINTR: the first sync
 * was interrupted and the collective must be resumed (resume = 1). */
static pd_status
run_collective(run_ctx *x, const pd_op *op, uint64_t seq, int resume,
               double deadline, int *published)
{
    pd_group *g = x->g;
    double timeout = op->timeout > 0 ? op->timeout : g->timeout;
    pd_coll c;
    memset(&c, 0, sizeof(c));
    c.g = g;
    c.t = g->t;
    c.rank = g->rank;
    c.size = g->size;
    c.op = op;
    c.deadline = deadline;
    c.base.magic = PD_FRAME_MAGIC;
    c.base.type = PD_FRAME_COLL;
    c.base.kind = (uint8_t)op->kind;
    c.base.dtype = (uint8_t)op->dtype;
    c.base.op = (uint8_t)op->op;
    c.base.root = op->root;
    c.base.seq = seq;
    c.base.count = op->kind == PD_K_ALLTOALL ? 0 : op->count;
    c.rdt = pd_dtype_accum(op->dtype);
    c.esz = pd_dtype_size(c.rdt);
    PD_LOG(PD_LOG_TRACE, "group", "rank %d: %s #%llu start (dtype %s, count %zu)",
           g->rank, op->name, (unsigned long long)seq,
           pd_dtype_name(op->dtype), op->count);
    double t0 = pd_now();
    pd_status st;
    if (g->shm != NULL && pd_kind_has(op->kind, PD_KF_SHM)) {
        c.shm = g->shm;
        c.resume = resume;
        c.waiter.deadline = deadline;
        c.waiter.check = shm_check;
        c.waiter.interrupted = x->interrupted ? shm_interrupted : NULL;
        c.waiter.ctx = x;
        c.id.seq = seq;
        c.id.count = c.base.count;
        c.id.kind = c.base.kind;
        c.id.dtype = c.base.dtype;
        c.id.op = c.base.op;
        c.id.root = c.base.root;
        uint64_t value = 0;
        if (op->kind == PD_K_ALLTOALL) {
            for (int p = 0; p < g->size; p++) {
                value = op->in_len[p] > value ? op->in_len[p] : value;
            }
        }
        if (op->kind == PD_K_ALLREDUCE) {
            shm_buf *sb = find_shm_buf(g, op->in[0],
                                       op->count * pd_dtype_size(op->dtype));
            /* ranks must agree on the path: buffer id and offset */
            c.id.aux = sb ? (sb->id << 40) ^
                                (uint64_t)(op->in[0] - sb->own) ^ 1
                          : 0;
        }
        st = PD_OK;
        if (!resume) {
            /* after an eager collective: everyone entered it, alike */
            st = pd_shm_entry(g->shm, &c.waiter, pd_kind_name);
            if (st == PD_EINTR) {
                return st; /* nothing published: *published stays 0 */
            }
            if (st == PD_OK) {
                pd_shm_enter(g->shm, &c.id, value);
            }
        }
        if (st == PD_OK) {
            *published = 1;
            st = run_coll_shm(&c, op);
            if (st == PD_EINTR) {
                return st;
            }
        }
    }
    else {
        g->t->ops->set_coll(g->t, &c.base);
        st = run_coll(&c, op);
    }
    PD_LOG(PD_LOG_TRACE, "group", "rank %d: %s #%llu %s after %.1f us", g->rank,
           op->name, (unsigned long long)seq, st == PD_OK ? "done" : "failed",
           (pd_now() - t0) * 1e6);
    if (st != PD_OK && st != PD_ECLOSED) {
        if (st == PD_ETIMEOUT && op->kind != PD_K_MONITORED_BARRIER &&
            group_err(g) == PD_OK) {
            explain_timeout(g, op, seq, timeout, x->on_progress);
        }
        else {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
            /* name the call when the transport's message does not */
            if (strstr(msg, op->name) == NULL && group_err(g) == PD_OK &&
                st == PD_ENETWORK) {
                pd_error(st, "%s (sequence number %llu): %s", op->name,
                         (unsigned long long)seq, msg);
            }
        }
    }
    return st;
}

static void
run_work(pd_group *g, pd_work *w)
{
    const pd_op *op = &w->op;
    double timeout = op->timeout > 0 ? op->timeout : g->timeout;
    if (group_err(g) != PD_OK) {
        work_complete(w, group_err(g), g->errmsg);
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

    uint64_t seq = w->seq ? w->seq : ++g->seq; /* handed over: taken */
    run_ctx x = {g, 1, 0.0, NULL, NULL};
    int published = 0;
    pd_status st = run_collective(&x, op, seq, w->resume, w->deadline,
                                  &published);
    if (st == PD_ECLOSED) {
        work_complete(w, st, pd_errmsg());
        return;
    }
    if (st != PD_OK) {
        set_fatal(g, st, pd_errmsg());
        work_complete(w, group_err(g), g->errmsg);
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
        propagate_fatal(g);
        if (atomic_load(&g->stopping)) {
            if (w != NULL) {
                work_complete(w, PD_ECLOSED,
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
        if (group_err(g) == PD_OK) {
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

/* ---------------------------------------------------------------- inline */

/* Blocking shared-memory collectives on an idle group run on the calling
 * thread, whatever their size: no hand-off to the progress thread and back.
 * Only the first sync waits for late ranks (and can be interrupted); after
 * it every rank is present, and a rank that dies is seen by the progress
 * thread, whose abort wakes this thread. */

static pd_work *work_new(pd_group *g, const pd_op *op);

/* Give w its own copies of the op's block pointer and length arrays. */
static pd_status
work_own_blocks(pd_group *g, pd_work *w)
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
    if (group_err(g) != PD_OK) {
        st = pd_error(group_err(g), "%s", g->errmsg);
    }
    else {
        double timeout = op->timeout > 0 ? op->timeout : g->timeout;
        double deadline = pd_now() + timeout;
        uint64_t seq = ++g->seq;
        run_ctx x = {g, 0, 0.0, interrupted, ictx};
        int published = 0;
        st = run_collective(&x, op, seq, 0, deadline, &published);
        if (st == PD_EINTR) {
            /* the progress thread finishes it; the caller may wait (the
             * caller's block arrays may live on its stack: copy them) */
            pd_work *w = work_new(g, op);
            if (w != NULL && work_own_blocks(g, w) != PD_OK) {
                pd_work_release(w);
                pd_work_release(w);
                w = NULL;
            }
            if (w != NULL) {
                /* published: resume after the first bump; else all again */
                w->resume = published;
                w->seq = seq;
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
        if (st != PD_OK && st != PD_ECLOSED) {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
            record_fatal(g, st, msg);
            st = pd_error(group_err(g), "%s", g->errmsg);
        }
    }
    pthread_mutex_lock(&g->mu);
    g->running = 0;
    g->caller = 0;
    int wake = g->qh != NULL || group_err(g) != PD_OK;
    pthread_mutex_unlock(&g->mu);
    if (wake) {
        g->t->ops->wake(g->t);
    }
    *out = st;
    return 1;
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
    atomic_init(&g->err, PD_OK);
    atomic_init(&g->err_claim, 0);
    pd_transport_events ev = {g, cb_on_abort, cb_current_seq};
    pd_status st = pd_tcp_create(rank, size, secret, &ev, &g->t, port_out);
    if (st != PD_OK) {
        pd_group_destroy(g);
        return st;
    }
    *out = g;
    return PD_OK;
}

/* A barrier over the transport, before the progress thread runs (shared
 * memory setup).  Uses a sequence number like any collective. */
static pd_status
setup_barrier(pd_group *g)
{
    pd_op op;
    memset(&op, 0, sizeof(op));
    op.kind = PD_K_BARRIER;
    snprintf(op.name, sizeof(op.name), "init_process_group");
    run_ctx x = {g, 1, 0.0, NULL, NULL};
    pd_shm *shm = g->shm;
    g->shm = NULL; /* not usable yet */
    int published = 0;
    pd_status st = run_collective(&x, &op, ++g->seq, 0, pd_now() + g->timeout,
                                  &published);
    g->shm = shm;
    return st;
}

static uint32_t
node_tag(const char *id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)id; *c; c++) {
        h = (h ^ *c) * 16777619u;
    }
    return h;
}

/* Shared memory among the ranks of each host: segments (created, mapped by
 * every local rank between two group-wide barriers, then unlinked), frames
 * between local ranks through rings, and, when every rank is on this host,
 * the shared-memory collectives.  Every rank takes part in the barriers. */
static pd_status
setup_shm(pd_group *g, uint64_t token, int spin, const char *const *id)
{
    int n = g->size, nlocal = 0, mylocal = -1, shared = 0;
    int *local_of = malloc(sizeof(int) * (size_t)n);
    if (local_of == NULL) {
        return pd_error(PD_ENOMEM, "process group: out of memory");
    }
    for (int p = 0; p < n; p++) {
        int same = 0;
        for (int q = 0; q < n; q++) {
            same += q != p && strcmp(id[p], id[q]) == 0;
        }
        shared |= same > 0;
        if (strcmp(id[p], id[g->rank]) == 0) {
            if (p == g->rank) {
                mylocal = nlocal;
            }
            local_of[p] = nlocal++;
        }
        else {
            local_of[p] = -1;
        }
    }
    if (!shared) {
        free(local_of);
        return PD_OK;
    }
    int mine = nlocal >= 2;
    pd_shm *shm = NULL;
    pd_status st = PD_OK, st2;
    if (mine) {
        st = pd_shm_create(mylocal, nlocal, token, node_tag(id[g->rank]), spin,
                           &shm);
    }
    /* every rank reports through the barrier, so a failed creation on one
     * rank fails init on all of them instead of leaving them waiting */
    st2 = setup_barrier(g);
    if (st == PD_OK && st2 != PD_OK) {
        st = st2;
    }
    if (st == PD_OK && mine) {
        st = pd_shm_attach(shm);
    }
    if (st == PD_OK) {
        st = setup_barrier(g);
    }
    /* every rank has mapped every segment (or failed): no name stays */
    pd_shm_unlink(shm, st != PD_OK);
    if (st == PD_OK && mine) {
        st = pd_tcp_use_shm(g->t, shm, local_of);
    }
    free(local_of);
    if (st != PD_OK) {
        char msg[PD_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        pd_shm_close(shm);
        return pd_error(st, "setting up shared memory between the ranks: %s",
                        msg);
    }
    g->lshm = shm;
    if (nlocal == n) {
        g->shm = shm;
    }
    /* the setup barriers are not the user's collectives: numbering starts
     * over (all their frames have arrived) */
    g->seq = 0;
    pd_hdr none;
    memset(&none, 0, sizeof(none));
    g->t->ops->set_coll(g->t, &none);
    return PD_OK;
}

pd_status
pd_group_connect(pd_group *g, const char *const *hosts, const int *ports,
                 uint64_t token, const char *const *nodes, int transport)
{
    if (g->size > 1) {
        PD_CHECK(pd_tcp_connect(g->t, hosts, ports, token,
                                pd_now() + g->timeout));
    }
    /* Ranks sharing this host: same node identity (hostname and boot id),
     * else same advertised address. */
    const char *const *id = nodes != NULL ? nodes : hosts;
    int local = 0;
    for (int p = 0; p < g->size; p++) {
        if (strcmp(id[p], id[g->rank]) == 0) {
            local++;
        }
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int spin = ncpu > 0 && local <= ncpu;
    g->spin_s = spin ? PD_WAIT_SPIN_S : 0.0;
    if (transport == PD_TRANSPORT_SHM && local != g->size) {
        return pd_error(PD_EINVAL,
                        "PYDDP_TRANSPORT=shm needs every rank on one host, "
                        "but only %d of %d ranks are on this one", local,
                        g->size);
    }
    if (g->size > 1 && transport != PD_TRANSPORT_TCP) {
        g->token = token;
        PD_CHECK(setup_shm(g, token, spin, id));
    }
    PD_LOG(PD_LOG_INFO, "group",
           "rank %d of %d connected (%d ranks on this host, transport %s, "
           "waiters %s)",
           g->rank, g->size, local, pd_group_transport(g),
           spin ? "spin" : "yield");
    int rc = pthread_create(&g->thr, NULL, progress_main, g);
    if (rc != 0) {
        return pd_error(PD_ESYS, "pthread_create: %s", strerror(rc));
    }
    g->thr_started = 1;
    return PD_OK;
}

const char *
pd_group_transport(const pd_group *g)
{
    return g->size == 1       ? "local"
           : g->shm != NULL   ? "shm"
           : g->lshm != NULL  ? "shm+tcp"
                              : "tcp";
}

static pd_work *
work_new(pd_group *g, const pd_op *op)
{
    pd_work *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return NULL;
    }
    atomic_init(&w->refs, 2); /* caller + queue */
    w->op = *op;
    w->src = -1;
    w->spin_s = g->spin_s;
    pthread_mutex_init(&w->mu, NULL);
    if (pd_cond_init_monotonic(&w->cv, op->name) != PD_OK) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
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
    pd_work *w = work_new(g, op);
    if (w == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", op->name);
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

/* ------------------------------------------------- shared-memory buffers */

static shm_buf *
find_shm_buf(pd_group *g, const char *p, size_t len)
{
    for (shm_buf *b = g->bufs; b != NULL; b = b->next) {
        if (p >= b->own && p + len <= b->own + b->len && len > 0) {
            return b;
        }
    }
    return NULL;
}

/* The group maps the peers' buffers; its own belongs to the caller. */
static void
free_shm_buf(shm_buf *b, int size)
{
    for (int p = 0; p < size && b->peer != NULL; p++) {
        if (b->peer[p] != NULL && b->peer[p] != b->own) {
            munmap(b->peer[p], b->len);
        }
    }
    free(b->peer);
    free(b);
}

/* Take the right to run collectives on this thread, once the group is idle
 * (pending work finished). */
static pd_status
acquire_idle(pd_group *g, const char *what)
{
    for (;;) {
        if (atomic_load(&g->stopping)) {
            return pd_error(PD_ECLOSED, "%s: the process group has been "
                            "destroyed", what);
        }
        pthread_mutex_lock(&g->mu);
        int ok = g->qh == NULL && !g->running;
        if (ok) {
            g->running = 1;
            g->caller = 1;
        }
        pthread_mutex_unlock(&g->mu);
        if (ok) {
            return PD_OK;
        }
        if (atomic_load(&g->stopping)) {
            return pd_error(PD_ECLOSED, "%s: the process group has been "
                            "destroyed", what);
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

static void
release_idle(pd_group *g)
{
    pthread_mutex_lock(&g->mu);
    g->running = 0;
    g->caller = 0;
    int wake = g->qh != NULL;
    pthread_mutex_unlock(&g->mu);
    if (wake) {
        g->t->ops->wake(g->t);
    }
}

static void
buf_name(char *buf, size_t len, uint64_t token, int rank, uint64_t id)
{
    snprintf(buf, len, "/pyddp.%016llx.%d.b%llu", (unsigned long long)token,
             rank, (unsigned long long)id);
}

/* One phase of the allocation: publish ok, sync, learn whether every rank
 * succeeded (*all_ok).  Consumes a sequence number. */
static pd_status
alloc_phase(pd_group *g, size_t len, int ok, int *all_ok)
{
    pd_shm_ident id;
    memset(&id, 0, sizeof(id));
    id.seq = ++g->seq;
    id.kind = PD_K_SHM_ALLOC;
    id.count = len;
    run_ctx x = {g, 0, 0.0, NULL, NULL};
    pd_shm_waiter w = {pd_now() + g->timeout, shm_check, NULL, &x};
    /* after an eager collective (a broadcast root that did not wait for
     * every rank): let everyone enter it first, as every collective does,
     * so the identity read below is of this allocation, not of a lagging
     * rank's earlier collective with the same sequence parity */
    pd_status st = pd_shm_entry(g->shm, &w, pd_kind_name);
    if (st == PD_OK) {
        pd_shm_enter(g->shm, &id, (uint64_t)ok);
        st = pd_shm_sync(g->shm, &w);
    }
    if (st == PD_OK) {
        st = pd_shm_check_ident(g->shm, &id, pd_kind_name);
    }
    if (st != PD_OK) {
        char msg[PD_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "_shared_array: %s", pd_errmsg());
        record_fatal(g, st, msg);
        g->t->ops->wake(g->t);
        return pd_error(st, "%s", msg);
    }
    *all_ok = 1;
    for (int p = 0; p < g->size; p++) {
        if (pd_shm_value(g->shm, p, id.seq) == 0) {
            *all_ok = 0;
        }
    }
    return PD_OK;
}

pd_status
pd_group_shm_alloc(pd_group *g, size_t len, void **out, size_t *maplen)
{
    if (g->shm == NULL) {
        return pd_error(PD_EINVAL,
                        "shared-memory buffers need a group whose ranks are "
                        "all on this host (and PYDDP_TRANSPORT not tcp); "
                        "this group uses %s", pd_group_transport(g));
    }
    if (len == 0) {
        len = 1;
    }
    len = (len + 4095) & ~(size_t)4095;
    PD_CHECK(acquire_idle(g, "_shared_array"));
    pd_status st = PD_OK;
    char why[PD_ERRMSG_MAX] = "";
    uint64_t bid = ++g->nbufs;
    char name[96];
    shm_buf *b = calloc(1, sizeof(*b));
    char **peer = calloc((size_t)g->size, sizeof(char *));
    int fd = -1, linked = 0, ok = b != NULL && peer != NULL, all_ok = 0;
    if (!ok) {
        snprintf(why, sizeof(why), "out of memory");
    }
    buf_name(name, sizeof(name), g->token, g->rank, bid);
    if (ok) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        ok = fd >= 0;
        linked = ok;
        int e;
        if (ok && (e = posix_fallocate(fd, 0, (off_t)len)) != 0) {
            errno = e;
            ok = 0;
        }
        if (ok) {
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                           0);
            ok = p != MAP_FAILED;
            peer[g->rank] = ok ? p : NULL;
        }
        if (!ok) {
            snprintf(why, sizeof(why), "%s of %zu bytes: %s", name, len,
                     strerror(errno));
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    PD_CHECK_GOTO(alloc_phase(g, len, ok, &all_ok), st, fail);
    if (!all_ok) {
        st = pd_error(PD_ESYS,
                      "_shared_array: a rank could not allocate %zu bytes of "
                      "shared memory (is /dev/shm large enough?)%s%s", len,
                      why[0] ? "; here: " : "", why);
        goto fail;
    }
    for (int p = 0; p < g->size && ok; p++) {
        if (p == g->rank) {
            continue;
        }
        char pn[96];
        buf_name(pn, sizeof(pn), g->token, p, bid);
        int pfd = shm_open(pn, O_RDWR, 0600);
        if (pfd < 0) {
            snprintf(why, sizeof(why), "shm_open(%s): %s", pn,
                     strerror(errno));
            ok = 0;
            break;
        }
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (m == MAP_FAILED) {
            snprintf(why, sizeof(why), "mmap(%s): %s", pn, strerror(errno));
            ok = 0;
            break;
        }
        peer[p] = m;
    }
    PD_CHECK_GOTO(alloc_phase(g, len, ok, &all_ok), st, fail);
    shm_unlink(name);
    linked = 0;
    if (!all_ok) {
        st = pd_error(PD_ESYS,
                      "_shared_array: a rank could not map the others' "
                      "shared memory%s%s", why[0] ? "; here: " : "", why);
        goto fail;
    }
    b->own = peer[g->rank];
    b->len = len;
    b->id = bid;
    b->peer = peer;
    b->next = g->bufs;
    g->bufs = b;
    release_idle(g);
    *out = b->own;
    *maplen = len;
    return PD_OK;
fail:
    if (linked) {
        shm_unlink(name);
    }
    if (peer != NULL && peer[g->rank] != NULL) {
        munmap(peer[g->rank], len);
        peer[g->rank] = NULL;
    }
    if (b != NULL) {
        b->peer = peer;
        b->len = len;
        free_shm_buf(b, g->size);
    }
    else {
        free(peer);
    }
    release_idle(g);
    return st;
}

void
pd_group_shm_forget(pd_group *g, void *own)
{
    if (acquire_idle(g, "_shared_array") != PD_OK) {
        return;
    }
    for (shm_buf **pp = &g->bufs; *pp != NULL; pp = &(*pp)->next) {
        shm_buf *b = *pp;
        if (b->own == own) {
            *pp = b->next;
            free_shm_buf(b, g->size);
            break;
        }
    }
    release_idle(g);
}

void
pd_group_destroy(pd_group *g)
{
    if (g == NULL) {
        return;
    }
    PD_LOG(PD_LOG_INFO, "group", "rank %d: destroying the group", g->rank);
    atomic_store(&g->stopping, 1);
    /* A collective running on another caller's thread sees "destroyed" at
     * its next check (woken now, within a sleep slice at worst): the
     * shared memory must stay mapped until it has left. */
    for (;;) {
        if (g->shm != NULL) {
            pd_shm_wake_all(g->shm);
        }
        pthread_mutex_lock(&g->mu);
        int busy = g->caller;
        pthread_mutex_unlock(&g->mu);
        if (!busy) {
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (g->thr_started) {
        g->t->ops->wake(g->t);
        pthread_join(g->thr, NULL);
    }
    pd_shm_leave(g->lshm);
    if (g->t != NULL) {
        g->t->ops->close(g->t);
    }
    while (g->bufs != NULL) {
        shm_buf *n = g->bufs->next;
        free_shm_buf(g->bufs, g->size);
        g->bufs = n;
    }
    pd_shm_close(g->lshm);
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
