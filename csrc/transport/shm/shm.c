/* Shared-memory segments, single-writer step flags and futex waits (shm.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "shm.h"
#include "cma.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../kernels/kernels.h"
#include "../../util/kinds.h"
#include "../../util/log.h"
#include "../../util/net.h"

/* Control block size, rounded up to a page so the banks are page-aligned. */
#define CTRL_BYTES                                                            \
    ((sizeof(pd_shm_ctrl) + (size_t)4095) & ~(size_t)4095)

/* Busy polling before sleeping, when every rank has a core of its own. */
#define SPIN_BUSY_S 100e-6
/* ... in slices this long, yielding the core between them: cheap on a core
 * of one's own (nothing else to run), and a wake-up placed on the peer's
 * core (the scheduler does that for a while after a futex wake) no longer
 * costs the peer the whole spin.  Measured, 2 ranks on 2 cores, broadcast
 * of 1 MiB: 70 us apart, 300-330 us in runs where they shared a core for a
 * while, 620 us pinned to one core. */
#define SPIN_SLICE_S 5e-6
/* Oversubscribed host, waiting for one rank (eager syncs): polling first. */
#define SPIN_EAGER_S 2e-6
/* Oversubscribed host: yields before sleeping on the futex. */
#define YIELDS 16
/* Longest futex sleep between checks (dead peer, deadline, signals). */
#define SLEEP_SLICE_NS 20000000L

/* Per-peer ring counters in a rank's segment (entry p concerns peer p). */
typedef struct ring_ctl {
    _Alignas(PD_SHM_LINE) _Atomic uint64_t head; /* bytes I wrote to p */
    _Alignas(PD_SHM_LINE) _Atomic uint64_t tail; /* bytes I read from p */
    _Atomic uint32_t want_data;                  /* I wait for p's data */
    _Atomic uint32_t want_space;                 /* I wait for p to read */
} ring_ctl;

struct pd_shm {
    int rank;
    int size;
    int spin;          /* 1: busy poll first; 0: yield (oversubscribed) */
    int cores_all;     /* every rank's spin was 1 (pd_shm_spins) */
    uint64_t token;
    uint32_t node;
    size_t bank_bytes;
    size_t ring_off;   /* ring_ctl[size] then rings[size] */
    size_t seg_bytes;
    char **base;       /* base[p]: rank p's segment (own included) */
    int *mapped;
    int linked;        /* own name still in /dev/shm */
    uint32_t step;     /* my step (private copy of ctrl->step) */
    int bank;
    pd_shm_ident cur;  /* the collective entered last */
    int unchecked;     /* it did not check every rank's identity */
    int cma;           /* single copies by cross-memory attach */
    uint64_t cma_word; /* what the peers' probes read (cma.c) */
    char *scratch;     /* pd_shm_scratch */
    size_t scratch_bytes;
    int waited_for;    /* the peer the last timed-out wait waited for */
};

