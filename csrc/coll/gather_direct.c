/* Gather: every rank sends its block to the root. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_gather_direct(pd_coll *c, const char *in, size_t len, char **out)
{
    int n = c->size, r = c->rank, root = c->base.root;
    pd_status st = PD_OK;
    pd_req *reqs = calloc((size_t)n + 2, sizeof(pd_req));
    size_t nr = 2;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "gather: out of memory");
    }
    PD_CHECK_GOTO(pd_coll_ring_check(c, reqs), st, exit);
    if (r == root) {
        for (int p = 0; p < n; p++) {
            if (p == r) {
                if (out[p] != in) {
                    memmove(out[p], in, len);
                }
            }
            else {
                PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], p, 0, out[p], len),
                              st, exit);
            }
        }
    }
    else {
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], root, 0, in, len), st,
                      exit);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}
