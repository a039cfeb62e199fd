/* Reduce for small messages: every rank sends to the root, which reduces
 * all contributions in rank order.  Non-root buffers are not modified. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_reduce_direct(pd_coll *c, const char *in, char *out, size_t count)
{
    int n = c->size, r = c->rank, root = c->base.root;
    size_t bytes = count * c->esz;
    pd_status st = PD_OK;
    pd_req *reqs = calloc((size_t)n + 2, sizeof(pd_req));
    char *tmp = NULL;
    char **blocks = NULL;
    size_t nr = 0;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "reduce: out of memory");
    }
    if (r != root) {
        PD_CHECK_GOTO(pd_coll_ring_check(c, reqs), st, exit);
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[2], root, 0, in, bytes), st, exit);
        st = pd_coll_wait(c, reqs, 3);
        goto exit;
    }
    tmp = malloc(bytes * (size_t)n + 1);
    blocks = malloc(sizeof(char *) * (size_t)n);
    if (tmp == NULL || blocks == NULL) {
        st = pd_error(PD_ENOMEM, "reduce: out of memory");
        goto exit;
    }
    PD_CHECK_GOTO(pd_coll_ring_check(c, reqs), st, exit);
    nr = 2;
    for (int p = 0; p < n; p++) {
        blocks[p] = tmp + bytes * (size_t)p;
        if (p == r) {
            memcpy(blocks[p], in, bytes);
        }
        else {
            PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], p, 0, blocks[p], bytes),
                          st, exit);
        }
    }
    PD_CHECK_GOTO(pd_coll_wait(c, reqs, nr), st, exit);
    pd_coll_reduce_blocks(c, out, blocks, count);
    pd_coll_finish(c, out, count);
exit:
    free(reqs);
    free(tmp);
    free(blocks);
    return st;
}
