/* Running one collective on this thread: its identity (the frame header
 * and the shared-memory entry), the waits' checks, the transport or
 * shared-memory algorithm (coll/select.c chooses), and the message of a
 * failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/log.h"

/* pd_coll's progress callback: the algorithms' waits over the transport. */
static pd_status
coll_progress(void *ctx, double deadline)
{
    pd_group *g = ctx;
    if (atomic_load(&g->stopping)) {
        return pd_error(PD_ECLOSED,
                        "the process group was destroyed while an operation "
                        "was in progress");
    }
    if (pd_now() >= deadline) {
        /* what arrived meanwhile first: a peer's abort or death waiting
         * to be read is the cause (this rank may have been the one
         * stopped, and its clock ran out while it was) */
        PD_CHECK(pd_grp_progress_once(g, 0.0));
        return pd_error(PD_ETIMEOUT, "timed out");
    }
    return pd_grp_progress_once(g, deadline);
}

static int
shm_interrupted(void *arg)
{
    run_ctx *x = arg;
    return x->interrupted != NULL && x->interrupted(x->ictx);
}

/* The phase probe, at the start of collective seq on every rank when the
 * collectives since the last one weigh PD_PHASE_EVERY (the same on every
 * rank): ranks 0 and 1 hand a cache line back and forth; rank 0 keeps what
 * it saw as its verdict, which it publishes with its next collectives'
 * identities (run below).  Only where every rank spins on a core of its
 * own: ranks sharing a core would measure the scheduler.  An unanswered
 * probe (rank 1 late) keeps the verdict. */
static void
phase_probe(pd_group *g, uint64_t seq)
{
    g->phase_weight = 0;
    g->phase_read = seq + 1; /* every rank reads the verdict then */
    if (g->rank == 0 && g->phase_force >= 0) {
        g->verdict = g->phase_force;
        return;
    }
    if (g->phase_force >= 0 || g->rank > 1 || !pd_shm_spins(g->shm)) {
        return;
    }
    double ns = pd_shm_pingpong(g->shm, seq + 1, PD_PHASE_TRIPS,
                                pd_now() + PD_PHASE_WAIT_S);
    if (g->rank == 0) {
        g->probes++;
        g->probe_ns = ns;
        if (ns > 0) {
            g->verdict = ns > g->phase_ns;
        }
    }
}

/* Run one collective (sequence number seq) on this thread.  Returns its
 * status; on failure the message names the call.  PD_EINTR: the first sync
 * was interrupted and the collective must be resumed (resume = 1). */
