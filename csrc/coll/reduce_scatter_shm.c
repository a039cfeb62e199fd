/* Reduce-scatter through shared memory: per round every rank copies a piece
 * of each of the other ranks' blocks into its bank (one region per
 * destination), one sync, and rank r reduces region r of every bank with its
 * own block straight from its input. */
#include <string.h>

#include "coll.h"

typedef struct reduce_scatter {
    char **in;
    char *out;
    char **src;
    size_t pe;  /* elements of one region */
    size_t esz;
} reduce_scatter;

static void
fill(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    reduce_scatter *x = ctx;
    char *bank = pd_shm_bank(c->shm, c->rank, b);
    for (int p = 0; p < c->size; p++) {
        if (p != c->rank) {
            pd_copy(bank + (size_t)p * x->pe * x->esz, x->in[p] + done * x->esz,
                   m * x->esz);
        }
    }
}

static void
drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    reduce_scatter *x = ctx;
    int n = c->size, r = c->rank;
    x->src[0] = x->in[r] + done * x->esz;
    for (int i = 1; i < n; i++) {
        x->src[i] = pd_shm_bank(c->shm, (r + i) % n, b) +
                    (size_t)r * x->pe * x->esz;
    }
    /* out may alias in[r] (src[0]) only */
    pd_shm_reduce(c, x->out + done * x->esz, x->src, n, m, 1);
}

static const pd_shm_round_ops ops = {.fill = fill, .drain = drain};

pd_status
pd_reduce_scatter_shm(pd_coll *c, char **in, char *out, size_t count)
{
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    size_t pe = (pd_shm_bank_elems(c, esz) / (size_t)c->size) & ~(size_t)15;
    char *stack[PD_SHM_STACK_RANKS];
    reduce_scatter x = {in, out, pd_shm_ptrs(c, stack), pe ? pe : 1, esz};
    if (x.src == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = pd_shm_rounds(c, &ops, &x, count, x.pe, -1, 0);
    pd_shm_ptrs_free(x.src, stack);
    return st;
}
