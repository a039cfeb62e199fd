/* Reduce-scatter for large messages: ring reduce-scatter over a scratch copy
 * of the input blocks (inputs are never modified), arranged so that rank r
 * ends up owning block r. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_reduce_scatter_ring(pd_coll *c, char **in, char *out, size_t count)
{
    int n = c->size, r = c->rank;
    size_t bytes = count * c->esz;
    pd_status st = PD_OK;
    char *work = malloc(bytes * (size_t)n + 1);
    char **seg = malloc(sizeof(char *) * (size_t)n);
    size_t *len = malloc(sizeof(size_t) * (size_t)n);
    if (work == NULL || seg == NULL || len == NULL) {
        st = pd_error(PD_ENOMEM, "reduce_scatter: out of memory");
        goto exit;
    }
    for (int p = 0; p < n; p++) {
        seg[p] = work + bytes * (size_t)p;
        len[p] = bytes;
        memcpy(seg[p], in[p], bytes);
    }
    PD_CHECK_GOTO(pd_ring_reduce_scatter(c, seg, len, n - 1, 0), st, exit);
    memcpy(out, seg[r], bytes);
exit:
    free(work);
    free(seg);
    free(len);
    return st;
}
