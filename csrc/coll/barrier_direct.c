/* Barrier: an empty message to and from every rank (one round). */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_barrier_direct(pd_coll *c)
{
    int n = c->size, r = c->rank;
    pd_status st = PD_OK;
    pd_req *reqs = calloc(2 * (size_t)n, sizeof(pd_req));
    size_t nr = 0;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "barrier: out of memory");
    }
    for (int k = 1; k < n; k++) {
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], (r + n - k) % n, 0, NULL, 0),
                      st, exit);
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], (r + k) % n, 0, NULL, 0),
                      st, exit);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}
