/* Broadcast through shared memory: the root copies a bank-sized chunk into
 * its bank, one sync, the others copy it out while the root fills its other
 * bank with the next chunk. */
#include <string.h>

#include "coll.h"

pd_status
pd_broadcast_shm(pd_coll *c, char *buf, size_t len)
{
    pd_shm *s = c->shm;
    int r = c->rank, root = c->id.root;
    size_t per = pd_shm_bank_size(s);
    size_t done = 0;
    size_t m = len < per ? len : per;
    int stream = len >= pd_shm_stream_bytes();
    int b = pd_shm_copyin_bank(c);
    if (!c->resume && r == root) {
        memcpy(pd_shm_bank(s, root, b), buf, m);
    }
    /* one round: the others wait for the root alone, the root only for the
     * first other rank to arrive (to see one that called something else) */
    PD_CHECK(pd_shm_first_sync_from(
        c, len > per ? -1 : r == root ? pd_shm_publisher_src(c) : root,
        len <= per && r != root));
    for (;;) {
        size_t m2 = len - done - m < per ? len - done - m : per;
        int b2 = m2 ? pd_shm_next_bank(s) : b;
        if (r == root) {
            if (m2) {
                memcpy(pd_shm_bank(s, root, b2), buf + done + m, m2);
            }
        }
        else {
            pd_copy_out(buf + done, pd_shm_bank(s, root, b), m, stream);
        }
        done += m;
        if (m2 == 0) {
            return PD_OK;
        }
        PD_CHECK(pd_shm_next_sync(c));
        b = b2;
        m = m2;
    }
}
