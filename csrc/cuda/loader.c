/* Run-time loading of libcudart and libnccl into the tables of cudawrap.h.
 *
 * Each library is loaded once per process under pthread_once: the candidate
 * paths of the first caller are tried in order (dlopen RTLD_NOW|RTLD_LOCAL,
 * then dlsym of every table entry, "cuda"/"nccl" + the field name); the first
 * candidate with every required symbol wins (for NCCL, also a version of at
 * least PD_NCCL_MIN_VERSION).  The outcome, the table or the report of every
 * candidate that failed ("<path>: <why>", one line each), is kept. */
#include "cudawrap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

typedef void (*pd_fn)(void);
/* POSIX guarantees dlsym's void * converts to a function pointer; the table
 * entries are filled with memcpy, which needs the two to be the same size. */
_Static_assert(sizeof(void *) == sizeof(pd_fn), "function pointers must fit void *");

typedef struct {
    const char *name; /* the exported symbol */
    size_t off;       /* its field in the table */
    int required;
} pd_sym;

#define CUDART_SYM(f, req) {"cuda" #f, offsetof(struct pd_cudart, f), req}
#define NCCL_SYM(f, req) {"nccl" #f, offsetof(struct pd_nccl, f), req}

static const pd_sym cudart_syms[] = {
    CUDART_SYM(GetDeviceCount, 1),        CUDART_SYM(GetDevice, 1),
    CUDART_SYM(SetDevice, 1),             CUDART_SYM(DeviceSynchronize, 1),
    CUDART_SYM(StreamCreateWithFlags, 1), CUDART_SYM(StreamDestroy, 1),
    CUDART_SYM(StreamSynchronize, 1),     CUDART_SYM(StreamQuery, 1),
    CUDART_SYM(StreamWaitEvent, 1),       CUDART_SYM(EventCreateWithFlags, 1),
    CUDART_SYM(EventDestroy, 1),          CUDART_SYM(EventRecord, 1),
    CUDART_SYM(EventQuery, 1),            CUDART_SYM(EventSynchronize, 1),
    CUDART_SYM(MemcpyAsync, 1),           CUDART_SYM(Malloc, 1),
    CUDART_SYM(Free, 1),                  CUDART_SYM(HostAlloc, 1),
    CUDART_SYM(FreeHost, 1),              CUDART_SYM(PointerGetAttributes, 1),
    CUDART_SYM(GetLastError, 1),          CUDART_SYM(GetErrorString, 1),
    CUDART_SYM(GetErrorName, 1),          CUDART_SYM(RuntimeGetVersion, 1),
    CUDART_SYM(DriverGetVersion, 1),
    CUDART_SYM(MemsetAsync, 0),           CUDART_SYM(LaunchHostFunc, 0),
};

static const pd_sym nccl_syms[] = {
    NCCL_SYM(GetVersion, 1),         NCCL_SYM(GetUniqueId, 1),
    NCCL_SYM(CommInitRank, 1),       NCCL_SYM(CommAbort, 1),
    NCCL_SYM(CommDestroy, 1),        NCCL_SYM(CommGetAsyncError, 1),
    NCCL_SYM(CommCount, 1),          NCCL_SYM(CommCuDevice, 1),
    NCCL_SYM(CommUserRank, 1),       NCCL_SYM(GetErrorString, 1),
    NCCL_SYM(AllReduce, 1),          NCCL_SYM(Broadcast, 1),
    NCCL_SYM(Reduce, 1),             NCCL_SYM(AllGather, 1),
    NCCL_SYM(ReduceScatter, 1),      NCCL_SYM(Send, 1),
    NCCL_SYM(Recv, 1),               NCCL_SYM(GroupStart, 1),
    NCCL_SYM(GroupEnd, 1),
    NCCL_SYM(CommInitRankConfig, 0), NCCL_SYM(CommSplit, 0),
    NCCL_SYM(CommFinalize, 0),       NCCL_SYM(GetLastError, 0),
};

/* Every field of the tables is a function pointer with an entry above. */
#define NSYMS(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(sizeof(struct pd_cudart) == NSYMS(cudart_syms) * sizeof(pd_fn),
               "cudart_syms must list every field of struct pd_cudart");
_Static_assert(sizeof(struct pd_nccl) == NSYMS(nccl_syms) * sizeof(pd_fn),
               "nccl_syms must list every field of struct pd_nccl");

#define REPORT_CAP 8192
#define PATH_CAP 4096

