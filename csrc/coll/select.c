/* Algorithm choice (Open MPI's coll/tuned decision files): which
 * algorithm of csrc/coll/ runs a collective, by kind, message size and
 * group size, over the transport (pd_coll_run) or in shared memory
 * (pd_coll_run_shm); and the float32 widening of half-precision reductions
 * over the transport.  One pure function decides (pd_coll_choose): both
 * runners dispatch on its answer and keep it in pd_coll.algo, which the
 * flight record, the DETAIL log and the timeline name, and which
 * pd_group_explain asks without running.  The thresholds are data in coll/rules.c, which the
 * single-copy helpers (coll/cma_common.c) read too. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

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
    int small = c->algo == PD_ALGO_DIRECT;
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
                pd_move(w, op->in[0], bytes);
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

static const char *const algo_names[PD_NALGOS] = {
    [PD_ALGO_NONE] = "none",         [PD_ALGO_DIRECT] = "direct",
    [PD_ALGO_RING] = "ring",         [PD_ALGO_FLAT] = "flat",
    [PD_ALGO_CHAIN] = "chain",       [PD_ALGO_PAIRWISE] = "pairwise",
    [PD_ALGO_STAR] = "star",         [PD_ALGO_SHM] = "shm",
    [PD_ALGO_SHM_INPLACE] = "shm-inplace", [PD_ALGO_CMA] = "cma",
};

static const char *const path_names[PD_NPATHS] = {
    [PD_PATH_NONE] = "none", [PD_PATH_LOCAL] = "local",
    [PD_PATH_SHM] = "shm",   [PD_PATH_SHM_TCP] = "shm+tcp",
    [PD_PATH_TCP] = "tcp",
};

const char *
pd_path_name(int path)
{
    return path >= 0 && path < PD_NPATHS ? path_names[path] : "unknown";
}

const char *
pd_algo_name(int algo)
{
    return algo >= 0 && algo < PD_NALGOS ? algo_names[algo] : "unknown";
}

pd_algo
pd_coll_choose(const pd_rules *r, int kind, int dtype, size_t count,
               int size, int shm, int cma, int inshm)
{
    if (shm) {
        /* single copies: by one rank's block in the call's own dtype */
        size_t len = count * pd_dtype_size(dtype);
        switch (kind) {
        case PD_K_ALLREDUCE:
            if (inshm) {
                return PD_ALGO_SHM_INPLACE;
            }
            /* fall through */
        case PD_K_REDUCE:
        case PD_K_REDUCE_SCATTER:
        case PD_K_BROADCAST:
        case PD_K_ALLGATHER:
        case PD_K_GATHER:
        case PD_K_SCATTER:
        case PD_K_ALLTOALL:
            return cma && pd_rules_cma(r, kind, len) ? PD_ALGO_CMA
                                                     : PD_ALGO_SHM;
        default:
            return PD_ALGO_SHM; /* barrier */
        }
    }
    switch (kind) {
    case PD_K_ALLREDUCE:
    case PD_K_REDUCE:
    case PD_K_REDUCE_SCATTER: {
        /* reduced in the accumulation dtype (halves widened to float32) */
        size_t bytes = count * pd_dtype_size(pd_dtype_accum(dtype));
        return bytes <= pd_rules_small(r, kind) || count < (size_t)size ||
                       size == 1
                   ? PD_ALGO_DIRECT
                   : PD_ALGO_RING;
    }
    case PD_K_BROADCAST:
        if (size == 1) {
            return PD_ALGO_NONE;
        }
        return count * pd_dtype_size(dtype) <= pd_rules_small(r, kind)
                   ? PD_ALGO_FLAT
                   : PD_ALGO_CHAIN;
    case PD_K_ALLGATHER:
        if (size == 1) {
            return PD_ALGO_NONE;
        }
        /* the whole output, as the rings' crossover was measured */
        return count * pd_dtype_size(dtype) * (size_t)size <=
                       pd_rules_small(r, kind)
                   ? PD_ALGO_DIRECT
                   : PD_ALGO_RING;
    case PD_K_ALLTOALL:
        return PD_ALGO_PAIRWISE;
    case PD_K_MONITORED_BARRIER:
        return PD_ALGO_STAR;
    case PD_K_GATHER:
    case PD_K_SCATTER:
    case PD_K_BARRIER:
        return PD_ALGO_DIRECT;
    default:
        return PD_ALGO_NONE;
    }
}

