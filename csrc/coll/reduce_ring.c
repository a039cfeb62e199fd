/* Reduce for large messages: ring reduce-scatter on a scratch copy (the
 * caller's buffer is left alone on non-root ranks), then every segment
 * owner sends its reduced segment to the root. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_reduce_ring(pd_coll *c, const char *in, char *out, size_t count)
{
    int n = c->size, r = c->rank, root = c->base.root;
    size_t bytes = count * c->esz;
    pd_status st = PD_OK;
    size_t *off = malloc(sizeof(size_t) * (size_t)(n + 1));
    size_t *len = malloc(sizeof(size_t) * (size_t)n);
    char **seg = malloc(sizeof(char *) * (size_t)n);
    pd_req *reqs = calloc((size_t)n + 2, sizeof(pd_req));
    char *work = r == root ? out : malloc(bytes + 1);
    size_t nr = 0;
    if (off == NULL || len == NULL || seg == NULL || reqs == NULL ||
        work == NULL) {
        st = pd_error(PD_ENOMEM, "reduce: out of memory");
        goto exit;
    }
    if (work != in) {
        memcpy(work, in, bytes);
    }
    pd_coll_split(count, n, off);
    for (int p = 0; p < n; p++) {
        seg[p] = work + off[p] * c->esz;
        len[p] = (off[p + 1] - off[p]) * c->esz;
    }
    PD_CHECK_GOTO(pd_ring_reduce_scatter(c, seg, len, 0, 0), st, exit);
    /* rank q owns segment q+1 */
    if (r == root) {
        for (int q = 0; q < n; q++) {
            if (q != r) {
                int s = (q + 1) % n;
                PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], q, PD_TAG(n, 0),
                                           seg[s], len[s]),
                              st, exit);
            }
        }
    }
    else {
        int s = (r + 1) % n;
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], root, PD_TAG(n, 0), seg[s],
                                   len[s]),
                      st, exit);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    free(off);
    free(len);
    free(seg);
    free(reqs);
    if (work != out) {
        free(work);
    }
    return st;
}