typedef struct pd_lib {
    const pd_sym *syms;
    size_t nsyms;
    void *table;
    /* NULL, or a check of an opened library before its symbols are read:
     * 0, or -1 with `why` filled */
    int (*check)(struct pd_lib *lib, void *handle, char *why, size_t cap);
    /* the first caller's candidates, read by the once routine */
    const char *const *paths;
    int n;
    /* the outcome */
    atomic_int loaded;
    void *handle; /* the library loaded */
    int version;
    char path[PATH_CAP];
    char report[REPORT_CAP];
    size_t used;
} pd_lib;

static struct pd_cudart cudart_table;
static struct pd_nccl nccl_table;

/* "2.x.y" for an ncclGetVersion code: X*10000+Y*100+Z since 2.9, before that
 * X*1000+Y*100+Z. */
static void
nccl_version_str(int v, char *buf, size_t cap)
{
    if (v >= 10000) {
        snprintf(buf, cap, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    } else {
        snprintf(buf, cap, "%d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
    }
}

/* Before the symbols, so that an old NCCL is named by its version rather
 * than by the first entry point it lacks. */
static int
nccl_check(pd_lib *lib, void *h, char *why, size_t cap)
{
    pd_nccl_res (*get_version)(int *);
    void *p = dlsym(h, "ncclGetVersion");
    if (p == NULL) {
        snprintf(why, cap, "loaded, but it lacks the symbol ncclGetVersion");
        return -1;
    }
    memcpy(&get_version, &p, sizeof(p));
    int v = 0;
    pd_nccl_res r = get_version(&v);
    if (r != PD_NCCL_SUCCESS) {
        snprintf(why, cap, "ncclGetVersion failed (ncclResult_t %d)", r);
        return -1;
    }
    if (v < PD_NCCL_MIN_VERSION) {
        char have[32], need[32];
        nccl_version_str(v, have, sizeof(have));
        nccl_version_str(PD_NCCL_MIN_VERSION, need, sizeof(need));
        snprintf(why, cap, "NCCL %s is too old: pyddp needs NCCL %s or later",
                 have, need);
        return -1;
    }
    lib->version = v;
    return 0;
}

static pd_lib cudart_lib = {cudart_syms, NSYMS(cudart_syms), &cudart_table,
                            NULL, NULL, 0, 0, NULL, 0, {0}, {0}, 0};
static pd_lib nccl_lib = {nccl_syms, NSYMS(nccl_syms), &nccl_table,
                          nccl_check, NULL, 0, 0, NULL, 0, {0}, {0}, 0};

/* One report line, "<path>: <why>", newlines in `why` made spaces. */
static void
report_line(pd_lib *lib, const char *path, const char *why)
{
    size_t room = sizeof(lib->report) - lib->used;
    int k = snprintf(lib->report + lib->used, room, "%s: %s\n", path, why);
    if (k < 0) {
        return;
    }
    size_t end = lib->used + ((size_t)k < room ? (size_t)k : room - 1);
    for (size_t i = lib->used; i + 1 < end; i++) {
        if (lib->report[i] == '\n') {
            lib->report[i] = ' ';
        }
    }
    lib->used = end;
}

/* Open `path` and fill the table; 0, or -1 with `why` filled. */
static int
try_path(pd_lib *lib, const char *path, char *why, size_t cap)
{
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(why, cap, "%s", e != NULL ? e : "dlopen failed");
        return -1;
    }
    if (lib->check != NULL && lib->check(lib, h, why, cap) < 0) {
        dlclose(h);
        return -1;
    }
    for (size_t i = 0; i < lib->nsyms; i++) {
        void *p = dlsym(h, lib->syms[i].name);
        if (p == NULL && lib->syms[i].required) {
            snprintf(why, cap, "loaded, but it lacks the symbol %s",
                     lib->syms[i].name);
            dlclose(h);
            return -1;
        }
        memcpy((char *)lib->table + lib->syms[i].off, &p, sizeof(p));
    }
    lib->handle = h;
    return 0; /* the handle stays open for the life of the process */
}

static void
load(pd_lib *lib)
{
    char why[1024];
    if (lib->n <= 0) {
        report_line(lib, "(no candidates)", "no library path was given");
    }
    for (int i = 0; i < lib->n; i++) {
        const char *path = lib->paths[i];
        if (try_path(lib, path, why, sizeof(why)) == 0) {
            snprintf(lib->path, sizeof(lib->path), "%s", path);
            atomic_store_explicit(&lib->loaded, 1, memory_order_release);
            break;
        }
        report_line(lib, path, why);
    }
}

/* Whether CUDA was used here, and whether this process was forked after it
 * was (CUDA cannot be used in a child forked after its parent initialised
 * it; a grandchild inherits both flags). */
static atomic_int cudart_used;
static atomic_int cudart_forked;

static void
cudart_after_fork_child(void)
{
    if (atomic_load(&cudart_used)) {
        atomic_store(&cudart_forked, 1);
    }
}

static void
cudart_once(void)
{
    load(&cudart_lib);
    if (atomic_load(&cudart_lib.loaded)) {
        pthread_atfork(NULL, NULL, cudart_after_fork_child);
    }
}
static void nccl_once(void) { load(&nccl_lib); }

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t cudart_done = PTHREAD_ONCE_INIT;
static pthread_once_t nccl_done = PTHREAD_ONCE_INIT;

static void
copy_out(char *dst, size_t cap, const char *src)
{
    if (dst != NULL && cap > 0) {
        snprintf(dst, cap, "%s", src);
    }
}

/* Run the once routine with the caller's candidates, then copy the kept
 * outcome out.  The mutex makes the candidates the once routine reads those
 * of the caller that runs it. */
static const void *
load_once(pd_lib *lib, pthread_once_t *once, void (*fn)(void),
          const char *const *paths, int n, char *report, size_t cap,
          char *loaded_path)
{
    pthread_mutex_lock(&load_mu);
    lib->paths = paths;
    lib->n = n;
    pthread_once(once, fn);
    lib->paths = NULL; /* the caller's array is not ours to keep */
    lib->n = 0;
    pthread_mutex_unlock(&load_mu);
    int ok = atomic_load_explicit(&lib->loaded, memory_order_acquire);
    copy_out(report, cap, lib->report);
    copy_out(loaded_path, cap, ok ? lib->path : "");
    return ok ? lib->table : NULL;
}

const struct pd_cudart *
pd_cudart_load(const char *const *paths, int n, char *report, size_t cap,
               char *loaded_path)
{
    return load_once(&cudart_lib, &cudart_done, cudart_once, paths, n, report,
                     cap, loaded_path);
}

const struct pd_nccl *
pd_nccl_load(const char *const *paths, int n, char *report, size_t cap,
             char *loaded_path, int *version)
{
    const struct pd_nccl *t = load_once(&nccl_lib, &nccl_done, nccl_once,
                                        paths, n, report, cap, loaded_path);
    if (version != NULL) {
        *version = t != NULL ? nccl_lib.version : 0;
    }
    return t;
}

const struct pd_cudart *
pd_cudart_get(void)
{
    return atomic_load_explicit(&cudart_lib.loaded, memory_order_acquire)
               ? &cudart_table
               : NULL;
}

void
pd_cudart_mark_used(void)
{
    atomic_store_explicit(&cudart_used, 1, memory_order_relaxed);
}

int
pd_cudart_fork_state(void)
{
    return atomic_load(&cudart_forked) ? 2 : atomic_load(&cudart_used) ? 1 : 0;
}

const struct pd_nccl *
pd_nccl_get(void)
{
    return atomic_load_explicit(&nccl_lib.loaded, memory_order_acquire)
               ? &nccl_table
               : NULL;
}

/* ------------------------------------------- the driver's context state */

typedef int (*pd_cu_device_get)(int *dev, int ordinal);
typedef int (*pd_cu_ctx_state)(int dev, unsigned *flags, int *active);
static pd_cu_device_get cu_device_get;
static pd_cu_ctx_state cu_ctx_state;
static pthread_once_t driver_done = PTHREAD_ONCE_INIT;

/* The driver's entry points, from libcuda.so.1 as the runtime loaded it
 * (RTLD_NOLOAD: never a second copy), or from the runtime library itself
 * when it exports them (the test stand-in). */
static void
driver_once(void)
{
    void *h = cudart_lib.handle;
    void *get = h != NULL ? dlsym(h, "cuDeviceGet") : NULL;
    void *state = h != NULL ? dlsym(h, "cuDevicePrimaryCtxGetState") : NULL;
    if (get == NULL || state == NULL) {
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        get = h != NULL ? dlsym(h, "cuDeviceGet") : NULL;
        state = h != NULL ? dlsym(h, "cuDevicePrimaryCtxGetState") : NULL;
    }
    if (get != NULL && state != NULL) {
        memcpy(&cu_device_get, &get, sizeof(get));
        memcpy(&cu_ctx_state, &state, sizeof(state));
    }
}

int
pd_cuda_ctx_active(int device)
{
    if (device < 0 || pd_cudart_get() == NULL) {
        return -1;
    }
    pthread_once(&driver_done, driver_once);
    if (cu_ctx_state == NULL) {
        return -1;
    }
    int dev = 0, active = 0;
    unsigned flags = 0;
    if (cu_device_get(&dev, device) != 0 || cu_ctx_state(dev, &flags, &active) != 0) {
        return -1;
    }
    return active != 0;
}
