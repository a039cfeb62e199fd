/* The MPI library mpi4py loaded: found by its symbols among the process's
 * loaded objects, its entry points called through the prototypes of its
 * ABI (csrc/mpi/comm.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "internal.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Prototypes with pointer handles (Open MPI) and with int handles (MPICH,
 * Intel MPI). */
typedef struct {
    int (*allreduce)(const void *, void *, int, void *, void *, void *);
    int (*bcast)(void *, int, void *, int, void *);
    int (*barrier)(void *);
    int (*isend)(const void *, int, void *, int, int, void *, pd_mpi_req *);
    int (*irecv)(void *, int, void *, int, int, void *, pd_mpi_req *);
} mpi_ptr_abi;

typedef struct {
    int (*allreduce)(const void *, void *, int, int, int, int);
    int (*bcast)(void *, int, int, int, int);
    int (*barrier)(int);
    int (*isend)(const void *, int, int, int, int, int, pd_mpi_req *);
    int (*irecv)(void *, int, int, int, int, int, pd_mpi_req *);
} mpi_int_abi;

typedef struct {
    void *lib;
    int int_handles; /* 1: MPICH's ABI */
    mpi_ptr_abi p;
    mpi_int_abi i;
    int (*test)(pd_mpi_req *, int *, void *);
    int (*error_string)(int, char *, int *);
} mpi_lib;

static mpi_lib lib; /* resolved once (load_mu), then only read */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static int
find_mpi(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    void **out = data;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') {
        return 0;
    }
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL) {
        return 0;
    }
    if (dlsym(h, "MPI_Iallreduce") != NULL && dlsym(h, "MPI_Test") != NULL) {
        *out = h;
        return 1;
    }
    dlclose(h);
    return 0;
}

/* POSIX: dlsym's void * converts to a function pointer. */
#define SYM(field, name)                                                     \
    do {                                                                     \
        void *s_ = dlsym(h, name);                                           \
        if (s_ == NULL) {                                                    \
            goto missing;                                                    \
        }                                                                    \
        memcpy(&(field), &s_, sizeof(s_));                                   \
    } while (0)

static pd_status
load_locked(int int_handles)
{
    if (lib.lib != NULL) {
        if (lib.int_handles != int_handles) {
            return pd_error(PD_EINVAL,
                            "MpiComm: handle_size differs from the first "
                            "MpiComm's (one MPI per process)");
        }
        return PD_OK;
    }
    void *h = NULL;
    dl_iterate_phdr(find_mpi, &h);
    if (h == NULL) {
        return pd_error(PD_EBACKEND,
                        "backend 'mpi': no MPI library is loaded in this "
                        "process (import mpi4py.MPI first)");
    }
    mpi_lib l;
    memset(&l, 0, sizeof(l));
    l.int_handles = int_handles;
    if (int_handles) {
        SYM(l.i.allreduce, "MPI_Allreduce");
        SYM(l.i.bcast, "MPI_Bcast");
        SYM(l.i.barrier, "MPI_Barrier");
        SYM(l.i.isend, "MPI_Isend");
        SYM(l.i.irecv, "MPI_Irecv");
    }
    else {
        SYM(l.p.allreduce, "MPI_Allreduce");
        SYM(l.p.bcast, "MPI_Bcast");
        SYM(l.p.barrier, "MPI_Barrier");
        SYM(l.p.isend, "MPI_Isend");
        SYM(l.p.irecv, "MPI_Irecv");
    }
    SYM(l.test, "MPI_Test");
    SYM(l.error_string, "MPI_Error_string");
    l.lib = h;
    lib = l;
    return PD_OK;
missing:
    dlclose(h);
    return pd_error(PD_EBACKEND,
                    "backend 'mpi': the loaded MPI library lacks an entry "
                    "point pyddp calls (MPI_Allreduce, MPI_Bcast, "
                    "MPI_Barrier, MPI_Isend, MPI_Irecv, MPI_Test, "
                    "MPI_Error_string)");
}

pd_status
pd_mpi_load(int int_handles)
{
    pthread_mutex_lock(&load_mu);
    pd_status st = load_locked(int_handles);
    pthread_mutex_unlock(&load_mu);
    return st;
}

#define HANDLE_P(x) ((void *)(x))
#define HANDLE_I(x) ((int)(x))

static int
call_allreduce(const void *s, void *r, int n, intptr_t dt, intptr_t op,
               intptr_t comm)
{
    return lib.int_handles
               ? lib.i.allreduce(s, r, n, HANDLE_I(dt), HANDLE_I(op),
                                 HANDLE_I(comm))
               : lib.p.allreduce(s, r, n, HANDLE_P(dt), HANDLE_P(op),
                                 HANDLE_P(comm));
}

static int
call_bcast(void *b, int n, intptr_t dt, int root, intptr_t comm)
{
    return lib.int_handles
               ? lib.i.bcast(b, n, HANDLE_I(dt), root, HANDLE_I(comm))
               : lib.p.bcast(b, n, HANDLE_P(dt), root, HANDLE_P(comm));
}

static int
call_barrier(intptr_t comm)
{
    return lib.int_handles ? lib.i.barrier(HANDLE_I(comm))
                           : lib.p.barrier(HANDLE_P(comm));
}

int
pd_mpi_isend(const void *b, int n, intptr_t dt, int to, int tag,
             intptr_t comm, pd_mpi_req *req)
{
    return lib.int_handles
               ? lib.i.isend(b, n, HANDLE_I(dt), to, tag, HANDLE_I(comm), req)
               : lib.p.isend(b, n, HANDLE_P(dt), to, tag, HANDLE_P(comm),
                             req);
}

int
pd_mpi_irecv(void *b, int n, intptr_t dt, int from, int tag,
             intptr_t comm, pd_mpi_req *req)
{
    return lib.int_handles
               ? lib.i.irecv(b, n, HANDLE_I(dt), from, tag, HANDLE_I(comm),
                             req)
               : lib.p.irecv(b, n, HANDLE_P(dt), from, tag, HANDLE_P(comm),
                             req);
}

int
pd_mpi_allreduce_inplace(pd_mpi_comm *c, void *buf, int n, intptr_t dt,
                         intptr_t op)
{
    return call_allreduce((const void *)c->in_place, buf, n, dt, op, c->coll);
}

int
pd_mpi_bcast(pd_mpi_comm *c, void *buf, int n, intptr_t dt, int root)
{
    return call_bcast(buf, n, dt, root, c->coll);
}

int
pd_mpi_barrier(pd_mpi_comm *c)
{
    return call_barrier(c->coll);
}

int
pd_mpi_test(pd_mpi_req *req, int *flag, void *status)
{
    return lib.test(req, flag, status);
}

/* MPI's text for an error code. */
void
pd_mpi_error_text(int err, char *text, size_t cap)
{
    int len = 0;
    if (lib.error_string(err, text, &len) != 0 || len < 0 ||
        (size_t)len >= cap) {
        snprintf(text, cap, "MPI error code %d", err);
    }
    else {
        text[len] = '\0';
    }
}
