/* The CUDA runtime and NCCL, loaded at run time (nothing in the build needs CUDA).
 *
 * libcudart and libnccl are opened with dlopen on first use and their entry
 * points copied into one table each, under pthread_once (NCCL's cudawrap is
 * the model).  Required symbols must all be present or loading fails naming
 * the missing one; optional symbols may be NULL and gate a feature (callers
 * test the pointer).  Only the types and constants pyddp uses are declared,
 * with their ABI values; the headers are not needed.
 *
 * Loading takes the candidate paths from the caller (the Python layer builds
 * the search order: PYDDP_*_LIBRARY, the NVIDIA pip wheels, torch's lib
 * directory, the system loader); a process loads each library once, and the
 * outcome (the table, or the report of every step that failed) is kept. */
#ifndef PD_CUDA_CUDAWRAP_H
#define PD_CUDA_CUDAWRAP_H

#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------- CUDA runtime */
typedef int pd_cuda_err;        /* cudaError_t */
typedef void *pd_cuda_stream;   /* cudaStream_t */
typedef void *pd_cuda_event;    /* cudaEvent_t */

enum {
    PD_CUDA_SUCCESS = 0,
    PD_CUDA_ERR_INVALID_VALUE = 1,
    PD_CUDA_ERR_INITIALIZATION = 3,
    PD_CUDA_ERR_INVALID_DEVICE = 101,
    PD_CUDA_ERR_INSUFFICIENT_DRIVER = 35,
    PD_CUDA_ERR_NO_DEVICE = 100,
    PD_CUDA_ERR_NOT_READY = 600,
};

#define PD_CUDA_STREAM_LEGACY ((pd_cuda_stream)0x1)
#define PD_CUDA_STREAM_PER_THREAD ((pd_cuda_stream)0x2)
#define PD_CUDA_STREAM_NON_BLOCKING 0x1u
#define PD_CUDA_EVENT_DISABLE_TIMING 0x2u
#define PD_CUDA_HOST_ALLOC_PORTABLE 0x1u

enum { /* cudaMemcpyKind */
    PD_CUDA_H2H = 0,
    PD_CUDA_H2D = 1,
    PD_CUDA_D2H = 2,
    PD_CUDA_D2D = 3,
    PD_CUDA_DEFAULT = 4,
};

enum { /* cudaMemoryType */
    PD_CUDA_MEM_UNREGISTERED = 0,
    PD_CUDA_MEM_HOST = 1,
    PD_CUDA_MEM_DEVICE = 2,
    PD_CUDA_MEM_MANAGED = 3,
};

typedef struct { /* cudaPointerAttributes (CUDA 11 and later) */
    int type;
    int device;
    void *device_pointer;
    void *host_pointer;
    long reserved[8];
} pd_cuda_ptr_attrs;

typedef void (*pd_cuda_host_fn)(void *user_data);

struct pd_cudart {
    /* required */
    pd_cuda_err (*GetDeviceCount)(int *count);
    pd_cuda_err (*GetDevice)(int *device);
    pd_cuda_err (*SetDevice)(int device);
    pd_cuda_err (*DeviceSynchronize)(void);
    pd_cuda_err (*StreamCreateWithFlags)(pd_cuda_stream *s, unsigned flags);
    pd_cuda_err (*StreamDestroy)(pd_cuda_stream s);
    pd_cuda_err (*StreamSynchronize)(pd_cuda_stream s);
    pd_cuda_err (*StreamQuery)(pd_cuda_stream s);
    pd_cuda_err (*StreamWaitEvent)(pd_cuda_stream s, pd_cuda_event e, unsigned flags);
    pd_cuda_err (*EventCreateWithFlags)(pd_cuda_event *e, unsigned flags);
    pd_cuda_err (*EventDestroy)(pd_cuda_event e);
    pd_cuda_err (*EventRecord)(pd_cuda_event e, pd_cuda_stream s);
    pd_cuda_err (*EventQuery)(pd_cuda_event e);
    pd_cuda_err (*EventSynchronize)(pd_cuda_event e);
    pd_cuda_err (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind,
                               pd_cuda_stream s);
    pd_cuda_err (*Malloc)(void **p, size_t n);
    pd_cuda_err (*Free)(void *p);
    pd_cuda_err (*HostAlloc)(void **p, size_t n, unsigned flags);
    pd_cuda_err (*FreeHost)(void *p);
    pd_cuda_err (*PointerGetAttributes)(pd_cuda_ptr_attrs *a, const void *p);
    pd_cuda_err (*GetLastError)(void);
    const char *(*GetErrorString)(pd_cuda_err e);
    const char *(*GetErrorName)(pd_cuda_err e);
    pd_cuda_err (*RuntimeGetVersion)(int *v);
    pd_cuda_err (*DriverGetVersion)(int *v);
    /* optional */
    pd_cuda_err (*MemsetAsync)(void *p, int value, size_t n, pd_cuda_stream s);
    pd_cuda_err (*LaunchHostFunc)(pd_cuda_stream s, pd_cuda_host_fn fn, void *data);
};

