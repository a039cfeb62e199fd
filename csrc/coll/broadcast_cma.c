/* Broadcast with one copy: the root publishes its buffer's address and every
 * other rank its own; each of the n-1 others reads the head of the message
 * straight from the root's buffer into its own (cross-memory attach) while
 * the root writes the tail, 1/n of the message, into each of them, so the
 * root's core copies too instead of waiting.  One sync then releases every
 * buffer.  Measured on 2 ranks (2-core EPYC, float32): 1 MiB 83 -> 44 us,
 * 4 MiB 246 -> 121 us, 16 MiB 1.14 -> 0.60 ms, 64 MiB 5.2 -> 3.9 ms against
 * the readers alone. */
#include "coll.h"

pd_status
pd_broadcast_cma(pd_coll *c, char *buf, size_t len)
{
    int root = c->id.root, n = c->size, b;
    char *one[1] = {buf};
    pd_cma_pub pub = {.out = one};
    /* the root's share of each reader's message: whole pages, from the end */
    size_t tail = (len / (size_t)n) & ~(size_t)4095;
    size_t head = len - tail;
    PD_CHECK(pd_cma_begin(c, &pub, &b));
    if (c->rank != root) {
        uint64_t src = pd_cma_table(c, root, b)[PD_CMA_OUT(n, 0)];
        PD_CHECK(pd_cma_read(c->shm, root, buf, src, head, c->op->name));
    } else if (tail > 0) {
        for (int p = 0; p < n; p++) {
            if (p != root) {
                uint64_t dst = pd_cma_table(c, p, b)[PD_CMA_OUT(n, 0)];
                PD_CHECK(pd_cma_write(c->shm, p, dst + head, buf + head, tail,
                                      c->op->name));
            }
        }
    }
    return pd_cma_end(c);
}
