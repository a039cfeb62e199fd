/* Private to csrc/transport/shm/: the layout of a rank's segment and the
 * helpers every file of the shared-memory transport uses on its hot paths
 * (inline here, so that splitting the files cost no call).  The public
 * interface is shm.h.
 */
#ifndef PD_SHM_INTERNAL_H
#define PD_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shm.h"

/* Per-peer ring counters in a rank's segment (entry p concerns peer p). */
typedef struct ring_ctl {
    _Alignas(PD_SHM_LINE) _Atomic uint64_t head; /* bytes I wrote to p */
    _Alignas(PD_SHM_LINE) _Atomic uint64_t tail; /* bytes I read from p */
    _Atomic uint32_t want_data;                  /* I wait for p's data */
    _Atomic uint32_t want_space;                 /* I wait for p to read */
} ring_ctl;

struct pd_shm {
    int rank;
    int size;
    int spin;          /* 1: busy poll first; 0: yield (oversubscribed) */
    int cores_all;     /* every rank's spin was 1 (pd_shm_spins) */
    uint64_t token;
    uint32_t node;
    size_t bank_bytes; /* in use: agreed at attach (pd_shm_bank_bytes) */
    size_t bank_cap;   /* room for one bank in every segment */
    size_t ring_off;   /* ring_ctl[size] then rings[size] */
    size_t seg_bytes;
    char **base;       /* base[p]: rank p's segment (own included) */
    int *mapped;
    int linked;        /* own name still in /dev/shm */
    uint32_t step;     /* my step (private copy of ctrl->step) */
    int bank;
    pd_shm_ident cur;  /* the collective entered last */
    int unchecked;     /* it did not check every rank's identity */
    int cma;           /* single copies by cross-memory attach */
    uint64_t cma_word; /* what the peers' probes read (cma.c) */
    char *scratch;     /* pd_shm_scratch */
    size_t scratch_bytes;
    int waited_for;    /* the peer the last timed-out wait waited for */
};

/* Rank p's control block (the start of its segment). */
static inline pd_shm_ctrl *
shm_ctrl(pd_shm *s, int p)
{
    return (pd_shm_ctrl *)s->base[p];
}

/* The counters of owner's ring towards p, in owner's segment. */
static inline ring_ctl *
rctl(pd_shm *s, int owner, int p)
{
    return (ring_ctl *)(s->base[owner] + s->ring_off) + p;
}

/* The bytes of owner's ring towards p. */
static inline char *
ring(pd_shm *s, int owner, int p)
{
    return s->base[owner] + s->ring_off + (size_t)s->size * sizeof(ring_ctl) +
           (size_t)p * PD_SHM_RING_BYTES;
}

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* a has reached b (wrap-safe) */
static inline int
reached(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) >= 0;
}

#endif
