/* A group's life: creation, connection (the transport, then shared memory
 * among the ranks of each host), and destruction. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../transport/shm/cma.h"
#include "../transport/shm/link_shm.h"
#include "../transport/tcp/tcp.h"
#include "../util/log.h"

/* ------------------------------------------------------------- lifecycle */

pd_status
pd_group_create(int rank, int size, double timeout_s, const char *secret,
                const char *bind_host, pd_group **out, int *port_out)
{
    if (size < 1) {
        return pd_error(PD_EINVAL, "world_size must be >= 1, got %d", size);
    }
    if (rank < 0 || rank >= size) {
        return pd_error(PD_EINVAL,
                        "rank %d is out of range: expected 0 <= rank < %d",
                        rank, size);
    }
    pd_group *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return pd_error(PD_ENOMEM, "process group: out of memory");
    }
    if (pd_fr_init(&g->fr, pd_fr_default_capacity()) != PD_OK) {
        pd_fr_free(&g->fr);
        free(g);
        return pd_error(PD_ENOMEM, "process group: out of memory");
    }
    g->rank = rank;
    g->size = size;
    g->timeout = timeout_s > 0 ? timeout_s : 1800.0;
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->stopping, 0);
    atomic_init(&g->err, PD_OK);
    atomic_init(&g->err_claim, 0);
    pd_transport_events ev = {g, pd_grp_cb_on_abort, pd_grp_cb_current_seq};
    pd_status st = pd_tcp_create(rank, size, secret, bind_host, &ev, &g->t,
                                 port_out);
    if (st != PD_OK) {
        pd_group_destroy(g);
        return st;
    }
    *out = g;
    return PD_OK;
}

/* Every rank's verdict on a step of the shared-memory setup (ok: it went
 * well here), gathered over the transport so that all ranks take the same
 * way: *first_bad is the first rank whose step failed, or -1.  Uses a
 * sequence number like any collective. */
static pd_status
setup_agree(pd_group *g, int ok, int *first_bad)
{
    int n = g->size;
    int32_t *flags = calloc((size_t)n, sizeof(int32_t));
    char **blocks = calloc((size_t)n, sizeof(char *));
    size_t *lens = calloc((size_t)n, sizeof(size_t));
    if (flags == NULL || blocks == NULL || lens == NULL) {
        free(flags);
        free(blocks);
        free(lens);
        return pd_error(PD_ENOMEM, "process group: out of memory");
    }
    for (int p = 0; p < n; p++) {
        blocks[p] = (char *)&flags[p];
        lens[p] = sizeof(int32_t);
    }
    int32_t mine = ok ? 1 : 0;
    char *in = (char *)&mine;
    pd_op op;
    memset(&op, 0, sizeof(op));
    op.kind = PD_K_ALLGATHER;
    op.dtype = PD_INT32;
    op.count = 1;
    op.in = &in;
    op.out = blocks;
    op.in_len = lens;
    op.out_len = lens;
    op.nblocks = n;
    snprintf(op.name, sizeof(op.name), "init_process_group");
    run_ctx x = {g, 1, 0.0, NULL, NULL, 0, 0};
    pd_shm *shm = g->shm;
    g->shm = NULL; /* not usable yet */
    int published = 0;
    pd_status st = pd_grp_run_collective(&x, &op, ++g->seq, 0,
                                         pd_now() + g->timeout, &published);
    g->shm = shm;
    *first_bad = -1;
    for (int p = 0; st == PD_OK && p < n; p++) {
        if (flags[p] != 1) {
            *first_bad = p;
            break;
        }
    }
    free(flags);
    free(blocks);
    free(lens);
    return st;
}

/* Single copies by cross-memory attach (transport/shm/cma.h) when every
 * rank can read every other's memory; else the banks, said once at INFO. */
