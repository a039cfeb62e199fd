/* Gather and scatter through shared memory, in bank-sized rounds with one
 * sync each. */
#include <string.h>

#include "coll.h"

typedef struct rooted {
    char *mine;          /* in (gather: pd_shm_fill_bytes) or out (scatter) */
    char *const *blocks; /* the root's: out (gather) or in (scatter) */
    size_t pe;           /* scatter: bytes of one region of the root's bank */
} rooted;

static void
gather_drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rooted *x = ctx;
    for (int p = 0; p < c->size; p++) {
        if (p != c->rank) {
            pd_copy(x->blocks[p] + done, pd_shm_bank(c->shm, p, b), m);
        }
    }
}

static const pd_shm_round_ops gather_root = {.drain = gather_drain};
static const pd_shm_round_ops gather_leaf = {.fill = pd_shm_fill_bytes};

pd_status
pd_gather_shm(pd_coll *c, const char *in, size_t len, char **out)
{
    int r = c->rank, root = c->id.root;
    size_t per = pd_shm_bank_size(c->shm);
    rooted x = {(char *)in, out, 0};
    if (r != root) {
        /* one round: a leaf waits only for the first other rank to arrive */
        return pd_shm_rounds(c, &gather_leaf, &x, len, per,
                             len > per ? -1 : PD_SHM_ANY, 0);
    }
    PD_CHECK(pd_shm_rounds(c, &gather_root, &x, len, per, -1, 0));
    if (out[r] != in) {
        pd_move(out[r], in, len);
    }
    return PD_OK;
}

/* The root's bank holds one region per other rank (none for itself):
 * rank p's is the (p - root - 1) mod n-th. */
static size_t
scatter_region(const pd_coll *c, int p)
{
    return (size_t)((p - c->id.root - 1 + c->size) % c->size);
}

static void
scatter_fill(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rooted *x = ctx;
    char *bank = pd_shm_bank(c->shm, c->rank, b);
    for (int p = 0; p < c->size; p++) {
        if (p != c->rank) {
            pd_copy(bank + scatter_region(c, p) * x->pe, x->blocks[p] + done,
                    m);
        }
    }
}

static void
scatter_drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rooted *x = ctx;
    pd_copy(x->mine + done,
            pd_shm_bank(c->shm, c->id.root, b) +
                scatter_region(c, c->rank) * x->pe,
            m);
}

static const pd_shm_round_ops scatter_root = {.fill = scatter_fill};
static const pd_shm_round_ops scatter_leaf = {.drain = scatter_drain};

pd_status
pd_scatter_shm(pd_coll *c, char **in, char *out, size_t len)
{
    int r = c->rank, root = c->id.root;
    size_t others = c->size > 1 ? (size_t)c->size - 1 : 1;
    size_t pe = (pd_shm_bank_size(c->shm) / others) & ~(size_t)63;
    rooted x = {out, in, pe};
    /* one round: the others wait for the root alone, the root only for the
     * first other rank to arrive */
    if (r != root) {
        return pd_shm_rounds(c, &scatter_leaf, &x, len, pe,
                             len > pe ? -1 : root, len <= pe);
    }
    PD_CHECK(pd_shm_rounds(c, &scatter_root, &x, len, pe,
                           len > pe ? -1 : pd_shm_publisher_src(c), 0));
    if (in[r] != out) {
        pd_move(out, in[r], len);
    }
    return PD_OK;
}