size_t
pd_shm_env_bytes(const char *name, size_t dflt, size_t lo, size_t hi)
{
    const char *e = getenv(name);
    if (e == NULL || !*e) {
        return dflt;
    }
    /* The rules of pyddp/_config.py, which refuses a bad value (naming the
     * variable) before the core reads it: digits, then K, M or G, blanks
     * around either, nothing else; here a bad value falls back to the
     * default (strtoull alone would take "abc" as 0 and "-5" as a huge
     * number). */
    while (*e == ' ' || *e == '\t') {
        e++;
    }
    if (*e < '0' || *e > '9') {
        return dflt;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(e, &end, 10);
    unsigned shift = 0;
    while (*end == ' ' || *end == '\t') {
        end++;
    }
    if (*end == 'K' || *end == 'k') {
        shift = 10;
        end++;
    }
    else if (*end == 'M' || *end == 'm') {
        shift = 20;
        end++;
    }
    else if (*end == 'G' || *end == 'g') {
        shift = 30;
        end++;
    }
    while (*end == ' ' || *end == '\t') {
        end++;
    }
    if (errno != 0 || *end != '\0' || x > (ULLONG_MAX >> shift)) {
        return dflt;
    }
    x <<= shift;
    return x >= lo && x <= hi ? (size_t)x : dflt;
}

/* PYDDP_SHM_CHUNK and PYDDP_SHM_STREAM, read once per process (and again
 * in a forked child: pd_shm_env_forget). */
static size_t bank_cached;
static size_t stream_cached;

void
pd_shm_env_forget(void)
{
    bank_cached = 0;
    stream_cached = 0;
    pd_cma_env_forget();
}

size_t
pd_shm_bank_bytes(void)
{
    if (bank_cached == 0) {
        bank_cached = pd_shm_env_bytes("PYDDP_SHM_CHUNK", (size_t)256 << 10,
                                       4096, (size_t)64 << 20) &
                      ~(size_t)4095;
    }
    return bank_cached;
}

size_t
pd_shm_stream_bytes(void)
{
    if (stream_cached == 0) {
        stream_cached = pd_shm_env_bytes("PYDDP_SHM_STREAM", (size_t)8 << 20, 1,
                                         SIZE_MAX);
    }
    return stream_cached;
}

/* Fault injection for the tests (tests/distributed/test_chaos.py): PYDDP_TEST_SHM_FAIL
 * = ENOSPC makes allocating this rank's segment fail as on a full /dev/shm,
 * EACCES makes creating it fail as on an unwritable one.  The real /dev/shm
 * is never touched.  Returns the errno to fail with at `stage` ("open" or
 * "alloc"), else 0. */
static int
test_shm_fail(const char *stage)
{
    const char *e = getenv("PYDDP_TEST_SHM_FAIL");
    if (e == NULL || !*e) {
        return 0;
    }
    if (strcmp(e, "ENOSPC") == 0) {
        return strcmp(stage, "alloc") == 0 ? ENOSPC : 0;
    }
    if (strcmp(e, "EACCES") == 0) {
        return strcmp(stage, "open") == 0 ? EACCES : 0;
    }
    return 0;
}

static void
seg_name(char *buf, size_t len, uint64_t token, uint32_t node, int rank)
{
    snprintf(buf, len, "/pyddp.%016llx.%08x.%d", (unsigned long long)token,
             node, rank);
}

static ring_ctl *
rctl(pd_shm *s, int owner, int p)
{
    return (ring_ctl *)(s->base[owner] + s->ring_off) + p;
}

static char *
ring(pd_shm *s, int owner, int p)
{
    return s->base[owner] + s->ring_off + (size_t)s->size * sizeof(ring_ctl) +
           (size_t)p * PD_SHM_RING_BYTES;
}

/* Segments left by a job whose every rank was killed between creating its
 * segment and unlinking it (a moment during start-up; survivors of a partial
 * kill unlink them themselves).  A rank segment records its creator's pid:
 * remove this user's segments whose creator is gone, and empty ones (creator
 * killed before writing anything), once they are older than any start-up
 * takes.  Shared buffers (".b<id>") carry no pid and are left alone. */
#define STALE_AGE_S 10

void
pd_shm_sweep_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned long long tok;
        unsigned node;
        int idx;
        char extra;
        if (sscanf(e->d_name, "pyddp.%16llx.%8x.%d%c", &tok, &node, &idx,
                   &extra) != 3) {
            continue;
        }
        int fd = openat(dirfd(d), e->d_name,
                        O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        struct stat st;
        int stale = 0;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == geteuid() && now - st.st_mtime >= STALE_AGE_S) {
            int32_t pid = 0;
            if ((size_t)st.st_size >= sizeof(pd_shm_ctrl)) {
                pd_shm_ctrl *c = mmap(NULL, sizeof(pd_shm_ctrl), PROT_READ,
                                      MAP_SHARED, fd, 0);
                if (c != MAP_FAILED) {
                    pid = c->pid;
                    munmap(c, sizeof(pd_shm_ctrl));
                }
            }
            stale = pid > 0 ? kill(pid, 0) != 0 && errno == ESRCH
                            : st.st_size == 0;
        }
        close(fd);
        if (stale && unlinkat(dirfd(d), e->d_name, 0) == 0) {
            PD_LOG(PD_LOG_INFO, "shm", "removed %s/%s, left by a dead job",
                   dir, e->d_name);
        }
    }
    closedir(d);
}

/* Process pid's state letter and start time (clock ticks after boot) from
 * /proc/<pid>/stat; 0 when it cannot be read (gone, no /proc). */
