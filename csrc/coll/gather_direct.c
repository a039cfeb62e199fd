/* Gather: every rank sends its block to the root. */
#include "coll.h"

pd_status
pd_gather_direct(pd_coll *c, const char *in, size_t len, char **out)
{
    return pd_coll_rooted(c, 1, out, (char *)in, len);
}
