/* Allgather through shared memory: every rank copies a bank-sized piece of
 * its block into its bank, one sync, every rank copies the others' pieces
 * out while filling its other bank with the next piece. */
#include <string.h>

#include "coll.h"

pd_status
pd_allgather_shm(pd_coll *c, const char *in, char **out, size_t len)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank;
    size_t per = pd_shm_bank_size(s);
    size_t done = 0;
    size_t m = len < per ? len : per;
    int stream = len * (size_t)n >= pd_shm_stream_bytes();
    int b = pd_shm_copyin_bank(c);
    if (!c->resume) {
        memcpy(pd_shm_bank(s, r, b), in, m);
    }
    PD_CHECK(pd_shm_first_sync(c));
    for (;;) {
        size_t m2 = len - done - m < per ? len - done - m : per;
        for (int i = 1; i < n; i++) {
            int p = (r + i) % n;
            pd_copy_out(out[p] + done, pd_shm_bank(s, p, b), m, stream);
        }
        done += m;
        if (m2 == 0) {
            break;
        }
        b = pd_shm_next_bank(s);
        memcpy(pd_shm_bank(s, r, b), in + done, m2);
        PD_CHECK(pd_shm_next_sync(c));
        m = m2;
    }
    if (out[r] != in) {
        if (stream && (out[r] + len <= in || in + len <= out[r])) {
            pd_copy_out(out[r], in, len, 1);
        }
        else {
            memmove(out[r], in, len);
        }
    }
    return PD_OK;
}
