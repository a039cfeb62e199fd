/* libnccl.so.2 for tests: the NCCL entry points pyddp uses (csrc/cuda/cudawrap.h)
 * with NCCL's ABI, result codes and messages, between processes on one host.
 *
 * - ncclGetUniqueId names a POSIX shared-memory segment; the ranks of
 *   ncclCommInitRank[Config] create or attach it and the last one to join
 *   unlinks it.  Between every ordered pair of ranks it holds a byte ring.
 * - Operations are tasks on the caller's stream (fake_cudart's workers), so
 *   they run in stream order: collectives exchange their data over the rings
 *   in chunks and reduce in rank order (every rank gets the same bits;
 *   float16/bfloat16 go through float with round-to-nearest-even after each
 *   step, as NumPy does); send/recv, and the ops of a group, progress
 *   together.  An op whose peers never come spins (sched_yield, then short
 *   sleeps) until ncclCommAbort; a dead peer is never detected here.
 * - Like NCCL: the duplicate-GPU check at init (NCCL_MULTI_RANK_GPU_ENABLE=1
 *   lifts it from version 2.30 on), argument checks as with
 *   NCCL_CHECK_POINTERS=1, ncclCommDestroy waiting for outstanding work,
 *   nonblocking communicators (ncclInProgress), ncclGetLastError's messages.
 * - Test knobs: FAKENCCL_VERSION (default 23203) is what ncclGetVersion
 *   answers; FAKENCCL_ASYNC_ERROR_AFTER=N makes a communicator's operation
 *   N+1 (a group counts once) set ncclRemoteError as its async error and hang
 *   until aborted, on every rank or only on FAKENCCL_ASYNC_ERROR_RANK;
 *   fakencclCommCount() counts live communicators; FAKENCCL_ABORT_DELAY_MS makes
 *   ncclCommAbort take that long, its communicator's kernels running meanwhile.
 * - Like NCCL 2.32 where a kinder stand-in hid bugs: pointers are checked only
 *   with NCCL_CHECK_POINTERS=1 (else a bad one faults on the "device");
 *   point-to-point peers connect inside ncclGroupEnd (or an ungrouped
 *   ncclSend/ncclRecv), waiting for the peer to post its side, and a
 *   non-blocking communicator answers ncclInProgress meanwhile, connecting
 *   and launching from a thread of its own; ncclCommSplit on a non-blocking
 *   parent answers ncclInProgress with *newcomm still NULL and writes the
 *   child from its own thread, the parent in progress until then.
 * - Like NCCL with two or more ranks (src/group.cc): on a non-blocking
 *   communicator of 2+ ranks every collective and point-to-point call (or
 *   ncclGroupEnd) starts a group job on a thread of its own and answers
 *   ncclInProgress; ncclCommGetAsyncError joins the finished job (two threads
 *   doing so at once would join it twice).  One rank: inline, as NCCL's
 *   ncclLaunchOneRank.  FAKENCCL_JOB_US (default 50) is how long a job takes
 *   before it launches.
 * - NCCL gives no thread-safety guarantee for a communicator: a second thread
 *   entering one (a call, ncclCommGetAsyncError, finalize, destroy, split)
 *   while another is inside it is reported on stderr and aborts the process
 *   (FAKENCCL_CONCURRENT=count: only counted, fakencclConcurrentEntries()).
 *   ncclCommAbort may come from any thread, and waits until the
 *   communicator's queued and running operations stopped, as NCCL's. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
enum {
    ncclSuccess,
    ncclUnhandledCudaError,
    ncclSystemError,
    ncclInternalError,
    ncclInvalidArgument,
    ncclInvalidUsage,
    ncclRemoteError,
    ncclInProgress,
    ncclTimeout,
};
enum { ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64, ncclFloat16, ncclFloat32,
       ncclFloat64, ncclBfloat16, NUM_TYPES };
enum { ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, NUM_OPS };

typedef struct {
    char internal[128];
} ncclUniqueId;

typedef struct { /* ncclConfig_t, NCCL 2.18's fields */
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare;
} ncclConfig_t;

#define NCCL_SPLIT_NOCOLOR (-1)
#define CONFIG_MAGIC 0xcafebeefu
#define CONFIG_UNDEF INT_MIN
#define DEFAULT_VERSION 23203
#define ID_MAGIC "FAKENCCL"
#define COMM_MAGIC 0x4e43434cu
#define RING (64 * 1024)  /* bytes in each ordered pair's ring */
#define CHUNK (64 * 1024) /* bytes a reduction stages per peer and step */

static const size_t esize[NUM_TYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

/* ---------------------------------------------------------- last error */

static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_err[1024];

__attribute__((format(printf, 1, 2))) static void warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&err_mu);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    const char *dbg = getenv("NCCL_DEBUG");
    if (dbg && (!strcasecmp(dbg, "WARN") || !strcasecmp(dbg, "INFO") || !strcasecmp(dbg, "TRACE")))
        fprintf(stderr, "%d NCCL WARN %s\n", (int)getpid(), last_err);
    pthread_mutex_unlock(&err_mu);
    va_end(ap);
}

static void lock_err(void) { pthread_mutex_lock(&err_mu); }
static void unlock_err(void) { pthread_mutex_unlock(&err_mu); }

__attribute__((constructor)) static void init(void)
{
    pthread_atfork(lock_err, unlock_err, unlock_err); /* a forked child can still warn */
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        perror("fakenccl");
        abort();
    }
    return p;
}

static int version(void)
{
    const char *s = getenv("FAKENCCL_VERSION");
    return s && *s ? atoi(s) : DEFAULT_VERSION;
}

/* ------------------------------------------------------ shared segment */

struct chan { /* one ordered pair's ring: head written by the sender, tail by the receiver */
    _Atomic uint64_t head;
    char pad0[56];
    _Atomic uint64_t tail;
    char pad1[56];
    _Atomic int hello; /* the sender posted point-to-point work to the receiver */
    char pad2[60];
    char buf[RING];
};

struct member {
    _Atomic int present;
    int device;
    int color, key;                  /* the last ncclCommSplit's arguments */
    _Atomic int split_in, split_out; /* splits whose arguments are written / read */
};

