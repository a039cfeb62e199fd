/* Allgather for small messages: every rank sends its block to every other
 * rank at once (one round of latency). */
#include "coll.h"

pd_status
pd_allgather_direct(pd_coll *c, char **blocks, const size_t *len)
{
    pd_peer_bufs send = {.one = blocks[c->rank], .each = len[c->rank]};
    pd_peer_bufs recv = {.at = blocks, .len = len};
    return pd_coll_exchange(c, &send, &recv);
}
