/* monitored_barrier: rank 0 waits for every other rank with its own timeout
 * and, when some do not arrive, names them (all of them with wait_all_ranks,
 * else the first), like torch's monitored_barrier; then releases everyone. */
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"

pd_status
pd_monitored_barrier_star(pd_coll *c, double timeout_s, int wait_all)
{
    int n = c->size, r = c->rank;
    pd_status st = PD_OK;
    pd_req *reqs = calloc(2 * (size_t)n, sizeof(pd_req));
    if (reqs == NULL) {
        return pd_error(PD_ENOMEM, "monitored_barrier: out of memory");
    }
    c->deadline = pd_now() + timeout_s;
    if (r != 0) {
        /* Give rank 0 time to report which ranks are missing: its message
         * names them, ours could only say that rank 0 did not answer. */
        c->deadline += timeout_s < 2.0 ? timeout_s : 2.0;
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[0], 0, 0, NULL, 0), st, exit);
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[1], 0, 1, NULL, 0), st, exit);
        st = pd_coll_wait(c, reqs, 2);
        goto exit;
    }
    for (int p = 1; p < n; p++) {
        PD_CHECK_GOTO(pd_coll_recv(c, &reqs[p], p, 0, NULL, 0), st, exit);
    }
    st = pd_coll_wait(c, reqs + 1, (size_t)(n - 1));
    if (st == PD_ETIMEOUT) {
        char list[512] = "";
        size_t off = 0;
        for (int p = 1; p < n; p++) {
            if (reqs[p].state != PD_REQ_DONE) {
                int k = snprintf(list + off, sizeof(list) - off, "%s%d",
                                 off ? ", " : "", p);
                if (k < 0 || (size_t)k >= sizeof(list) - off) {
                    break;
                }
                off += (size_t)k;
                if (!wait_all) {
                    break;
                }
            }
        }
        st = pd_error(PD_ETIMEOUT,
                      "monitored_barrier: rank%s %s failed to pass "
                      "monitoredBarrier in %.0f ms (sequence number %llu)",
                      wait_all ? "s" : "", list, timeout_s * 1000.0,
                      (unsigned long long)c->base.seq);
        goto exit;
    }
    if (st != PD_OK) {
        goto exit;
    }
    for (int p = 1; p < n; p++) {
        PD_CHECK_GOTO(pd_coll_send(c, &reqs[n + p - 1], p, 1, NULL, 0), st,
                      exit);
    }
    st = pd_coll_wait(c, reqs + n, (size_t)(n - 1));
exit:
    free(reqs);
    return st;
}
