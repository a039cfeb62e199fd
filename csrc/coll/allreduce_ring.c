/* Allreduce for large messages: ring reduce-scatter, then ring allgather
 * (bandwidth-optimal: 2(n-1)/n of the buffer per rank in each direction). */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_allreduce_ring(pd_coll *c, char *buf, size_t count)
{
    int n = c->size;
    pd_status st = PD_OK;
    size_t *off = malloc(sizeof(size_t) * (size_t)(n + 1));
    size_t *len = malloc(sizeof(size_t) * (size_t)n);
    char **seg = malloc(sizeof(char *) * (size_t)n);
    if (off == NULL || len == NULL || seg == NULL) {
        st = pd_error(PD_ENOMEM, "all_reduce: out of memory");
        goto exit;
    }
    pd_coll_split(count, n, off);
    for (int p = 0; p < n; p++) {
        seg[p] = buf + off[p] * c->esz;
        len[p] = (off[p + 1] - off[p]) * c->esz;
    }
    PD_CHECK_GOTO(pd_ring_reduce_scatter(c, seg, len, 0, 0, NULL, NULL), st, exit);
    st = pd_ring_allgather(c, seg, len, 0, n);
exit:
    free(off);
    free(len);
    free(seg);
    return st;
}
