/* The NCCL and MPI backends' cores (csrc/nccl/, csrc/mpi/) without a GPU,
 * MPI or Python: the kind-to-NCCL mapping, the launch layouts, the MPI
 * library search and a one-rank signature check. */
#include "pd_test.h"

#include "kernels/kernels.h"
#include "mpi/comm.h"
#include "nccl/comm.h"
#include "util/kinds.h"

static void
test_nccl_reduction(void)
{
    int ndt = -1, nop = -1;
    size_t mult = 0;
    T_CHECK(pd_ncomm_reduction(PD_FLOAT32, PD_SUM, &ndt, &nop, &mult) == NULL);
    T_CHECK(ndt == PD_NCCL_FLOAT32 && nop == PD_NCCL_SUM && mult == 1);
    /* complex: pairs of reals, SUM or AVG only */
    T_CHECK(pd_ncomm_reduction(PD_COMPLEX64, PD_AVG, &ndt, &nop, &mult) ==
            NULL);
    T_CHECK(ndt == PD_NCCL_FLOAT32 && nop == PD_NCCL_AVG && mult == 2);
    T_CHECK(pd_ncomm_reduction(PD_COMPLEX128, PD_MAX, &ndt, &nop, &mult) !=
            NULL);
    /* bool as torch: logical or (SUM, MAX) and and (PRODUCT, MIN) */
    T_CHECK(pd_ncomm_reduction(PD_BOOL, PD_SUM, &ndt, &nop, &mult) == NULL);
    T_CHECK(ndt == PD_NCCL_UINT8 && nop == PD_NCCL_MAX);
    T_CHECK(pd_ncomm_reduction(PD_BOOL, PD_PRODUCT, &ndt, &nop, &mult) ==
            NULL);
    T_CHECK(nop == PD_NCCL_MIN);
    T_CHECK(pd_ncomm_reduction(PD_BOOL, PD_AVG, &ndt, &nop, &mult) != NULL);
    /* what NCCL lacks */
    const char *why = pd_ncomm_reduction(PD_INT16, PD_SUM, &ndt, &nop, &mult);
    T_CHECK(why != NULL && strstr(why, "int16") != NULL);
    why = pd_ncomm_reduction(PD_INT32, PD_BXOR, &ndt, &nop, &mult);
    T_CHECK(why != NULL && strstr(why, "BXOR") != NULL);
    T_CHECK(pd_ncomm_reduction(-1, PD_SUM, &ndt, &nop, &mult) != NULL);
    T_CHECK(pd_ncomm_reduction(PD_FLOAT32, PD_NREDOPS, &ndt, &nop, &mult) !=
            NULL);
}

static void
test_nccl_layouts(void)
{
    pd_ncomm c;
    memset(&c, 0, sizeof(c));
    c.size = 4;
    c.rank = 1;
    size_t splits[4] = {1, 2, 3, 4};
    pd_nlaunch L;
    memset(&L, 0, sizeof(L));
    L.kind = PD_K_ALLGATHER;
    L.nin = 1;
    L.nout = 4;
    T_CHECK(pd_ncomm_layout_ok(&c, &L));
    L.nout = 1;
    T_CHECK(pd_ncomm_layout_ok(&c, &L));
    L.nout = 2;
    T_CHECK(!pd_ncomm_layout_ok(&c, &L));
    /* gather: blocks on the root only */
    L.kind = PD_K_GATHER;
    L.root = 0;
    L.nout = 0;
    T_CHECK(pd_ncomm_layout_ok(&c, &L));
    L.root = 1;
    T_CHECK(!pd_ncomm_layout_ok(&c, &L));
    L.nout = 4;
    T_CHECK(pd_ncomm_layout_ok(&c, &L));
    /* all_to_all needs both splits */
    L.kind = PD_K_ALLTOALL;
    L.nin = 4;
    L.nout = 1;
    L.isplit = splits;
    T_CHECK(!pd_ncomm_layout_ok(&c, &L));
    L.osplit = splits;
    T_CHECK(pd_ncomm_layout_ok(&c, &L));
    L.kind = PD_K_REDUCE;
    L.nin = 1;
    T_CHECK(pd_ncomm_layout_ok(&c, &L));
    L.nin = 0;
    T_CHECK(!pd_ncomm_layout_ok(&c, &L));
}

static void
test_mpi_not_loaded(void)
{
    /* no MPI library in this process: a clear error, never a crash */
    T_ST(pd_mpi_load(0), PD_EBACKEND);
    T_MSG_HAS("no MPI library is loaded");
}

static void
test_mpi_check_one_rank(void)
{
    /* one rank: nothing to exchange, so no MPI call is made */
    pd_mpi_comm c;
    memset(&c, 0, sizeof(c));
    c.size = 1;
    c.timeout = 1.0;
    T_OK(pd_mpi_comm_init(&c));
    int err = 0;
    T_CHECK(pd_mpi_check(&c, PD_K_ALLREDUCE, PD_FLOAT32, PD_SUM, 0, 10, 0.0,
                         &err, NULL) == PD_MPI_OK);
    T_CHECK(c.seq == 1);
    int64_t want[PD_MPI_SIGN] = {1, PD_K_ALLREDUCE, PD_FLOAT32, PD_SUM, 0, 10};
    for (int i = 0; i < PD_MPI_SIGN; i++) {
        T_CHECK(c.sig[i] == want[i] && c.sig[PD_MPI_SIGN + i] == -want[i]);
    }
    pd_mpi_comm_free(&c);
}

int
main(void)
{
    T_RUN(test_nccl_reduction);
    T_RUN(test_nccl_layouts);
    T_RUN(test_mpi_not_loaded);
    T_RUN(test_mpi_check_one_rank);
    return pd_test_result();
}
