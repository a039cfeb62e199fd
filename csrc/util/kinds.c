/* The table of collective kinds (util/kinds.h). */
#include "kinds.h"

#define R PD_KF_ROOTED
#define D PD_KF_REDUCES
#define S PD_KF_SHM
#define P PD_KF_P2P

const pd_kind_info pd_kinds[PD_NKINDS] = {
    [PD_K_NONE] = {"none", "NONE", PD_KF_INTERNAL, PD_BLK_NONE, PD_BLK_NONE},
    /* in place: the output is also the root's input */
    [PD_K_BROADCAST] = {"broadcast", "BROADCAST", R | S, PD_BLK_NONE,
                        PD_BLK_ONE},
    /* in place; an out-of-place call (DDP's _all_reduce_into) passes one
     * input too */
    [PD_K_ALLREDUCE] = {"all_reduce", "ALLREDUCE", D | S, PD_BLK_NONE,
                        PD_BLK_ONE},
    [PD_K_REDUCE] = {"reduce", "REDUCE", R | D | S, PD_BLK_ONE, PD_BLK_ONE},
    [PD_K_ALLGATHER] = {"all_gather", "ALLGATHER", S, PD_BLK_ONE,
                        PD_BLK_ALL},
    [PD_K_GATHER] = {"gather", "GATHER", R | S, PD_BLK_ONE, PD_BLK_ROOT_ALL},
    [PD_K_SCATTER] = {"scatter", "SCATTER", R | S, PD_BLK_ROOT_ALL,
                      PD_BLK_ONE},
    [PD_K_REDUCE_SCATTER] = {"reduce_scatter", "REDUCE_SCATTER", D | S,
                             PD_BLK_ALL, PD_BLK_ONE},
    [PD_K_ALLTOALL] = {"all_to_all", "ALLTOALL", S | PD_KF_SPLITS,
                       PD_BLK_ALL, PD_BLK_ALL},
    [PD_K_BARRIER] = {"barrier", "BARRIER", S, PD_BLK_NONE, PD_BLK_NONE},
    /* names late ranks one by one over the connections: no shm version */
    [PD_K_MONITORED_BARRIER] = {"monitored_barrier", "MONITORED_BARRIER", 0,
                                PD_BLK_NONE, PD_BLK_NONE},
    [PD_K_SEND] = {"send", "SEND", R | P, PD_BLK_ONE, PD_BLK_NONE},
    [PD_K_RECV] = {"recv", "RECV", R | P, PD_BLK_NONE, PD_BLK_ONE},
    /* pd_group_shm_alloc's agreement round, through shared memory */
    [PD_K_SHM_ALLOC] = {"_shared_array", "SHM_ALLOC", S | PD_KF_INTERNAL,
                        PD_BLK_NONE, PD_BLK_NONE},
};

const pd_kind_info pd_kind_unknown = {"unknown", "UNKNOWN", PD_KF_INTERNAL,
                                     PD_BLK_NONE, PD_BLK_NONE};

const char *
pd_kind_name(int kind)
{
    return pd_kind_get(kind)->name;
}

int
pd_kind_blocks(int kind, int out, int rank, int root, int size)
{
    const pd_kind_info *k = pd_kind_get(kind);
    switch (out ? k->out : k->in) {
    case PD_BLK_ONE:
        return 1;
    case PD_BLK_ALL:
        return size;
    case PD_BLK_ROOT_ALL:
        return rank == root ? size : 0;
    default:
        return 0;
    }
}
