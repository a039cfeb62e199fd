/* Reduce-scatter for small messages: block p of every rank goes straight to
 * rank p, which reduces the contributions in rank order. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_reduce_scatter_direct(pd_coll *c, char **in, char *out, size_t count)
{
    size_t bytes = count * c->esz;
    char **blocks = pd_coll_scratch_blocks(c, bytes);
    if (blocks == NULL) {
        return PD_ENOMEM;
    }
    pd_peer_bufs send = {.at = in, .each = bytes};
    pd_peer_bufs recv = {.at = blocks, .each = bytes};
    pd_status st = pd_coll_exchange(c, &send, &recv);
    if (st == PD_OK) {
        pd_coll_reduce_blocks(c, out, blocks, count);
        pd_coll_finish(c, out, count);
    }
    free(blocks);
    return st;
}
