/* Shared-memory segments (shm.h): the sizes from the environment, one
 * segment per rank created, mapped by every peer and unlinked once all
 * have it, stale segments of dead jobs swept, the banks and the scratch
 * buffer; the owner process a segment names (timeout diagnosis); and the
 * fuzzing hooks that overwrite what a peer publishes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "internal.h"
#include "cma.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../util/log.h"
#include "../../util/net.h"

/* Control block size, rounded up to a page so the banks are page-aligned. */
#define CTRL_BYTES                                                            \
    ((sizeof(pd_shm_ctrl) + (size_t)4095) & ~(size_t)4095)


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

/* The banks' default: 1 MiB where every local rank has a core of its own,
 * 256 KiB where they share cores.  With a core each, a collective of up to
 * a bank per rank runs in one round, two syncs, where 256 KiB banks took
 * four rounds of two at 1 MiB.  Measured on the 2-core EPYC VM, 2 ranks,
 * float32, every kind through the banks (single copies off), 256 KiB banks
 * against 1 MiB in alternating jobs, median us: all_reduce 1 MiB 109-115 ->
 * 72-73, 4 MiB 402-427 -> 295-340; reduce 1 MiB 96-100 -> 52-59, 4 MiB
 * 386-431 -> 215-227; broadcast 4 MiB 424-491 -> 118-153; gather 4 MiB
 * 229-324 -> 139-146; scatter 4 MiB 261-321 -> 109-142; 256 KiB and 16 MiB
 * the same within the noise; 2 MiB banks no better than 1 MiB.  4 ranks on
 * the 2 cores, out of the box (rules measured by the first job), 9 rounds
 * of each: all_gather 4 MiB 534-910 -> 711-1368, gather 1 MiB 43-69 ->
 * 47-113, broadcast 4 MiB 333-433 -> 372-531, but all_to_all 1 MiB 153-257
 * -> 111-716 and reduce 1 MiB 229-273 -> 209-272: where ranks wait for the
 * scheduler, smaller rounds overlap one rank's copy with another's turn.
 * Every segment has room for 1 MiB banks, 1.5 MiB more than 256 KiB ones
 * took (its rings, 256 KiB per local rank, stay the larger part from 6
 * local ranks on).  The choice
 * is made at attach from every local rank's flag ANDed (pd_shm_spins), so
 * ranks that count cores differently still agree; the segments hold banks
 * of the larger size either way, laid out before that is known.
 * PYDDP_SHM_CHUNK sets both. */
#define PD_SHM_BANK_OWN_CORES ((size_t)1 << 20)
#define PD_SHM_BANK_SHARED_CORES ((size_t)256 << 10)
#define PD_SHM_BANK_UNSET ((size_t)1) /* below the smallest bank: unset */

size_t
pd_shm_bank_bytes(int cores_all)
{
    if (bank_cached == 0) {
        bank_cached = pd_shm_env_bytes("PYDDP_SHM_CHUNK", PD_SHM_BANK_UNSET,
                                       4096, (size_t)64 << 20);
    }
    if (bank_cached == PD_SHM_BANK_UNSET) {
        return cores_all ? PD_SHM_BANK_OWN_CORES : PD_SHM_BANK_SHARED_CORES;
    }
    return bank_cached & ~(size_t)4095;
}

/* The host's last-level cache as sysfs gives it for CPU 0 (the cache a
 * core shares with its neighbours: a CCX's 32 MiB on an EPYC, where
 * sysconf's _SC_LEVEL3_CACHE_SIZE says the whole chip's 256 MiB), 0 when
 * it says nothing. */
static size_t
shared_cache_bytes(void)
{
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96], buf[32];
        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            break;
        }
        size_t got = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[got] = '\0';
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        size_t unit = *end == 'K' ? 1024 : *end == 'M' ? (size_t)1 << 20 : 1;
        if (v > 0 && v < ((unsigned long long)1 << 40) / unit &&
            (size_t)v * unit > best) {
            best = (size_t)v * unit;
        }
    }
    return best;
}

size_t
pd_shm_stream_bytes(void)
{
    if (stream_cached == 0) {
        /* a quarter of the shared cache (8 MiB of an EPYC CCX's 32), within
         * [2, 64] MiB; 8 MiB when sysfs does not say */
        size_t llc = shared_cache_bytes() / 4;
        size_t dflt = llc == 0 ? (size_t)8 << 20
                      : llc < ((size_t)2 << 20) ? (size_t)2 << 20
                      : llc > ((size_t)64 << 20) ? (size_t)64 << 20
                                                  : llc;
        stream_cached = pd_shm_env_bytes("PYDDP_SHM_STREAM", dflt, 1,
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
    /* room for the larger banks; the size in use is agreed at attach */
    s->bank_cap = pd_shm_bank_bytes(1);
    s->bank_bytes = pd_shm_bank_bytes(0);
    s->ring_off = CTRL_BYTES + 2 * s->bank_cap;
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
        if (shm_ctrl(s, q)->cores != 1u) {
            s->cores_all = 0;
        }
    }
    s->bank_bytes = pd_shm_bank_bytes(s->cores_all);
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
    return shm_ctrl(s, p);
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
    return s->base[p] + CTRL_BYTES + (size_t)b * s->bank_cap;
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

char
pd_shm_peer_state(pd_shm *s, int p)
{
    if (p < 0 || p >= s->size || p == s->rank || !s->mapped[p]) {
        return 0;
    }
    pd_shm_ctrl *c = shm_ctrl(s, p);
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