static pd_status
setup_cma(pd_group *g)
{
    char why[PD_ERRMSG_MAX / 2] = "";
    pd_status st = pd_cma_probe(g->shm);
    if (st != PD_OK) {
        snprintf(why, sizeof(why), "%s", pd_errmsg());
    }
    int bad = -1;
    PD_CHECK(setup_agree(g, st == PD_OK, &bad));
    pd_shm_set_cma(g->shm, bad < 0);
    if (bad < 0) {
        PD_LOG(PD_LOG_INFO, "group", "rank %d: large messages can move "
               "with one copy between the ranks (cross-memory attach)",
               g->rank);
    }
    else if (bad == g->rank) {
        PD_LOG(PD_LOG_INFO, "group", "rank %d: no cross-memory attach (%s): "
               "large messages copy through shared memory", g->rank, why);
    }
    else {
        PD_LOG(PD_LOG_INFO, "group", "rank %d: no cross-memory attach (rank "
               "%d cannot use it): large messages copy through shared memory",
               g->rank, bad);
    }
    return PD_OK;
}

static uint32_t
node_tag(const char *id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)id; *c; c++) {
        h = (h ^ *c) * 16777619u;
    }
    return h;
}

/* Shared memory among the ranks of each host: segments (created, mapped by
 * every local rank between two group-wide agreements, then unlinked),
 * frames between local ranks through rings, and, when every rank is on this
 * host, the shared-memory collectives.  Every rank takes part in the
 * agreements, so a rank whose /dev/shm is full or unwritable makes every
 * rank take the same way: TCP for everything (logged; the reason kept for
 * pd_group_shm_fallback), or, with PYDDP_TRANSPORT=shm (forced), an error on
 * every rank naming it. */
static pd_status
setup_shm(pd_group *g, uint64_t token, int spin, const char *const *id,
          int forced)
{
    int n = g->size, nlocal = 0, mylocal = -1, shared = 0;
    int *local_of = malloc(sizeof(int) * (size_t)n);
    if (local_of == NULL) {
        return pd_error(PD_ENOMEM, "process group: out of memory");
    }
    for (int p = 0; p < n; p++) {
        int same = 0;
        for (int q = 0; q < n; q++) {
            same += q != p && strcmp(id[p], id[q]) == 0;
        }
        shared |= same > 0;
        if (strcmp(id[p], id[g->rank]) == 0) {
            if (p == g->rank) {
                mylocal = nlocal;
            }
            local_of[p] = nlocal++;
        }
        else {
            local_of[p] = -1;
        }
    }
    if (!shared) {
        free(local_of);
        return PD_OK;
    }
    int mine = nlocal >= 2;
    pd_shm *shm = NULL;
    pd_status st = PD_OK, st_net;
    char why[PD_ERRMSG_MAX / 2] = ""; /* this rank's failure */
    int bad = -1;
    if (mine) {
        st = pd_shm_create(mylocal, nlocal, token, node_tag(id[g->rank]), spin,
                           &shm);
        if (st != PD_OK) {
            snprintf(why, sizeof(why), "%s", pd_errmsg());
        }
    }
    st_net = setup_agree(g, st == PD_OK, &bad);
    if (st_net == PD_OK && bad < 0) {
        if (mine) {
            st = pd_shm_attach(shm);
            if (st != PD_OK) {
                snprintf(why, sizeof(why), "%s", pd_errmsg());
            }
        }
        st_net = setup_agree(g, st == PD_OK, &bad);
    }
    if (st_net != PD_OK) {
        snprintf(why, sizeof(why), "%s", pd_errmsg());
    }
    /* every rank has mapped every segment (or gives up): no name stays */
    pd_shm_unlink(shm, st_net != PD_OK || bad >= 0);
    if (st_net == PD_OK && bad < 0 && mine) {
        st_net = pd_shm_use_links(g->t, shm, local_of);
        if (st_net != PD_OK) {
            snprintf(why, sizeof(why), "%s", pd_errmsg());
        }
    }
    free(local_of);
    if (st_net != PD_OK) {
        /* the transport failed (a peer died, a timeout): no agreement */
        pd_shm_close(shm);
        return pd_error(st_net, "setting up shared memory between the ranks: "
                        "%s", why);
    }
    if (bad >= 0) {
        pd_shm_close(shm);
        shm = NULL;
        char cause[PD_ERRMSG_MAX / 2];
        if (bad == g->rank) {
            snprintf(cause, sizeof(cause), "%s", why);
        }
        else {
            snprintf(cause, sizeof(cause), "rank %d's %s says why", bad,
                     forced ? "error" : "warning");
        }
        if (forced) {
            return pd_error(PD_ESYS, "PYDDP_TRANSPORT=shm, but rank %d could "
                            "not set up shared memory: %s (unset "
                            "PYDDP_TRANSPORT to fall back to TCP)", bad,
                            cause);
        }
        snprintf(g->shm_fallback, sizeof(g->shm_fallback),
                 "rank %d could not set up shared memory (%s): collectives "
                 "use TCP", bad, cause);
        PD_LOG(PD_LOG_WARN, "group", "rank %d: %s", g->rank, g->shm_fallback);
    }
    g->lshm = shm;
    if (shm != NULL && nlocal == n) {
        g->shm = shm;
        PD_CHECK(setup_cma(g));
    }
    /* the setup agreements are not the user's collectives: numbering starts
     * over (all their frames have arrived) */
    g->seq = 0;
    pd_hdr none;
    memset(&none, 0, sizeof(none));
    g->t->ops->set_coll(g->t, &none);
    return PD_OK;
}

