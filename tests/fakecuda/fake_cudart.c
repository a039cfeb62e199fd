/* libcudart.so.13 for tests: the CUDA runtime entry points pyddp uses
 * (csrc/cuda/cudawrap.h), with CUDA's ABI and error codes, on a machine
 * without a GPU.
 *
 * - FAKECUDA_DEVICES (default 2) devices; 0 makes every call fail with
 *   cudaErrorNoDevice.  The current device is per thread.
 * - "Device" memory is host memory the host cannot read: a cudaMalloc pointer
 *   is an address in a PROT_NONE reservation (reading or writing it from the
 *   host faults, as on a GPU), backed by a shadow block that only this
 *   library's copies and fake_nccl's kernels touch (fakecuda_host translates).
 *   Blocks are recorded with their device (cudaPointerGetAttributes answers
 *   type 2 and the device), filled with 0xCB (uninitialised); freed blocks are
 *   poisoned with 0xDD and kept a while, so work that runs after its buffer
 *   was freed is caught.  cudaHostAlloc memory is plain host memory.
 * - A stream is a worker thread running its FIFO of tasks.  The legacy default
 *   stream (0 or 0x1, one per device) synchronises with the blocking streams
 *   of its device, as CUDA's does; 0x2 is one per-thread default stream per
 *   device.  An event is a position in a stream's FIFO.
 * - A task touching a device range that is not inside a live block is an
 *   illegal memory access: it is skipped, stderr names it, and the process's
 *   sticky error becomes cudaErrorIllegalAddress (700).
 * - An event belongs to the device current when it was created: recording it
 *   on another device's stream is cudaErrorInvalidResourceHandle, as in CUDA
 *   (a stream may wait on another device's event: CUDA allows that).
 * - cudaFreeHost waits for the work of every stream first, as CUDA's does;
 *   cudaFree for the streams of the memory's device (an implicit device sync).
 * - Test-only exports: fakecudaStreamSleep (a slow kernel), fakecudaFreeUnsynced
 *   (a caching allocator's free), fakecudaMemStats,
 *   fakecudaStreamCount, fakecudaHostFreeCount, fakecudaClearError.
 * A child forked after this process initialised CUDA (any call but the
 * version and error-string queries) gets cudaErrorInitializationError from
 * every call but cudaGetDeviceCount, as with CUDA 13 (seen on an H100); a
 * child forked before gets a fresh start. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define STREAM_LEGACY ((cudaStream_t)0x1)
#define STREAM_PER_THREAD ((cudaStream_t)0x2)
#define ALIGN 256
#define QUARANTINE_BYTES ((size_t)64 << 20)
#define EVENT_MAGIC 0x45564e54u

/* ------------------------------------------------------------------ errors */

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    {0, "cudaSuccess", "no error"},
    {1, "cudaErrorInvalidValue", "invalid argument"},
    {2, "cudaErrorMemoryAllocation", "out of memory"},
    {3, "cudaErrorInitializationError", "initialization error"},
    {21, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {100, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {101, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {600, "cudaErrorNotReady", "device not ready"},
    {700, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
};

static _Atomic int sticky;
static _Atomic int initialised; /* a call used CUDA in this process */
static int forked_after_init;   /* this process was forked after its parent's did */
static _Atomic long host_frees; /* cudaFreeHost calls that freed a block */
static _Thread_local cudaError_t last_error;
static _Thread_local int cur_dev;

/* Every call's result passes here: the last error is remembered per thread
 * (cudaErrorNotReady is a status, not an error). */
static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess && e != cudaErrorNotReady)
        last_error = e;
    return e;
}

static int ndev(void)
{
    const char *s = getenv("FAKECUDA_DEVICES");
    if (!s || !*s)
        return 2;
    char *end;
    long n = strtol(s, &end, 10);
    if (*end || n < 0)
        return 0;
    return n > MAX_DEVICES ? MAX_DEVICES : (int)n;
}

/* CUDA cannot be used in a child forked after the parent initialised it. */
static cudaError_t init_check(void)
{
    if (forked_after_init)
        return cudaErrorInitializationError;
    atomic_store(&initialised, 1);
    return cudaSuccess;
}

/* Devices with a primary context, as the runtime creates them: cudaSetDevice
 * (CUDA 12+) and the first call that needs a device, on the calling thread's
 * current device (device 0 in a thread that never set one). */
static _Atomic unsigned long long contexts;

/* What every call checks first. */
static cudaError_t status(void)
{
    cudaError_t e = init_check();
    if (e)
        return e;
    return ndev() == 0 ? cudaErrorNoDevice : atomic_load(&sticky);
}

/* What every call that needs a device checks first (it makes the current
 * device's context). */
static cudaError_t ready(void)
{
    cudaError_t e = status();
    if (e != cudaErrorNoDevice && e != cudaErrorInitializationError)
        atomic_fetch_or(&contexts, 1ull << cur_dev);
    return e;
}

/* ------------------------------------------------- global state (g_mu) */

enum { LEGACY, PER_THREAD, CREATED };

struct task {
    struct task *next;
    void (*run)(void *);
    void *arg;
};

struct stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct task *head, *tail;
    uint64_t queued, done; /* tasks appended / finished (under mu) */
    int device, kind, blocking, closing;
    unsigned gen; /* the fork generation it belongs to */
};

