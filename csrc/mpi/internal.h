/* Helpers shared by the files of csrc/mpi/ (not part of its API). */
#ifndef PD_MPI_INTERNAL_H
#define PD_MPI_INTERNAL_H

#include "comm.h"

/* an MPI_Request of either ABI (int or pointer) */
typedef intptr_t pd_mpi_req;

int pd_mpi_isend(const void *b, int n, intptr_t dt, int to, int tag,
                 intptr_t comm, pd_mpi_req *req);
int pd_mpi_irecv(void *b, int n, intptr_t dt, int from, int tag,
                 intptr_t comm, pd_mpi_req *req);
int pd_mpi_test(pd_mpi_req *req, int *flag, void *status);

#endif
