/* Reduce-scatter for small messages: block p of every rank goes straight to
 * rank p, which reduces the contributions in rank order. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_reduce_scatter_direct(pd_coll *c, char **in, char *out, size_t count)
{
    int n = c->size, r = c->rank;
    size_t bytes = count * c->esz;
    pd_status st = PD_OK;
    char *tmp = malloc(bytes * (size_t)n + 1);
    char **blocks = malloc(sizeof(char *) * (size_t)n);
    pd_req *reqs = calloc(2 * (size_t)n, sizeof(pd_req));
    size_t nr = 0;
    if (tmp == NULL || blocks == NULL || reqs == NULL) {
        st = pd_error(PD_ENOMEM, "reduce_scatter: out of memory");
        goto exit;
    }
    for (int p = 0; p < n; p++) {
        blocks[p] = tmp + bytes * (size_t)p;
    }
    memcpy(tmp + bytes * (size_t)r, in[r], bytes);
    for (int k = 1; k < n; k++) {
        int p = (r + k) % n;
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], p, 0, blocks[p], bytes), st,
                      exit);
    }
    for (int k = 1; k < n; k++) {
        int p = (r + k) % n;
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], p, 0, in[p], bytes), st,
                      exit);
    }
    PD_CHECK_GOTO(pd_coll_wait(c, reqs, nr), st, exit);
    pd_coll_reduce_blocks(c, out, blocks, count);
    pd_coll_finish(c, out, count);
exit:
    free(tmp);
    free(blocks);
    free(reqs);
    return st;
}
