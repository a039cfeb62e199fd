/* All-to-all through shared memory.  A rank's bank holds one region per
 * destination: a 64-byte header with the whole block's size (checked by
 * the receiver against what it expects) and a piece of the block.  Every
 * rank publishes its largest block with its identity, so all ranks agree on
 * the number of rounds.
 *
 * From pd_cma_threshold() bytes (the longest block of any rank, known after
 * the first sync) the header also carries the block's address and the
 * receivers read the blocks straight from the senders' buffers by
 * cross-memory attach (one copy instead of two); a rank that knows before
 * the first sync (its own longest block is that long) copies no piece into
 * its bank. */
#include <stdint.h>
#include <string.h>

#include "coll.h"

#define REGION_HDR 64

typedef struct alltoall {
    char **in;
    const size_t *in_len;
    char **out;
    const size_t *out_len;
    size_t pe; /* bytes of a region's piece */
    int cma;   /* single copies (decided in start) */
    int skip;  /* the first fill copies no piece: cma is certain */
    int stream; /* outputs far larger than the caches: write around them */
} alltoall;

/* Region of rank to's block in rank from's bank b. */
static char *
region(pd_coll *c, const alltoall *x, int from, int b, int to)
{
    return pd_shm_bank(c->shm, from, b) + (size_t)to * (x->pe + REGION_HDR);
}

/* [done, done + pe) of every block, clipped to its size; the first round
 * writes the headers. */
static void
fill(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    alltoall *x = ctx;
    (void)m;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) {
            continue;
        }
        char *reg = region(c, x, c->rank, b, p);
        if (done == 0) {
            uint64_t total = x->in_len[p];
            uint64_t addr = (uint64_t)(uintptr_t)x->in[p];
            memcpy(reg, &total, sizeof(total));
            memcpy(reg + sizeof(total), &addr, sizeof(addr));
        }
        if (done < x->in_len[p] && !x->skip) {
            size_t k = x->in_len[p] - done < x->pe ? x->in_len[p] - done
                                                    : x->pe;
            pd_copy(reg + REGION_HDR, x->in[p] + done, k);
        }
    }
}

/* The rounds run for the largest block of any rank; every block sent here
 * must have the size expected. */
static pd_status
start(pd_coll *c, void *ctx, int b, size_t *len)
{
    alltoall *x = ctx;
    int r = c->rank;
    size_t longest = 0;
    for (int p = 0; p < c->size; p++) {
        uint64_t v = pd_shm_value(c->shm, p, c->id.seq);
        if (v > longest) {
            longest = v;
        }
        if (p == r) {
            continue;
        }
        uint64_t total;
        memcpy(&total, region(c, x, p, b, r), sizeof(total));
        if (total != x->out_len[p]) {
            return pd_error(PD_EMISMATCH,
                            "all_to_all size mismatch: rank %d sends %llu "
                            "bytes to rank %d, which expects %zu bytes",
                            p, (unsigned long long)total, r, x->out_len[p]);
        }
    }
    *len = longest;
    if (pd_cma_use(c, longest)) {
        x->cma = 1;
        c->algo = PD_ALGO_CMA; /* settled only now: the record says so */
        *len = 0; /* no rounds */
        for (int i = 1; i < c->size; i++) {
            int p = (r + i) % c->size;
            uint64_t addr;
            memcpy(&addr, region(c, x, p, b, r) + sizeof(uint64_t),
                   sizeof(addr));
            PD_CHECK(pd_cma_read(c->shm, p, x->out[p], addr, x->out_len[p],
                                 c->op->name));
        }
    }
    return PD_OK;
}

static void
drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    alltoall *x = ctx;
    int n = c->size, r = c->rank;
    (void)m;
    if (x->cma) {
        return;
    }
    for (int i = 1; i < n; i++) {
        int p = (r + i) % n;
        if (done < x->out_len[p]) {
            size_t k = x->out_len[p] - done < x->pe ? x->out_len[p] - done
                                                     : x->pe;
            pd_copy_out(x->out[p] + done, region(c, x, p, b, r) + REGION_HDR,
                        k, x->stream);
        }
    }
}

static const pd_shm_round_ops ops = {.fill = fill, .start = start,
                                     .drain = drain};

pd_status
pd_alltoall_shm(pd_coll *c, char **in, const size_t *in_len, char **out,
                const size_t *out_len)
{
    int r = c->rank;
    size_t pe = (pd_shm_bank_size(c->shm) / (size_t)c->size - REGION_HDR) &
                ~(size_t)63;
    size_t mine = 0;
    for (int p = 0; p < c->size; p++) {
        mine = in_len[p] > mine ? in_len[p] : mine;
    }
    size_t whole = 0, sent = 0;
    for (int p = 0; p < c->size; p++) {
        whole += out_len[p];
        sent += in_len[p];
    }
    alltoall x = {in, in_len, out, out_len, pe, 0, pd_cma_use(c, mine),
                  pd_shm_stream_set(c, sent, whole)};
    /* the length is the longest block, known after the first sync */
    PD_CHECK(pd_shm_rounds(c, &ops, &x, 0, pe, -1, 0));
    if (in_len[r] != out_len[r]) {
        return pd_error(PD_EINVAL,
                        "all_to_all: rank %d sends itself %zu bytes but "
                        "expects %zu", r, in_len[r], out_len[r]);
    }
    pd_move_out(out[r], in[r], in_len[r], x.stream);
    return x.cma ? pd_cma_end(c) : PD_OK;
}
