/* Reduce through shared memory: the allreduce's rounds (allreduce_shm.c)
 * with only the root copying the reduced slices out; in one round (small
 * messages) the root reduces every bank and the leaves wait only for their
 * left neighbour. */
#include "coll.h"

pd_status
pd_reduce_shm(pd_coll *c, const char *in, char *out, size_t count)
{
    return pd_shm_reduce_rounds(c, in, out, count, c->id.root);
}