struct seg {
    _Atomic int nranks;
    _Atomic int joined;
};

#define MEMBERS_AT 64

static size_t chans_at(int n) { return (MEMBERS_AT + (size_t)n * sizeof(struct member) + 63) / 64 * 64; }
static size_t seg_size(int n) { return chans_at(n) + (size_t)n * (size_t)n * sizeof(struct chan); }

struct ncclComm {
    unsigned magic;
    int rank, nranks, device, blocking;
    _Atomic int abort;
    _Atomic int state;   /* ncclInProgress while ranks join, then the async result */
    _Atomic int refs;    /* the user's handle + one per queued task */
    _Atomic int pending; /* queued tasks not finished */
    _Atomic int finalizing;
    _Atomic int released; /* ncclCommDestroy or ncclCommAbort gave the user's reference back */
    _Atomic int busy;     /* a non-blocking split or group is still in progress (its thread) */
    _Atomic int inside;   /* a thread is inside a call on this communicator */
    pthread_mutex_t job_mu;
    pthread_t job;        /* the last group job's thread, joined by the next query */
    int job_unjoined;     /* under job_mu */
    int error_after; /* FAKENCCL_ASYNC_ERROR_AFTER for this rank, or -1 */
    int ops;         /* tasks run (by the stream worker) */
    int splits;
    struct seg *seg;
    size_t size;
    char name[200];
};
typedef struct ncclComm *ncclComm_t;

static _Atomic int live_comms;
static _Atomic long concurrent_entries;

/* A thread enters the communicator (every call but ncclCommAbort): NCCL gives
 * no thread-safety guarantee, so a second thread inside at once is the
 * caller's bug.  Returns whether this call owns the entry (leave() it). */
static int enter(struct ncclComm *c, const char *what)
{
    int zero = 0;
    if (atomic_compare_exchange_strong(&c->inside, &zero, 1))
        return 1;
    atomic_fetch_add(&concurrent_entries, 1);
    const char *mode = getenv("FAKENCCL_CONCURRENT");
    if (mode && !strcmp(mode, "count"))
        return 0;
    fprintf(stderr, "%d fakenccl: %s entered communicator %s (rank %d) while another thread was inside "
            "it: NCCL gives no thread-safety guarantee, calls into one communicator must be serialised\n",
            (int)getpid(), what, c->name, c->rank);
    fflush(stderr);
    abort();
}

static void leave(struct ncclComm *c, int owned)
{
    if (owned)
        atomic_store(&c->inside, 0);
}

/* Join the last group job if it has finished (wait: whether or not). */
static void join_job(struct ncclComm *c, int wait)
{
    pthread_mutex_lock(&c->job_mu);
    if (c->job_unjoined && (wait || !atomic_load(&c->busy))) {
        pthread_join(c->job, NULL);
        c->job_unjoined = 0;
    }
    pthread_mutex_unlock(&c->job_mu);
}

static struct member *member(struct ncclComm *c, int r)
{
    return (struct member *)((char *)c->seg + MEMBERS_AT) + r;
}

static struct chan *chan(struct ncclComm *c, int from, int to)
{
    return (struct chan *)((char *)c->seg + chans_at(c->nranks)) + (size_t)from * (size_t)c->nranks + to;
}

static void comm_unref(struct ncclComm *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    munmap(c->seg, c->size);
    c->magic = 0;
    pthread_mutex_destroy(&c->job_mu);
    free(c);
    atomic_fetch_sub(&live_comms, 1);
}

/* Give the user's reference back once, whichever of destroy and abort comes
 * first (the watchdog may abort a comm that another thread is destroying). */
static void release_user_ref(struct ncclComm *c)
{
    if (!atomic_exchange(&c->released, 1)) {
        /* a job still waiting for a peer keeps its own reference and ends on its own */
        pthread_mutex_lock(&c->job_mu);
        if (c->job_unjoined) {
            if (atomic_load(&c->busy))
                pthread_detach(c->job);
            else
                pthread_join(c->job, NULL);
            c->job_unjoined = 0;
        }
        pthread_mutex_unlock(&c->job_mu);
        comm_unref(c);
    }
}

static void backoff(unsigned *idle)
{
    if (++*idle < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, *idle < 1024 ? 20000 : 500000};
    nanosleep(&ts, NULL);
}

/* Wait until pred(c, arg); -1 if the communicator is aborted first. */
static int spin(struct ncclComm *c, int (*pred)(struct ncclComm *, int), int arg)
{
    unsigned idle = 0;
    while (!pred(c, arg)) {
        if (atomic_load(&c->abort))
            return -1;
        backoff(&idle);
    }
    return 0;
}

static int all_joined(struct ncclComm *c, int arg)
{
    (void)arg;
    return atomic_load(&c->seg->joined) == c->nranks;
}

static int no_pending(struct ncclComm *c, int arg)
{
    (void)arg;
    return atomic_load(&c->pending) == 0;
}

static int never(struct ncclComm *c, int arg)
{
    (void)c;
    (void)arg;
    return 0;
}

static int split_written(struct ncclComm *c, int g)
{
    for (int i = 0; i < c->nranks; i++)
        if (atomic_load(&member(c, i)->split_in) < g)
            return 0;
    return 1;
}

static int split_read(struct ncclComm *c, int g)
{
    for (int i = 0; i < c->nranks; i++)
        if (atomic_load(&member(c, i)->split_out) < g)
            return 0;
    return 1;
}

/* Once every rank joined: NCCL's duplicate-GPU check. */
static ncclResult_t check_joined(struct ncclComm *c)
{
    int st = atomic_load(&c->state);
    if (st != ncclInProgress || !all_joined(c, 0))
        return st;
    const char *multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    int r = ncclSuccess;
    if (!(multi && !strcmp(multi, "1") && version() >= 23000)) {
        for (int i = 0; i < c->nranks && !r; i++) {
            if (i != c->rank && member(c, i)->device == c->device) {
                if (version() >= 23000) /* NCCL 2.30 rewrote the message (the text of 2.32's library) */
                    warn("Multiple Ranks are using the same GPU/Partition. Set "
                         "NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.");
                else
                    warn("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", c->rank, i,
                         0x1000ul * (unsigned long)(c->device + 1));
                r = ncclInvalidUsage;
            }
        }
    }
    atomic_compare_exchange_strong(&c->state, &st, r);
    return atomic_load(&c->state);
}

