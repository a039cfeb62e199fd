/* Reduce for large messages: ring reduce-scatter from the read-only input
 * (the caller's buffer is left alone on non-root ranks), then every segment
 * owner sends its reduced segment to the root. */
#include <stdlib.h>

#include "coll.h"

pd_status
pd_reduce_ring(pd_coll *c, const char *in, char *out, size_t count)
{
    int n = c->size, r = c->rank, root = c->base.root;
    pd_status st = PD_OK;
    size_t *off = malloc(sizeof(size_t) * (size_t)(n + 1));
    size_t *len = malloc(sizeof(size_t) * (size_t)n);
    char **inseg = malloc(sizeof(char *) * (size_t)n);
    pd_req *reqs = calloc((size_t)n + 2, sizeof(pd_req));
    char *mine = NULL;
    size_t nr = 0;
    if (off == NULL || len == NULL || inseg == NULL || reqs == NULL) {
        st = pd_error(PD_ENOMEM, "reduce: out of memory");
        goto exit;
    }
    pd_coll_split(count, n, off);
    for (int p = 0; p < n; p++) {
        inseg[p] = (char *)in + off[p] * c->esz;
        len[p] = (off[p + 1] - off[p]) * c->esz;
    }
    /* rank q owns segment q+1: the root reduces its own straight into out */
    int s = (r + 1) % n;
    if (r == root) {
        mine = out + off[s] * c->esz;
    }
    else if ((mine = malloc(len[s] + 1)) == NULL) {
        st = pd_error(PD_ENOMEM, "reduce: out of memory");
        goto exit;
    }
    PD_CHECK_GOTO(pd_ring_reduce_scatter(c, NULL, len, 0, 0, inseg, mine), st,
                  exit);
    if (r == root) {
        for (int q = 0; q < n; q++) {
            if (q != r) {
                int qs = (q + 1) % n;
                PD_CHECK_GOTO(pd_coll_recv(c, &reqs[nr++], q, PD_TAG(n, 0),
                                           out + off[qs] * c->esz, len[qs]),
                              st, exit);
            }
        }
    }
    else {
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[nr++], root, PD_TAG(n, 0), mine,
                                   len[s]),
                      st, exit);
    }
    st = pd_coll_wait(c, reqs, nr);
exit:
    if (r != root) {
        free(mine);
    }
    free(off);
    free(len);
    free(inseg);
    free(reqs);
    return st;
}