struct event {
    unsigned magic, flags;
    int device;       /* current when it was created */
    struct stream *s; /* where it was last recorded (NULL: never) */
    uint64_t seq;     /* complete once s->done reaches it */
};

struct block {
    char *p;      /* the address handed out */
    size_t n;
    int device, type;
    char *shadow; /* where the bytes are (p itself for host memory) */
    size_t span;  /* bytes of p's PROT_NONE reservation (0: none) */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned gen;                  /* bumped in a forked child */
static struct stream **streams;       /* every stream of this generation */
static int nstreams, capstreams;
static struct stream *defaults[2][MAX_DEVICES]; /* [LEGACY / PER_THREAD][device] */
static struct block *blocks;          /* live allocations, sorted by address */
static int nblocks, capblocks;
static struct block quarantine[256];  /* freed, poisoned, not yet returned */
static int qhead, qcount;
static size_t qbytes;

static void grow(void **arr, int *cap, int n, size_t elem)
{
    if (n < *cap)
        return;
    int c = *cap ? 2 * *cap : 16;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p) {
        perror("fakecuda");
        abort();
    }
    *arr = p;
    *cap = c;
}

static void before_fork(void) { pthread_mutex_lock(&g_mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&g_mu); }

static void after_fork_child(void)
{
    /* The parent's worker threads do not exist here: start afresh. */
    gen++;
    nstreams = 0;
    forked_after_init |= atomic_load(&initialised);
    memset(defaults, 0, sizeof defaults);
    pthread_mutex_unlock(&g_mu);
}

__attribute__((constructor)) static void init(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* --------------------------------------------------------------- streams */

static void *worker(void *arg)
{
    struct stream *s = arg;
    cur_dev = s->device;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->closing)
            pthread_cond_wait(&s->cv, &s->mu);
        struct task *t = s->head;
        if (!t)
            break;
        pthread_mutex_unlock(&s->mu);
        t->run(t->arg);
        pthread_mutex_lock(&s->mu);
        s->head = t->next;
        if (!s->head)
            s->tail = NULL;
        s->done++;
        pthread_cond_broadcast(&s->cv);
        free(t);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Under g_mu. */
static struct stream *stream_new(int device, int kind, int blocking)
{
    struct stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->device = device;
    s->kind = kind;
    s->blocking = blocking;
    s->gen = gen;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, worker, s);
    pthread_attr_destroy(&attr);
    if (rc) {
        free(s);
        return NULL;
    }
    grow((void **)&streams, &capstreams, nstreams, sizeof *streams);
    streams[nstreams++] = s;
    return s;
}

