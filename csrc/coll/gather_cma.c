/* Gather and scatter with one copy: the root publishes its blocks'
 * addresses; every other rank writes its block straight into the root's
 * output (gather) or reads its block straight from the root's input
 * (scatter) by cross-memory attach, all at once; one sync releases the
 * root's buffers. */
#include <string.h>

#include "coll.h"

pd_status
pd_gather_cma(pd_coll *c, const char *in, size_t len, char **out)
{
    int n = c->size, r = c->rank, root = c->id.root, b;
    pd_cma_pub pub = {.out = r == root ? out : NULL, .out_each = 1};
    PD_CHECK(pd_cma_begin(c, &pub, &b));
    if (r != root) {
        PD_CHECK(pd_cma_write(c->shm, root,
                              pd_cma_table(c, root, b)[PD_CMA_OUT(n, r)], in,
                              len, c->op->name));
    }
    else if (out[r] != in) {
        pd_move(out[r], in, len);
    }
    return pd_cma_end(c);
}

pd_status
pd_scatter_cma(pd_coll *c, char **in, char *out, size_t len)
{
    int r = c->rank, root = c->id.root, b;
    pd_cma_pub pub = {.in = r == root ? in : NULL, .in_each = 1};
    PD_CHECK(pd_cma_begin(c, &pub, &b));
    if (r != root) {
        PD_CHECK(pd_cma_read(c->shm, root, out,
                             pd_cma_table(c, root, b)[PD_CMA_IN(c->size, r)], len,
                             c->op->name));
    }
    else if (in[r] != out) {
        pd_move(out, in[r], len);
    }
    return pd_cma_end(c);
}