static ncclResult_t comm_create(struct ncclComm **out, int nranks, const char *name, int rank,
                                int device, int blocking)
{
    *out = NULL;
    size_t size = seg_size(nranks);
    struct stat st;
    const char *why = NULL;
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || fstat(fd, &st))
        why = strerror(errno);
    else if (st.st_size && (size_t)st.st_size != size)
        why = "the ranks disagree on the number of ranks";
    else if (!st.st_size && ftruncate(fd, (off_t)size))
        why = strerror(errno);
    if (why) {
        warn("fakenccl: shared memory %s: %s", name, why);
        if (fd >= 0)
            close(fd);
        shm_unlink(name);
        return ncclSystemError;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        warn("fakenccl: mmap %s: %s", name, strerror(errno));
        shm_unlink(name);
        return ncclSystemError;
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) {
        munmap(m, size);
        return ncclSystemError;
    }
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->blocking = blocking;
    c->seg = m;
    c->size = size;
    pthread_mutex_init(&c->job_mu, NULL);
    snprintf(c->name, sizeof c->name, "%s", name);
    atomic_store(&c->state, ncclInProgress);
    atomic_store(&c->refs, 1);
    atomic_fetch_add(&live_comms, 1);
    const char *after = getenv("FAKENCCL_ASYNC_ERROR_AFTER"), *only = getenv("FAKENCCL_ASYNC_ERROR_RANK");
    c->error_after = after && *after && !(only && *only && atoi(only) != rank) ? atoi(after) : -1;

    int expect = 0;
    if (!atomic_compare_exchange_strong(&c->seg->nranks, &expect, nranks) && expect != nranks) {
        warn("fakenccl: rank %d joined %s with nranks %d, another rank with %d", rank, name, nranks, expect);
        goto fail;
    }
    member(c, rank)->device = device;
    if (atomic_exchange(&member(c, rank)->present, 1)) {
        warn("fakenccl: rank %d joined %s twice", rank, name);
        goto fail;
    }
    if (atomic_fetch_add(&c->seg->joined, 1) + 1 == nranks)
        shm_unlink(name);
    if (!blocking) {
        *out = c;
        return check_joined(c) == ncclSuccess ? ncclSuccess : ncclInProgress;
    }
    spin(c, all_joined, 0);
    ncclResult_t r = check_joined(c);
    if (r == ncclSuccess) {
        *out = c;
        return r;
    }
    release_user_ref(c);
    return r;
fail:
    shm_unlink(name);
    release_user_ref(c);
    return ncclInvalidUsage;
}

/* ----------------------------------------------------------------- rings */

struct xfer {
    int peer, send;
    char *buf;
    size_t len, done;
};

static size_t ring_move(struct ncclComm *c, struct xfer *x)
{
    struct chan *ch = x->send ? chan(c, c->rank, x->peer) : chan(c, x->peer, c->rank);
    uint64_t head = atomic_load_explicit(&ch->head, x->send ? memory_order_relaxed : memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&ch->tail, x->send ? memory_order_acquire : memory_order_relaxed);
    size_t room = x->send ? RING - (size_t)(head - tail) : (size_t)(head - tail);
    size_t k = x->len - x->done < room ? x->len - x->done : room;
    if (!k)
        return 0;
    size_t at = (size_t)((x->send ? head : tail) % RING), first = k < RING - at ? k : RING - at;
    char *mine = x->buf + x->done;
    if (x->send) {
        memcpy(ch->buf + at, mine, first);
        memcpy(ch->buf, mine + first, k - first);
        atomic_store_explicit(&ch->head, head + k, memory_order_release);
    } else {
        memcpy(mine, ch->buf + at, first);
        memcpy(mine + first, ch->buf, k - first);
        atomic_store_explicit(&ch->tail, tail + k, memory_order_release);
    }
    x->done += k;
    return k;
}

/* Move every transfer to completion, all at once (so sends and receives
 * cannot deadlock); transfers to one peer in one direction go in order.
 * -1 if the communicator is aborted first. */
static int progress(struct ncclComm *c, struct xfer *x, int n)
{
    unsigned idle = 0;
    for (;;) {
        int left = 0, moved = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].done == x[i].len)
                continue;
            left = 1;
            int blocked = 0;
            for (int j = 0; j < i && !blocked; j++)
                blocked = x[j].peer == x[i].peer && x[j].send == x[i].send && x[j].done < x[j].len;
            if (!blocked && ring_move(c, &x[i]))
                moved = 1;
        }
        if (!left)
            return 0;
        if (atomic_load(&c->abort))
            return -1;
        if (moved)
            idle = 0;
        else
            backoff(&idle);
    }
}

/* ------------------------------------------------------------ reductions */

static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN stays NaN */
        return sign | 0x7e00;
    if (ax >= 0x477ff000u) /* 65520 and above round to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000u) { /* below 2^-14: subnormal (or zero) */
        float a;
        memcpy(&a, &ax, sizeof a);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    }
    uint32_t h = (((ax >> 23) - 112) << 10) | ((ax >> 13) & 0x3ff), rest = ax & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}