/* The stream a handle names on the calling thread. */
static cudaError_t resolve(cudaStream_t h, struct stream **out)
{
    cudaError_t e = ready();
    if (e)
        return e;
    struct stream *s = NULL;
    pthread_mutex_lock(&g_mu);
    if (h == NULL || h == STREAM_LEGACY || h == STREAM_PER_THREAD) {
        int kind = h == STREAM_PER_THREAD ? PER_THREAD : LEGACY;
        struct stream **d = &defaults[kind][cur_dev];
        if (!*d)
            *d = stream_new(cur_dev, kind, 1);
        s = *d;
        e = s ? cudaSuccess : cudaErrorMemoryAllocation;
    } else {
        for (int i = 0; i < nstreams && !s; i++)
            if (streams[i] == (struct stream *)h && !streams[i]->closing)
                s = streams[i];
        e = s ? cudaSuccess : cudaErrorInvalidResourceHandle;
    }
    pthread_mutex_unlock(&g_mu);
    *out = s;
    return e;
}

/* Append a task; *seq (if given) receives its position. */
static int append(struct stream *s, void (*run)(void *), void *arg, uint64_t *seq)
{
    struct task *t = malloc(sizeof *t);
    if (!t)
        return -1;
    t->next = NULL;
    t->run = run;
    t->arg = arg;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    uint64_t q = ++s->queued;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (seq)
        *seq = q;
    return 0;
}

