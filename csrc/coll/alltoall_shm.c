/* All-to-all through shared memory.  A rank's bank holds one region per
 * destination: a 64-byte header with the whole block's size (checked by
 * the receiver against what it expects) and a piece of the block.  Every
 * rank publishes its largest block with its identity, so all ranks agree on
 * the number of rounds. */
#include <stdint.h>
#include <string.h>

#include "coll.h"

#define REGION_HDR 64

static void
fill(pd_shm *s, int r, int b, int n, size_t pe, char **in,
     const size_t *in_len, size_t done, int header)
{
    for (int p = 0; p < n; p++) {
        if (p == r) {
            continue;
        }
        char *reg = pd_shm_bank(s, r, b) + (size_t)p * (pe + REGION_HDR);
        if (header) {
            uint64_t total = in_len[p];
            memcpy(reg, &total, sizeof(total));
        }
        if (done < in_len[p]) {
            size_t m = in_len[p] - done < pe ? in_len[p] - done : pe;
            memcpy(reg + REGION_HDR, in[p] + done, m);
        }
    }
}

pd_status
pd_alltoall_shm(pd_coll *c, char **in, const size_t *in_len, char **out,
                const size_t *out_len)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank;
    size_t pe = (pd_shm_bank_size(s) / (size_t)n - REGION_HDR) &
                ~(size_t)63;
    int b = pd_shm_copyin_bank(c);
    if (!c->resume) {
        fill(s, r, b, n, pe, in, in_len, 0, 1);
    }
    PD_CHECK(pd_shm_first_sync(c));
    size_t longest = 0;
    for (int p = 0; p < n; p++) {
        uint64_t v = pd_shm_value(s, p, c->id.seq);
        if (v > longest) {
            longest = v;
        }
        if (p == r) {
            continue;
        }
        uint64_t total;
        memcpy(&total, pd_shm_bank(s, p, b) + (size_t)r * (pe + REGION_HDR),
               sizeof(total));
        if (total != out_len[p]) {
            return pd_error(PD_EMISMATCH,
                            "all_to_all size mismatch: rank %d sends %llu "
                            "bytes to rank %d, which expects %zu bytes",
                            p, (unsigned long long)total, r, out_len[p]);
        }
    }
    for (size_t done = 0;;) {
        for (int i = 1; i < n; i++) {
            int p = (r + i) % n;
            if (done < out_len[p]) {
                size_t m = out_len[p] - done < pe ? out_len[p] - done : pe;
                memcpy(out[p] + done,
                       pd_shm_bank(s, p, b) + (size_t)r * (pe + REGION_HDR) +
                           REGION_HDR,
                       m);
            }
        }
        done += pe;
        if (done >= longest) {
            break;
        }
        b = pd_shm_next_bank(s);
        fill(s, r, b, n, pe, in, in_len, done, 0);
        PD_CHECK(pd_shm_next_sync(c));
    }
    if (in_len[r] != out_len[r]) {
        return pd_error(PD_EINVAL,
                        "all_to_all: rank %d sends itself %zu bytes but "
                        "expects %zu", r, in_len[r], out_len[r]);
    }
    if (out[r] != in[r]) {
        memmove(out[r], in[r], in_len[r]);
    }
    return PD_OK;
}
