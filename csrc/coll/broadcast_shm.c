/* Broadcast through shared memory: the root copies a bank-sized chunk into
 * its bank, one sync, the others copy it out while the root fills its other
 * bank with the next chunk. */
#include "coll.h"

typedef struct bcast {
    char *buf; /* first: pd_shm_fill_bytes */
    int stream;
} bcast;

static void
leaf_drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    bcast *x = ctx;
    pd_copy_out(x->buf + done, pd_shm_bank(c->shm, c->id.root, b), m,
                x->stream);
}

static const pd_shm_round_ops root_ops = {.fill = pd_shm_fill_bytes};
static const pd_shm_round_ops leaf_ops = {.drain = leaf_drain};

pd_status
pd_broadcast_shm(pd_coll *c, char *buf, size_t len)
{
    int r = c->rank, root = c->id.root;
    size_t per = pd_shm_bank_size(c->shm);
    bcast x = {buf, len >= pd_shm_stream_bytes()};
    /* one round: the others wait for the root alone, the root only for the
     * first other rank to arrive (to see one that called something else) */
    if (r == root) {
        return pd_shm_rounds(c, &root_ops, &x, len, per,
                             len > per ? -1 : pd_shm_publisher_src(c), 0);
    }
    return pd_shm_rounds(c, &leaf_ops, &x, len, per, len > per ? -1 : root,
                         len <= per);
}
