/* Gather and scatter through shared memory, in bank-sized rounds with one
 * sync each. */
#include <string.h>

#include "coll.h"

pd_status
pd_gather_shm(pd_coll *c, const char *in, size_t len, char **out)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank, root = c->id.root;
    size_t per = pd_shm_bank_size(s);
    size_t done = 0;
    size_t m = len < per ? len : per;
    int b = pd_shm_copyin_bank(c);
    if (!c->resume && r != root) {
        memcpy(pd_shm_bank(s, r, b), in, m);
    }
    /* one round: a leaf waits only for the first other rank to arrive */
    PD_CHECK(pd_shm_first_sync_from(
        c, len > per || r == root ? -1 : PD_SHM_ANY, 0));
    for (;;) {
        size_t m2 = len - done - m < per ? len - done - m : per;
        int b2 = m2 ? pd_shm_next_bank(s) : b;
        if (r == root) {
            for (int p = 0; p < n; p++) {
                if (p != r) {
                    memcpy(out[p] + done, pd_shm_bank(s, p, b), m);
                }
            }
        }
        else if (m2) {
            memcpy(pd_shm_bank(s, r, b2), in + done + m, m2);
        }
        done += m;
        if (m2 == 0) {
            break;
        }
        PD_CHECK(pd_shm_next_sync(c));
        b = b2;
        m = m2;
    }
    if (r == root && out[r] != in) {
        memmove(out[r], in, len);
    }
    return PD_OK;
}

pd_status
pd_scatter_shm(pd_coll *c, char **in, char *out, size_t len)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank, root = c->id.root;
    size_t pe = (pd_shm_bank_size(s) / (size_t)n) & ~(size_t)63;
    size_t done = 0;
    size_t m = len < pe ? len : pe;
    int b = pd_shm_copyin_bank(c);
    if (!c->resume && r == root) {
        for (int p = 0; p < n; p++) {
            if (p != r) {
                memcpy(pd_shm_bank(s, r, b) + (size_t)p * pe, in[p], m);
            }
        }
    }
    /* one round: the others wait for the root alone, the root only for the
     * first other rank to arrive */
    PD_CHECK(pd_shm_first_sync_from(
        c, len > pe ? -1 : r == root ? pd_shm_publisher_src(c) : root,
        len <= pe && r != root));
    for (;;) {
        size_t m2 = len - done - m < pe ? len - done - m : pe;
        int b2 = m2 ? pd_shm_next_bank(s) : b;
        if (r == root) {
            for (int p = 0; p < n && m2; p++) {
                if (p != r) {
                    memcpy(pd_shm_bank(s, r, b2) + (size_t)p * pe,
                           in[p] + done + m, m2);
                }
            }
        }
        else {
            memcpy(out + done, pd_shm_bank(s, root, b) + (size_t)r * pe, m);
        }
        done += m;
        if (m2 == 0) {
            break;
        }
        PD_CHECK(pd_shm_next_sync(c));
        b = b2;
        m = m2;
    }
    if (r == root && in[r] != out) {
        memmove(out, in[r], len);
    }
    return PD_OK;
}
