/* The identity of each collective (shm.h): every rank publishes what it
 * entered beside its step, and checks its peers' at the first sync point,
 * so ranks that called different collectives get an error naming both
 * calls on every rank; and what the identities tell afterwards (the
 * highest entered, the phase rank 0 published).
 */
#include "internal.h"

#include <stdio.h>

#include "../../kernels/kernels.h"
#include "../../util/kinds.h"

void
pd_shm_enter(pd_shm *s, const pd_shm_ident *id, uint64_t value)
{
    pd_shm_ctrl *c = shm_ctrl(s, s->rank);
    c->ident[id->seq & 1] = *id;
    c->value[id->seq & 1] = value;
    s->cur = *id;
    /* published by the release store of the next step */
}

static void
describe(const pd_shm_ident *id, const char *(*kind_name)(int), char *buf,
         size_t len)
{
    int kind = id->kind;
    int reduces = pd_kind_has(kind, PD_KF_REDUCES);
    /* a collective's root (shared memory runs no point-to-point kind) */
    int rooted = pd_kind_has(kind, PD_KF_ROOTED) &&
                 !pd_kind_has(kind, PD_KF_P2P);
    char opbuf[32] = "", rootbuf[32] = "";
    if (reduces) {
        snprintf(opbuf, sizeof(opbuf), ", op=%s",
                 id->op < PD_NREDOPS ? pd_redop_name((pd_redop)id->op) : "?");
    }
    if (rooted) {
        snprintf(rootbuf, sizeof(rootbuf), ", root=%d", id->root);
    }
    snprintf(buf, len, "%s(dtype=%s, count=%llu%s%s) [sequence number %llu]",
             kind_name(kind),
             id->dtype < PD_NDTYPES ? pd_dtype_name((pd_dtype)id->dtype) : "?",
             (unsigned long long)id->count, rootbuf, opbuf,
             (unsigned long long)id->seq);
}

pd_status
pd_shm_check_ident(pd_shm *s, const pd_shm_ident *id,
                   const char *(*kind_name)(int))
{
    return pd_shm_check_ident_from(s, id, kind_name, -1);
}

pd_status
pd_shm_check_ident_from(pd_shm *s, const pd_shm_ident *id,
                        const char *(*kind_name)(int), int src)
{
    s->unchecked = src != -1;
    for (int p = 0; p < s->size; p++) {
        if (p == s->rank || (src >= 0 && p != src)) {
            continue;
        }
        if (src == PD_SHM_ANY &&
            !reached(atomic_load_explicit(&shm_ctrl(s, p)->step,
                                          memory_order_acquire),
                     s->step)) {
            continue; /* not here yet: checked at the next entry */
        }
        const pd_shm_ident *o = &shm_ctrl(s, p)->ident[id->seq & 1];
        if (o->seq != id->seq || o->kind != id->kind ||
            o->dtype != id->dtype || o->op != id->op || o->root != id->root ||
            o->count != id->count || o->aux != id->aux) {
            char a[256], b[256];
            describe(id, kind_name, a, sizeof(a));
            describe(o, kind_name, b, sizeof(b));
            if (o->seq == id->seq && o->kind == id->kind &&
                o->count == id->count && o->aux != id->aux) {
                return pd_error(PD_EMISMATCH,
                                "collective mismatch between ranks: rank %d "
                                "and rank %d called %s with different "
                                "shared-memory buffers or split sizes, or "
                                "another PYDDP_CMA_THRESHOLD",
                                s->rank, p, a);
            }
            return pd_error(PD_EMISMATCH,
                            "collective mismatch between ranks: rank %d "
                            "called %s but rank %d called %s",
                            s->rank, a, p, b);
        }
    }
    return PD_OK;
}

uint64_t
pd_shm_value(pd_shm *s, int p, uint64_t seq)
{
    return shm_ctrl(s, p)->value[seq & 1];
}

uint64_t
pd_shm_entered(pd_shm *s, int p)
{
    pd_shm_ctrl *c = shm_ctrl(s, p);
    uint64_t a = c->ident[0].seq, b = c->ident[1].seq;
    return a > b ? a : b;
}

int
pd_shm_phase_of(pd_shm *s, uint64_t seq, int keep)
{
    const pd_shm_ident *o = &shm_ctrl(s, 0)->ident[seq & 1];
    return o->seq == seq ? o->phase : keep;
}
