/* Allgather for small messages: every rank sends its block to every other
 * rank at once (one round of latency). */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_allgather_direct(pd_coll *c, char **blocks, const size_t *len)
{
    int n = c->size, r = c->rank;
    pd_status st = PD_OK;
    pd_req *reqs = calloc(2 * (size_t)n, sizeof(pd_req));
    size_t nr = 0;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "all_gather: out of memory");
    }
    for (int k = 1; k < n; k++) {
        int p = (r + k) % n;
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], p, 0, blocks[p], len[p]),
                      st, exit);
    }
    for (int k = 1; k < n; k++) {
        int p = (r + k) % n;
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], p, 0, blocks[r], len[r]),
                      st, exit);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}