static int
proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        return 0;
    }
    ssize_t n;
    do {
        n = read(fd, buf, sizeof(buf) - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    /* "pid (comm) S ppid ...": comm may hold spaces and parentheses, so
     * the fields start after the last ')' */
    char *q = strrchr(buf, ')');
    if (q == NULL || q[1] != ' ' || q[2] == '\0') {
        return 0;
    }
    *state = q[2];
    /* starttime is field 22; the state is field 3 */
    char *f = q + 3;
    for (int i = 3; i < 22; i++) {
        f = strchr(f, ' ');
        if (f == NULL) {
            return 0;
        }
        f++;
    }
    char *end;
    unsigned long long v = strtoull(f, &end, 10);
    if (end == f) {
        return 0;
    }
    *start = (uint64_t)v;
    return 1;
}

pd_status
pd_shm_create(int rank, int size, uint64_t token, uint32_t node, int spin,
              pd_shm **out)
{
    pd_shm *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return pd_error(PD_ENOMEM, "shared memory: out of memory");
    }
    *out = s;
    s->rank = rank;
    s->size = size;
    s->spin = spin;
    s->token = token;
    s->node = node;
    s->waited_for = -1;
    s->bank_bytes = pd_shm_bank_bytes();
    s->ring_off = CTRL_BYTES + 2 * s->bank_bytes;
    s->seg_bytes = s->ring_off + (size_t)size * sizeof(ring_ctl) +
                   (size_t)size * PD_SHM_RING_BYTES;
    s->base = calloc((size_t)size, sizeof(char *));
    s->mapped = calloc((size_t)size, sizeof(int));
    if (s->base == NULL || s->mapped == NULL) {
        return pd_error(PD_ENOMEM, "shared memory: out of memory");
    }
    pd_shm_sweep_stale("/dev/shm");
    char name[64];
    seg_name(name, sizeof(name), token, node, rank);
    int inject = test_shm_fail("open");
    int fd = inject ? (errno = inject, -1)
                    : shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        return pd_syserror(PD_ESYS, "creating shared memory segment %s in "
                           "/dev/shm: shm_open", name);
    }
    s->linked = 1;
    /* allocate the pages now: a full /dev/shm fails here, not with SIGBUS
     * in the middle of a collective */
    int e = test_shm_fail("alloc");
    if (e == 0) {
        e = posix_fallocate(fd, 0, (off_t)s->seg_bytes);
    }
    if (e != 0) {
        errno = e;
        pd_status st = pd_syserror(
            PD_ESYS, "allocating %zu bytes of shared memory for %s (is "
            "/dev/shm large enough?)", s->seg_bytes, name);
        close(fd);
        return st;
    }
    void *p = mmap(NULL, s->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        return pd_syserror(PD_ESYS, "mmap(%s)", name);
    }
    s->base[rank] = p;
    s->mapped[rank] = 1;
    pd_shm_ctrl *c = p;
    c->pid = (int32_t)getpid();
    c->cores = spin ? 1u : 0u;
    char state;
    uint64_t start = 0;
    c->start = proc_stat(getpid(), &state, &start) ? start : 0;
    /* the word a peer's cross-memory-attach probe reads (cma.c): a value
     * it cannot guess, so a pid that names another process fails */
    if (pd_random_bytes(&s->cma_word, sizeof(s->cma_word)) != PD_OK) {
        s->cma_word = (uint64_t)(uintptr_t)s ^ ((uint64_t)getpid() << 32);
    }
    c->cma_addr = (uint64_t)(uintptr_t)&s->cma_word;
    c->cma_cookie = s->cma_word;
    return PD_OK;
}

pd_status
pd_shm_attach(pd_shm *s)
{
    for (int q = 0; q < s->size; q++) {
        if (s->mapped[q]) {
            continue;
        }
        char name[64];
        seg_name(name, sizeof(name), s->token, s->node, q);
        int fd = shm_open(name, O_RDWR, 0600);
        if (fd < 0) {
            return pd_syserror(PD_ESYS,
                               "shm_open(%s) of local rank %d's segment", name,
                               q);
        }
        struct stat stt;
        if (fstat(fd, &stt) != 0 || (size_t)stt.st_size != s->seg_bytes) {
            close(fd);
            return pd_error(PD_EINVAL,
                            "shared memory segment %s of local rank %d has "
                            "another size than this rank's (%zu bytes): "
                            "every rank must use the same PYDDP_SHM_CHUNK",
                            name, q, s->seg_bytes);
        }
        void *p = mmap(NULL, s->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            return pd_syserror(PD_ESYS, "mmap(%s)", name);
        }
        s->base[q] = p;
        s->mapped[q] = 1;
    }
    s->cores_all = 1;
    for (int q = 0; q < s->size; q++) {
        if (pd_shm_ctrl_of(s, q)->cores != 1u) {
            s->cores_all = 0;
        }
    }
    return PD_OK;
}

void
pd_shm_unlink(pd_shm *s, int all)
{
    if (s == NULL) {
        return;
    }
    char name[64];
    for (int q = 0; q < s->size; q++) {
        if (q == s->rank ? !s->linked : !all) {
            continue;
        }
        seg_name(name, sizeof(name), s->token, s->node, q);
        if (shm_unlink(name) != 0 && errno != ENOENT) {
            PD_LOG(PD_LOG_WARN, "shm", "shm_unlink(%s): %s", name,
                   strerror(errno));
        }
        if (q == s->rank) {
            s->linked = 0;
        }
    }
}

