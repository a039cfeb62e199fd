/* Allreduce and reduce with one copy each way.  Rank r owns slice r of the
 * array: chunk by chunk it reads slice r of every other rank's input into
 * its cache (cross-memory attach), reduces it with its own, and writes the
 * result straight into every rank's output (allreduce) or the root's
 * (reduce).  Only rank r reads or writes slice r anywhere, and it reads a
 * chunk before writing it, so in-place calls are safe.  The result is the
 * same on every rank (one rank reduces each element).  One sync after the
 * addresses are published, one before the buffers are released.
 *
 * Reduce: a rank other than the root also writes its slice's result into
 * the root, a copy between processes that costs about three local copies
 * (process_vm_readv of 1 MiB: 90 us against memcpy's 26 on a 2-core EPYC),
 * so the root takes a larger slice: per byte of its slice a rank reads n-1
 * pieces (3 units each) and reduces them (1), and the others write the
 * result too (3): the slices are sized inversely to those costs, which
 * evens out the cores' work (2 ranks: the root's slice is 7/11 of the
 * array instead of 1/2).  Measured on 2 ranks (2-core EPYC, float32, A/B
 * in the same processes): 64 KiB 10.4 -> 8.9 us, 1 MiB 103-119 -> 84-88,
 * 4 MiB 364-438 -> 274-294, 16 MiB 1.52-1.79 -> 1.45-1.47 ms.  Where ranks
 * share cores (4 ranks on 2) it gained nothing (0.97-1.06x): even slices.
 *
 * Up to ROOT_ALONE bytes the root reduces the whole array alone: one read
 * per other rank, and the others only publish their inputs and wait, where
 * a slice of their own would cost them a read and a write (two system
 * calls and their page pinning, about 1.5 us each) for a few microseconds
 * of copying. */
#include "coll.h"

/* Reduce: the root alone up to this many bytes.  Measured (2-core EPYC,
 * float32, the three ways alternating in the same processes, median us,
 * split / root alone): 2 ranks 8 KiB 5.4 / 3.8, 16 KiB 5.8 / 4.5, 32 KiB
 * 6.9 / 5.9, 64 KiB 9.0 / 8.8, 128 KiB 13.1 / 15.2; 4 ranks on 2 cores
 * 8 KiB 26.3 / 18.4, 64 KiB 37.8 / 34.9, 128 KiB 50.3 / 55.8. */
#define ROOT_ALONE ((size_t)64 << 10)

/* Costs per byte of a slice, in local copies: a copy between processes, a
 * reduction of the pieces. */
#define CROSS_COST 3
#define REDUCE_COST 1

/* off[0..n]: the slices of count elements, rank order; the root's weighted
 * against the others' as above (every rank computes the same). */
static void
reduce_split(size_t count, int n, int root, size_t *off)
{
    size_t w_root = (size_t)n * CROSS_COST + REDUCE_COST;        /* 1/others' cost */
    size_t w_other = (size_t)(n - 1) * CROSS_COST + REDUCE_COST; /* 1/root's cost */
    size_t total = w_root + (size_t)(n - 1) * w_other;
    size_t mine = count / total * w_root + count % total * w_root / total;
    size_t rest = count - mine;
    size_t q = rest / (size_t)(n - 1), rem = rest % (size_t)(n - 1);
    off[0] = 0;
    for (int p = 0, k = 0; p < n; p++) {
        size_t sz = mine;
        if (p != root) {
            sz = q + ((size_t)k < rem ? 1 : 0);
            k++;
        }
        off[p + 1] = off[p] + sz;
    }
}

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
    if (root >= 0 && n > 1 && count * esz <= ROOT_ALONE) {
        for (int p = 0; p <= n; p++) {
            split[p] = p <= root ? 0 : count; /* [0, count) for the root */
        }
    }
    else if (root >= 0 && n > 1 && pd_shm_spins(c->shm)) {
        reduce_split(count, n, root, split);
    }
    else {
        pd_coll_split(count, n, split);
    }
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
