/* The kind-to-NCCL mapping: NCCL types and ops for pyddp's dtypes and
 * ReduceOps, the layouts each kind reads, and the NCCL calls (grouped where a
 * kind takes several) that run one launch (csrc/nccl/comm.h). */
#include "internal.h"

#include "../kernels/kernels.h"
#include "../util/kinds.h"

const char *
pd_ncomm_reduction(int dt, int op, int *ndt, int *nop, size_t *mult)
{
    static const int types[PD_NDTYPES] = {
        [PD_BOOL] = PD_NCCL_UINT8,       [PD_INT8] = PD_NCCL_INT8,
        [PD_UINT8] = PD_NCCL_UINT8,      [PD_INT16] = -1,
        [PD_UINT16] = -1,                [PD_INT32] = PD_NCCL_INT32,
        [PD_UINT32] = PD_NCCL_UINT32,    [PD_INT64] = PD_NCCL_INT64,
        [PD_UINT64] = PD_NCCL_UINT64,    [PD_FLOAT16] = PD_NCCL_FLOAT16,
        [PD_BFLOAT16] = PD_NCCL_BFLOAT16, [PD_FLOAT32] = PD_NCCL_FLOAT32,
        [PD_FLOAT64] = PD_NCCL_FLOAT64,  [PD_COMPLEX64] = PD_NCCL_FLOAT32,
        [PD_COMPLEX128] = PD_NCCL_FLOAT64,
    };
    static const int ops[PD_NREDOPS] = {
        [PD_SUM] = PD_NCCL_SUM, [PD_AVG] = PD_NCCL_AVG,
        [PD_PRODUCT] = PD_NCCL_PROD, [PD_MIN] = PD_NCCL_MIN,
        [PD_MAX] = PD_NCCL_MAX, [PD_BAND] = -1, [PD_BOR] = -1, [PD_BXOR] = -1,
    };
    if (dt < 0 || dt >= PD_NDTYPES || types[dt] < 0) {
        return "NCCL has no reductions on this dtype (int16 and uint16 can only "
               "be broadcast, gathered, scattered or sent)";
    }
    if (op < 0 || op >= PD_NREDOPS || ops[op] < 0) {
        return "NCCL supports ReduceOp SUM, AVG, PRODUCT, MIN and MAX (not "
               "BAND, BOR or BXOR)";
    }
    *ndt = types[dt];
    *nop = ops[op];
    *mult = 1;
    if (dt == PD_COMPLEX64 || dt == PD_COMPLEX128) {
        if (op != PD_SUM && op != PD_AVG) {
            return "complex tensors can only be reduced with SUM or AVG";
        }
        *mult = 2;
    }
    if (dt == PD_BOOL) { /* as torch: logical or / and */
        if (op == PD_SUM || op == PD_MAX) {
            *nop = PD_NCCL_MAX;
        }
        else if (op == PD_PRODUCT || op == PD_MIN) {
            *nop = PD_NCCL_MIN;
        }
        else {
            return "bool tensors cannot be reduced with AVG";
        }
    }
    return NULL;
}

/* The layouts the launch reads (the Python layer builds them). */
int
pd_ncomm_layout_ok(const pd_ncomm *c, const pd_nlaunch *L)
{
    ptrdiff_t n = c->size;
    int ok = 1;
    switch (L->kind) {
    case PD_K_ALLREDUCE: case PD_K_BROADCAST: case PD_K_RECV:
        ok = L->nout == 1;
        break;
    case PD_K_REDUCE:
        ok = L->nin == 1 && L->nout == 1;
        break;
    case PD_K_SEND:
        ok = L->nin == 1;
        break;
    case PD_K_ALLGATHER:
        ok = L->nin == 1 && (L->nout == 1 || L->nout == n);
        break;
    case PD_K_REDUCE_SCATTER:
        ok = L->nout == 1 && (L->nin == 1 || L->nin == n);
        break;
    case PD_K_GATHER:
        ok = L->nin == 1 && (c->rank == L->root ? L->nout == n : 1);
        break;
    case PD_K_SCATTER:
        ok = L->nout == 1 && (c->rank == L->root ? L->nin == n : 1);
        break;
    case PD_K_ALLTOALL:
        ok = (L->nin == 1 || L->nin == n) && (L->nout == 1 || L->nout == n) &&
             L->isplit != NULL && L->osplit != NULL;
        break;
    default:
        break;
    }
    return ok;
}

/* Enqueue the NCCL calls of one launch on s.  Returns the NCCL result or
 * -1 - cudaError for a CUDA call's failure. */
