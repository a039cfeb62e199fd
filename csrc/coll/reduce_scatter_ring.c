/* Reduce-scatter for large messages: ring reduce-scatter straight from the
 * read-only input blocks (partial sums travel through two scratch
 * segments, never a copy of the input), arranged so that rank r ends up
 * owning block r, written into the output. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_reduce_scatter_ring(pd_coll *c, char **in, char *out, size_t count)
{
    int n = c->size;
    pd_status st = PD_OK;
    size_t *len = malloc(sizeof(size_t) * (size_t)n);
    if (len == NULL) {
        return pd_error(PD_ENOMEM, "reduce_scatter: out of memory");
    }
    for (int p = 0; p < n; p++) {
        len[p] = count * c->esz;
    }
    st = pd_ring_reduce_scatter(c, NULL, len, n - 1, 0, in, out);
    free(len);
    return st;
}