void
pd_group_cancel_connect(pd_group *g, const char *why)
{
    if (g != NULL && g->t != NULL) {
        pd_tcp_cancel_connect(g->t, why);
    }
}

pd_status
pd_group_connect(pd_group *g, const char *const *hosts, const int *ports,
                 uint64_t token, const char *const *nodes, int transport,
                 int cores)
{
    if (g->size > 1) {
        PD_CHECK(pd_tcp_connect(g->t, hosts, ports, token,
                                pd_now() + g->timeout));
    }
    /* Ranks sharing this host: same node identity (hostname and boot id),
     * else same advertised address. */
    const char *const *id = nodes != NULL ? nodes : hosts;
    int local = 0;
    for (int p = 0; p < g->size; p++) {
        if (strcmp(id[p], id[g->rank]) == 0) {
            local++;
        }
    }
    /* the cores this host's ranks can keep busy at once (the caller knows
     * their CPU sets and the cgroup's CPU limit), else the online CPUs */
    long ncpu = cores > 0 ? cores : sysconf(_SC_NPROCESSORS_ONLN);
    int spin = ncpu > 0 && local <= ncpu;
    /* for the tests: the paths of a host with a core per rank, on a smaller
     * one (slow there, never wrong) */
    const char *test_spin = getenv("PYDDP_TEST_SPIN");
    if (test_spin != NULL && strcmp(test_spin, "1") == 0) {
        spin = 1;
    }
    g->spin_s = spin ? PD_WAIT_SPIN_S : 0.0;
    /* Work on the progress thread is asynchronous: the caller's thread is
     * likely computing meanwhile (DDP's backward pass).  Without a core to
     * spare for each rank's two busy threads, a busy-polling progress thread
     * takes the core from the computation: it sleeps instead.
     * PYDDP_PROGRESS_SPIN=1/0 forces it either way. */
    const char *ps = getenv("PYDDP_PROGRESS_SPIN");
    if (ps != NULL && (ps[0] == '0' || ps[0] == '1') && ps[1] == '\0') {
        g->progress_nospin = ps[0] == '0';
    }
    else {
        g->progress_nospin = !(ncpu > 0 && 2L * local <= ncpu);
    }
    if (transport == PD_TRANSPORT_SHM && local != g->size) {
        return pd_error(PD_EINVAL,
                        "PYDDP_TRANSPORT=shm needs every rank on one host, "
                        "but only %d of %d ranks are on this one", local,
                        g->size);
    }
    if (g->size > 1 && transport != PD_TRANSPORT_TCP) {
        g->token = token;
        PD_CHECK(setup_shm(g, token, spin, id, transport == PD_TRANSPORT_SHM));
    }
    PD_LOG(PD_LOG_INFO, "group",
           "rank %d of %d connected (%d ranks on this host, transport %s, "
           "waiters %s)",
           g->rank, g->size, local, pd_group_transport(g),
           spin ? "spin" : "yield");
    int rc = pthread_create(&g->thr, NULL, pd_grp_progress_main, g);
    if (rc != 0) {
        return pd_error(PD_ESYS, "pthread_create: %s", strerror(rc));
    }
    g->thr_started = 1;
    return PD_OK;
}

