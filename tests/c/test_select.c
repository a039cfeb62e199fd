/* Algorithm choice (coll/select.c's pd_coll_choose): the one decision both
 * runners dispatch on and pd_group_explain reports, by kind, size, group
 * size, path and rules. */
#include "coll/coll.h"
#include "kernels/kernels.h"
#include "pd_test.h"

#include <stdlib.h>

static void
test_transport_crossovers(void)
{
    pd_rules r;
    memset(&r, 0, sizeof(r));
    size_t small = PD_SMALL_BYTES / 4; /* float32 elements at the crossover */
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, small, 2, 0, 0,
                           0) == PD_ALGO_DIRECT);
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, small + 1, 2, 0,
                           0, 0) == PD_ALGO_RING);
    /* halves reduce in float32: the crossover counts the widened bytes */
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT16, small + 1, 2, 0,
                           0, 0) == PD_ALGO_RING);
    T_CHECK(pd_coll_choose(NULL, PD_K_REDUCE, PD_FLOAT32, 1 << 20, 1, 0, 0,
                           0) == PD_ALGO_DIRECT); /* one rank */
    T_CHECK(pd_coll_choose(&r, PD_K_BROADCAST, PD_FLOAT32, small, 4, 0, 0,
                           0) == PD_ALGO_FLAT);
    T_CHECK(pd_coll_choose(&r, PD_K_BROADCAST, PD_FLOAT32, small + 1, 4, 0,
                           0, 0) == PD_ALGO_CHAIN);
    T_CHECK(pd_coll_choose(&r, PD_K_BROADCAST, PD_FLOAT32, 9, 1, 0, 0, 0) ==
            PD_ALGO_NONE);
    /* all_gather: the whole output against the crossover */
    T_CHECK(pd_coll_choose(&r, PD_K_ALLGATHER, PD_FLOAT32, small / 4, 4, 0, 0,
                           0) == PD_ALGO_DIRECT);
    T_CHECK(pd_coll_choose(&r, PD_K_ALLGATHER, PD_FLOAT32, small / 4 + 1, 4,
                           0, 0, 0) == PD_ALGO_RING);
    T_CHECK(pd_coll_choose(&r, PD_K_ALLTOALL, PD_FLOAT32, 1, 4, 0, 0, 0) ==
            PD_ALGO_PAIRWISE);
    T_CHECK(pd_coll_choose(&r, PD_K_MONITORED_BARRIER, PD_UINT8, 0, 4, 0, 0,
                           0) == PD_ALGO_STAR);
    /* a tuned crossover moves the choice */
    r.small_bytes[PD_K_ALLREDUCE] = 1024;
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, 257, 2, 0, 0, 0) ==
            PD_ALGO_RING);
}

static void
test_shared_memory(void)
{
    pd_rules r;
    memset(&r, 0, sizeof(r));
    size_t big = (size_t)32 << 20; /* bytes: the default all_reduce rule */
    /* only where single copies can run (cma set) and from the rule */
    unsetenv("PYDDP_CMA_THRESHOLD");
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, big / 4, 2, 1, 1,
                           0) == PD_ALGO_CMA);
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, big / 4 - 1, 2, 1,
                           1, 0) == PD_ALGO_SHM);
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, big / 4, 2, 1, 0,
                           0) == PD_ALGO_SHM);
    T_CHECK(pd_coll_choose(&r, PD_K_ALLREDUCE, PD_FLOAT32, big / 4, 2, 1, 1,
                           1) == PD_ALGO_SHM_INPLACE);
    T_CHECK(pd_coll_choose(&r, PD_K_BARRIER, PD_UINT8, 0, 2, 1, 1, 0) ==
            PD_ALGO_SHM);
    /* a rule per kind, and its gap */
    r.cma_from[PD_K_REDUCE] = 4096;
    r.cma_gap_lo[PD_K_REDUCE] = 8192;
    r.cma_gap_hi[PD_K_REDUCE] = 16384;
    T_CHECK(pd_coll_choose(&r, PD_K_REDUCE, PD_UINT8, 4096, 2, 1, 1, 0) ==
            PD_ALGO_CMA);
    T_CHECK(pd_coll_choose(&r, PD_K_REDUCE, PD_UINT8, 8192, 2, 1, 1, 0) ==
            PD_ALGO_SHM);
    T_CHECK(pd_coll_choose(&r, PD_K_REDUCE, PD_UINT8, 16384, 2, 1, 1, 0) ==
            PD_ALGO_CMA);
}

static void
test_names(void)
{
    T_CHECK(strcmp(pd_algo_name(PD_ALGO_CMA), "cma") == 0);
    T_CHECK(strcmp(pd_algo_name(PD_ALGO_SHM_INPLACE), "shm-inplace") == 0);
    T_CHECK(strcmp(pd_algo_name(PD_NALGOS), "unknown") == 0);
    T_CHECK(strcmp(pd_path_name(PD_PATH_SHM_TCP), "shm+tcp") == 0);
    for (int a = 0; a < PD_NALGOS; a++) {
        T_CHECK(pd_algo_name(a) != NULL);
    }
    for (int p = 0; p < PD_NPATHS; p++) {
        T_CHECK(pd_path_name(p) != NULL);
    }
}

int
main(void)
{
    T_RUN(test_transport_crossovers);
    T_RUN(test_shared_memory);
    T_RUN(test_names);
    return pd_test_result();
}