pd_status
pd_grp_run_collective(run_ctx *x, const pd_op *op, uint64_t seq,
                      int resume, double deadline, int *published)
{
    pd_group *g = x->g;
    double timeout = op->timeout > 0 ? op->timeout : g->timeout;
    pd_coll c;
    memset(&c, 0, sizeof(c));
    c.t = g->t;
    c.progress = coll_progress;
    c.progress_ctx = g;
    c.timeout = timeout;
    c.rank = g->rank;
    c.size = g->size;
    c.op = op;
    c.rules = &g->rules;
    c.deadline = deadline;
    c.waited_for = -1;
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
    char *stack[16];
    char **peer = NULL;
    if (g->shm != NULL && pd_kind_has(op->kind, PD_KF_SHM)) {
        c.shm = g->shm;
        c.resume = resume;
        c.waiter.deadline = deadline;
        c.waiter.check = pd_grp_shm_check;
        c.waiter.interrupted = x->interrupted ? shm_interrupted : NULL;
        c.waiter.ctx = x;
        c.waiter.nospin = x->on_progress && g->progress_nospin;
        c.id.seq = seq;
        c.id.count = c.base.count;
        c.id.kind = c.base.kind;
        c.id.dtype = c.base.dtype;
        c.id.op = c.base.op;
        c.id.root = c.base.root;
        st = PD_OK;
        if (!resume) {
            if (g->phase_ns > 0 && g->phase_weight >= PD_PHASE_EVERY) {
                phase_probe(g, seq);
            }
            /* after an eager collective: everyone entered it, alike */
            st = pd_shm_entry(g->shm, &c.waiter, pd_kind_name);
            if (st == PD_EINTR) {
                goto out; /* nothing published: *published stays 0 */
            }
            if (g->phase_ns > 0 && g->phase_read != 0 &&
                seq >= g->phase_read) {
                /* rank 0 entered the last collective (the probe's, or a
                 * shared-array allocation after it): its verdict, read
                 * once per probe (a line rank 0 writes at every
                 * collective costs the others a miss) */
                g->phase = pd_shm_phase_of(g->shm, seq - 1, g->phase);
                g->phase_read = 0;
            }
        }
        c.rules = g->phase ? &g->rules_slow : &g->rules;
        c.id.phase = g->rank == 0 ? (uint8_t)g->verdict : 0;
        uint64_t value = 0;
        if (op->kind == PD_K_ALLTOALL) {
            for (int p = 0; p < g->size; p++) {
                value = op->in_len[p] > value ? op->in_len[p] : value;
            }
        }
        shm_buf *sb = NULL;
        if (op->kind == PD_K_ALLREDUCE) {
            sb = pd_grp_find_shm_buf(g, op->in[0],
                                     op->count * pd_dtype_size(op->dtype));
        }
        if (sb != NULL) {
            /* every rank's copy of the array: no copy-in */
            size_t off = (size_t)(op->in[0] - sb->own);
            peer = g->size <= 16 ? stack
                                 : malloc(sizeof(char *) * (size_t)g->size);
            if (peer == NULL) {
                return pd_error(PD_ENOMEM, "%s: out of memory", op->name);
            }
            for (int p = 0; p < g->size; p++) {
                peer[p] = sb->peer[p] + off;
            }
            c.inshm = peer;
            /* ranks must agree on the path: buffer id and offset */
            c.id.aux = (sb->id << 40) ^ (uint64_t)off ^ 1;
        }
        else if (pd_shm_cma(g->shm)) {
            /* ranks must agree on when single copies start: a rank with
             * another PYDDP_CMA_THRESHOLD or other rules (or phase) would
             * read a bank as addresses */
            size_t glo, ghi;
            pd_rules_cma_gap(c.rules, op->kind, &glo, &ghi);
            c.id.aux = ((uint64_t)pd_rules_cma_from(c.rules, op->kind)
                        << 1) ^
                       ((uint64_t)glo * 0x9e3779b97f4a7c15ull) ^
                       ((uint64_t)ghi * 0xc2b2ae3d27d4eb4full) ^
                       0xc3a0000000000000ull;
        }
        if (!resume && st == PD_OK) {
            pd_shm_enter(g->shm, &c.id, value);
            if (g->phase_ns > 0) {
                /* the same on every rank: the identity's count */
                g->phase_weight += 1.0 + (double)(c.id.count *
                                                  pd_dtype_size(op->dtype)) /
                                             (256.0 * 1024.0);
            }
        }
        if (st == PD_OK) {
            *published = 1;
            st = pd_coll_run_shm(&c, op);
            if (st == PD_EINTR) {
                goto out;
            }
        }
    }
    else {
        g->t->ops->set_coll(g->t, &c.base);
        st = pd_coll_run(&c, op);
    }
    PD_LOG(PD_LOG_TRACE, "group", "rank %d: %s #%llu %s after %.1f us", g->rank,
           op->name, (unsigned long long)seq, st == PD_OK ? "done" : "failed",
           (pd_now() - t0) * 1e6);
    if (st != PD_OK && st != PD_ECLOSED) {
        if (st == PD_ETIMEOUT && op->kind != PD_K_MONITORED_BARRIER &&
            pd_grp_err(g) == PD_OK) {
            int waited = c.shm != NULL ? pd_shm_waited_for(c.shm)
                                       : c.waited_for;
            st = pd_grp_explain_timeout(g, op, seq, timeout,
                                        x->on_progress, waited);
        }
        else {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
            /* name the call when the transport's message does not */
            if (strstr(msg, op->name) == NULL && pd_grp_err(g) == PD_OK &&
                st == PD_ENETWORK) {
                pd_error(st, "%s (sequence number %llu): %s", op->name,
                         (unsigned long long)seq, msg);
            }
        }
    }
out:
    x->path = (uint8_t)(c.shm != NULL ? PD_PATH_SHM : pd_grp_path(g));
    x->algo = (uint8_t)c.algo;
    if (peer != NULL && peer != stack) {
        free(peer);
    }
    return st;
}
