/* Allgather for large messages: ring, each block forwarded around once,
 * received straight into its place in the output. */
#include "coll.h"

pd_status
pd_allgather_ring(pd_coll *c, char **blocks, const size_t *len)
{
    /* Rank r starts with its own block r = logical r+1 with rot = -1. */
    return pd_ring_allgather(c, blocks, len, c->size - 1, 0);
}
