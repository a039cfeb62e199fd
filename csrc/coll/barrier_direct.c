/* Barrier: an empty message to and from every rank (one round). */
#include "coll.h"

pd_status
pd_barrier_direct(pd_coll *c)
{
    pd_peer_bufs none = {0};
    return pd_coll_exchange(c, &none, &none);
}