pd_nccl_res
pd_ncomm_enqueue(pd_ncomm *c, const pd_nlaunch *L, pd_cuda_stream s,
                 const char **what)
{
    const struct pd_nccl *nc = c->nc;
    pd_nccl_comm comm = c->comm;
    int n = c->size, me = c->rank;
    size_t bytes = L->count * L->itemsize;
    int ndt = PD_NCCL_UINT8, nop = PD_NCCL_SUM;
    size_t mult = 1;
    pd_nccl_res r = PD_NCCL_SUCCESS;
    pd_cuda_err e;
    if (pd_kind_has(L->kind, PD_KF_REDUCES)) {
        pd_ncomm_reduction(L->dtype, L->op, &ndt, &nop, &mult); /* checked */
    }
    size_t rcount = L->count * mult;
#define TRY(call, name)                                                    \
    do {                                                                   \
        *what = (name);                                                    \
        if ((r = (call)) != PD_NCCL_SUCCESS && r != PD_NCCL_IN_PROGRESS) { \
            goto out;                                                      \
        }                                                                  \
    } while (0)
#define COPY(dst, src, nb)                                                 \
    do {                                                                   \
        if ((nb) > 0 && (e = c->rt->MemcpyAsync((dst), (src), (nb),        \
                                                PD_CUDA_D2D, s))) {        \
            *what = "cudaMemcpyAsync";                                     \
            r = -1 - e;                                                    \
            goto out;                                                      \
        }                                                                  \
    } while (0)
    int grouped = 0;
    switch (L->kind) {
    case PD_K_ALLREDUCE:
        TRY(nc->AllReduce(L->nin ? L->ins[0] : L->outs[0], L->outs[0],
                          rcount, ndt, nop, comm, s), "ncclAllReduce");
        break;
    case PD_K_BROADCAST:
        TRY(nc->Broadcast(L->outs[0], L->outs[0], bytes, PD_NCCL_UINT8,
                          L->root, comm, s), "ncclBroadcast");
        break;
    case PD_K_REDUCE:
        TRY(nc->Reduce(L->ins[0], L->outs[0], rcount, ndt, nop, L->root, comm,
                       s), "ncclReduce");
        break;
    case PD_K_BARRIER:
        TRY(nc->AllReduce(c->scratch, c->scratch, 1, PD_NCCL_FLOAT32,
                          PD_NCCL_SUM, comm, s), "ncclAllReduce (barrier)");
        break;
    case PD_K_SEND:
        TRY(nc->Send(L->ins[0], bytes, PD_NCCL_UINT8, L->root, comm, s),
            "ncclSend");
        break;
    case PD_K_RECV:
        TRY(nc->Recv(L->outs[0], bytes, PD_NCCL_UINT8, L->root, comm, s),
            "ncclRecv");
        break;
    case PD_K_ALLGATHER:
        if (L->nout == 1) {
            TRY(nc->AllGather(L->ins[0], L->outs[0], bytes, PD_NCCL_UINT8,
                              comm, s), "ncclAllGather");
            break;
        }
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        for (int p = 0; p < n; p++) {
            TRY(nc->Broadcast(p == me ? L->ins[0] : L->outs[p], L->outs[p],
                              bytes, PD_NCCL_UINT8, p, comm, s),
                "ncclBroadcast (all_gather)");
        }
        break;
    case PD_K_REDUCE_SCATTER:
        if (L->nin == 1) {
            TRY(nc->ReduceScatter(L->ins[0], L->outs[0], rcount, ndt, nop,
                                  comm, s), "ncclReduceScatter");
            break;
        }
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        for (int p = 0; p < n; p++) {
            TRY(nc->Reduce(L->ins[p], L->outs[0], rcount, ndt, nop, p, comm,
                           s), "ncclReduce (reduce_scatter)");
        }
        break;
    case PD_K_GATHER:
    case PD_K_SCATTER: {
        int gather = L->kind == PD_K_GATHER;
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        if (me != L->root) {
            if (gather) {
                TRY(nc->Send(L->ins[0], bytes, PD_NCCL_UINT8, L->root, comm, s),
                    "ncclSend (gather)");
            }
            else {
                TRY(nc->Recv(L->outs[0], bytes, PD_NCCL_UINT8, L->root, comm,
                             s), "ncclRecv (scatter)");
            }
            break;
        }
        for (int p = 0; p < n; p++) {
            if (p == me) {
                COPY(gather ? L->outs[p] : L->outs[0],
                     gather ? L->ins[0] : L->ins[p], bytes);
            }
            else if (gather) {
                TRY(nc->Recv(L->outs[p], bytes, PD_NCCL_UINT8, p, comm, s),
                    "ncclRecv (gather)");
            }
            else {
                TRY(nc->Send(L->ins[p], bytes, PD_NCCL_UINT8, p, comm, s),
                    "ncclSend (scatter)");
            }
        }
        break;
    }
    case PD_K_ALLTOALL: {
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        size_t ioff = 0, ooff = 0;
        for (int p = 0; p < n; p++) {
            size_t ib = L->isplit ? L->isplit[p] : bytes;
            size_t ob = L->osplit ? L->osplit[p] : bytes;
            char *ip = L->nin == 1 ? (char *)L->ins[0] + ioff : L->ins[p];
            char *op = L->nout == 1 ? (char *)L->outs[0] + ooff : L->outs[p];
            ioff += ib;
            ooff += ob;
            if (p == me) {
                COPY(op, ip, ib < ob ? ib : ob);
                continue;
            }
            if (ib > 0) {
                TRY(nc->Send(ip, ib, PD_NCCL_UINT8, p, comm, s),
                    "ncclSend (all_to_all)");
            }
            if (ob > 0) {
                TRY(nc->Recv(op, ob, PD_NCCL_UINT8, p, comm, s),
                    "ncclRecv (all_to_all)");
            }
        }
        break;
    }
    case PD_K_NONE: /* batched point-to-point */
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        for (int i = 0; i < L->np2p; i++) {
            if (L->p2p_send[i]) {
                TRY(nc->Send(L->p2p_ptr[i], L->p2p_bytes[i], PD_NCCL_UINT8,
                             L->p2p_peer[i], comm, s), "ncclSend");
            }
            else {
                TRY(nc->Recv(L->p2p_ptr[i], L->p2p_bytes[i], PD_NCCL_UINT8,
                             L->p2p_peer[i], comm, s), "ncclRecv");
            }
        }
        break;
    default:
        *what = "launch";
        r = PD_NCCL_INVALID_ARGUMENT;
        break;
    }
out:
    if (grouped) {
        pd_nccl_res g = nc->GroupEnd();
        if (r == PD_NCCL_SUCCESS || r == PD_NCCL_IN_PROGRESS) {
            *what = "ncclGroupEnd";
            r = g;
        }
    }
    return r;
#undef TRY
#undef COPY
}
