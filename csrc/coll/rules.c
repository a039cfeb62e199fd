/* The defaults of coll/rules.h.  The measurements behind them are in
 * docs/benchmarks.md ("Measurements behind the algorithm thresholds"). */
#include "rules.h"

#include "../transport/shm/cma.h"
#include "../util/kinds.h"

/* Single copies (coll/<collective>_cma.c) from these sizes; 0: never.
 * They pin every page of the peer's buffer and copy at a third of memcpy's
 * speed in cache, so they win only past the caches: all_reduce from
 * 32 MiB, gather and scatter from 16 MiB blocks (below, the banks are
 * 1.1-6x faster).  broadcast from 1 MiB: its root writes 1/n of every
 * reader's message while they read the rest (coll/broadcast_cma.c), which
 * beat the banks from 16-64 KiB on 2 ranks and from 1-4 MiB on 4 (2-core
 * EPYC, 2026-11-27: 4 ranks, 1 MiB 163-184 us against 181-559, 16 MiB
 * 2.5-2.6 ms against 3.2-8.1).  reduce, reduce_scatter, all_gather and
 * all_to_all keep the banks: as fast or faster at 64 MiB.  scatter on 4
 * ranks keeps them too (single copies lost after other large collectives in
 * the same processes); PYDDP_CMA_THRESHOLD=256K serves a program that
 * mostly scatters. */
static const size_t cma_from[PD_NKINDS] = {
    [PD_K_ALLREDUCE] = (size_t)32 << 20,
    [PD_K_BROADCAST] = (size_t)1 << 20,
    [PD_K_GATHER] = (size_t)16 << 20,
    [PD_K_SCATTER] = (size_t)16 << 20,
};

size_t
pd_coll_cma_threshold(int kind)
{
    size_t from = kind >= 0 && kind < PD_NKINDS ? cma_from[kind] : 0;
    return from != 0 ? from : PD_CMA_DEFAULT;
}

size_t
pd_rules_cma_from(const pd_rules *r, int kind)
{
    size_t at = pd_cma_threshold();
    if (at != PD_CMA_DEFAULT) {
        return at; /* PYDDP_CMA_THRESHOLD: every kind, every group */
    }
    if (r != NULL && kind >= 0 && kind < PD_NKINDS && r->cma_from[kind]) {
        return r->cma_from[kind];
    }
    return pd_coll_cma_threshold(kind);
}

void
pd_rules_cma_gap(const pd_rules *r, int kind, size_t *lo, size_t *hi)
{
    *lo = *hi = 0;
    if (pd_cma_threshold() == PD_CMA_DEFAULT && r != NULL && kind >= 0 &&
        kind < PD_NKINDS && r->cma_gap_lo[kind] < r->cma_gap_hi[kind]) {
        *lo = r->cma_gap_lo[kind];
        *hi = r->cma_gap_hi[kind];
    }
}

int
pd_rules_cma(const pd_rules *r, int kind, size_t bytes)
{
    size_t lo, hi;
    pd_rules_cma_gap(r, kind, &lo, &hi);
    return bytes >= pd_rules_cma_from(r, kind) && !(bytes >= lo && bytes < hi);
}

size_t
pd_rules_small(const pd_rules *r, int kind)
{
    if (r != NULL && kind >= 0 && kind < PD_NKINDS && r->small_bytes[kind]) {
        return r->small_bytes[kind];
    }
    return PD_SMALL_BYTES;
}
