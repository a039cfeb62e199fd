/* Reduce for small messages: every rank sends to the root, which reduces
 * all contributions in rank order.  Non-root buffers are not modified. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_reduce_direct(pd_coll *c, const char *in, char *out, size_t count)
{
    int root = c->rank == c->base.root;
    char **blocks = NULL;
    if (root && (blocks = pd_coll_scratch_blocks(c, count * c->esz)) == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = pd_coll_rooted(c, 1, blocks, (char *)in, count * c->esz);
    if (st == PD_OK && root) {
        pd_coll_reduce_blocks(c, out, blocks, count);
        pd_coll_finish(c, out, count);
    }
    free(blocks);
    return st;
}
