/* Helpers shared by the files of csrc/nccl/ (not part of its API). */
#ifndef PD_NCCL_INTERNAL_H
#define PD_NCCL_INTERNAL_H

#include "comm.h"

void pd_nccl_nap(void);
/* Around every NCCL call that takes a communicator (comm.h: inside). */
#define PD_NCCL_ENTER(c)                                                     \
    do {                                                                     \
        if (atomic_fetch_add(&(c)->inside, 1) != 0) {                        \
            atomic_fetch_add(&(c)->overlaps, 1);                             \
        }                                                                    \
    } while (0)
#define PD_NCCL_LEAVE(c) atomic_fetch_sub(&(c)->inside, 1)
const char *pd_nccl_text(const struct pd_nccl *nc, pd_nccl_comm comm,
                         pd_nccl_res r, char *buf, size_t cap);
pd_status pd_ncomm_nccl_error(pd_ncomm *c, const char *what, pd_nccl_res r);
pd_status pd_ncomm_cuda_error(const struct pd_cudart *rt, const char *what,
                              pd_cuda_err e);
int pd_ncomm_dev_enter(pd_ncomm *c);
void pd_ncomm_dev_leave(pd_ncomm *c, int prev);
pd_nccl_res pd_ncomm_settle(pd_ncomm *c, pd_nccl_comm comm, double deadline);
void pd_ncomm_abort_now(pd_ncomm *c);
/* enqueue.c: the NCCL calls of one launch on s. */
pd_nccl_res pd_ncomm_enqueue(pd_ncomm *c, const pd_nlaunch *L,
                             pd_cuda_stream s, const char **what);
/* launch.c: the end-event pool. */
pd_cuda_event pd_ncomm_pool_get(pd_ncomm *c, pd_cuda_err *e);
void pd_ncomm_pool_put(pd_ncomm *c, pd_cuda_event ev);

#endif
