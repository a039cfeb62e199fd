/* Reduce-scatter with one copy: every rank publishes its input blocks'
 * addresses; rank r reads block r of every other rank's input into its
 * cache, chunk by chunk (cross-memory attach), and reduces it with its own
 * block r straight into its output; one sync releases the inputs. */
#include "coll.h"

pd_status
pd_reduce_scatter_cma(pd_coll *c, char **in, char *out, size_t count)
{
    int n = c->size, r = c->rank, b;
    pd_cma_pub pub = {.in = in, .in_each = 1};
    PD_CHECK(pd_cma_begin(c, &pub, &b));
    uint64_t stack[PD_SHM_STACK_RANKS];
    uint64_t *from = pd_cma_addrs(c, stack);
    if (from == NULL) {
        return PD_ENOMEM;
    }
    for (int p = 0; p < n; p++) {
        from[p] = pd_cma_table(c, p, b)[PD_CMA_IN(n, r)];
    }
    pd_cma_red x = {in[r], from, out, NULL};
    pd_status st = pd_cma_reduce(c, &x, count);
    pd_cma_addrs_free(from, stack);
    return st != PD_OK ? st : pd_cma_end(c);
}