static void wait_done(struct stream *s, uint64_t seq)
{
    if (s->gen != gen) /* a stream of the parent process */
        return;
    pthread_mutex_lock(&s->mu);
    while (s->done < seq)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static int is_done(struct stream *s, uint64_t seq)
{
    if (s->gen != gen)
        return 1;
    pthread_mutex_lock(&s->mu);
    int done = s->done >= seq;
    pthread_mutex_unlock(&s->mu);
    return done;
}

static uint64_t last_queued(struct stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t q = s->queued;
    pthread_mutex_unlock(&s->mu);
    return q;
}

struct wait {
    struct stream *s;
    uint64_t seq;
};

static void run_wait(void *arg)
{
    struct wait *w = arg;
    wait_done(w->s, w->seq);
    free(w);
}

/* Make s wait (a task) for the work queued on t so far. */
static int wait_for(struct stream *s, struct stream *t, uint64_t seq)
{
    if (t == s || is_done(t, seq))
        return 0;
    struct wait *w = malloc(sizeof *w);
    if (!w)
        return -1;
    w->s = t;
    w->seq = seq;
    if (append(s, run_wait, w, NULL)) {
        free(w);
        return -1;
    }
    return 0;
}

/* Append a task after the legacy default stream's implicit synchronisation:
 * legacy work waits for all blocking streams of its device, and blocking
 * streams' work waits for the legacy stream. */
static cudaError_t push(struct stream *s, void (*run)(void *), void *arg, uint64_t *seq)
{
    int fail = 0;
    pthread_mutex_lock(&g_mu);
    if (s->kind == LEGACY) {
        for (int i = 0; i < nstreams; i++)
            if (streams[i]->device == s->device && streams[i]->blocking)
                fail |= wait_for(s, streams[i], last_queued(streams[i]));
    } else if (s->blocking && defaults[LEGACY][s->device]) {
        struct stream *l = defaults[LEGACY][s->device];
        fail |= wait_for(s, l, last_queued(l));
    }
    pthread_mutex_unlock(&g_mu);
    if (fail || append(s, run, arg, seq))
        return cudaErrorMemoryAllocation;
    return cudaSuccess;
}

cudaError_t fakecuda_enqueue(cudaStream_t h, void (*run)(void *), void *arg)
{
    struct stream *s;
    cudaError_t e = resolve(h, &s);
    return e ? e : push(s, run, arg, NULL);
}

/* -------------------------------------------------------------- memory */

/* Index of the block containing p, or -1.  Under g_mu. */
static int find(const void *p)
{
    int lo = 0, hi = nblocks - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const char *b = blocks[mid].p;
        if ((const char *)p < b)
            hi = mid - 1;
        else if ((const char *)p >= b + (blocks[mid].n ? blocks[mid].n : 1))
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

/* -1: p is in no block; 0: [p, p+n) overruns its block; 1: inside. */
static int lookup(const void *p, size_t n, int *device, int *type)
{
    pthread_mutex_lock(&g_mu);
    int i = find(p), r = -1;
    if (i >= 0) {
        r = (size_t)((const char *)p - blocks[i].p) + n <= blocks[i].n;
        if (device)
            *device = blocks[i].device;
        if (type)
            *type = blocks[i].type;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

int fakecuda_accessible(const void *p, size_t n, int *device)
{
    return lookup(p, n, device, NULL) == 1;
}

void *fakecuda_host(const void *p)
{
    pthread_mutex_lock(&g_mu);
    int i = find(p);
    char *h = i >= 0 ? blocks[i].shadow + ((const char *)p - blocks[i].p) : (char *)p;
    pthread_mutex_unlock(&g_mu);
    return h;
}

void fakecuda_fault(const char *what, const void *p, size_t n)
{
    fprintf(stderr,
            "fakecuda: %s: illegal memory access at %p (%zu bytes): not inside a live "
            "cudaMalloc/cudaHostAlloc block\n",
            what, p, n);
    atomic_store(&sticky, cudaErrorIllegalAddress);
}

static cudaError_t alloc(void **p, size_t n, int type)
{
    if (!p)
        return cudaErrorInvalidValue;
    cudaError_t e = ready();
    if (e)
        return e;
    *p = NULL;
    if (n == 0)
        return cudaSuccess;
    char *shadow = aligned_alloc(ALIGN, (n + ALIGN - 1) / ALIGN * ALIGN);
    if (!shadow)
        return cudaErrorMemoryAllocation;
    memset(shadow, 0xCB, n);
    char *m = shadow;
    size_t span = 0;
    if (type == 2) { /* device memory: an address the host cannot touch */
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        span = (n + page - 1) / page * page;
        void *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r == MAP_FAILED) {
            free(shadow);
            return cudaErrorMemoryAllocation;
        }
        m = r;
    }
    pthread_mutex_lock(&g_mu);
    grow((void **)&blocks, &capblocks, nblocks, sizeof *blocks);
    int i = nblocks;
    while (i > 0 && blocks[i - 1].p > m) {
        blocks[i] = blocks[i - 1];
        i--;
    }
    blocks[i] = (struct block){m, n, cur_dev, type, shadow, span};
    nblocks++;
    pthread_mutex_unlock(&g_mu);
    *p = m;
    return cudaSuccess;
}

static cudaError_t release(void *p, int type)
{
    cudaError_t e = init_check();
    if (e || !p)
        return e;
    pthread_mutex_lock(&g_mu);
    int i = find(p);
    if (i < 0 || blocks[i].p != p || blocks[i].type != type) {
        pthread_mutex_unlock(&g_mu);
        return cudaErrorInvalidValue;
    }
    struct block b = blocks[i];
    memmove(blocks + i, blocks + i + 1, (size_t)(nblocks - i - 1) * sizeof *blocks);
    nblocks--;
    memset(b.shadow, 0xDD, b.n);
    int cap = (int)(sizeof quarantine / sizeof *quarantine);
    while (qcount && (qcount == cap || qbytes + b.n > QUARANTINE_BYTES)) {
        free(quarantine[qhead].shadow);
        if (quarantine[qhead].span)
            munmap(quarantine[qhead].p, quarantine[qhead].span);
        qbytes -= quarantine[qhead].n;
        qhead = (qhead + 1) % cap;
        qcount--;
    }
    quarantine[(qhead + qcount++) % cap] = b;
    qbytes += b.n;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) { return ret(alloc(p, n, 2)); }
static cudaError_t sync_streams(int device);

/* As CUDA's cudaFree: an implicit synchronisation of the device the memory is
 * on (every stream of it, so a stuck kernel of anyone's makes it wait). */
cudaError_t cudaFree(void *p)
{
    int device = -2, type = 0;
    cudaError_t e = p ? ready() : cudaSuccess;
    if (!e && p) {
        lookup(p, 0, &device, &type);
        if (type == 2)
            e = sync_streams(device);
    }
    return ret(e ? e : release(p, 2));
}

/* Test-only: free without that synchronisation, as a caching allocator hands
 * memory back to its pool (torch's does): a kernel still queued on it then
 * touches an illegal address. */
cudaError_t fakecudaFreeUnsynced(void *p) { return ret(release(p, 2)); }

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    return ret(flags & ~7u ? cudaErrorInvalidValue : alloc(p, n, 1));
}

/* CUDA's cudaFreeHost waits for the device: so does this one. */
cudaError_t cudaFreeHost(void *p)
{
    cudaError_t e = p ? sync_streams(-1) : cudaSuccess;
    if (!e)
        e = release(p, 1);
    if (!e && p)
        atomic_fetch_add(&host_frees, 1);
    return ret(e);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    if (!a)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = ready();
    if (e)
        return ret(e);
    int device = -2, type = 0;
    lookup(p, 0, &device, &type);
    memset(a, 0, sizeof *a);
    a->type = type;
    a->device = device;
    a->devicePointer = type ? (void *)p : NULL;
    a->hostPointer = type == 1 ? (void *)p : NULL;
    return cudaSuccess;
}

/* ---------------------------------------------------- copies and sets */

struct copy {
    char *dst;
    const char *src;
    size_t n;
    int value;                /* memset's byte, or -1 for a copy */
    int check_dst, check_src; /* the sides that are device memory */
};

static void run_copy(void *arg)
{
    struct copy *c = arg;
    const char *what = c->value < 0 ? "cudaMemcpyAsync" : "cudaMemsetAsync";
    if (c->check_dst && !fakecuda_accessible(c->dst, c->n, NULL))
        fakecuda_fault(what, c->dst, c->n);
    else if (c->check_src && !fakecuda_accessible(c->src, c->n, NULL))
        fakecuda_fault(what, c->src, c->n);
    else if (c->value < 0)
        memmove(fakecuda_host(c->dst), fakecuda_host(c->src), c->n);
    else
        memset(fakecuda_host(c->dst), c->value, c->n);
    free(c);
}

/* Whether a side of a copy is usable: device memory must lie inside one block
 * (*check = 1); memory in no block passes unless `device` demands a block. */
static int side_ok(const void *p, size_t n, int device, int *check)
{
    int r = lookup(p, n, NULL, NULL);
    *check = r >= 0;
    return r == 1 || (r < 0 && !device);
}

static cudaError_t enqueue_copy(void *dst, const void *src, size_t n, int value, int dst_dev,
                                int src_dev, cudaStream_t h)
{
    struct stream *s;
    cudaError_t e = resolve(h, &s);
    if (e)
        return e;
    if (n == 0)
        return cudaSuccess;
    struct copy c = {dst, src, n, value, 0, 0};
    if (!dst || !side_ok(dst, n, dst_dev, &c.check_dst) ||
        (value < 0 && (!src || !side_ok(src, n, src_dev, &c.check_src))))
        return cudaErrorInvalidValue;
    struct copy *t = malloc(sizeof *t);
    if (!t)
        return cudaErrorMemoryAllocation;
    *t = c;
    e = push(s, run_copy, t, NULL);
    if (e)
        free(t);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t h)
{
    /* kinds: H2H 0, H2D 1, D2H 2, D2D 3, Default 4 */
    if (kind < 0 || kind > 4)
        return ret(cudaErrorInvalidMemcpyDirection);
    return ret(enqueue_copy(dst, src, n, -1, kind == 1 || kind == 3, kind == 2 || kind == 3, h));
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t h)
{
    return ret(enqueue_copy(p, NULL, n, value & 0xff, 1, 0, h));
}

/* --------------------------------------------------- streams: the API */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
    if (!out || flags & ~1u)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = ready();
    if (e)
        return ret(e);
    pthread_mutex_lock(&g_mu);
    struct stream *s = stream_new(cur_dev, CREATED, !(flags & 1u));
    pthread_mutex_unlock(&g_mu);
    *out = s;
    return ret(s ? cudaSuccess : cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    struct stream *s;
    cudaError_t e = resolve(h, &s);
    if (e)
        return ret(e);
    if (s->kind != CREATED)
        return ret(cudaErrorInvalidResourceHandle);
    /* The handle dies now; the worker finishes what is queued, then exits. */
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    struct stream *s;
    cudaError_t e = resolve(h, &s);
    if (e)
        return ret(e);
    wait_done(s, last_queued(s));
    return ret(ready());
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    struct stream *s;
    cudaError_t e = resolve(h, &s);
    if (e)
        return ret(e);
    e = ready();
    return ret(e ? e : is_done(s, last_queued(s)) ? cudaSuccess : cudaErrorNotReady);
}

/* Wait for the work queued so far on every stream of `device` (-1: of every
 * device). */
static cudaError_t sync_streams(int device)
{
    cudaError_t e = ready();
    if (e)
        return e;
    pthread_mutex_lock(&g_mu);
    int n = 0;
    struct wait *w = malloc((size_t)(nstreams ? nstreams : 1) * sizeof *w);
    for (int i = 0; w && i < nstreams; i++)
        if (device < 0 || streams[i]->device == device)
            w[n++] = (struct wait){streams[i], last_queued(streams[i])};
    pthread_mutex_unlock(&g_mu);
    if (!w)
        return cudaErrorMemoryAllocation;
    for (int i = 0; i < n; i++)
        wait_done(w[i].s, w[i].seq);
    free(w);
    return ready();
}

cudaError_t cudaDeviceSynchronize(void) { return ret(sync_streams(cur_dev)); }

struct host_fn {
    void (*fn)(void *);
    void *data;
};

static void run_host_fn(void *arg)
{
    struct host_fn f = *(struct host_fn *)arg;
    free(arg);
    f.fn(f.data);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, void (*fn)(void *), void *data)
{
    if (!fn)
        return ret(cudaErrorInvalidValue);
    struct host_fn *f = malloc(sizeof *f);
    if (!f)
        return ret(cudaErrorMemoryAllocation);
    f->fn = fn;
    f->data = data;
    cudaError_t e = fakecuda_enqueue(h, run_host_fn, f);
    if (e)
        free(f);
    return ret(e);
}

/* ---------------------------------------------------------------- events */

static struct event *event_of(void *e)
{
    struct event *ev = e;
    return ev && ev->magic == EVENT_MAGIC ? ev : NULL;
}

cudaError_t cudaEventCreateWithFlags(void **out, unsigned flags)
{
    if (!out || flags & ~7u)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = ready();
    if (e)
        return ret(e);
    struct event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return ret(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC;
    ev->flags = flags;
    ev->device = cur_dev;
    *out = ev;
    return cudaSuccess;
}

/* Destroyed events are kept (marked dead) so a stale handle is an error. */
cudaError_t cudaEventDestroy(void *e)
{
    struct event *ev = event_of(e);
    cudaError_t err = init_check();
    if (err || !ev)
        return ret(err ? err : cudaErrorInvalidResourceHandle);
    ev->magic = 0;
    return cudaSuccess;
}

static void run_nothing(void *arg) { (void)arg; }

cudaError_t cudaEventRecord(void *e, cudaStream_t h)
{
    struct event *ev = event_of(e);
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    struct stream *s;
    uint64_t seq;
    cudaError_t err = resolve(h, &s);
    if (!err && s->device != ev->device)
        err = cudaErrorInvalidResourceHandle;
    if (!err)
        err = push(s, run_nothing, NULL, &seq);
    if (err)
        return ret(err);
    pthread_mutex_lock(&g_mu);
    ev->s = s;
    ev->seq = seq;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* The stream position an event stands for; s NULL: never recorded. */
static cudaError_t event_pos(void *e, struct stream **s, uint64_t *seq)
{
    struct event *ev = event_of(e);
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g_mu);
    *s = ev->s;
    *seq = ev->seq;
    pthread_mutex_unlock(&g_mu);
    return ready();
}

cudaError_t cudaEventQuery(void *e)
{
    struct stream *s;
    uint64_t seq;
    cudaError_t err = event_pos(e, &s, &seq);
    if (err)
        return ret(err);
    return !s || is_done(s, seq) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(void *e)
{
    struct stream *s;
    uint64_t seq;
    cudaError_t err = event_pos(e, &s, &seq);
    if (err)
        return ret(err);
    if (s)
        wait_done(s, seq);
    return ret(ready());
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, void *e, unsigned flags)
{
    struct stream *s, *t;
    uint64_t seq;
    cudaError_t err = flags & ~1u ? cudaErrorInvalidValue : resolve(h, &s);
    if (!err)
        err = event_pos(e, &t, &seq);
    if (err || !t) /* waiting on a never-recorded event does nothing */
        return ret(err);
    struct wait *w = malloc(sizeof *w);
    if (!w)
        return ret(cudaErrorMemoryAllocation);
    *w = (struct wait){t, seq};
    err = push(s, run_wait, w, NULL);
    if (err)
        free(w);
    return ret(err);
}

/* ---------------------------------------------------- devices, versions */

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    /* It initialises CUDA (a child forked afterwards cannot use it), yet it
     * answers in such a child: CUDA 13 did so on an H100. */
    if (!forked_after_init)
        atomic_store(&initialised, 1);
    *count = ndev();
    return ret(*count ? cudaSuccess : cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = status(); /* asks, creates nothing */
    if (!e)
        *device = cur_dev;
    return ret(e);
}

cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = status();
    if (!e && (device < 0 || device >= ndev()))
        e = cudaErrorInvalidDevice;
    if (!e) {
        cur_dev = device;
        atomic_fetch_or(&contexts, 1ull << device);
    }
    return ret(e);
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return atomic_load(&sticky) ? atomic_load(&sticky) : e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == e)
            return errors[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == e)
            return errors[i].name;
    return "unrecognized error code";
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}

/* ------------------------------------------------------ test-only extras */

static void run_sleep(void *arg)
{
    unsigned ms = (unsigned)(uintptr_t)arg;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts))
        ;
}

