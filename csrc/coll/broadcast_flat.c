/* Broadcast for small messages: the root sends to every rank directly. */
#include "coll.h"

pd_status
pd_broadcast_flat(pd_coll *c, char *buf, size_t len)
{
    return pd_coll_rooted(c, 0, NULL, buf, len);
}
