/* Allreduce and reduce with one copy each way.  Rank r owns slice r of the
 * array: chunk by chunk it reads slice r of every other rank's input into
 * its cache (cross-memory attach), reduces it with its own, and writes the
 * result straight into every rank's output (allreduce) or the root's
 * (reduce).  Only rank r reads or writes slice r anywhere, and it reads a
 * chunk before writing it, so in-place calls are safe.  The result is the
 * same on every rank (one rank reduces each element).  One sync after the
 * addresses are published, one before the buffers are released. */
#include "coll.h"

static pd_status
run(pd_coll *c, const char *in, char *out, size_t count, int root)
{
    int n = c->size, r = c->rank, b;
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    char *ins[1] = {(char *)in};
    char *outs[1] = {out};
    int has_out = root < 0 || r == root;
    pd_cma_pub pub = {.in = ins, .out = has_out ? outs : NULL};
    PD_CHECK(pd_cma_begin(c, &pub, &b));
    size_t off[PD_SHM_STACK_RANKS + 1];
    size_t *split = n <= PD_SHM_STACK_RANKS
                        ? off
                        : malloc(sizeof(size_t) * ((size_t)n + 1));
    uint64_t fstack[PD_SHM_STACK_RANKS], tstack[PD_SHM_STACK_RANKS];
    uint64_t *from = pd_cma_addrs(c, fstack), *to = pd_cma_addrs(c, tstack);
    pd_status st = PD_OK;
    if (split == NULL || from == NULL || to == NULL) {
        st = pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
        goto out;
    }
    pd_coll_split(count, n, split);
    size_t lo = split[r] * esz;
    for (int p = 0; p < n; p++) {
        uint64_t *t = pd_cma_table(c, p, b);
        from[p] = t[PD_CMA_IN(n, 0)] + lo;
        to[p] = p != r && (root < 0 || p == root) ? t[PD_CMA_OUT(n, 0)] + lo
                                                   : 0;
    }
    pd_cma_red x = {in + lo, from, has_out ? out + lo : NULL, to};
    PD_CHECK_GOTO(pd_cma_reduce(c, &x, split[r + 1] - split[r]), st, out);
    st = pd_cma_end(c);
out:
    if (split != off) {
        free(split);
    }
    if (from != NULL) {
        pd_cma_addrs_free(from, fstack);
    }
    if (to != NULL) {
        pd_cma_addrs_free(to, tstack);
    }
    return st;
}

pd_status
pd_allreduce_cma(pd_coll *c, const char *in, char *out, size_t count)
{
    return run(c, in, out, count, -1);
}

pd_status
pd_reduce_cma(pd_coll *c, const char *in, char *out, size_t count)
{
    return run(c, in, out, count, c->id.root);
}
