/* Gather and scatter with one copy: the root publishes its blocks'
 * addresses (gather: the senders their inputs' too); every other rank
 * writes its block straight into the root's output (gather) or reads its
 * block straight from the root's input (scatter) by cross-memory attach,
 * all at once; one sync releases every buffer.
 *
 * Gather: the root, after copying its own block, reads the tail of every
 * other rank's block itself, so that its core copies too instead of
 * waiting (see root_tail).  Measured on 2 ranks (2-core EPYC, float32,
 * A/B in the same processes): 256 KiB 27-30 -> 17-21 us, 1 MiB 80-98 ->
 * 55-57, 4 MiB 164-321 -> 181-197; at 16 MiB it lost (1.43-1.91 ->
 * 1.67-2.05 ms), so blocks from 8 MiB are moved by the senders alone, and
 * so are all blocks where ranks share cores (4 ranks on 2: 1 MiB 134 ->
 * 196 us).  Scatter the same way (the root writing the tails into the
 * receivers) lost at 4 MiB (168-200 -> 255-262 us) and gained nothing
 * below: the receivers read their whole blocks. */
#include <string.h>

#include "coll.h"

/* The root's share of each sender's block: whole pages, from the end.
 * With a copy between processes costing R local copies, the root (its own
 * block, then n-1 tails) and every sender (its head) are even at a tail of
 * (R-1)/(R n) of the block.  R is about 3 for blocks under 4 MiB and 2 from
 * there (NumPy puts arrays of 4 MiB and more on huge pages, which
 * process_vm_readv pins faster; measured on the 2-core EPYC: 2 MiB 175 us
 * against memcpy's 50, 8 MiB 710 against 375). */
static size_t
root_tail(const pd_coll *c, size_t len)
{
    if (len >= ((size_t)8 << 20) || !pd_shm_spins(c->shm)) {
        return 0; /* (oversubscribed: the root's core has no time to give) */
    }
    size_t cross = len < ((size_t)4 << 20) ? 3 : 2;
    return (len / (cross * (size_t)c->size) * (cross - 1)) & ~(size_t)4095;
}

pd_status
pd_gather_cma(pd_coll *c, const char *in, size_t len, char **out)
{
    int n = c->size, r = c->rank, root = c->id.root, b;
    char *mine[1] = {(char *)in};
    pd_cma_pub pub = {.in = r != root ? mine : NULL,
                      .out = r == root ? out : NULL, .out_each = 1};
    size_t tail = root_tail(c, len), head = len - tail;
    PD_CHECK(pd_cma_begin(c, &pub, &b));
    if (r != root) {
        PD_CHECK(pd_cma_write(c->shm, root,
                              pd_cma_table(c, root, b)[PD_CMA_OUT(n, r)], in,
                              head, c->op->name));
        return pd_cma_end(c);
    }
    if (out[r] != in) {
        pd_move(out[r], in, len);
    }
    for (int i = 1; tail > 0 && i < n; i++) {
        int p = (r + i) % n;
        PD_CHECK(pd_cma_read(c->shm, p, out[p] + head,
                             pd_cma_table(c, p, b)[PD_CMA_IN(n, 0)] + head,
                             tail, c->op->name));
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