/* A task that sleeps `ms` milliseconds: a slow kernel. */
cudaError_t fakecudaStreamSleep(cudaStream_t h, unsigned ms)
{
    return ret(fakecuda_enqueue(h, run_sleep, (void *)(uintptr_t)ms));
}

/* Live cudaMalloc blocks and bytes, live cudaHostAlloc blocks. */
void fakecudaMemStats(int *device_blocks, size_t *device_bytes, int *host_blocks)
{
    int nd = 0, nh = 0;
    size_t bytes = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < nblocks; i++) {
        if (blocks[i].type == 2) {
            nd++;
            bytes += blocks[i].n;
        } else {
            nh++;
        }
    }
    pthread_mutex_unlock(&g_mu);
    *device_blocks = nd;
    *device_bytes = bytes;
    *host_blocks = nh;
}

/* cudaFreeHost calls that freed a block in this process. */
long fakecudaHostFreeCount(void) { return atomic_load(&host_frees); }

/* Streams created with cudaStreamCreateWithFlags and not destroyed. */
int fakecudaStreamCount(void)
{
    int n = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < nstreams; i++)
        n += streams[i]->kind == CREATED && !streams[i]->closing;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* Forget the sticky error (a test that provoked one cleans up). */
void fakecudaClearError(void)
{
    atomic_store(&sticky, cudaSuccess);
    last_error = cudaSuccess;
}

/* ------------------------------------------- the driver's context queries */

/* cuDeviceGet and cuDevicePrimaryCtxGetState, which live in libcuda.so.1 on a
 * real machine: pyddp looks for them in the runtime library first. */
int cuDeviceGet(int *dev, int ordinal)
{
    if (!dev || ordinal < 0 || ordinal >= ndev())
        return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}

int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
    if (!flags || !active)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    if (dev < 0 || dev >= ndev())
        return 101;
    *flags = 0;
    *active = (int)((atomic_load(&contexts) >> dev) & 1u);
    return 0;
}

/* Test-only: the devices with a primary context (bit d: device d). */
unsigned long long fakecudaContexts(void) { return atomic_load(&contexts); }
