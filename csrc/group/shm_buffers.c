/* Arrays in the group's shared memory (pd_group_shm_alloc): every rank
 * allocates one that every other rank maps, so all_reduce on them needs no
 * copy-in (DDP's buckets). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------- shared-memory buffers */

shm_buf *
pd_grp_find_shm_buf(pd_group *g, const char *p, size_t len)
{
    for (shm_buf *b = g->bufs; b != NULL; b = b->next) {
        if (p >= b->own && p + len <= b->own + b->len && len > 0) {
            return b;
        }
    }
    return NULL;
}

/* The group maps the peers' buffers; its own belongs to the caller. */
void
pd_grp_free_shm_buf(shm_buf *b, int size)
{
    for (int p = 0; p < size && b->peer != NULL; p++) {
        if (b->peer[p] != NULL && b->peer[p] != b->own) {
            munmap(b->peer[p], b->len);
        }
    }
    free(b->peer);
    free(b);
}

/* Take the right to run collectives on this thread, once the group is idle
 * (pending work finished). */
pd_status
pd_grp_acquire_idle(pd_group *g, const char *what)
{
    for (;;) {
        if (atomic_load(&g->stopping)) {
            return pd_error(PD_ECLOSED, "%s: the process group has been "
                            "destroyed", what);
        }
        pthread_mutex_lock(&g->mu);
        int ok = g->qh == NULL && !g->running;
        if (ok) {
            g->running = 1;
            g->caller = 1;
        }
        pthread_mutex_unlock(&g->mu);
        if (ok) {
            return PD_OK;
        }
        if (atomic_load(&g->stopping)) {
            return pd_error(PD_ECLOSED, "%s: the process group has been "
                            "destroyed", what);
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

void
pd_grp_release_idle(pd_group *g)
{
    pthread_mutex_lock(&g->mu);
    g->running = 0;
    g->caller = 0;
    int wake = g->qh != NULL;
    pthread_mutex_unlock(&g->mu);
    if (wake) {
        g->t->ops->wake(g->t);
    }
}

static void
buf_name(char *buf, size_t len, uint64_t token, int rank, uint64_t id)
{
    snprintf(buf, len, "/pyddp.%016llx.%d.b%llu", (unsigned long long)token,
             rank, (unsigned long long)id);
}

/* One phase of the allocation: publish ok, sync, learn whether every rank
 * succeeded (*all_ok).  Consumes a sequence number. */
static pd_status
alloc_phase(pd_group *g, size_t len, int ok, int *all_ok)
{
    pd_shm_ident id;
    memset(&id, 0, sizeof(id));
    id.seq = ++g->seq;
    id.kind = PD_K_SHM_ALLOC;
    id.count = len;
    id.phase = g->rank == 0 ? (uint8_t)g->verdict : 0; /* carried on */
    run_ctx x = {g, 0, 0.0, NULL, NULL, 0, 0};
    pd_shm_waiter w = {pd_now() + g->timeout, pd_grp_shm_check, NULL, &x, 0};
    /* after an eager collective (a broadcast root that did not wait for
     * every rank): let everyone enter it first, as every collective does,
     * so the identity read below is of this allocation, not of a lagging
     * rank's earlier collective with the same sequence parity */
    pd_status st = pd_shm_entry(g->shm, &w, pd_kind_name);
    if (st == PD_OK) {
        pd_shm_enter(g->shm, &id, (uint64_t)ok);
        st = pd_shm_sync(g->shm, &w);
    }
    if (st == PD_OK) {
        st = pd_shm_check_ident(g->shm, &id, pd_kind_name);
    }
    if (st != PD_OK) {
        char msg[PD_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "_shared_array: %s", pd_errmsg());
        pd_grp_record_fatal(g, st, msg);
        g->t->ops->wake(g->t);
        return pd_error(st, "%s", msg);
    }
    *all_ok = 1;
    for (int p = 0; p < g->size; p++) {
        if (pd_shm_value(g->shm, p, id.seq) == 0) {
            *all_ok = 0;
        }
    }
    return PD_OK;
}

pd_status
pd_group_shm_alloc(pd_group *g, size_t len, void **out, size_t *maplen)
{
    if (g->shm == NULL) {
        return pd_error(PD_EINVAL,
                        "shared-memory buffers need a group whose ranks are "
                        "all on this host (and PYDDP_TRANSPORT not tcp); "
                        "this group uses %s", pd_group_transport(g));
    }
    if (len == 0) {
        len = 1;
    }
    len = (len + 4095) & ~(size_t)4095;
    PD_CHECK(pd_grp_acquire_idle(g, "_shared_array"));
    pd_status st = PD_OK;
    char why[PD_ERRMSG_MAX] = "";
    uint64_t bid = ++g->nbufs;
    char name[96];
    shm_buf *b = calloc(1, sizeof(*b));
    char **peer = calloc((size_t)g->size, sizeof(char *));
    int fd = -1, linked = 0, ok = b != NULL && peer != NULL, all_ok = 0;
    if (!ok) {
        snprintf(why, sizeof(why), "out of memory");
    }
    buf_name(name, sizeof(name), g->token, g->rank, bid);
    if (ok) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        ok = fd >= 0;
        linked = ok;
        int e;
        if (ok && (e = posix_fallocate(fd, 0, (off_t)len)) != 0) {
            errno = e;
            ok = 0;
        }
        if (ok) {
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                           0);
            ok = p != MAP_FAILED;
            peer[g->rank] = ok ? p : NULL;
        }
        if (!ok) {
            snprintf(why, sizeof(why), "%s of %zu bytes: %s", name, len,
                     strerror(errno));
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    PD_CHECK_GOTO(alloc_phase(g, len, ok, &all_ok), st, fail);
    if (!all_ok) {
        st = pd_error(PD_ESYS,
                      "_shared_array: a rank could not allocate %zu bytes of "
                      "shared memory (is /dev/shm large enough?)%s%s", len,
                      why[0] ? "; here: " : "", why);
        goto fail;
    }
    for (int p = 0; p < g->size && ok; p++) {
        if (p == g->rank) {
            continue;
        }
        char pn[96];
        buf_name(pn, sizeof(pn), g->token, p, bid);
        int pfd = shm_open(pn, O_RDWR, 0600);
        if (pfd < 0) {
            snprintf(why, sizeof(why), "shm_open(%s): %s", pn,
                     strerror(errno));
            ok = 0;
            break;
        }
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (m == MAP_FAILED) {
            snprintf(why, sizeof(why), "mmap(%s): %s", pn, strerror(errno));
            ok = 0;
            break;
        }
        peer[p] = m;
    }
    PD_CHECK_GOTO(alloc_phase(g, len, ok, &all_ok), st, fail);
    shm_unlink(name);
    linked = 0;
    if (!all_ok) {
        st = pd_error(PD_ESYS,
                      "_shared_array: a rank could not map the others' "
                      "shared memory%s%s", why[0] ? "; here: " : "", why);
        goto fail;
    }
    b->own = peer[g->rank];
    b->len = len;
    b->id = bid;
    b->peer = peer;
    b->next = g->bufs;
    g->bufs = b;
    pd_grp_release_idle(g);
    *out = b->own;
    *maplen = len;
    return PD_OK;
fail:
    if (linked) {
        shm_unlink(name);
    }
    if (peer != NULL && peer[g->rank] != NULL) {
        munmap(peer[g->rank], len);
        peer[g->rank] = NULL;
    }
    if (b != NULL) {
        b->peer = peer;
        b->len = len;
        pd_grp_free_shm_buf(b, g->size);
    }
    else {
        free(peer);
    }
    pd_grp_release_idle(g);
    return st;
}

void
pd_group_shm_forget(pd_group *g, void *own)
{
    if (pd_grp_acquire_idle(g, "_shared_array") != PD_OK) {
        return;
    }
    for (shm_buf **pp = &g->bufs; *pp != NULL; pp = &(*pp)->next) {
        shm_buf *b = *pp;
        if (b->own == own) {
            *pp = b->next;
            pd_grp_free_shm_buf(b, g->size);
            break;
        }
    }
    pd_grp_release_idle(g);
}