void
pd_shm_close(pd_shm *s)
{
    if (s == NULL) {
        return;
    }
    pd_shm_unlink(s, 0);
    for (int q = 0; q < s->size && s->base != NULL; q++) {
        if (s->mapped[q]) {
            munmap(s->base[q], s->seg_bytes);
        }
    }
    free(s->base);
    free(s->mapped);
    free(s->scratch);
    free(s);
}

int
pd_shm_spins(const pd_shm *s)
{
    return s->cores_all;
}

int
pd_shm_rank(const pd_shm *s)
{
    return s->rank;
}

int
pd_shm_size(const pd_shm *s)
{
    return s->size;
}

pd_shm_ctrl *
pd_shm_ctrl_of(pd_shm *s, int p)
{
    return (pd_shm_ctrl *)s->base[p];
}

void
pd_shm_set_cma(pd_shm *s, int on)
{
    s->cma = on;
}

int
pd_shm_cma(const pd_shm *s)
{
    return s != NULL && s->cma;
}

char *
pd_shm_scratch(pd_shm *s, size_t bytes)
{
    if (bytes > s->scratch_bytes) {
        char *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (p == NULL) {
            pd_error(PD_ENOMEM, "shared memory: out of memory");
            return NULL;
        }
        free(s->scratch);
        s->scratch = p;
        s->scratch_bytes = bytes;
    }
    return s->scratch;
}

char *
pd_shm_bank(pd_shm *s, int p, int b)
{
    return s->base[p] + CTRL_BYTES + (size_t)b * s->bank_bytes;
}

size_t
pd_shm_bank_size(const pd_shm *s)
{
    return s->bank_bytes;
}

int
pd_shm_cur_bank(const pd_shm *s)
{
    return s->bank;
}

int
pd_shm_next_bank(pd_shm *s)
{
    s->bank ^= 1;
    return s->bank;
}

void
pd_shm_enter(pd_shm *s, const pd_shm_ident *id, uint64_t value)
{
    pd_shm_ctrl *c = pd_shm_ctrl_of(s, s->rank);
    c->ident[id->seq & 1] = *id;
    c->value[id->seq & 1] = value;
    s->cur = *id;
    /* published by the release store of the next step */
}

/* ------------------------------------------------------------- waiting */

static long
futex(_Atomic uint32_t *addr, int op, uint32_t val,
      const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* a has reached b (wrap-safe) */
static inline int
reached(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) >= 0;
}

/* Peer p failed the group, or left it before reaching target. */
static pd_status
peer_aborted(pd_shm *s, int p, uint32_t target)
{
    pd_shm_ctrl *c = pd_shm_ctrl_of(s, p);
    uint32_t a = atomic_load_explicit(&c->abort, memory_order_acquire);
    if (a == 0) {
        if (atomic_load_explicit(&c->left, memory_order_acquire) &&
            !reached(atomic_load_explicit(&c->step, memory_order_acquire),
                     target)) {
            return pd_error(PD_ENETWORK,
                            "rank %d cannot complete the collective: rank %d "
                            "has left the group (destroyed its process group "
                            "or exited)", s->rank, p);
        }
        return PD_OK;
    }
    char msg[PD_ERRMSG_MAX];
    memcpy(msg, c->abort_msg, sizeof(msg));
    msg[sizeof(msg) - 1] = '\0';
    pd_status st = a < PD_NSTATUS ? (pd_status)a : PD_EBACKEND;
    return pd_error(st, "%s", msg);
}

static pd_status
wait_checks(pd_shm *s, const pd_shm_waiter *w, int p, uint32_t target)
{
    pd_status st;
    for (int q = 0; q < s->size; q++) {
        if (q != s->rank && (st = peer_aborted(s, q, target)) != PD_OK) {
            return st;
        }
    }
    if (w->check != NULL && (st = w->check(w->ctx)) != PD_OK) {
        return st;
    }
    if (w->interrupted != NULL && w->interrupted(w->ctx)) {
        return pd_error(PD_EINTR, "interrupted");
    }
    if (w->deadline > 0 && pd_now() >= w->deadline) {
        s->waited_for = p;
        return pd_error(PD_ETIMEOUT, "timed out waiting for local rank %d",
                        p);
    }
    return PD_OK;
}

/* Poll word until it reaches target or `until` passes; 1 if reached. */
static int
poll_until(_Atomic uint32_t *word, uint32_t target, double until)
{
    do {
        for (int i = 0; i < 64; i++) {
            if (reached(atomic_load_explicit(word, memory_order_acquire),
                        target)) {
                return 1;
            }
            cpu_relax();
        }
    } while (pd_now() < until);
    return 0;
}

