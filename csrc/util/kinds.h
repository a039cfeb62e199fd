/* The one table of collective kinds: what each operation looks like
 * (name, rooted, reduces, how many blocks each side has, which transports
 * run it).  Every layer reads it (the group, the transports' messages, the
 * binding's argument checks, Python through pyddp._C.KINDS) instead of
 * re-encoding it.  dtypes and reduce ops have theirs in kernels/dtype.c. */
#ifndef PD_UTIL_KINDS_H
#define PD_UTIL_KINDS_H

#include <stddef.h>

typedef enum pd_kind {
    PD_K_NONE = 0,
    PD_K_BROADCAST,
    PD_K_ALLREDUCE,
    PD_K_REDUCE,
    PD_K_ALLGATHER,
    PD_K_GATHER,
    PD_K_SCATTER,
    PD_K_REDUCE_SCATTER,
    PD_K_ALLTOALL,
    PD_K_BARRIER,
    PD_K_MONITORED_BARRIER,
    PD_K_SEND,
    PD_K_RECV,
    PD_K_SHM_ALLOC,
    PD_NKINDS
} pd_kind;

/* Kind flags. */
enum {
    PD_KF_ROOTED = 1u << 0,   /* a root (src / dst / peer) takes part */
    PD_KF_REDUCES = 1u << 1,  /* takes a ReduceOp */
    PD_KF_SHM = 1u << 2,      /* has a shared-memory algorithm */
    PD_KF_P2P = 1u << 3,      /* point to point, not a collective */
    PD_KF_SPLITS = 1u << 4,   /* per-rank block sizes may differ: the count
                                 is not part of the call's identity */
    PD_KF_INTERNAL = 1u << 5, /* not a user-facing operation */
};

/* How many blocks (one per rank, or one) a side of an operation has. */
typedef enum pd_blocks {
    PD_BLK_NONE = 0, /* no array on that side (in place, or none) */
    PD_BLK_ONE,      /* one array */
    PD_BLK_ALL,      /* one block per rank */
    PD_BLK_ROOT_ALL, /* one block per rank on the root, none elsewhere */
} pd_blocks;

typedef struct pd_kind_info {
    const char *name;  /* API name in messages: "all_reduce" */
    const char *ident; /* constant name in pyddp._C: "ALLREDUCE" */
    unsigned flags;    /* PD_KF_* */
    unsigned char in;  /* pd_blocks of the input side */
    unsigned char out; /* pd_blocks of the output side */
} pd_kind_info;

extern const pd_kind_info pd_kinds[PD_NKINDS];
extern const pd_kind_info pd_kind_unknown;

/* The entry of kind (an "unknown" entry for anything out of range); inline:
 * the hot paths ask on every call. */
static inline const pd_kind_info *
pd_kind_get(int kind)
{
    return kind >= 0 && kind < PD_NKINDS ? &pd_kinds[kind] : &pd_kind_unknown;
}

static inline int
pd_kind_has(int kind, unsigned flag)
{
    return (pd_kind_get(kind)->flags & flag) != 0;
}

const char *pd_kind_name(int kind);
/* Blocks a side (out = 0 input, 1 output) has on this rank. */
int pd_kind_blocks(int kind, int out, int rank, int root, int size);

#endif
