/* Broadcast for small messages: the root sends to every rank directly. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_broadcast_flat(pd_coll *c, char *buf, size_t len)
{
    int n = c->size, r = c->rank, root = c->base.root;
    pd_status st = PD_OK;
    pd_req *reqs = calloc((size_t)n + 2, sizeof(pd_req));
    size_t nr = 2;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "broadcast: out of memory");
    }
    PD_CHECK_GOTO(pd_coll_ring_check(c, reqs), st, exit);
    if (r == root) {
        for (int k = 1; k < n; k++) {
            PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], (r + k) % n, 0, buf,
                                       len),
                          st, exit);
        }
    }
    else {
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], root, 0, buf, len), st,
                      exit);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}
