/* Diagnostics: which ranks a timed-out collective waited for; the group's
 * flight-recorder accessors (group.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

/* Append ", %d" (or "%d" first) to buf at *off, within cap. */
static void
add_rank(char *buf, size_t cap, size_t *off, int p)
{
    int k = snprintf(buf + *off, cap - *off, "%s%d", *off ? ", " : "", p);
    if (k > 0 && (size_t)k < cap - *off) {
        *off += (size_t)k;
    }
}

/* A peer failed the group before this rank's own clock ran out: its abort
 * waits in shared memory, or as a control message not read yet (the
 * transport's, on the progress thread).  PD_OK when none did. */
static pd_status
peer_failed_first(pd_group *g, int on_progress)
{
    if (g->shm != NULL) {
        PD_CHECK(pd_shm_peer_failure(g->shm));
    }
    if (on_progress) {
        PD_CHECK(g->t->ops->progress(g->t, 0));
    }
    return PD_OK;
}

/* A collective timed out: find out where the peers are (through shared
 * memory, or by asking them over the transport) and name the ranks that
 * never reached this collective; when every rank reached it, name the one
 * this rank was waiting for (waited_for, -1: unknown), which entered it but
 * never did its part (stopped inside a gather, say).  A peer this host's
 * /proc shows stopped (SIGSTOP, a debugger) is named whatever its sequence
 * number: a rank stopped after entering the collective, or after running
 * ahead into the next, is where every other wait ends.
 *
 * Returns the status of the error it sets: PD_ETIMEOUT, or the status of a
 * peer's failure that came first.  That one is reported instead: the
 * group's verdict was made there, and this rank's would be later and, when
 * this rank was the one stopped (continued after its peers gave up on it),
 * wrong: it would blame the ranks that gave up on it. */
pd_status
pd_grp_explain_timeout(pd_group *g, const pd_op *op, uint64_t seq, double timeout,
                int on_progress, int waited_for)
{
    PD_CHECK(peer_failed_first(g, on_progress));
    /* not asked (the transport belongs to another thread): neither late
     * nor silent */
    const uint64_t unknown = UINT64_MAX - 1;
    uint64_t *seqs = calloc((size_t)g->size, sizeof(uint64_t));
    char never[512] = "", silent[512] = "", behind[512] = "";
    char stopped[512] = "";
    size_t on = 0, os = 0, ob = 0, ot = 0;
    if (seqs != NULL) {
        if (g->shm != NULL) {
            for (int p = 0; p < g->size; p++) {
                seqs[p] = p == g->rank ? seq : pd_shm_entered(g->shm, p);
            }
        }
        else if (on_progress) {
            g->t->ops->query_seqs(g->t, seqs, 1.0);
            /* an abort read while the peers answered: a verdict made
             * before this one */
            pd_status st = peer_failed_first(g, on_progress);
            if (st != PD_OK) {
                free(seqs);
                return st;
            }
        }
        else {
            for (int p = 0; p < g->size; p++) {
                seqs[p] = unknown;
            }
        }
        /* The culprits: the ranks that did not answer (stopped, or
         * gone); else the ranks furthest behind (among the stopped ones,
         * when /proc shows some).  A rank behind the others but ahead of a
         * culprit is waiting on it (eager collectives let ranks run
         * ahead): said apart, not blamed. */
        uint64_t lowest = UINT64_MAX;
        int any_silent = 0;
        /* the ranks this host's /proc shows stopped (with shared memory,
         * every rank is on this host and its pid is known): the culprits,
         * before any rank merely behind */
        char *is_stopped = calloc((size_t)g->size, 1);
        if (g->shm != NULL && is_stopped != NULL) {
            for (int p = 0; p < g->size; p++) {
                char state = p == g->rank ? 0
                                          : pd_shm_peer_state(g->shm, p);
                if (state == 'T' || state == 't') {
                    is_stopped[p] = 1;
                    add_rank(stopped, sizeof(stopped), &ot, p);
                }
            }
        }
        for (int p = 0; p < g->size; p++) {
            if (p == g->rank || seqs[p] == unknown) {
                continue;
            }
            if (ot > 0 && !is_stopped[p]) {
                continue; /* the lowest among the stopped ones */
            }
            if (seqs[p] == UINT64_MAX) {
                any_silent = 1;
            }
            else if (seqs[p] < seq && seqs[p] < lowest) {
                lowest = seqs[p];
            }
        }
        for (int p = 0; p < g->size; p++) {
            if (p == g->rank || seqs[p] == unknown) {
                continue;
            }
            if (seqs[p] == UINT64_MAX) {
                add_rank(silent, sizeof(silent), &os, p);
            }
            else if (seqs[p] < seq) {
                int culprit = !any_silent && seqs[p] == lowest &&
                              (ot == 0 || is_stopped[p]);
                char *buf = culprit ? never : behind;
                size_t cap = culprit ? sizeof(never) : sizeof(behind);
                size_t *off = culprit ? &on : &ob;
                int k = snprintf(buf + *off, cap - *off,
                                 "%s%d (at sequence number %llu)",
                                 *off ? ", " : "", p,
                                 (unsigned long long)seqs[p]);
                if (k > 0 && (size_t)k < cap - *off) {
                    *off += (size_t)k;
                }
            }
        }
        free(is_stopped);
    }
    free(seqs);
    char stuck[160] = "";
    if (on == 0 && os == 0 && ot == 0 && waited_for >= 0 &&
        waited_for != g->rank && waited_for < g->size) {
        snprintf(stuck, sizeof(stuck), "; rank %d entered it but never did "
                 "its part (this rank waited for it: stopped, or stuck)",
                 waited_for);
    }
    char also[600] = "";
    if (ob > 0) {
        snprintf(also, sizeof(also), "; behind too, waiting on them: [%s]",
                 behind);
    }
    return pd_error(PD_ETIMEOUT,
                    "rank %d: %s (sequence number %llu) timed out after "
                    "%.1f s; ranks that never arrived: [%s]%s%s%s%s%s%s%s%s",
                    g->rank, op->name, (unsigned long long)seq, timeout,
                    never, os ? "; ranks that did not answer: [" : "",
                    silent, os ? "]" : "",
                    ot ? "; ranks stopped (SIGSTOP or a debugger): [" : "",
                    stopped, ot ? "]" : "", stuck, also);
}