/* ---------------------------------------------------------------------- NCCL */
typedef int pd_nccl_res;   /* ncclResult_t */
typedef void *pd_nccl_comm; /* ncclComm_t */
typedef struct {
    char internal[128];
} pd_nccl_uid;

enum {
    PD_NCCL_SUCCESS = 0,
    PD_NCCL_UNHANDLED_CUDA = 1,
    PD_NCCL_SYSTEM = 2,
    PD_NCCL_INTERNAL = 3,
    PD_NCCL_INVALID_ARGUMENT = 4,
    PD_NCCL_INVALID_USAGE = 5,
    PD_NCCL_REMOTE = 6,
    PD_NCCL_IN_PROGRESS = 7,
    PD_NCCL_TIMEOUT = 8,
};

enum { /* ncclDataType_t */
    PD_NCCL_INT8 = 0,
    PD_NCCL_UINT8 = 1,
    PD_NCCL_INT32 = 2,
    PD_NCCL_UINT32 = 3,
    PD_NCCL_INT64 = 4,
    PD_NCCL_UINT64 = 5,
    PD_NCCL_FLOAT16 = 6,
    PD_NCCL_FLOAT32 = 7,
    PD_NCCL_FLOAT64 = 8,
    PD_NCCL_BFLOAT16 = 9,
};

enum { /* ncclRedOp_t */
    PD_NCCL_SUM = 0,
    PD_NCCL_PROD = 1,
    PD_NCCL_MAX = 2,
    PD_NCCL_MIN = 3,
    PD_NCCL_AVG = 4,
};

#define PD_NCCL_SPLIT_NOCOLOR (-1)
#define PD_NCCL_API_MAGIC 0xcafebeefu
#define PD_NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)

/* ncclConfig_t as NCCL 2.18 laid it out (the first fields of every later
 * layout; NCCL reads `size` and `version` to know which fields are present). */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cga_cluster_size;
    int min_ctas;
    int max_ctas;
    const char *net_name;
    int split_share;
} pd_nccl_config;

/* The config an initialiser passes: NCCL_CONFIG_INITIALIZER for the 2.18 layout
 * with `blocking` set, every byte zeroed first (NCCL copies the struct whole,
 * its padding included). */
static inline void
pd_nccl_config_init(pd_nccl_config *c, int blocking)
{
    memset(c, 0, sizeof(*c));
    c->size = sizeof(*c);
    c->magic = PD_NCCL_API_MAGIC;
    c->version = 21800;
    c->blocking = blocking;
    c->cga_cluster_size = PD_NCCL_CONFIG_UNDEF_INT;
    c->min_ctas = PD_NCCL_CONFIG_UNDEF_INT;
    c->max_ctas = PD_NCCL_CONFIG_UNDEF_INT;
    c->net_name = NULL;
    c->split_share = PD_NCCL_CONFIG_UNDEF_INT;
}

