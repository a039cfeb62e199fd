/* Helpers shared by the collective algorithms. */
#include "coll.h"

#include <string.h>


static void
fill_hdr(pd_coll *c, pd_req *r, int peer, int tag, const void *buf,
         size_t len)
{
    r->peer = peer;
    r->buf = (char *)buf;
    r->len = len;
    r->next = NULL;
    r->state = PD_REQ_POSTED;
    r->off = 0;
    (void)c;
    (void)tag;
}

pd_status
pd_coll_send(pd_coll *c, pd_req *r, int peer, int tag, const void *buf,
             size_t len)
{
    fill_hdr(c, r, peer, tag, buf, len);
    r->hdr = c->base;
    r->hdr.tag = tag;
    return c->t->ops->post_send(c->t, r);
}

pd_status
pd_coll_recv(pd_coll *c, pd_req *r, int peer, int tag, void *buf, size_t len)
{
    fill_hdr(c, r, peer, tag, buf, len);
    r->expect = c->base;
    r->expect.tag = tag;
    return c->t->ops->post_recv(c->t, r);
}

pd_status
pd_coll_wait(pd_coll *c, pd_req *reqs, size_t n)
{
    size_t i = 0;
    for (;;) {
        while (i < n && reqs[i].state == PD_REQ_DONE) {
            i++;
        }
        if (i == n) {
            return PD_OK;
        }
        pd_status st = c->progress(c->progress_ctx, c->deadline);
        if (st == PD_ETIMEOUT) {
            c->waited_for = reqs[i].peer;
            return pd_error(st,
                            "rank %d: %s (sequence number %llu) timed out "
                            "waiting for rank %d",
                            c->rank, c->op->name,
                            (unsigned long long)c->base.seq, reqs[i].peer);
        }
        if (st != PD_OK) {
            return st;
        }
    }
}

pd_status
pd_coll_wait_one(pd_coll *c, pd_req *r)
{
    return pd_coll_wait(c, r, 1);
}

static int
receives_data(const pd_coll *c, int rank, int root_receives)
{
    return root_receives ? rank == c->base.root : rank != c->base.root;
}

pd_status
pd_coll_ring_check(pd_coll *c, pd_req reqs[2], int root_receives)
{
    int right = (c->rank + 1) % c->size;
    int left = (c->rank + c->size - 1) % c->size;
    reqs[0].state = PD_REQ_DONE;
    reqs[1].state = PD_REQ_DONE;
    if (c->size == 1) {
        return PD_OK;
    }
    if (!receives_data(c, right, root_receives)) {
        PD_CHECK(pd_coll_send(c, &reqs[0], right, PD_TAG_CHECK, NULL, 0));
    }
    if (!receives_data(c, c->rank, root_receives)) {
        PD_CHECK(pd_coll_recv(c, &reqs[1], left, PD_TAG_CHECK, NULL, 0));
    }
    return PD_OK;
}

void
pd_coll_reduce_blocks(pd_coll *c, char *out, char **blocks, size_t count)
{
    if (c->size == 1) {
        if (out != blocks[0]) {
            pd_move(out, blocks[0], count * c->esz);
        }
        return;
    }
    pd_reduce3(c->rdt, (pd_redop)c->base.op, out, blocks[0], blocks[1], count);
    for (int p = 2; p < c->size; p++) {
        pd_reduce(c->rdt, (pd_redop)c->base.op, out, blocks[p], count);
    }
}

void
pd_coll_finish(pd_coll *c, char *buf, size_t count)
{
    if (c->base.op == PD_AVG) {
        pd_reduce_avg_finish(c->rdt, buf, count, c->size);
    }
}

void
pd_coll_split(size_t count, int size, size_t *off)
{
    size_t q = count / (size_t)size, rem = count % (size_t)size;
    off[0] = 0;
    for (int i = 0; i < size; i++) {
        off[i + 1] = off[i] + q + ((size_t)i < rem ? 1 : 0);
    }
}
