/* The two one-round shapes of the direct algorithms
 * (coll/<collective>_direct.c, broadcast_flat.c, alltoall_pairwise.c):
 * every rank with every other, and the root with every other rank.  All
 * transfers are posted at once (the transport queues them per peer, so the
 * order of posting changes no peer's frames), then the rank's own block is
 * copied while they progress, then the wait. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

static char *
block_at(const pd_peer_bufs *b, int p)
{
    return b->at != NULL ? b->at[p] : b->one;
}

static size_t
block_len(const pd_peer_bufs *b, int p)
{
    return b->len != NULL ? b->len[p] : b->each;
}

static void
copy_own(char *dst, const char *src, size_t len)
{
    if (dst != src) {
        pd_move(dst, src, len);
    }
}

/* A frame of the call (tag 0) to or from peer. */
static pd_status
post(pd_coll *c, pd_req *r, int peer, int receive, char *buf, size_t len)
{
    return receive ? pd_coll_recv(c, r, peer, 0, buf, len)
                   : pd_coll_send(c, r, peer, 0, buf, len);
}

pd_status
pd_coll_exchange(pd_coll *c, const pd_peer_bufs *send,
                 const pd_peer_bufs *recv)
{
    int n = c->size, r = c->rank;
    pd_status st = PD_OK;
    pd_req *reqs = calloc(2 * (size_t)n, sizeof(pd_req));
    size_t nr = 0;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
    }
    /* the receives first, then the sends */
    const pd_peer_bufs *side[2] = {send, recv};
    for (int receive = 1; receive >= 0; receive--) {
        for (int k = 1; k < n; k++) {
            int p = (r + k) % n;
            PD_CHECK_GOTO(post(c, &reqs[nr++], p, receive,
                               block_at(side[receive], p),
                               block_len(side[receive], p)),
                          st, exit);
        }
    }
    copy_own(block_at(recv, r), block_at(send, r), block_len(recv, r));
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}

pd_status
pd_coll_rooted(pd_coll *c, int to_root, char **blocks, char *mine,
               size_t len)
{
    int n = c->size, r = c->rank, root = c->base.root;
    pd_status st = PD_OK;
    /* the ring check's two, then one per peer (the root) or one */
    pd_req *reqs = calloc((size_t)n + 2, sizeof(pd_req));
    size_t nr = 2;
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
    }
    PD_CHECK_GOTO(pd_coll_ring_check(c, reqs, to_root), st, exit);
    if (r != root) {
        PD_CHECK_GOTO(post(c, &reqs[nr++], root, !to_root, mine, len), st,
                      exit);
    }
    else {
        for (int k = 1; k < n; k++) {
            int p = (r + k) % n;
            char *peer = blocks != NULL ? blocks[p] : mine;
            PD_CHECK_GOTO(post(c, &reqs[nr++], p, to_root, peer, len), st,
                          exit);
        }
        if (blocks != NULL) {
            if (to_root) {
                copy_own(blocks[r], mine, len);
            }
            else {
                copy_own(mine, blocks[r], len);
            }
        }
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(reqs);
    return st;
}

char **
pd_coll_scratch_blocks(pd_coll *c, size_t bytes)
{
    int n = c->size;
    /* the blocks start on a cache line past the pointers */
    size_t head = (sizeof(char *) * (size_t)n + 63) & ~(size_t)63;
    char **blocks = malloc(head + bytes * (size_t)n + 1);
    if (blocks == NULL) {
        pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
        return NULL;
    }
    for (int p = 0; p < n; p++) {
        blocks[p] = (char *)blocks + head + bytes * (size_t)p;
    }
    return blocks;
}