/* ------------------------------------------------------ flight recorder */

pd_fr *
pd_group_flight(pd_group *g)
{
    return &g->fr;
}

size_t
pd_group_flight_capacity(pd_group *g)
{
    return g->fr.cap;
}

pd_status
pd_group_explain(pd_group *g, int kind, int dtype, size_t count, int *path,
                 int *algo)
{
    if (kind <= PD_K_NONE || kind >= PD_NKINDS ||
        pd_kind_has(kind, PD_KF_P2P) || kind == PD_K_SHM_ALLOC || dtype < 0 ||
        dtype >= PD_NDTYPES) {
        return pd_error(PD_EINVAL, "explain: not a collective (kind %d, "
                        "dtype %d)", kind, dtype);
    }
    /* as run.c: the segment for the kinds it serves, the phase's rules */
    int shm = g->shm != NULL && pd_kind_has(kind, PD_KF_SHM);
    const pd_rules *r = g->phase ? &g->rules_slow : &g->rules;
    int cma = shm && pd_shm_cma(g->shm) &&
              (size_t)g->size * 3 * sizeof(uint64_t) <=
                  pd_shm_bank_size(g->shm);
    *path = shm ? PD_PATH_SHM : pd_grp_path(g);
    *algo = pd_coll_choose(r, kind, dtype, count, g->size, shm, cma, 0);
    return PD_OK;
}

size_t
pd_group_flight_records(pd_group *g, pd_fr_entry *out, size_t cap)
{
    return pd_fr_snapshot(&g->fr, out, cap);
}

pd_status
pd_group_flight_configure(pd_group *g, const char *path, const char *meta)
{
    return pd_fr_configure(&g->fr, path, meta);
}

pd_status
pd_group_flight_dump(pd_group *g, const char *path, const char *reason)
{
    return pd_fr_dump(&g->fr, path, reason, 0);
}

void
pd_group_set_timeline_track(pd_group *g, int tid)
{
    g->fr.tl_tid = tid;
}