pd_status
pd_coll_run(pd_coll *c, const pd_op *op)
{
    size_t esz = pd_dtype_size(op->dtype);
    c->algo = pd_coll_choose(c->rules, op->kind, op->dtype, op->count,
                             c->size, 0, 0, 0);
    switch (op->kind) {
    case PD_K_ALLREDUCE:
    case PD_K_REDUCE:
    case PD_K_REDUCE_SCATTER:
        return run_reduction(c, op);
    case PD_K_BROADCAST: {
        size_t len = op->count * esz;
        if (c->algo == PD_ALGO_NONE) {
            return PD_OK;
        }
        return c->algo == PD_ALGO_FLAT
                   ? pd_broadcast_flat(c, op->out[0], len)
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
            pd_move(op->out[c->rank], op->in[0], len);
        }
        pd_status st = PD_OK;
        if (c->algo != PD_ALGO_NONE) {
            st = c->algo == PD_ALGO_DIRECT
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
            c, c->timeout, op->wait_all);
    default:
        return pd_error(PD_EINVAL, "unknown collective kind %d", op->kind);
    }
}

pd_status
pd_coll_run_shm(pd_coll *c, const pd_op *op)
{
    size_t esz = pd_dtype_size(op->dtype);
    size_t len = op->count * esz;
    /* single copies by cross-memory attach from the rules' threshold
     * (coll/rules.c; per rank's block; all_to_all decides after its first
     * sync) */
    c->algo = op->kind == PD_K_ALLTOALL
                  ? PD_ALGO_SHM /* coll/alltoall_shm.c settles it */
                  : pd_coll_choose(c->rules, op->kind, op->dtype, op->count,
                                   c->size, 1, pd_cma_possible(c),
                                   c->inshm != NULL);
    int cma = c->algo == PD_ALGO_CMA;
    switch (op->kind) {
    case PD_K_ALLREDUCE: {
        if (c->algo == PD_ALGO_SHM_INPLACE) {
            /* the input lives in the group's shared memory: no copy-in */
            return op->out[0] == op->in[0]
                       ? pd_allreduce_shm_inplace(c, c->inshm, op->count)
                       : pd_allreduce_shm_into(c, c->inshm, op->out[0],
                                               op->count);
        }
        return cma ? pd_allreduce_cma(c, op->in[0], op->out[0], op->count)
                   : pd_allreduce_shm(c, op->in[0], op->out[0], op->count);
    }
    case PD_K_REDUCE:
        return cma ? pd_reduce_cma(c, op->in[0], op->out[0], op->count)
                   : pd_reduce_shm(c, op->in[0], op->out[0], op->count);
    case PD_K_REDUCE_SCATTER:
        return cma ? pd_reduce_scatter_cma(c, op->in, op->out[0], op->count)
                   : pd_reduce_scatter_shm(c, op->in, op->out[0], op->count);
    case PD_K_BROADCAST:
        return cma ? pd_broadcast_cma(c, op->out[0], len)
                   : pd_broadcast_shm(c, op->out[0], len);
    case PD_K_ALLGATHER:
        return cma ? pd_allgather_cma(c, op->in[0], op->out, len)
                   : pd_allgather_shm(c, op->in[0], op->out, len);
    case PD_K_GATHER:
        return cma ? pd_gather_cma(c, op->in[0], len, op->out)
                   : pd_gather_shm(c, op->in[0], len, op->out);
    case PD_K_SCATTER:
        return cma ? pd_scatter_cma(c, op->in, op->out[0], len)
                   : pd_scatter_shm(c, op->in, op->out[0], len);
    case PD_K_ALLTOALL:
        return pd_alltoall_shm(c, op->in, op->in_len, op->out, op->out_len);
    case PD_K_BARRIER:
        return pd_barrier_shm(c);
    default:
        return pd_error(PD_EINVAL, "unknown collective kind %d", op->kind);
    }
}