const char *
pd_group_shm_fallback(const pd_group *g)
{
    return g->shm_fallback[0] ? g->shm_fallback : NULL;
}

const char *
pd_group_transport(const pd_group *g)
{
    return g->size == 1       ? "local"
           : g->shm != NULL   ? "shm"
           : g->lshm != NULL  ? "shm+tcp"
                              : "tcp";
}

int
pd_grp_path(const pd_group *g)
{
    /* frames over the transport: its links, as pd_group_transport says */
    return g->size == 1       ? PD_PATH_LOCAL
           : g->shm != NULL   ? PD_PATH_SHM
           : g->lshm != NULL  ? PD_PATH_SHM_TCP
                              : PD_PATH_TCP;
}

int
pd_group_single_copy(const pd_group *g)
{
    return g->shm != NULL && pd_shm_cma(g->shm);
}

size_t
pd_group_bank_bytes(const pd_group *g)
{
    return g->shm != NULL ? pd_shm_bank_size(g->shm) : 0;
}

/* Fill one table of rules (dst: the group's rules or its slow-phase
 * rules) while the group is idle: the next collective takes mu to start,
 * so it sees them.  The progress thread clears `running` just after it
 * completed the caller's last work: give it a moment (up to a second)
 * before calling it busy.  phase_ns >= 0 (the slow table): the phases'
 * threshold too, and the phase state starts over. */
