/* Broadcast for large messages: a pipelined chain root -> root+1 -> ... in
 * chunks; each rank forwards a chunk as soon as it has it, so the time is
 * about one transfer of the buffer plus (n-2) chunks. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_broadcast_chain(pd_coll *c, char *buf, size_t len)
{
    int n = c->size, r = c->rank, root = c->base.root;
    int v = (r - root + n) % n;
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    /* Chunks let a middle rank forward while it receives, at a cost per
     * frame: about eight chunks keep the chain's fill time small. */
    size_t chunk = n == 2 ? PD_CHUNK_BYTES : len / 8;
    if (chunk < PD_CHUNK_BYTES) {
        chunk = PD_CHUNK_BYTES;
    }
    size_t k = len == 0 ? 1 : (len + chunk - 1) / chunk;
    pd_status st = PD_OK;
    pd_req *sreq = calloc(k + 2, sizeof(pd_req));
    pd_req *rreq = calloc(k, sizeof(pd_req));
    size_t ns = 2;
    if (sreq == NULL || rreq == NULL) {
        st = pd_error(PD_ENOMEM, "broadcast: out of memory");
        goto exit;
    }
    PD_CHECK_GOTO(pd_coll_ring_check(c, sreq, 0), st, exit);
    if (v != 0) {
        for (size_t j = 0; j < k; j++) {
            size_t off = j * chunk;
            size_t cl = len - off < chunk ? len - off : chunk;
            PD_CHECK_GOTO(pd_coll_recv(c, &rreq[j], prev, PD_TAG(0, (int)j),
                                       buf + off, cl),
                          st, exit);
        }
    }
    for (size_t j = 0; j < k; j++) {
        size_t off = j * chunk;
        size_t cl = len - off < chunk ? len - off : chunk;
        if (v != 0) {
            PD_CHECK_GOTO(pd_coll_wait_one(c, &rreq[j]), st, exit);
        }
        if (v != n - 1) {
            PD_CHECK_GOTO(pd_coll_send(c, &sreq[ns++], next, PD_TAG(0, (int)j),
                                       buf + off, cl),
                          st, exit);
        }
    }
    st = pd_coll_wait(c, sreq, ns);
exit:
    free(sreq);
    free(rreq);
    return st;
}