static float b2f(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t f2b(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

static float id_f(float v) { return v; }
static double id_d(double v) { return v; }

/* Integers wrap (computed unsigned), floats go through `C`. */
#define INT_COMBINE(T, U)                                                                          \
    do {                                                                                           \
        T *a = acc;                                                                                \
        const T *b = src;                                                                          \
        for (size_t i = 0; i < k; i++)                                                             \
            a[i] = op == ncclProd  ? (T)((U)a[i] * (U)b[i])                                        \
                   : op == ncclMax ? (a[i] > b[i] ? a[i] : b[i])                                   \
                   : op == ncclMin ? (a[i] < b[i] ? a[i] : b[i])                                   \
                                   : (T)((U)a[i] + (U)b[i]);                                       \
    } while (0)

#define FLT_COMBINE(S, C, LOAD, STORE)                                                             \
    do {                                                                                           \
        S *a = acc;                                                                                \
        const S *b = src;                                                                          \
        for (size_t i = 0; i < k; i++) {                                                           \
            C x = LOAD(a[i]), y = LOAD(b[i]);                                                      \
            a[i] = STORE(op == ncclProd  ? x * y                                                   \
                         : op == ncclMax ? (x > y ? x : y)                                         \
                         : op == ncclMin ? (x < y ? x : y)                                         \
                                         : x + y);                                                 \
        }                                                                                          \
    } while (0)

/* acc[i] = acc[i] op src[i] (avg sums; divide() finishes it). */
static void combine(void *acc, const void *src, size_t k, int dtype, int op)
{
    switch (dtype) {
    case ncclInt8: INT_COMBINE(int8_t, uint8_t); break;
    case ncclUint8: INT_COMBINE(uint8_t, uint8_t); break;
    case ncclInt32: INT_COMBINE(int32_t, uint32_t); break;
    case ncclUint32: INT_COMBINE(uint32_t, uint32_t); break;
    case ncclInt64: INT_COMBINE(int64_t, uint64_t); break;
    case ncclUint64: INT_COMBINE(uint64_t, uint64_t); break;
    case ncclFloat16: FLT_COMBINE(uint16_t, float, h2f, f2h); break;
    case ncclFloat32: FLT_COMBINE(float, float, id_f, id_f); break;
    case ncclFloat64: FLT_COMBINE(double, double, id_d, id_d); break;
    default: FLT_COMBINE(uint16_t, float, b2f, f2b); break;
    }
}

#define DIVIDE(S, C, LOAD, STORE)                                                                  \
    do {                                                                                           \
        S *a = acc;                                                                                \
        for (size_t i = 0; i < k; i++)                                                             \
            a[i] = STORE((C)(LOAD(a[i]) / (C)n));                                                  \
    } while (0)

#define ID(v) (v)

/* ncclAvg's last step: integers divide (truncating), floats divide in C. */
static void divide(void *acc, size_t k, int dtype, int n)
{
    switch (dtype) {
    case ncclInt8: DIVIDE(int8_t, int, ID, (int8_t)); break;
    case ncclUint8: DIVIDE(uint8_t, int, ID, (uint8_t)); break;
    case ncclInt32: DIVIDE(int32_t, int32_t, ID, ID); break;
    case ncclUint32: DIVIDE(uint32_t, uint32_t, ID, ID); break;
    case ncclInt64: DIVIDE(int64_t, int64_t, ID, ID); break;
    case ncclUint64: DIVIDE(uint64_t, uint64_t, ID, ID); break;
    case ncclFloat16: DIVIDE(uint16_t, float, h2f, f2h); break;
    case ncclFloat32: DIVIDE(float, float, ID, ID); break;
    case ncclFloat64: DIVIDE(double, double, ID, ID); break;
    default: DIVIDE(uint16_t, float, b2f, f2b); break;
    }
}

/* ------------------------------------------------------------ operations */

enum { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, SEND, RECV };
static const char *const opname[] = {"AllReduce", "Broadcast",     "Reduce", "AllGather",
                                     "ReduceScatter", "Send", "Recv"};

struct op {
    int kind;
    const char *send;
    char *recv;
    size_t count;
    int dtype, redop, root; /* root: the peer of Send and Recv */
    struct ncclComm *comm;
    cudaStream_t stream;
};

static int uses_send(const struct op *o)
{
    return o->kind != RECV && (o->kind != BROADCAST || o->comm->rank == o->root);
}

static int uses_recv(const struct op *o)
{
    return o->kind != SEND && (o->kind != REDUCE || o->comm->rank == o->root);
}

static size_t send_bytes(const struct op *o)
{
    return o->count * esize[o->dtype] * (o->kind == REDUCESCATTER ? (size_t)o->comm->nranks : 1);
}

static size_t recv_bytes(const struct op *o)
{
    return o->count * esize[o->dtype] * (o->kind == ALLGATHER ? (size_t)o->comm->nranks : 1);
}

/* The part of my input that goes into rank `dest`'s result. */
static const char *piece(const struct op *o, int dest, size_t off)
{
    size_t base = o->kind == REDUCESCATTER ? (size_t)dest * o->count : 0;
    return o->send + (base + off) * esize[o->dtype];
}

/* Allreduce, reduce, reduce-scatter: chunk by chunk, every rank sends each
 * peer its piece for that peer, and the ranks that own a result reduce the
 * pieces in rank order. */
static int reduce_chunks(struct ncclComm *c, const struct op *o)
{
    int n = c->nranks, me = c->rank, root = o->kind == REDUCE ? o->root : -1, rc = 0;
    size_t es = esize[o->dtype], per = CHUNK / es;
    char *stage = xmalloc((size_t)(n + 1) * CHUNK), *acc = stage + (size_t)n * CHUNK;
    struct xfer *x = xmalloc(2 * (size_t)n * sizeof *x);
    for (size_t off = 0; off < o->count && !rc; off += per) {
        size_t k = o->count - off < per ? o->count - off : per, len = k * es;
        int nx = 0;
        for (int p = 0; p < n; p++) {
            if (p == me)
                continue;
            if (root < 0 || p == root)
                x[nx++] = (struct xfer){p, 1, (char *)piece(o, p, off), len, 0};
            if (root < 0 || me == root)
                x[nx++] = (struct xfer){p, 0, stage + (size_t)p * CHUNK, len, 0};
        }
        rc = progress(c, x, nx);
        if (rc || (root >= 0 && me != root))
            continue;
        for (int p = 0; p < n; p++) {
            const char *src = p == me ? piece(o, me, off) : stage + (size_t)p * CHUNK;
            if (p == 0)
                memcpy(acc, src, len);
            else
                combine(acc, src, k, o->dtype, o->redop);
        }
        if (o->redop == ncclAvg)
            divide(acc, k, o->dtype, n);
        memcpy(o->recv + off * es, acc, len);
    }
    free(stage);
    free(x);
    return rc;
}

/* One collective; -1 if aborted. */
static int collective(struct ncclComm *c, const struct op *o)
{
    if (o->kind != BROADCAST && o->kind != ALLGATHER)
        return reduce_chunks(c, o);
    int n = c->nranks, me = c->rank, nx = 0;
    size_t bytes = o->count * esize[o->dtype];
    struct xfer *x = xmalloc(2 * (size_t)n * sizeof *x);
    if (o->kind == ALLGATHER)
        memmove(o->recv + (size_t)me * bytes, o->send, bytes);
    else if (me == o->root)
        memmove(o->recv, o->send, bytes);
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        if (o->kind == ALLGATHER || me == o->root)
            x[nx++] = (struct xfer){p, 1, (char *)o->send, bytes, 0};
        if (o->kind == ALLGATHER)
            x[nx++] = (struct xfer){p, 0, o->recv + (size_t)p * bytes, bytes, 0};
        else if (p == o->root)
            x[nx++] = (struct xfer){p, 0, o->recv, bytes, 0};
    }
    int rc = progress(c, x, nx);
    free(x);
    return rc;
}

/* A task on the stream: the ops of one call or one group, for one comm.
 * Buffers are checked first (memory freed since the call is an illegal
 * access), then collectives run in order, then every send/recv at once. */
struct task {
    struct ncclComm *comm;
    int n;
    struct op ops[];
};

static int accessible(const struct op *o)
{
    const char *what = NULL;
    const void *p = NULL;
    size_t len = 0;
    if (uses_send(o) && !fakecuda_accessible(o->send, send_bytes(o), NULL))
        what = "sendbuff", p = o->send, len = send_bytes(o);
    else if (uses_recv(o) && !fakecuda_accessible(o->recv, recv_bytes(o), NULL))
        what = "recvbuff", p = o->recv, len = recv_bytes(o);
    if (!what)
        return 1;
    char msg[64];
    snprintf(msg, sizeof msg, "nccl%s %s", opname[o->kind], what);
    fakecuda_fault(msg, p, len);
    return 0;
}

static void run_ops(struct ncclComm *c, const struct op *ops, int n);

static void execute(struct ncclComm *c, const struct op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        if (!accessible(&ops[i])) {
            int ok = ncclSuccess;
            atomic_compare_exchange_strong(&c->state, &ok, ncclUnhandledCudaError);
            warn("Cuda failure '%s'", cudaGetErrorString(cudaErrorIllegalAddress));
            return;
        }
    }
    /* the kernels' view of device memory: its shadow (the addresses are PROT_NONE) */
    struct op *t = xmalloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) {
        t[i] = ops[i];
        t[i].send = ops[i].send ? fakecuda_host(ops[i].send) : NULL;
        t[i].recv = ops[i].recv ? fakecuda_host(ops[i].recv) : NULL;
    }
    run_ops(c, t, n);
    free(t);
}

