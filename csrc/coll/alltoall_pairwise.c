/* All-to-all: block p goes to rank p; all transfers are posted at once and
 * progress together.  Per-pair sizes may differ (all_to_all_single with
 * split sizes); each frame's size is checked by its receiver. */
#include "coll.h"

pd_status
pd_alltoall_pairwise(pd_coll *c, char **in, const size_t *in_len, char **out,
                     const size_t *out_len)
{
    int r = c->rank;
    if (out_len[r] != in_len[r]) {
        return pd_error(PD_EINVAL,
                        "all_to_all: rank %d sends %zu bytes to itself but "
                        "expects %zu", r, in_len[r], out_len[r]);
    }
    pd_peer_bufs send = {.at = in, .len = in_len};
    pd_peer_bufs recv = {.at = out, .len = out_len};
    return pd_coll_exchange(c, &send, &recv);
}
