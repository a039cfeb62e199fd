/* All-to-all: block p goes to rank p; all transfers are posted at once and
 * progress together.  Per-pair sizes may differ (all_to_all_single with
 * split sizes); each frame's size is checked by its receiver. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_alltoall_pairwise(pd_coll *c, char **in, const size_t *in_len, char **out,
                     const size_t *out_len)
{
    int n = c->size, r = c->rank;
    pd_status st = PD_OK;
    pd_req *reqs = calloc(2 * (size_t)n, sizeof(pd_req));
    size_t nr = 0;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "all_to_all: out of memory");
    }
    for (int k = 1; k < n; k++) {
        int p = (r + n - k) % n;
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], p, 0, out[p], out_len[p]),
                      st, exit);
    }
    for (int k = 1; k < n; k++) {
        int p = (r + k) % n;
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], p, 0, in[p], in_len[p]), st,
                      exit);
    }
    if (out_len[r] != in_len[r]) {
        st = pd_error(PD_EINVAL,
                      "all_to_all: rank %d sends %zu bytes to itself but "
                      "expects %zu", r, in_len[r], out_len[r]);
        goto exit;
    }
    if (out[r] != in[r]) {
        memmove(out[r], in[r], in_len[r]);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}