static void run_ops(struct ncclComm *c, const struct op *ops, int n)
{
    int np = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == SEND || ops[i].kind == RECV)
            np++;
        else if (collective(c, &ops[i]))
            return;
    }
    struct xfer *x = xmalloc((size_t)np * sizeof *x);
    np = 0;
    for (int i = 0; i < n; i++) {
        const struct op *o = &ops[i];
        if (o->kind == SEND || o->kind == RECV)
            x[np++] = (struct xfer){o->root, o->kind == SEND, o->kind == SEND ? (char *)o->send : o->recv,
                                    o->count * esize[o->dtype], 0};
    }
    progress(c, x, np);
    free(x);
}

static void run_task(void *arg)
{
    struct task *t = arg;
    struct ncclComm *c = t->comm;
    if (!atomic_load(&c->abort) && atomic_load(&c->state) == ncclSuccess) {
        if (c->error_after >= 0 && c->ops >= c->error_after) {
            int ok = ncclSuccess;
            if (atomic_compare_exchange_strong(&c->state, &ok, ncclRemoteError))
                warn("fakenccl: injected remote error after %d operations (FAKENCCL_ASYNC_ERROR_AFTER)",
                     c->ops);
            spin(c, never, 0);
        } else {
            c->ops++;
            execute(c, t->ops, t->n);
        }
    }
    atomic_fetch_sub(&c->pending, 1);
    comm_unref(c);
    free(t);
}

/* Queue ops (one comm, one stream) as one task on the comm's device. */
static ncclResult_t launch(const struct op *ops, int n)
{
    struct ncclComm *c = ops[0].comm;
    struct task *t = xmalloc(sizeof *t + (size_t)n * sizeof *ops);
    t->comm = c;
    t->n = n;
    memcpy(t->ops, ops, (size_t)n * sizeof *ops);
    atomic_fetch_add(&c->refs, 1);
    atomic_fetch_add(&c->pending, 1);
    int saved = 0;
    cudaGetDevice(&saved);
    cudaSetDevice(c->device); /* the default stream is the comm device's */
    cudaError_t e = fakecuda_enqueue(ops[0].stream, run_task, t);
    cudaSetDevice(saved);
    if (!e)
        return ncclSuccess;
    warn("Cuda failure '%s'", cudaGetErrorString(e));
    atomic_fetch_sub(&c->pending, 1);
    atomic_fetch_sub(&c->refs, 1);
    free(t);
    return ncclUnhandledCudaError;
}

/* ------------------------------------------------- point-to-point connection */

/* As NCCL: the first point-to-point work between two ranks connects them
 * inside ncclGroupEnd (or the ungrouped ncclSend/ncclRecv), which waits for
 * the peer to post its side; a blocking communicator waits there, a
 * non-blocking one answers ncclInProgress and connects (then launches) from
 * a thread of its own, the communicator in progress meanwhile. */
static int connected(struct ncclComm *c, int peer)
{
    return atomic_load(&chan(c, peer, c->rank)->hello) != 0;
}

static int all_connected(const struct op *ops, int n)
{
    for (int i = 0; i < n; i++)
        if ((ops[i].kind == SEND || ops[i].kind == RECV) && !connected(ops[i].comm, ops[i].root))
            return 0;
    return 1;
}

static int wait_connected(const struct op *ops, int n)
{
    unsigned idle = 0;
    while (!all_connected(ops, n)) {
        if (atomic_load(&ops[0].comm->abort))
            return -1;
        backoff(&idle);
    }
    return 0;
}

