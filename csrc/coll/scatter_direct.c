/* Scatter: the root sends block p to rank p. */
#include "coll.h"

pd_status
pd_scatter_direct(pd_coll *c, char **in, char *out, size_t len)
{
    return pd_coll_rooted(c, 0, in, out, len);
}
