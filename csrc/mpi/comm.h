/* Backend "mpi"'s core: the calls on its hot path made from C, no Python.h
 * (csrc/python/mpi.c binds them as _C.MpiComm).
 *
 * pyddp/distributed/backends/mpi/backend.py reaches MPI through mpi4py, which finds the
 * site's MPI and knows its ABI.  Each mpi4py call costs about 1-2 us of
 * argument handling, more than a small MPI_Allreduce itself (0.5 us between
 * two ranks of one host), and the signature check (one nonblocking
 * allreduce polled until done) costs about 30 us when polled from Python
 * against 2 us from C.  So the check and the small blocking collectives on
 * plain CPU arrays call MPI from here, on the library mpi4py already loaded
 * (found among the process's loaded objects by its MPI_Allreduce symbol,
 * never linked: pyddp builds without MPI) and on handles mpi4py gives
 * (communicators, datatypes, ops as integers).
 *
 * Handles are pointers in Open MPI's ABI and ints in MPICH's (mpi4py's
 * _sizeof says which): the entry points are called through one of two
 * prototype sets accordingly.  MPI_Request storage is 8 bytes (either ABI);
 * statuses are given a buffer larger than either ABI's MPI_Status. */
#ifndef PD_MPI_COMM_H
#define PD_MPI_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "../util/status.h"

#define PD_MPI_NDT 16 /* pyddp dtype codes */
#define PD_MPI_NOPS 8 /* pyddp reduce op codes */
/* signature fields: seq, kind, dtype, op, root, count */
#define PD_MPI_SIGN 6

/* Outcomes: the check's (PD_MPI_OK .. PD_MPI_MISMATCH, as _C.MpiComm.check
 * returns them), a Ctrl-C, and an error of the collective's own MPI call. */
enum { PD_MPI_OK = 0, PD_MPI_ERROR = 1, PD_MPI_TIMEOUT = 2,
       PD_MPI_MISMATCH = 3, PD_MPI_INTERRUPTED = 4, PD_MPI_CALL_ERROR = 5 };

typedef struct pd_mpi_comm {
    intptr_t coll, aux;     /* communicator handles */
    intptr_t in_place;      /* MPI_IN_PLACE's value */
    intptr_t sig_type;      /* MPI_INT64_T */
    /* dtype code -> MPI datatype (0: not here) */
    intptr_t types[PD_MPI_NDT];
    /* (dtype, op) -> MPI op (0: not here) */
    intptr_t ops[PD_MPI_NDT][PD_MPI_NOPS];
    int rank, size, check;
    double timeout;
    int failed;             /* the group failed: everything goes to Python */
    long long seq;
    /* the check's buffers (2 * SIGN int64 each: this rank's signature, the
     * running MIN, a peer's); left to MPI (leaked) when a check is
     * abandoned (timeout, Ctrl-C) with a request still pending */
    int64_t *sig, *sigr, *sigp;
} pd_mpi_comm;

/* Find the MPI library loaded in this process and resolve its entry points
 * (once; int_handles: MPICH's ABI).  PD_EINVAL when a later call names the
 * other ABI; PD_EBACKEND when no MPI is loaded or it lacks an entry point. */
pd_status pd_mpi_load(int int_handles);
/* Allocate c's check buffers (c zeroed, its fields set by the caller). */
pd_status pd_mpi_comm_init(pd_mpi_comm *c);
void pd_mpi_comm_free(pd_mpi_comm *c);

/* How the check's waits treat the caller (the binding: the GIL). */
typedef struct pd_mpi_waiter {
    void (*enter)(void *ctx);       /* before a wait (releases the GIL) */
    void (*leave)(void *ctx);       /* after it (takes the GIL back) */
    int (*interrupted)(void *ctx);  /* every 50 ms once the wait sleeps:
                                       1 ends it (a signal's exception) */
    void *ctx;
} pd_mpi_waiter;

/* The signature check of one collective: PD_MPI_OK, or a failure outcome
 * (*mpi_err set for PD_MPI_ERROR; PD_MPI_INTERRUPTED when w->interrupted
 * said so).  w may be NULL: nothing to release, never interrupted. */
int pd_mpi_check(pd_mpi_comm *c, int kind, int dtype, long op, long root,
                 long long count, double timeout, int *mpi_err,
                 const pd_mpi_waiter *w);

/* The blocking collectives on c's communicator: MPI's return code. */
int pd_mpi_allreduce_inplace(pd_mpi_comm *c, void *buf, int n, intptr_t dt,
                             intptr_t op);
int pd_mpi_bcast(pd_mpi_comm *c, void *buf, int n, intptr_t dt, int root);
int pd_mpi_barrier(pd_mpi_comm *c);

/* MPI's text for an error code. */
void pd_mpi_error_text(int err, char *text, size_t cap);

#endif
