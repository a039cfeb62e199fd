/* Reduce through shared memory: the allreduce's rounds (allreduce_shm.c)
 * with only the root copying the reduced slices out; in one round (small
 * messages) the root reduces every bank and a leaf waits only for the first
 * other rank to arrive. */
#include "coll.h"

pd_status
pd_reduce_shm(pd_coll *c, const char *in, char *out, size_t count)
{
    return pd_shm_reduce_rounds(c, in, out, count, c->id.root);
}