static pd_status
set_table(pd_group *g, pd_rules *dst, const size_t *cma_from,
          const size_t *small_bytes, const size_t *gap_lo,
          const size_t *gap_hi, size_t n, double phase_ns, const char *what)
{
    if (n > PD_NKINDS) {
        return pd_error(PD_EINVAL, "%s: %zu kinds given, the table has %d",
                        what, n, PD_NKINDS);
    }
    int idle = 0;
    double until = pd_now() + 1.0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        idle = g->qh == NULL && !g->running;
        if (idle) {
            for (size_t k = 0; k < n; k++) {
                dst->cma_from[k] = cma_from != NULL ? cma_from[k] : 0;
                dst->small_bytes[k] = small_bytes != NULL ? small_bytes[k]
                                                          : 0;
                dst->cma_gap_lo[k] = gap_lo != NULL ? gap_lo[k] : 0;
                dst->cma_gap_hi[k] = gap_hi != NULL ? gap_hi[k] : 0;
            }
            if (phase_ns >= 0) {
                const char *f = getenv("PYDDP_TEST_PHASE");
                g->phase_ns = phase_ns;
                g->phase = g->verdict = 0;
                g->probe_ns = -1;
                g->phase_weight = PD_PHASE_EVERY; /* the next one probes */
                g->phase_force = f == NULL || *f == '\0' ? -1
                                 : strcmp(f, "slow") == 0 ? 1
                                                          : 0;
            }
        }
        pthread_mutex_unlock(&g->mu);
        if (idle || pd_now() > until) {
            break;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    if (!idle) {
        return pd_error(PD_EINVAL, "%s: a collective is queued or running; "
                        "set the rules between collectives", what);
    }
    return PD_OK;
}

pd_status
pd_group_set_rules(pd_group *g, const size_t *cma_from,
                   const size_t *small_bytes, const size_t *gap_lo,
                   const size_t *gap_hi, size_t n)
{
    return set_table(g, &g->rules, cma_from, small_bytes, gap_lo, gap_hi, n,
                     -1, "set_rules");
}

pd_status
pd_group_set_slow_rules(pd_group *g, const size_t *cma_from,
                        const size_t *small_bytes, const size_t *gap_lo,
                        const size_t *gap_hi, size_t n, double phase_ns)
{
    if (!(phase_ns >= 0)) {
        return pd_error(PD_EINVAL, "set_slow_rules: the threshold must be "
                        ">= 0 ns (0: no phases), got %g", phase_ns);
    }
    return set_table(g, &g->rules_slow, cma_from, small_bytes, gap_lo, gap_hi,
                     n, phase_ns, "set_slow_rules");
}

pd_status
pd_group_probe_phase(pd_group *g, double *ns)
{
    *ns = -1;
    if (g->shm == NULL || g->size < 2) {
        return PD_OK;
    }
    PD_CHECK(pd_grp_acquire_idle(g, "probe_phase"));
    /* tags apart from the collectives' (their sequence numbers + 1) */
    uint64_t tag = ((uint64_t)1 << 55) | ++g->manual_probes;
    *ns = pd_shm_pingpong(g->shm, tag, PD_PHASE_TRIPS * 4,
                          pd_now() + 100 * PD_PHASE_WAIT_S);
    pd_grp_release_idle(g);
    return PD_OK;
}

void
pd_group_phase(const pd_group *g, int *phase, double *probe_ns,
               double *phase_ns, uint64_t *probes)
{
    *phase = g->phase;
    *probe_ns = g->probe_ns;
    *phase_ns = g->phase_ns;
    *probes = g->probes;
}

void
pd_group_rules_in_force(const pd_group *g, int slow, int kind,
                        size_t *cma_from, size_t *small, size_t *gap_lo,
                        size_t *gap_hi)
{
    const pd_rules *r = slow ? &g->rules_slow : &g->rules;
    *cma_from = pd_rules_cma_from(r, kind);
    pd_rules_cma_gap(r, kind, gap_lo, gap_hi);
    *small = pd_rules_small(r, kind);
}

void
pd_group_destroy(pd_group *g)
{
    if (g == NULL) {
        return;
    }
    PD_LOG(PD_LOG_INFO, "group", "rank %d: destroying the group", g->rank);
    atomic_store(&g->stopping, 1);
    /* A collective running on another caller's thread sees "destroyed" at
     * its next check (woken now, within a sleep slice at worst): the
     * shared memory must stay mapped until it has left. */
    for (;;) {
        if (g->shm != NULL) {
            pd_shm_wake_all(g->shm);
        }
        pthread_mutex_lock(&g->mu);
        int busy = g->caller;
        pthread_mutex_unlock(&g->mu);
        if (!busy) {
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (g->thr_started) {
        g->t->ops->wake(g->t);
        pthread_join(g->thr, NULL);
    }
    pd_shm_leave(g->lshm);
    if (g->t != NULL) {
        g->t->ops->close(g->t);
    }
    while (g->bufs != NULL) {
        shm_buf *n = g->bufs->next;
        pd_grp_free_shm_buf(g->bufs, g->size);
        g->bufs = n;
    }
    pd_shm_close(g->lshm);
    pthread_mutex_destroy(&g->mu);
    pd_fr_free(&g->fr);
    free(g);
}

int
pd_group_rank(const pd_group *g)
{
    return g->rank;
}

int
pd_group_size(const pd_group *g)
{
    return g->size;
}