struct pd_nccl {
    /* required */
    pd_nccl_res (*GetVersion)(int *version);
    pd_nccl_res (*GetUniqueId)(pd_nccl_uid *id);
    pd_nccl_res (*CommInitRank)(pd_nccl_comm *comm, int nranks, pd_nccl_uid id,
                                int rank);
    pd_nccl_res (*CommAbort)(pd_nccl_comm comm);
    pd_nccl_res (*CommDestroy)(pd_nccl_comm comm);
    pd_nccl_res (*CommGetAsyncError)(pd_nccl_comm comm, pd_nccl_res *res);
    pd_nccl_res (*CommCount)(pd_nccl_comm comm, int *count);
    pd_nccl_res (*CommCuDevice)(pd_nccl_comm comm, int *device);
    pd_nccl_res (*CommUserRank)(pd_nccl_comm comm, int *rank);
    const char *(*GetErrorString)(pd_nccl_res res);
    pd_nccl_res (*AllReduce)(const void *send, void *recv, size_t count, int dtype,
                             int op, pd_nccl_comm comm, pd_cuda_stream s);
    pd_nccl_res (*Broadcast)(const void *send, void *recv, size_t count, int dtype,
                             int root, pd_nccl_comm comm, pd_cuda_stream s);
    pd_nccl_res (*Reduce)(const void *send, void *recv, size_t count, int dtype,
                          int op, int root, pd_nccl_comm comm, pd_cuda_stream s);
    pd_nccl_res (*AllGather)(const void *send, void *recv, size_t sendcount,
                             int dtype, pd_nccl_comm comm, pd_cuda_stream s);
    pd_nccl_res (*ReduceScatter)(const void *send, void *recv, size_t recvcount,
                                 int dtype, int op, pd_nccl_comm comm,
                                 pd_cuda_stream s);
    pd_nccl_res (*Send)(const void *buf, size_t count, int dtype, int peer,
                        pd_nccl_comm comm, pd_cuda_stream s);
    pd_nccl_res (*Recv)(void *buf, size_t count, int dtype, int peer,
                        pd_nccl_comm comm, pd_cuda_stream s);
    pd_nccl_res (*GroupStart)(void);
    pd_nccl_res (*GroupEnd)(void);
    /* optional */
    pd_nccl_res (*CommInitRankConfig)(pd_nccl_comm *comm, int nranks,
                                      pd_nccl_uid id, int rank,
                                      pd_nccl_config *config);
    pd_nccl_res (*CommSplit)(pd_nccl_comm comm, int color, int key,
                             pd_nccl_comm *newcomm, pd_nccl_config *config);
    pd_nccl_res (*CommFinalize)(pd_nccl_comm comm);
    const char *(*GetLastError)(pd_nccl_comm comm);
};

/* The oldest NCCL pyddp accepts (2.18.0). */
#define PD_NCCL_MIN_VERSION 21800

/* Load libcudart / libnccl once per process from `paths` (tried in order; a
 * path without '/' goes to the system loader's search).  Returns the table,
 * or NULL with `report` (NUL-terminated, at most `cap` bytes) listing each
 * path tried and why it failed.  Later calls return the first outcome, the
 * paths they pass ignored.  For NCCL, `*version` receives ncclGetVersion's
 * code and `loaded_path` (cap bytes) the file that was loaded; a version
 * below PD_NCCL_MIN_VERSION is refused (NULL, the report names it). */
const struct pd_cudart *pd_cudart_load(const char *const *paths, int n, char *report,
                                       size_t cap, char *loaded_path);
const struct pd_nccl *pd_nccl_load(const char *const *paths, int n, char *report,
                                   size_t cap, char *loaded_path, int *version);

/* Whether `device`'s primary context exists (1), does not (0), or cannot be
 * told (-1: no driver entry points, or the runtime is not loaded).  Asks the
 * driver (cuDevicePrimaryCtxGetState), which, unlike cudaSetDevice, never
 * creates a context: pyddp restores a caller's device only where it has one,
 * as torch's MaybeSetDevice. */
int pd_cuda_ctx_active(int device);

/* The tables once loaded successfully, else NULL (never loads). */
const struct pd_cudart *pd_cudart_get(void);
const struct pd_nccl *pd_nccl_get(void);

/* CUDA was used in this process (a device was found, or a call needing one
 * was made): a child forked from now on cannot use CUDA. */
void pd_cudart_mark_used(void);

/* 0: this process has not used CUDA through pyddp; 1: it has; 2: it was
 * forked after it (or its parent) had, and CUDA refuses to work in such a
 * child (cudaErrorInitializationError). */
int pd_cudart_fork_state(void);

#endif /* PD_CUDA_CUDAWRAP_H */