static ncclResult_t launch(const struct op *ops, int n);

struct connect_job {
    int n;
    struct op ops[];
};

static void *connect_thread(void *arg)
{
    struct connect_job *j = arg;
    struct ncclComm *c = j->ops[0].comm;
    cudaSetDevice(c->device); /* as NCCL's own threads */
    const char *us = getenv("FAKENCCL_JOB_US");
    long job_us = us && *us ? atol(us) : 50;
    if (job_us > 0) {
        struct timespec ts = {job_us / 1000000, (job_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (wait_connected(j->ops, j->n) == 0 && launch(j->ops, j->n) != ncclSuccess) {
        int ok = ncclSuccess;
        atomic_compare_exchange_strong(&c->state, &ok, ncclUnhandledCudaError);
    }
    atomic_store(&c->busy, 0);
    comm_unref(c);
    free(j);
    return NULL;
}

/* Run fn(job) on a thread of the library's, the communicator in progress
 * (busy) and referenced until fn ends (fn clears busy, unrefs, frees job). */
static ncclResult_t in_background(struct ncclComm *c, void *(*fn)(void *), void *job)
{
    join_job(c, 1); /* the previous job ended (the communicator was not busy) */
    atomic_fetch_add(&c->refs, 1);
    atomic_store(&c->busy, 1);
    pthread_mutex_lock(&c->job_mu);
    int e = pthread_create(&c->job, NULL, fn, job);
    c->job_unjoined = !e;
    pthread_mutex_unlock(&c->job_mu);
    if (e) {
        atomic_store(&c->busy, 0);
        atomic_fetch_sub(&c->refs, 1);
        free(job);
        return ncclSystemError;
    }
    return ncclInProgress;
}

/* Launch ops (one comm, one stream) once their point-to-point peers are connected. */
static ncclResult_t connect_and_launch(const struct op *ops, int n)
{
    struct ncclComm *c = ops[0].comm;
    for (int i = 0; i < n; i++)
        if (ops[i].kind == SEND || ops[i].kind == RECV)
            atomic_store(&chan(c, c->rank, ops[i].root)->hello, 1);
    int group_job = !c->blocking && c->nranks >= 2;
    if (all_connected(ops, n) && !group_job)
        return launch(ops, n);
    if (c->blocking) {
        if (wait_connected(ops, n))
            return ncclInvalidUsage;
        return launch(ops, n);
    }
    struct connect_job *j = xmalloc(sizeof *j + (size_t)n * sizeof *ops);
    j->n = n;
    memcpy(j->ops, ops, (size_t)n * sizeof *ops);
    return in_background(c, connect_thread, j);
}

/* ----------------------------------------------------------------- groups */

static _Thread_local struct {
    int depth;
    ncclResult_t err;
    struct op *ops;
    int n, cap;
} grp;

ncclResult_t ncclGroupStart(void)
{
    grp.depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (grp.depth == 0) {
        warn("ncclGroupEnd: not in a group call.");
        return ncclInvalidUsage;
    }
    if (--grp.depth)
        return ncclSuccess;
    ncclResult_t r = grp.err;
    int inprog = 0;
    /* One task per (comm, stream), its ops in call order. */
    struct op *part = xmalloc((size_t)grp.n * sizeof *part);
    for (int i = 0; i < grp.n && !r; i++) {
        if (!grp.ops[i].comm)
            continue;
        int k = 0;
        for (int j = i; j < grp.n; j++) {
            if (grp.ops[j].comm == grp.ops[i].comm && grp.ops[j].stream == grp.ops[i].stream) {
                part[k++] = grp.ops[j];
                if (j > i)
                    grp.ops[j].comm = NULL;
            }
        }
        int owned = enter(part[0].comm, "ncclGroupEnd");
        ncclResult_t q = connect_and_launch(part, k);
        leave(part[0].comm, owned);
        if (q == ncclInProgress)
            inprog = 1; /* reported once the other parts are launched */
        else
            r = q;
    }
    if (!r && inprog)
        r = ncclInProgress;
    free(part);
    grp.n = 0;
    grp.err = ncclSuccess;
    return r;
}

/* ---------------------------------------------------- calls and checks */

static ncclResult_t comm_check(struct ncclComm *c, const char *name)
{
    if (!c) {
        warn("%s : comm argument is NULL", name);
        return ncclInvalidArgument;
    }
    if (c->magic != COMM_MAGIC) {
        warn("%s : invalid communicator", name);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t ensure_ready(struct ncclComm *c, const char *name)
{
    ncclResult_t r = comm_check(c, name);
    if (r)
        return r;
    if (atomic_load(&c->abort)) {
        warn("%s : the communicator was aborted", name);
        return ncclInvalidUsage;
    }
    r = check_joined(c);
    if (r == ncclInProgress || atomic_load(&c->busy)) {
        warn("Attempt to use communicator before the previous operation returned ncclSuccess");
        return ncclInvalidArgument;
    }
    return r;
}

static ncclResult_t ptr_check(const struct op *o, const void *p, const char *what)
{
    cudaPointerAttributes a;
    const char *name = opname[o->kind];
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess || !a.devicePointer) {
        warn("%s : %s %p is not a valid pointer", name, what, p);
        return ncclInvalidArgument;
    }
    if (a.type == 2 && a.device != o->comm->device) {
        warn("%s : %s allocated on device %d mismatchs with NCCL device %d", name, what, a.device,
             o->comm->device);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t check_args(const struct op *o)
{
    const char *name = opname[o->kind];
    int n = o->comm->nranks;
    if (o->kind != ALLREDUCE && o->kind != ALLGATHER && o->kind != REDUCESCATTER &&
        (o->root < 0 || o->root >= n)) {
        warn("%s : invalid root %d (root should be in the 0..%d range)", name, o->root, n);
        return ncclInvalidArgument;
    }
    if (o->dtype < 0 || o->dtype >= NUM_TYPES) {
        warn("%s : invalid type %d", name, o->dtype);
        return ncclInvalidArgument;
    }
    if ((o->kind == ALLREDUCE || o->kind == REDUCE || o->kind == REDUCESCATTER) &&
        (o->redop < 0 || o->redop >= NUM_OPS)) {
        warn("%s : invalid reduction operation %d", name, o->redop);
        return ncclInvalidArgument;
    }
    /* As NCCL: pointers are checked only with NCCL_CHECK_POINTERS=1; otherwise a
     * bad one is an illegal address on the device (execute: a sticky fault). */
    const char *chk = getenv("NCCL_CHECK_POINTERS");
    if (!chk || strcmp(chk, "1"))
        return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    if (o->count && uses_send(o))
        r = ptr_check(o, o->send, "sendbuff");
    if (!r && o->count && uses_recv(o))
        r = ptr_check(o, o->recv, "recvbuff");
    return r;
}

static ncclResult_t submit_in(struct op o)
{
    ncclResult_t r = ensure_ready(o.comm, opname[o.kind]);
    if (!r)
        r = check_args(&o);
    if (!r && o.count) {
        /* the stream is looked at by the call, not by the job that launches later */
        cudaError_t e = cudaStreamQuery(o.stream);
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            warn("Cuda failure '%s'", cudaGetErrorString(e));
            r = ncclUnhandledCudaError;
        }
    }
    if (r || !o.count) {
        if (r && grp.depth && !grp.err)
            grp.err = r;
        return r;
    }
    if (!grp.depth)
        return connect_and_launch(&o, 1);
    if (grp.n == grp.cap) {
        grp.cap = grp.cap ? 2 * grp.cap : 16;
        struct op *p = realloc(grp.ops, (size_t)grp.cap * sizeof *p);
        if (!p) {
            perror("fakenccl");
            abort();
        }
        grp.ops = p;
    }
    grp.ops[grp.n++] = o;
    return ncclSuccess;
}

static ncclResult_t submit(struct op o)
{
    ncclResult_t r = comm_check(o.comm, opname[o.kind]);
    if (r) {
        if (grp.depth && !grp.err)
            grp.err = r;
        return r;
    }
    int owned = enter(o.comm, opname[o.kind]);
    r = submit_in(o);
    leave(o.comm, owned);
    return r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, ncclComm_t comm,
                           cudaStream_t s)
{
    return submit((struct op){ALLREDUCE, send, recv, count, dtype, op, 0, comm, s});
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root,
                           ncclComm_t comm, cudaStream_t s)
{
    return submit((struct op){BROADCAST, send, recv, count, dtype, 0, root, comm, s});
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, int dtype, int op, int root,
                        ncclComm_t comm, cudaStream_t s)
{
    return submit((struct op){REDUCE, send, recv, count, dtype, op, root, comm, s});
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int dtype, ncclComm_t comm,
                           cudaStream_t s)
{
    return submit((struct op){ALLGATHER, send, recv, sendcount, dtype, 0, 0, comm, s});
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dtype, int op,
                               ncclComm_t comm, cudaStream_t s)
{
    return submit((struct op){REDUCESCATTER, send, recv, recvcount, dtype, op, 0, comm, s});
}

ncclResult_t ncclSend(const void *buf, size_t count, int dtype, int peer, ncclComm_t comm, cudaStream_t s)
{
    return submit((struct op){SEND, buf, NULL, count, dtype, 0, peer, comm, s});
}

ncclResult_t ncclRecv(void *buf, size_t count, int dtype, int peer, ncclComm_t comm, cudaStream_t s)
{
    return submit((struct op){RECV, NULL, buf, count, dtype, 0, peer, comm, s});
}

/* ---------------------------------------------------- communicators */

ncclResult_t ncclGetVersion(int *v)
{
    if (!v) {
        warn("ncclGetVersion : version argument is NULL");
        return ncclInvalidArgument;
    }
    *v = version();
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    uint64_t r;
    if (!id) {
        warn("ncclGetUniqueId : out argument is NULL");
        return ncclInvalidArgument;
    }
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
        warn("fakenccl: getrandom: %s", strerror(errno));
        return ncclSystemError;
    }
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, 8);
    snprintf(id->internal + 8, sizeof id->internal - 8, "/fakenccl-%d-%016llx", (int)getpid(),
             (unsigned long long)r);
    return ncclSuccess;
}

static ncclResult_t read_config(const ncclConfig_t *cfg, int *blocking, const char *name)
{
    if (!cfg)
        return ncclSuccess;
    if (cfg->magic != CONFIG_MAGIC) {
        warn("%s : ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER", name);
        return ncclInvalidArgument;
    }
    if (cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int) || cfg->blocking == CONFIG_UNDEF)
        return ncclSuccess;
    if (cfg->blocking != 0 && cfg->blocking != 1) {
        warn("%s : invalid blocking attribute %d", name, cfg->blocking);
        return ncclInvalidArgument;
    }
    *blocking = cfg->blocking;
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                              const ncclConfig_t *cfg)
{
    int blocking = 1, device;
    if (!out) {
        warn("CommInitRank : newcomm argument is NULL");
        return ncclInvalidArgument;
    }
    *out = NULL;
    ncclResult_t r = read_config(cfg, &blocking, "CommInitRankConfig");
    if (r)
        return r;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        warn("Invalid rank requested : %d/%d", rank, nranks);
        return ncclInvalidArgument;
    }
    if (memcmp(id->internal, ID_MAGIC, 8) || !memchr(id->internal + 8, 0, sizeof id->internal - 8)) {
        warn("fakenccl: the unique id was not made by ncclGetUniqueId");
        return ncclInvalidArgument;
    }
    cudaError_t e = cudaGetDevice(&device);
    if (e) {
        warn("Cuda failure '%s'", cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return comm_create(out, nranks, id->internal + 8, rank, device, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    return init_rank(out, nranks, &id, rank, NULL);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    return init_rank(out, nranks, &id, rank, config);
}

/* A collective over the parent: every rank posts (color, key) in the parent's
 * segment, then each color joins a segment of its own, ranks ordered by (key,
 * parent rank).  On a blocking parent, on the calling thread; on a
 * non-blocking one, as NCCL: ncclInProgress at once, *out still NULL, and the
 * child's handle stored later from a thread of the library's, the parent in
 * progress until then. */
static ncclResult_t split_now(ncclComm_t c, int g, int color, int key, ncclComm_t *out, int blocking)
{
    int n = 0, rank = 0;
    struct member *m = member(c, c->rank);
    if (spin(c, split_read, g - 1)) /* everyone read my previous split's arguments */
        goto aborted;
    m->color = color;
    m->key = key;
    atomic_store(&m->split_in, g);
    if (spin(c, split_written, g))
        goto aborted;
    for (int i = 0; i < c->nranks; i++) {
        struct member *o = member(c, i);
        if (o->color != color)
            continue;
        n++;
        rank += o->key < key || (o->key == key && i < c->rank);
    }
    atomic_store(&m->split_out, g);
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    char name[sizeof c->name];
    if (snprintf(name, sizeof name, "%s-%dc%d", c->name, g, color) >= (int)sizeof name) {
        warn("fakenccl: CommSplit : communicators split too deep");
        return ncclInternalError;
    }
    ncclComm_t child = NULL;
    ncclResult_t r = comm_create(&child, n, name, rank, c->device, blocking);
    __atomic_store_n(out, child, __ATOMIC_RELEASE);
    return r;
aborted:
    warn("CommSplit : the communicator was aborted");
    return ncclInvalidUsage;
}

struct split_job {
    ncclComm_t c, *out;
    int g, color, key, blocking;
};

static void *split_thread(void *arg)
{
    struct split_job *j = arg;
    ncclComm_t c = j->c;
    ncclResult_t r = split_now(c, j->g, j->color, j->key, j->out, j->blocking);
    if (r != ncclSuccess && r != ncclInProgress) {
        int ok = ncclSuccess;
        atomic_compare_exchange_strong(&c->state, &ok, r);
    }
    atomic_store(&c->busy, 0);
    comm_unref(c);
    free(j);
    return NULL;
}

static ncclResult_t split_in(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *config);

ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *config)
{
    ncclResult_t r = comm_check(c, "CommSplit");
    if (r)
        return r;
    int owned = enter(c, "ncclCommSplit");
    r = split_in(c, color, key, out, config);
    leave(c, owned);
    return r;
}

static ncclResult_t split_in(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *config)
{
    ncclResult_t r = ensure_ready(c, "CommSplit");
    if (r)
        return r;
    if (!out) {
        warn("CommSplit : newcomm argument is NULL");
        return ncclInvalidArgument;
    }
    *out = NULL;
    int blocking = c->blocking;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
        warn("CommSplit : invalid color %d", color);
        return ncclInvalidArgument;
    }
    if ((r = read_config(config, &blocking, "CommSplit")))
        return r;
    int g = ++c->splits;
    if (c->blocking)
        return split_now(c, g, color, key, out, blocking);
    struct split_job *j = xmalloc(sizeof *j);
    *j = (struct split_job){c, out, g, color, key, blocking};
    return in_background(c, split_thread, j);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *res)
{
    ncclResult_t r = comm_check(c, "ncclGetAsyncError");
    if (r)
        return r;
    if (!res) {
        warn("ncclGetAsyncError : asyncError argument is NULL");
        return ncclInvalidArgument;
    }
    int owned = enter(c, "ncclCommGetAsyncError");
    join_job(c, 0);
    r = check_joined(c);
    if (r == ncclSuccess && ((atomic_load(&c->finalizing) && atomic_load(&c->pending)) ||
                             atomic_load(&c->busy)))
        r = ncclInProgress;
    *res = r;
    leave(c, owned);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    ncclResult_t r = comm_check(c, "CommFinalize");
    if (r)
        return r;
    int owned = enter(c, "ncclCommFinalize");
    atomic_store(&c->finalizing, 1);
    if (c->blocking)
        r = spin(c, no_pending, 0) ? ncclInvalidUsage : ncclSuccess;
    else
        r = no_pending(c, 0) ? ncclSuccess : ncclInProgress;
    leave(c, owned);
    return r;
}

/* Waits for the outstanding work (forever if it hangs, as NCCL's does,
 * unless another thread aborts the comm meanwhile). */
ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    ncclResult_t r = comm_check(c, "CommDestroy");
    if (r)
        return r;
    int owned = enter(c, "ncclCommDestroy");
    atomic_fetch_add(&c->refs, 1);
    spin(c, no_pending, 0);
    leave(c, owned);
    release_user_ref(c);
    comm_unref(c);
    return ncclSuccess;
}

/* Makes the comm's queued and running operations stop; never waits. */
ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    ncclResult_t r = comm_check(c, "CommAbort");
    if (r)
        return r;
    /* FAKENCCL_ABORT_DELAY_MS: the abort takes that long, the kernels running until its end (as
     * NCCL's abort, which waits for its proxy threads and kernels) */
    const char *delay = getenv("FAKENCCL_ABORT_DELAY_MS");
    if (delay && *delay) {
        struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(&c->abort, 1);
    /* as NCCL's: returns once the communicator's operations stopped (they see the flag) */
    unsigned idle = 0;
    while (atomic_load(&c->pending) > 0)
        backoff(&idle);
    release_user_ref(c);
    return ncclSuccess;
}

static ncclResult_t comm_attr(ncclComm_t c, int *out, int value, const char *name)
{
    ncclResult_t r = comm_check(c, name);
    if (r)
        return r;
    if (!out) {
        warn("%s : out argument is NULL", name);
        return ncclInvalidArgument;
    }
    *out = value;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t c, int *count)
{
    return comm_attr(c, count, c ? c->nranks : 0, "CommCount");
}

ncclResult_t ncclCommCuDevice(ncclComm_t c, int *device)
{
    return comm_attr(c, device, c ? c->device : 0, "CommCuDevice");
}

ncclResult_t ncclCommUserRank(ncclComm_t c, int *rank)
{
    return comm_attr(c, rank, c ? c->rank : 0, "CommUserRank");
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "timeout";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t c)
{
    (void)c;
    return last_err;
}

/* Test-only: communicators created and not yet freed in this process. */
int fakencclCommCount(void) { return atomic_load(&live_comms); }

/* Test-only: how many times a thread entered a communicator another thread was inside. */
long fakencclConcurrentEntries(void) { return atomic_load(&concurrent_entries); }
