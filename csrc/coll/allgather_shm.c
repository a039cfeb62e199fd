/* Allgather through shared memory: every rank copies a bank-sized piece of
 * its block into its bank, one sync, every rank copies the others' pieces
 * out while filling its other bank with the next piece. */
#include <string.h>

#include "coll.h"

typedef struct allgather {
    char *in; /* first: pd_shm_fill_bytes */
    char **out;
    int stream;
} allgather;

static void
drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    allgather *x = ctx;
    int n = c->size, r = c->rank;
    for (int i = 1; i < n; i++) {
        int p = (r + i) % n;
        pd_copy_out(x->out[p] + done, pd_shm_bank(c->shm, p, b), m,
                    x->stream);
    }
}

static const pd_shm_round_ops ops = {.fill = pd_shm_fill_bytes,
                                     .drain = drain};

pd_status
pd_allgather_shm(pd_coll *c, const char *in, char **out, size_t len)
{
    int r = c->rank;
    allgather x = {(char *)in, out,
                   pd_shm_stream_set(c, len, len * (size_t)c->size)};
    PD_CHECK(pd_shm_rounds(c, &ops, &x, len, pd_shm_bank_size(c->shm), -1,
                           0));
    pd_move_out(out[r], in, len, x.stream);
    return PD_OK;
}
