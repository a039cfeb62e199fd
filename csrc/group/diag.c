/* Diagnostics: which ranks a timed-out collective waited for; the group's
 * flight-recorder accessors (group.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

/* A collective timed out: find out where the peers are (through shared
 * memory, or by asking them over the transport) and name the ranks that
 * never reached this collective; when every rank reached it, name the one
 * this rank was waiting for (waited_for, -1: unknown), which entered it but
 * never did its part (stopped inside a gather, say). */
void
pd_grp_explain_timeout(pd_group *g, const pd_op *op, uint64_t seq, double timeout,
                int on_progress, int waited_for)
{
    /* not asked (the transport belongs to another thread): neither late
     * nor silent */
    const uint64_t unknown = UINT64_MAX - 1;
    uint64_t *seqs = calloc((size_t)g->size, sizeof(uint64_t));
    char never[512] = "", silent[512] = "", behind[512] = "";
    size_t on = 0, os = 0, ob = 0;
    if (seqs != NULL) {
        if (g->shm != NULL) {
            for (int p = 0; p < g->size; p++) {
                seqs[p] = p == g->rank ? seq : pd_shm_entered(g->shm, p);
            }
        }
        else if (on_progress) {
            g->t->ops->query_seqs(g->t, seqs, 1.0);
        }
        else {
            for (int p = 0; p < g->size; p++) {
                seqs[p] = unknown;
            }
        }
        /* The culprits: the ranks that did not answer (stopped, or
         * gone); else the ranks furthest behind.  A rank behind the others
         * but ahead of a culprit is waiting on it (eager collectives let
         * ranks run ahead): said apart, not blamed. */
        uint64_t lowest = UINT64_MAX;
        int any_silent = 0;
        for (int p = 0; p < g->size; p++) {
            if (p == g->rank || seqs[p] == unknown) {
                continue;
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
                int k = snprintf(silent + os, sizeof(silent) - os, "%s%d",
                                 os ? ", " : "", p);
                if (k > 0 && (size_t)k < sizeof(silent) - os) {
                    os += (size_t)k;
                }
            }
            else if (seqs[p] < seq) {
                int culprit = !any_silent && seqs[p] == lowest;
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
    }
    free(seqs);
    char stuck[160] = "";
    if (on == 0 && os == 0 && waited_for >= 0 && waited_for != g->rank &&
        waited_for < g->size) {
        snprintf(stuck, sizeof(stuck), "; rank %d entered it but never did "
                 "its part (this rank waited for it: stopped, or stuck)",
                 waited_for);
    }
    char also[600] = "";
    if (ob > 0) {
        snprintf(also, sizeof(also), "; behind too, waiting on them: [%s]",
                 behind);
    }
    pd_error(PD_ETIMEOUT,
             "rank %d: %s (sequence number %llu) timed out after %.1f s; "
             "ranks that never arrived: [%s]%s%s%s%s%s",
             g->rank, op->name, (unsigned long long)seq, timeout, never,
             os ? "; ranks that did not answer: [" : "", silent,
             os ? "]" : "", stuck, also);
}

/* ------------------------------------------------------ flight recorder */

size_t
pd_group_flight_capacity(pd_group *g)
{
    return g->fr.cap;
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
