/* Ring reduce-scatter and ring allgather over per-rank segments, pipelined
 * in chunks: each received chunk is reduced (or stored) and forwarded to the
 * right neighbour while the following chunks are still in flight.
 * Bandwidth-optimal: each rank sends and receives (n-1)/n of the data per
 * phase (gloo's allreduce_ring.h, NCCL's ring). */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

static size_t
nchunks_of(size_t len)
{
    return len == 0 ? 1 : (len + PD_CHUNK_BYTES - 1) / PD_CHUNK_BYTES;
}

static size_t
max_nchunks(const size_t *seglen, int n)
{
    size_t m = 1;
    for (int i = 0; i < n; i++) {
        size_t k = nchunks_of(seglen[i]);
        if (k > m) {
            m = k;
        }
    }
    return m;
}

static void
chunk_range(size_t len, size_t k, size_t *off, size_t *clen)
{
    *off = k * PD_CHUNK_BYTES;
    *clen = len - *off < PD_CHUNK_BYTES ? len - *off : PD_CHUNK_BYTES;
    if (len == 0) {
        *off = 0;
        *clen = 0;
    }
}

static int
phys(int logical, int rot, int n)
{
    return ((logical + rot) % n + n) % n;
}

pd_status
pd_ring_reduce_scatter(pd_coll *c, char **seg, const size_t *seglen, int rot,
                       int step0, char *const *in, char *final)
{
    int n = c->size, r = c->rank;
    int right = (r + 1) % n, left = (r + n - 1) % n;
    size_t mk = max_nchunks(seglen, n), maxlen = 0;
    pd_status st = PD_OK;
    for (int i = 0; i < n; i++) {
        maxlen = seglen[i] > maxlen ? seglen[i] : maxlen;
    }
    /* Sends of all steps stay posted until the end: n-1 steps of mk chunks.
     * Receives go through a small window of chunk buffers that stays in
     * cache, so the reduction reads what the kernel just wrote.  With a
     * read-only input, partial sums alternate between two scratch
     * segments (a step's sends read one while the next step fills the
     * other). */
    pd_req *sreq = calloc((size_t)(n - 1) * mk, sizeof(pd_req));
    size_t *sidx = calloc((size_t)(n - 1) * mk, sizeof(size_t));
    pd_req *rreq = calloc(PD_RING_WINDOW, sizeof(pd_req));
    char *tmp = malloc(PD_CHUNK_BYTES * PD_RING_WINDOW);
    char *scratch = NULL;
    size_t nsent = 0;
    if (in != NULL && n > 2) {
        scratch = malloc(2 * maxlen + 1);
    }
    if (sreq == NULL || sidx == NULL || rreq == NULL || tmp == NULL ||
        (in != NULL && n > 2 && scratch == NULL)) {
        st = pd_error(PD_ENOMEM, "ring reduce-scatter: out of memory");
        goto exit;
    }
    {
        int s = phys(r, rot, n);
        const char *src = in != NULL ? in[s] : seg[s];
        size_t k = nchunks_of(seglen[s]);
        for (size_t j = 0; j < k; j++) {
            size_t off, cl;
            chunk_range(seglen[s], j, &off, &cl);
            PD_CHECK_GOTO(pd_coll_send(c, &sreq[nsent++], right,
                                       PD_TAG(step0, (int)j), src + off, cl),
                          st, exit);
        }
    }
    for (int t = 0; t < n - 1; t++) {
        int s = phys(r - t - 1, rot, n);
        int last = t == n - 2;
        size_t k = nchunks_of(seglen[s]);
        size_t posted = 0;
        for (size_t j = 0; j < k; j++) {
            size_t off, cl;
            while (posted < k && posted < j + PD_RING_WINDOW) {
                size_t w = posted % PD_RING_WINDOW;
                chunk_range(seglen[s], posted, &off, &cl);
                PD_CHECK_GOTO(pd_coll_recv(c, &rreq[w], left,
                                           PD_TAG(step0 + t, (int)posted),
                                           tmp + w * PD_CHUNK_BYTES, cl),
                              st, exit);
                posted++;
            }
            size_t w = j % PD_RING_WINDOW;
            chunk_range(seglen[s], j, &off, &cl);
            PD_CHECK_GOTO(pd_coll_wait_one(c, &rreq[w]), st, exit);
            char *dst;
            if (in == NULL) {
                dst = seg[s] + off;
                pd_reduce(c->rdt, (pd_redop)c->base.op, dst,
                          tmp + w * PD_CHUNK_BYTES, cl / c->esz);
            }
            else {
                dst = last ? final + off : scratch + (size_t)(t % 2) * maxlen + off;
                if (!last && t >= 2) {
                    /* the send of step t-1 read this scratch chunk */
                    PD_CHECK_GOTO(pd_coll_wait_one(
                                      c, &sreq[sidx[(size_t)(t - 2) * mk + j]]),
                                  st, exit);
                }
                pd_reduce3(c->rdt, (pd_redop)c->base.op, dst, in[s] + off,
                           tmp + w * PD_CHUNK_BYTES, cl / c->esz);
            }
            if (!last) {
                sidx[(size_t)t * mk + j] = nsent;
                PD_CHECK_GOTO(pd_coll_send(c, &sreq[nsent++], right,
                                           PD_TAG(step0 + t + 1, (int)j), dst,
                                           cl),
                              st, exit);
            }
            else {
                pd_coll_finish(c, dst, cl / c->esz);
            }
        }
    }
    st = pd_coll_wait(c, sreq, nsent);
exit:
    free(sreq);
    free(sidx);
    free(rreq);
    free(tmp);
    free(scratch);
    return st;
}