/* Wait until peer p's step reaches target.  source: p is the one source of
 * an eager sync's data.
 *
 * With a core per rank, poll for a while, then sleep on the peer's step
 * word (the futex).  On an oversubscribed host (more local ranks than
 * cores) poll only for a source, which is likely running right now on
 * another core, then yield the core a few times, then sleep.  Measured with
 * 4 ranks on 2 cores (median of max-over-ranks, us): 16 yields then sleep:
 * broadcast 0.8-2, allreduce 5-8; yielding for 200 us: broadcast 2-17,
 * allreduce 5-8; sleeping at once: 27 for both (futex wake-ups are slow). */
static pd_status
wait_peer(pd_shm *s, int p, uint32_t target, const pd_shm_waiter *w,
          int source)
{
    pd_shm_ctrl *pc = pd_shm_ctrl_of(s, p);
    _Atomic uint32_t *word = &pc->step;
    if (reached(atomic_load_explicit(word, memory_order_acquire), target)) {
        return PD_OK;
    }
    int busy = s->spin && !w->nospin;
    double spin = busy ? SPIN_BUSY_S : source ? SPIN_EAGER_S : 0.0;
    if (spin > 0) {
        double end = pd_now() + spin;
        for (;;) {
            double now = pd_now();
            double slice = busy ? SPIN_SLICE_S : 10e-6;
            if (poll_until(word, target, now + slice < end ? now + slice : end)) {
                return PD_OK;
            }
            if (atomic_load_explicit(&pc->abort, memory_order_relaxed) ||
                atomic_load_explicit(&pc->left, memory_order_relaxed)) {
                return peer_aborted(s, p, target);
            }
            if (pd_now() >= end) {
                break;
            }
            if (busy) {
                /* the peer may be waiting for this very core (the
                 * scheduler put both ranks on one for a while) */
                sched_yield();
            }
        }
    }
    if (!busy) {
        /* give the core to the ranks we wait for (or to this rank's own
         * computing thread), a few times */
        for (int i = 0; i < YIELDS; i++) {
            sched_yield();
            if (reached(atomic_load_explicit(word, memory_order_acquire),
                        target)) {
                return PD_OK;
            }
        }
    }
    /* sleep on the peer's step word */
    pd_shm_ctrl *me = pd_shm_ctrl_of(s, s->rank);
    for (;;) {
        PD_CHECK(wait_checks(s, w, p, target));
        atomic_store_explicit(&me->sleeping, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(word, memory_order_seq_cst);
        if (reached(v, target)) {
            atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
            return PD_OK;
        }
        struct timespec ts = {0, SLEEP_SLICE_NS};
        futex(word, FUTEX_WAIT, v, &ts);
        atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
        if (reached(atomic_load_explicit(word, memory_order_acquire),
                    target)) {
            return PD_OK;
        }
    }
}

static void
wake_sleepers(pd_shm *s)
{
    pd_shm_ctrl *me = pd_shm_ctrl_of(s, s->rank);
    for (int p = 0; p < s->size; p++) {
        if (p != s->rank &&
            atomic_load_explicit(&pd_shm_ctrl_of(s, p)->sleeping,
                                 memory_order_seq_cst)) {
            futex(&me->step, FUTEX_WAKE, INT_MAX, NULL);
            return;
        }
    }
}

pd_status
pd_shm_sync_wait(pd_shm *s, const pd_shm_waiter *w)
{
    /* Start with the next rank so that ranks do not all poll rank 0. */
    for (int i = 1; i < s->size; i++) {
        int p = (s->rank + i) % s->size;
        pd_status st = wait_peer(s, p, s->step, w, 0);
        if (st != PD_OK) {
            return st;
        }
    }
    return PD_OK;
}

static void
bump(pd_shm *s)
{
    pd_shm_ctrl *me = pd_shm_ctrl_of(s, s->rank);
    s->step++;
    atomic_store_explicit(&me->step, s->step, memory_order_seq_cst);
    wake_sleepers(s);
}

pd_status
pd_shm_sync(pd_shm *s, const pd_shm_waiter *w)
{
    bump(s);
    return pd_shm_sync_wait(s, w);
}

/* Wait until some peer reaches target: poll them all for a moment (the
 * first one to arrive is likely running right now), then wait for the left
 * neighbour. */
static pd_status
wait_any(pd_shm *s, uint32_t target, const pd_shm_waiter *w)
{
    double until = pd_now() + (s->spin && !w->nospin ? SPIN_BUSY_S
                                                    : SPIN_EAGER_S);
    do {
        for (int i = 1; i < s->size; i++) {
            int p = (s->rank + s->size - i) % s->size;
            if (reached(atomic_load_explicit(&pd_shm_ctrl_of(s, p)->step,
                                             memory_order_acquire),
                        target)) {
                return PD_OK;
            }
        }
        cpu_relax();
    } while (pd_now() < until);
    return wait_peer(s, (s->rank + s->size - 1) % s->size, target, w, 0);
}

pd_status
pd_shm_sync_wait_from(pd_shm *s, const pd_shm_waiter *w, int src, int data)
{
    if (src == PD_SHM_ANY) {
        return wait_any(s, s->step, w);
    }
    if (src < 0) {
        return pd_shm_sync_wait(s, w);
    }
    if (src == s->rank) {
        return PD_OK;
    }
    return wait_peer(s, src, s->step, w, data);
}

pd_status
pd_shm_sync_from(pd_shm *s, const pd_shm_waiter *w, int src, int data)
{
    bump(s);
    return pd_shm_sync_wait_from(s, w, src, data);
}

static void
describe(const pd_shm_ident *id, const char *(*kind_name)(int), char *buf,
         size_t len)
{
    int kind = id->kind;
    int reduces = pd_kind_has(kind, PD_KF_REDUCES);
    /* a collective's root (shared memory runs no point-to-point kind) */
    int rooted = pd_kind_has(kind, PD_KF_ROOTED) &&
                 !pd_kind_has(kind, PD_KF_P2P);
    char opbuf[32] = "", rootbuf[32] = "";
    if (reduces) {
        snprintf(opbuf, sizeof(opbuf), ", op=%s",
                 id->op < PD_NREDOPS ? pd_redop_name((pd_redop)id->op) : "?");
    }
    if (rooted) {
        snprintf(rootbuf, sizeof(rootbuf), ", root=%d", id->root);
    }
    snprintf(buf, len, "%s(dtype=%s, count=%llu%s%s) [sequence number %llu]",
             kind_name(kind),
             id->dtype < PD_NDTYPES ? pd_dtype_name((pd_dtype)id->dtype) : "?",
             (unsigned long long)id->count, rootbuf, opbuf,
             (unsigned long long)id->seq);
}

pd_status
pd_shm_check_ident(pd_shm *s, const pd_shm_ident *id,
                   const char *(*kind_name)(int))
{
    return pd_shm_check_ident_from(s, id, kind_name, -1);
}

pd_status
pd_shm_entry(pd_shm *s, const pd_shm_waiter *w,
             const char *(*kind_name)(int))
{
    if (!s->unchecked) {
        return PD_OK;
    }
    /* every rank has entered the last collective: its identity is there,
     * and whatever it read of this rank's banks it has read */
    PD_CHECK(pd_shm_sync_wait(s, w));
    return pd_shm_check_ident_from(s, &s->cur, kind_name, -1);
}

pd_status
pd_shm_check_ident_from(pd_shm *s, const pd_shm_ident *id,
                        const char *(*kind_name)(int), int src)
{
    s->unchecked = src != -1;
    for (int p = 0; p < s->size; p++) {
        if (p == s->rank || (src >= 0 && p != src)) {
            continue;
        }
        if (src == PD_SHM_ANY &&
            !reached(atomic_load_explicit(&pd_shm_ctrl_of(s, p)->step,
                                          memory_order_acquire),
                     s->step)) {
            continue; /* not here yet: checked at the next entry */
        }
        const pd_shm_ident *o = &pd_shm_ctrl_of(s, p)->ident[id->seq & 1];
        if (o->seq != id->seq || o->kind != id->kind ||
            o->dtype != id->dtype || o->op != id->op || o->root != id->root ||
            o->count != id->count || o->aux != id->aux) {
            char a[256], b[256];
            describe(id, kind_name, a, sizeof(a));
            describe(o, kind_name, b, sizeof(b));
            if (o->seq == id->seq && o->kind == id->kind &&
                o->count == id->count && o->aux != id->aux) {
                return pd_error(PD_EMISMATCH,
                                "collective mismatch between ranks: rank %d "
                                "and rank %d called %s with different "
                                "shared-memory buffers or split sizes, or "
                                "another PYDDP_CMA_THRESHOLD",
                                s->rank, p, a);
            }
            return pd_error(PD_EMISMATCH,
                            "collective mismatch between ranks: rank %d "
                            "called %s but rank %d called %s",
                            s->rank, a, p, b);
        }
    }
    return PD_OK;
}

uint64_t
pd_shm_value(pd_shm *s, int p, uint64_t seq)
{
    return pd_shm_ctrl_of(s, p)->value[seq & 1];
}

int
pd_shm_waited_for(const pd_shm *s)
{
    return s->waited_for;
}

uint64_t
pd_shm_entered(pd_shm *s, int p)
{
    pd_shm_ctrl *c = pd_shm_ctrl_of(s, p);
    uint64_t a = c->ident[0].seq, b = c->ident[1].seq;
    return a > b ? a : b;
}

char
pd_shm_peer_state(pd_shm *s, int p)
{
    if (p < 0 || p >= s->size || p == s->rank || !s->mapped[p]) {
        return 0;
    }
    pd_shm_ctrl *c = pd_shm_ctrl_of(s, p);
    /* the peer's words: a pid that is not positive names no one process */
    int32_t pid = c->pid;
    uint64_t want = c->start;
    char state;
    uint64_t start;
    if (pid <= 0 || want == 0 || !proc_stat(pid, &state, &start) ||
        start != want) {
        return 0;
    }
    return state;
}

pd_status
pd_shm_peer_failure(pd_shm *s)
{
    for (int p = 0; p < s->size; p++) {
        if (p == s->rank || !s->mapped[p]) {
            continue;
        }
        pd_shm_ctrl *c = pd_shm_ctrl_of(s, p);
        if (atomic_load_explicit(&c->abort, memory_order_acquire) != 0) {
            /* target 0 is always reached: only the abort speaks */
            return peer_aborted(s, p, 0);
        }
    }
    return PD_OK;
}

/* ------------------------------------------------------------------ rings */

size_t
pd_shm_ring_write(pd_shm *s, int d, const void *buf, size_t len)
{
    ring_ctl *mine = rctl(s, s->rank, d);
    uint64_t head = atomic_load_explicit(&mine->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&rctl(s, d, s->rank)->tail,
                                         memory_order_acquire);
    /* tail is the peer's word: a value behind or past what was written
     * (a corrupt or hostile peer) must not send the copy out of the ring */
    uint64_t used = head - tail;
    size_t space = used <= PD_SHM_RING_BYTES
                       ? PD_SHM_RING_BYTES - (size_t)used : 0;
    size_t n = len < space ? len : space;
    if (n == 0) {
        return 0;
    }
    char *rb = ring(s, s->rank, d);
    size_t at = (size_t)(head % PD_SHM_RING_BYTES);
    size_t first = PD_SHM_RING_BYTES - at < n ? PD_SHM_RING_BYTES - at : n;
    pd_copy(rb + at, buf, first);
    pd_copy(rb, (const char *)buf + first, n - first);
    atomic_store_explicit(&mine->head, head + n, memory_order_seq_cst);
    return n;
}

size_t
pd_shm_ring_read(pd_shm *s, int p, void *buf, size_t len)
{
    ring_ctl *mine = rctl(s, s->rank, p);
    uint64_t tail = atomic_load_explicit(&mine->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&rctl(s, p, s->rank)->head,
                                         memory_order_acquire);
    /* head is the peer's word: never read more than one ring's worth */
    uint64_t used = head - tail;
    size_t avail = used <= PD_SHM_RING_BYTES ? (size_t)used
                                             : PD_SHM_RING_BYTES;
    size_t n = len < avail ? len : avail;
    if (n == 0) {
        return 0;
    }
    const char *rb = ring(s, p, s->rank);
    size_t at = (size_t)(tail % PD_SHM_RING_BYTES);
    size_t first = PD_SHM_RING_BYTES - at < n ? PD_SHM_RING_BYTES - at : n;
    pd_copy(buf, rb + at, first);
    pd_copy((char *)buf + first, rb, n - first);
    atomic_store_explicit(&mine->tail, tail + n, memory_order_seq_cst);
    return n;
}

int
pd_shm_ring_readable(pd_shm *s, int p)
{
    uint64_t tail = atomic_load_explicit(&rctl(s, s->rank, p)->tail,
                                         memory_order_relaxed);
    return atomic_load_explicit(&rctl(s, p, s->rank)->head,
                                memory_order_seq_cst) != tail;
}

int
pd_shm_ring_writable(pd_shm *s, int d)
{
    uint64_t head = atomic_load_explicit(&rctl(s, s->rank, d)->head,
                                         memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&rctl(s, d, s->rank)->tail,
                                         memory_order_seq_cst);
    return head - tail < PD_SHM_RING_BYTES;
}

void
pd_shm_ring_want(pd_shm *s, int p, int data, int space)
{
    ring_ctl *mine = rctl(s, s->rank, p);
    if (atomic_load_explicit(&mine->want_data, memory_order_relaxed) !=
        (uint32_t)data) {
        atomic_store_explicit(&mine->want_data, (uint32_t)data,
                              memory_order_seq_cst);
    }
    if (atomic_load_explicit(&mine->want_space, memory_order_relaxed) !=
        (uint32_t)space) {
        atomic_store_explicit(&mine->want_space, (uint32_t)space,
                              memory_order_seq_cst);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

int
pd_shm_ring_peer_waits(pd_shm *s, int p, int data)
{
    ring_ctl *theirs = rctl(s, p, s->rank);
    return data ? atomic_load_explicit(&theirs->want_data,
                                       memory_order_seq_cst) != 0
                : atomic_load_explicit(&theirs->want_space,
                                       memory_order_seq_cst) != 0;
}

void
pd_shm_abort(pd_shm *s, int status, const char *msg)
{
    if (s == NULL || s->base == NULL || !s->mapped[s->rank]) {
        return;
    }
    pd_shm_ctrl *me = pd_shm_ctrl_of(s, s->rank);
    if (atomic_load(&me->abort) == 0) {
        snprintf(me->abort_msg, sizeof(me->abort_msg), "%s", msg);
        atomic_store_explicit(&me->abort, (uint32_t)status,
                              memory_order_seq_cst);
    }
    pd_shm_wake_all(s);
}

void
pd_shm_leave(pd_shm *s)
{
    if (s == NULL || s->base == NULL || !s->mapped[s->rank]) {
        return;
    }
    atomic_store_explicit(&pd_shm_ctrl_of(s, s->rank)->left, 1,
                          memory_order_seq_cst);
    pd_shm_wake_all(s);
}

void
pd_shm_wake_all(pd_shm *s)
{
    for (int p = 0; p < s->size; p++) {
        if (s->mapped[p]) {
            futex(&pd_shm_ctrl_of(s, p)->step, FUTEX_WAKE, INT_MAX, NULL);
        }
    }
}

/* ---------------------------------------------------------------- fuzzing */

void
pd_shm_fuzz_sizes(size_t *ctrl, size_t *ring_ctl_bytes, size_t *ring_bytes)
{
    *ctrl = sizeof(pd_shm_ctrl);
    *ring_ctl_bytes = sizeof(ring_ctl);
    *ring_bytes = PD_SHM_RING_BYTES;
}

void
pd_shm_fuzz_publish(pd_shm *s, int p, const void *ctrl, size_t ctrl_len,
                    const void *rings, size_t rings_len)
{
    /* this rank starts over: no step taken, nothing read or written */
    memset(s->base[s->rank], 0, sizeof(pd_shm_ctrl));
    memset((void *)rctl(s, s->rank, 0), 0,
           (size_t)s->size * sizeof(ring_ctl));
    s->step = 0;
    s->bank = 0;
    s->unchecked = 0;
    memset(&s->cur, 0, sizeof(s->cur));
    /* the peer's words: whatever the bytes say */
    size_t cb = sizeof(pd_shm_ctrl), rb = (size_t)s->size * sizeof(ring_ctl);
    memset(s->base[p], 0, cb);
    memcpy(s->base[p], ctrl, ctrl_len < cb ? ctrl_len : cb);
    memset((void *)rctl(s, p, 0), 0, rb);
    memcpy((void *)rctl(s, p, 0), rings, rings_len < rb ? rings_len : rb);
}

double
pd_shm_pingpong(pd_shm *s, uint64_t tag, int k, double deadline)
{
    if (s->rank > 1 || s->size < 2) {
        return 0;
    }
    _Atomic uint64_t *ping = &pd_shm_ctrl_of(s, 0)->probe;
    _Atomic uint64_t *pong = &pd_shm_ctrl_of(s, 1)->probe;
    double trip[64];
    k = k < 2 ? 2 : k > 64 ? 64 : k;
    for (int i = 1; i <= k; i++) {
        uint64_t v = (tag << 8) | (uint64_t)i;
        double t0 = pd_now();
        if (s->rank == 0) {
            atomic_store_explicit(ping, v, memory_order_release);
        }
        _Atomic uint64_t *wait = s->rank == 0 ? pong : ping;
        unsigned spins = 0;
        while (atomic_load_explicit(wait, memory_order_acquire) != v) {
            cpu_relax();
            if ((++spins & 63u) == 0 && pd_now() > deadline) {
                return s->rank == 0 ? -1.0 : 0.0;
            }
        }
        if (s->rank == 1) {
            atomic_store_explicit(pong, v, memory_order_release);
        }
        trip[i - 1] = pd_now() - t0;
    }
    if (s->rank != 0) {
        return 0;
    }
    /* the median trip after the first (which waits for rank 1 to come) */
    int m = k - 1;
    double *t = trip + 1;
    for (int i = 1; i < m; i++) {
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    }
    return t[m / 2] * 1e9 / 2.0;
}

int
pd_shm_phase_of(pd_shm *s, uint64_t seq, int keep)
{
    const pd_shm_ident *o = &pd_shm_ctrl_of(s, 0)->ident[seq & 1];
    return o->seq == seq ? o->phase : keep;
}
