/* Allreduce for small messages: every rank sends its whole buffer to every
 * other rank (one round of latency) and reduces all contributions in rank
 * order, so every rank computes bit-identical results.  That is exactly a
 * direct reduce-scatter whose every input block is the whole buffer. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_allreduce_direct(pd_coll *c, char *buf, size_t count)
{
    char **blocks = malloc(sizeof(char *) * (size_t)c->size);
    if (blocks == NULL) {
        return pd_error(PD_ENOMEM, "all_reduce: out of memory");
    }
    for (int p = 0; p < c->size; p++) {
        blocks[p] = buf;
    }
    pd_status st = pd_reduce_scatter_direct(c, blocks, buf, count);
    free(blocks);
    return st;
}