pd_status
pd_ring_allgather(pd_coll *c, char **seg, const size_t *seglen, int rot,
                  int step0)
{
    int n = c->size, r = c->rank;
    int right = (r + 1) % n, left = (r + n - 1) % n;
    size_t mk = max_nchunks(seglen, n);
    pd_status st = PD_OK;
    pd_req *sreq = calloc((size_t)(n - 1) * mk, sizeof(pd_req));
    pd_req *rreq = calloc(mk, sizeof(pd_req));
    size_t nsent = 0;
    if (sreq == NULL || rreq == NULL) {
        st = pd_error(PD_ENOMEM, "ring allgather: out of memory");
        goto exit;
    }
    {
        int s = phys(r + 1, rot, n);
        size_t k = nchunks_of(seglen[s]);
        for (size_t j = 0; j < k; j++) {
            size_t off, cl;
            chunk_range(seglen[s], j, &off, &cl);
            PD_CHECK_GOTO(pd_coll_send(c, &sreq[nsent++], right,
                                       PD_TAG(step0, (int)j), seg[s] + off,
                                       cl),
                          st, exit);
        }
    }
    for (int t = 0; t < n - 1; t++) {
        int s = phys(r - t, rot, n);
        size_t k = nchunks_of(seglen[s]);
        for (size_t j = 0; j < k; j++) {
            size_t off, cl;
            chunk_range(seglen[s], j, &off, &cl);
            PD_CHECK_GOTO(pd_coll_recv(c, &rreq[j], left,
                                       PD_TAG(step0 + t, (int)j),
                                       seg[s] + off, cl),
                          st, exit);
        }
        for (size_t j = 0; j < k; j++) {
            size_t off, cl;
            chunk_range(seglen[s], j, &off, &cl);
            PD_CHECK_GOTO(pd_coll_wait_one(c, &rreq[j]), st, exit);
            if (t < n - 2) {
                PD_CHECK_GOTO(pd_coll_send(c, &sreq[nsent++], right,
                                           PD_TAG(step0 + t + 1, (int)j),
                                           seg[s] + off, cl),
                              st, exit);
            }
        }
    }
    st = pd_coll_wait(c, sreq, nsent);
exit:
    free(sreq);
    free(rreq);
    return st;
}
