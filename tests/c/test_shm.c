/* transport/shm: segments (created, mapped by every rank, unlinked), step
 * syncs with identity checks, byte rings, timeouts and aborts, between real
 * forked processes. */
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_test.h"
#include "coll/rules.h"
#include "transport/shm/cma.h"
#include "transport/shm/shm.h"

/* A barrier in anonymous shared memory, for setting the segments up. */
typedef struct {
    _Atomic int count;
    _Atomic int gen;
} bar_t;

static bar_t *bar;

static void
barrier(int n)
{
    int g = atomic_load(&bar->gen);
    if (atomic_fetch_add(&bar->count, 1) == n - 1) {
        atomic_store(&bar->count, 0);
        atomic_fetch_add(&bar->gen, 1);
        return;
    }
    while (atomic_load(&bar->gen) == g) {
        usleep(50);
    }
}

static int
count_segments(uint64_t token)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "pyddp.%016llx.",
             (unsigned long long)token);
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (d == NULL) {
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    }
    closedir(d);
    return n;
}

static pd_shm *
setup(int rank, int n, uint64_t token)
{
    pd_shm *s = NULL;
    T_OK(pd_shm_create(rank, n, token, 7, 0, &s));
    barrier(n);
    T_OK(pd_shm_attach(s));
    barrier(n);
    pd_shm_unlink(s, 0);
    barrier(n);
    T_CHECK(count_segments(token) == 0);
    return s;
}

typedef void (*child_fn)(int rank, int n, uint64_t token);

/* Run fn in n forked processes; every check failure makes the test fail. */
static void
run(int n, child_fn fn)
{
    static uint64_t token = 0x5eed0000;
    token++;
    atomic_store(&bar->count, 0);
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            pd_test_failures = 0; /* this rank's own checks, not the parent's */
            alarm(30); /* never hang the suite */
            fn(r, n, token);
            _exit(pd_test_failures ? 1 : 0);
        }
    }
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rank %d of %d failed (status %#x)\n", r, n,
                    status);
            pd_test_failures++;
        }
    }
    T_CHECK(count_segments(token) == 0);
}

static const char *
kind_name(int k)
{
    return k == 2 ? "all_reduce" : k == 1 ? "broadcast" : "other";
}

static pd_shm_ident
ident(uint64_t seq, uint64_t count)
{
    pd_shm_ident id;
    memset(&id, 0, sizeof(id));
    id.seq = seq;
    id.count = count;
    id.kind = 2;
    id.dtype = 11;
    return id;
}

/* Every rank writes its bank, syncs, reads everyone's: 2000 rounds. */
static void
child_sync(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    pd_shm_waiter w = {pd_now() + 20, NULL, NULL, NULL, 0};
    for (uint64_t i = 1; i <= 2000; i++) {
        pd_shm_ident id = ident(i, 10);
        int b = pd_shm_next_bank(s);
        uint64_t v = i * 100 + (uint64_t)rank;
        memcpy(pd_shm_bank(s, rank, b), &v, sizeof(v));
        pd_shm_enter(s, &id, v);
        T_OK(pd_shm_sync(s, &w));
        T_OK(pd_shm_check_ident(s, &id, kind_name));
        for (int p = 0; p < n; p++) {
            uint64_t got;
            memcpy(&got, pd_shm_bank(s, p, b), sizeof(got));
            T_CHECK(got == i * 100 + (uint64_t)p);
            T_CHECK(pd_shm_value(s, p, i) == got);
        }
        if (pd_test_failures) {
            break;
        }
    }
    pd_shm_close(s);
}

static void
test_sync_and_banks(void)
{
    run(2, child_sync);
    run(3, child_sync);
}

/* The phase probe: ranks 0 and 1 hand a line back and forth (rank 0 gets a
 * handoff time, the others 0 at once); a probe rank 1 never answers
 * returns -1 on rank 0 by its deadline; rank 0's phase in its identity of
 * a collective is what every rank reads back for that sequence number. */
static void
child_pingpong(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    for (uint64_t tag = 1; tag <= 50; tag++) {
        double ns = pd_shm_pingpong(s, tag, 8, pd_now() + 10);
        if (rank == 0) {
            T_CHECK(ns > 0 && ns < 1e8);
        }
        else {
            T_CHECK(ns == 0);
        }
    }
    barrier(n);
    if (rank == 0) {
        /* rank 1 does not take part: unanswered by the deadline */
        double t0 = pd_now();
        T_CHECK(pd_shm_pingpong(s, 99, 8, t0 + 0.01) == -1.0);
        T_CHECK(pd_now() - t0 < 5.0);
    }
    barrier(n);
    pd_shm_waiter w = {pd_now() + 20, NULL, NULL, NULL, 0};
    for (uint64_t seq = 1; seq <= 6; seq++) {
        pd_shm_ident id = ident(seq, 10);
        id.phase = rank == 0 ? (uint8_t)(seq % 3 == 0) : 0;
        T_OK(pd_shm_entry(s, &w, kind_name));
        if (seq > 1) {
            T_CHECK(pd_shm_phase_of(s, seq - 1, 7) == ((seq - 1) % 3 == 0));
        }
        pd_shm_enter(s, &id, 0);
        T_OK(pd_shm_sync(s, &w));
        T_OK(pd_shm_check_ident(s, &id, kind_name));
    }
    /* a sequence number rank 0's identities no longer hold: keep */
    T_CHECK(pd_shm_phase_of(s, 2, 7) == 7);
    barrier(n);
    pd_shm_close(s);
}

static void
test_pingpong(void)
{
    run(2, child_pingpong);
    run(3, child_pingpong);
}

/* The last rank calls with another count at sequence number 5. */
static void
child_mismatch(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    pd_shm_waiter w = {pd_now() + 20, NULL, NULL, NULL, 0};
    for (uint64_t i = 1; i <= 5; i++) {
        pd_shm_ident id = ident(i, i == 5 && rank == n - 1 ? 20 : 10);
        pd_shm_enter(s, &id, 0);
        T_OK(pd_shm_sync(s, &w));
        pd_status st = pd_shm_check_ident(s, &id, kind_name);
        if (i < 5) {
            T_CHECK(st == PD_OK);
        }
        else {
            T_CHECK(st == PD_EMISMATCH);
            T_MSG_HAS("collective mismatch between ranks");
            T_MSG_HAS("count=10");
            T_MSG_HAS("count=20");
            T_MSG_HAS("sequence number 5");
        }
    }
    pd_shm_close(s);
}

static void
test_mismatch_seen_by_every_rank(void)
{
    run(3, child_mismatch);
}

/* Rank 1 never arrives: rank 0 times out, naming it. */
static void
child_timeout(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    if (rank == 0) {
        pd_shm_waiter w = {pd_now() + 0.3, NULL, NULL, NULL, 0};
        double t0 = pd_now();
        T_ST(pd_shm_sync(s, &w), PD_ETIMEOUT);
        T_MSG_HAS("local rank 1");
        double dt = pd_now() - t0;
        T_CHECK(dt >= 0.29 && dt < 2.0);
    }
    barrier(n);
    pd_shm_close(s);
}

static void
test_timeout(void)
{
    run(2, child_timeout);
}

/* Rank 1 aborts while rank 0 sleeps in a sync. */
static void
child_abort(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    if (rank == 0) {
        pd_shm_waiter w = {pd_now() + 20, NULL, NULL, NULL, 0};
        double t0 = pd_now();
        T_ST(pd_shm_sync(s, &w), PD_ENETWORK);
        T_MSG_HAS("boom from rank 1");
        T_CHECK(pd_now() - t0 < 5.0);
    }
    else {
        usleep(300000); /* rank 0 is asleep on the futex by now */
        pd_shm_abort(s, PD_ENETWORK, "boom from rank 1");
    }
    barrier(n);
    pd_shm_close(s);
}

static void
test_abort_wakes_sleepers(void)
{
    run(2, child_abort);
}

/* Both ranks stream 3 MB through the rings at once, in odd-sized pieces,
 * and check every byte. */
static void
child_rings(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    int peer = 1 - rank;
    size_t total = 3u << 20;
    unsigned char *out = malloc(total), *in = malloc(total);
    for (size_t i = 0; i < total; i++) {
        out[i] = (unsigned char)(i * 7 + (size_t)rank * 13 + i / 4099);
    }
    size_t sent = 0, got = 0, piece = 1;
    double deadline = pd_now() + 20;
    while ((sent < total || got < total) && pd_now() < deadline) {
        if (sent < total) {
            size_t m = total - sent < piece ? total - sent : piece;
            sent += pd_shm_ring_write(s, peer, out + sent, m);
        }
        if (got < total) {
            got += pd_shm_ring_read(s, peer, in + got, piece * 3 + 1);
        }
        piece = piece * 5 % 100003 + 1;
    }
    T_CHECK(sent == total && got == total);
    for (size_t i = 0; i < total; i++) {
        unsigned char want = (unsigned char)(i * 7 + (size_t)peer * 13 +
                                             i / 4099);
        if (in[i] != want) {
            T_CHECK(in[i] == want);
            break;
        }
    }
    T_CHECK(!pd_shm_ring_readable(s, peer));
    pd_shm_ring_want(s, peer, 1, 0);
    barrier(n);
    /* Only now has the peer read all it was sent: before the barrier the
     * last write may still fill the ring. */
    T_CHECK(pd_shm_ring_writable(s, peer));
    T_CHECK(pd_shm_ring_peer_waits(s, peer, 1));
    T_CHECK(!pd_shm_ring_peer_waits(s, peer, 0));
    barrier(n);
    free(out);
    free(in);
    pd_shm_close(s);
}

static void
test_rings(void)
{
    run(2, child_rings);
}

/* Cross-memory attach between two ranks: the probe, reads and writes at
 * every byte offset 0..7 and odd sizes, a bad address (an error naming the
 * rank, no crash), and a peer that died (PD_ENETWORK naming it). */
static void
child_cma(int rank, int n, uint64_t token)
{
    pd_shm *s = setup(rank, n, token);
    int peer = 1 - rank;
    enum { BUF = 70000 };
    unsigned char *mine = malloc(BUF), *got = malloc(BUF), *in = malloc(BUF);
    T_CHECK(mine != NULL && got != NULL && in != NULL);
    for (int i = 0; i < BUF; i++) {
        mine[i] = (unsigned char)(i * 7 + rank * 13);
    }
    memset(in, 0, BUF);
    uint64_t addrs[2] = {(uint64_t)(uintptr_t)mine, (uint64_t)(uintptr_t)in};
    memcpy(pd_shm_bank(s, rank, 0), addrs, sizeof(addrs));
    T_OK(pd_cma_probe(s));
    barrier(n);
    uint64_t theirs[2];
    memcpy(theirs, pd_shm_bank(s, peer, 0), sizeof(theirs));
    static const size_t sizes[] = {0, 1, 7, 4095, 4097, 65537};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        for (size_t off = 0; off < 8; off++) {
            size_t len = sizes[k];
            memset(got, 0xee, BUF);
            T_OK(pd_cma_read(s, peer, got + (7 - off), theirs[0] + off, len,
                             "test"));
            int same = 1;
            for (size_t i = 0; i < len; i++) {
                same &= got[7 - off + i] ==
                        (unsigned char)((off + i) * 7 + peer * 13);
            }
            T_CHECK(same);
            T_CHECK(got[7 - off + len] == 0xee);
        }
    }
    /* rank 0 writes its pattern into rank 1's in at offset 3 */
    if (rank == 0) {
        T_OK(pd_cma_write(s, 1, theirs[1] + 3, mine, 65537, "test"));
    }
    barrier(n);
    if (rank == 1) {
        T_CHECK(in[0] == 0 && in[2] == 0 && in[3 + 65537] == 0);
        int same = 1;
        for (int i = 0; i < 65537; i++) {
            same &= in[3 + i] == (unsigned char)(i * 7);
        }
        T_CHECK(same);
    }
    /* an address the peer has not mapped */
    T_ST(pd_cma_read(s, peer, got, 8, 16, "test"), PD_ESYS);
    T_MSG_HAS("rank");
    barrier(n);
    if (rank == 1) {
        _exit(pd_test_failures ? 1 : 0); /* a zombie until run() reaps it */
    }
    pd_status st = PD_OK;
    for (int i = 0; i < 500 && st == PD_OK; i++) {
        st = pd_cma_read(s, 1, got, theirs[0], 16, "broadcast");
        if (st == PD_OK) {
            usleep(10000);
        }
    }
    T_ST(st, PD_ENETWORK);
    T_MSG_HAS("broadcast: rank 1 died");
    free(mine);
    free(got);
    free(in);
    pd_shm_close(s);
}

static void
test_cma(void)
{
    run(2, child_cma);
}

/* A fake rank segment in dir: ctrl-sized with a creator pid, or empty;
 * old: modified a minute ago. */
static void
fake_segment(const char *dir, const char *name, int with_ctrl, int32_t pid,
             int old)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
    T_CHECK(fd >= 0);
    if (with_ctrl) {
        pd_shm_ctrl c;
        memset(&c, 0, sizeof(c));
        c.pid = pid;
        T_CHECK(write(fd, &c, sizeof(c)) == (ssize_t)sizeof(c));
    }
    close(fd);
    if (old) {
        struct timeval tv[2];
        gettimeofday(&tv[0], NULL);
        tv[0].tv_sec -= 60;
        tv[1] = tv[0];
        T_CHECK(utimes(path, tv) == 0);
    }
}

static int
exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void
test_sweep_stale(void)
{
    char dir[] = "/tmp/pd_sweep_XXXXXX";
    T_CHECK(mkdtemp(dir) != NULL);
    pid_t child = fork();
    if (child == 0) {
        _exit(0);
    }
    waitpid(child, NULL, 0); /* a pid that is gone */
    fake_segment(dir, "pyddp.00000000000000aa.0000000b.0", 1, child, 1);
    fake_segment(dir, "pyddp.00000000000000aa.0000000b.1", 1, getpid(), 1);
    fake_segment(dir, "pyddp.00000000000000aa.0000000b.2", 0, 0, 1);
    fake_segment(dir, "pyddp.00000000000000aa.0000000b.3", 0, 0, 0);
    fake_segment(dir, "pyddp.00000000000000aa.0000000b.4", 1, child, 0);
    fake_segment(dir, "pyddp.00000000000000aa.0.b1", 0, 0, 1);
    fake_segment(dir, "other.file", 0, 0, 1);
    pd_shm_sweep_stale(dir);
    T_CHECK(!exists(dir, "pyddp.00000000000000aa.0000000b.0")); /* dead */
    T_CHECK(exists(dir, "pyddp.00000000000000aa.0000000b.1"));  /* alive */
    T_CHECK(!exists(dir, "pyddp.00000000000000aa.0000000b.2")); /* empty */
    T_CHECK(exists(dir, "pyddp.00000000000000aa.0000000b.3"));  /* recent */
    T_CHECK(exists(dir, "pyddp.00000000000000aa.0000000b.4"));  /* recent */
    T_CHECK(exists(dir, "pyddp.00000000000000aa.0.b1"));        /* buffer */
    T_CHECK(exists(dir, "other.file"));
    const char *left[] = {"pyddp.00000000000000aa.0000000b.1",
                          "pyddp.00000000000000aa.0000000b.3",
                          "pyddp.00000000000000aa.0000000b.4",
                          "pyddp.00000000000000aa.0.b1", "other.file"};
    for (size_t i = 0; i < sizeof(left) / sizeof(left[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, left[i]);
        unlink(path);
    }
    T_CHECK(rmdir(dir) == 0);
}

/* Byte counts from the environment, by the rules of pyddp/_config.py
 * (tests/project/test_config_env.py has the same cases): digits, then K, M or G,
 * blanks around either; anything else is the default. */
static void
test_env_bytes(void)
{
    static const struct {
        const char *text;
        size_t want;
    } cases[] = {
        {"262144", 262144},         {"256K", (size_t)256 << 10},
        {"1m", (size_t)1 << 20},    {" 256 K ", (size_t)256 << 10},
        {"1G", (size_t)1 << 30},    {"2g", (size_t)2 << 30},
        {"0", 0},                   {"abc", 77},
        {"-5", 77},                 {"256KB", 77},
        {"1.5M", 77},               {"K", 77},
        {"", 77},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        setenv("PYDDP_TEST_ENV_BYTES", cases[i].text, 1);
        T_CHECK(pd_shm_env_bytes("PYDDP_TEST_ENV_BYTES", 77, 0, SIZE_MAX) ==
                cases[i].want);
    }
    setenv("PYDDP_TEST_ENV_BYTES", "8M", 1); /* out of [lo, hi]: default */
    T_CHECK(pd_shm_env_bytes("PYDDP_TEST_ENV_BYTES", 77, 0, 1 << 20) == 77);
    unsetenv("PYDDP_TEST_ENV_BYTES");
}

/* A rule with a gap: single copies from cma_from, the banks again in
 * [gap_lo, gap_hi); PYDDP_CMA_THRESHOLD overrides both. */
static void
test_rules_gap(void)
{
    pd_rules r;
    memset(&r, 0, sizeof(r));
    int k = PD_K_ALLGATHER;
    r.cma_from[k] = 16 << 10;
    r.cma_gap_lo[k] = 512 << 10;
    r.cma_gap_hi[k] = 2 << 20;
    T_CHECK(!pd_rules_cma(&r, k, 8 << 10));
    T_CHECK(pd_rules_cma(&r, k, 16 << 10));
    T_CHECK(pd_rules_cma(&r, k, (512 << 10) - 1));
    T_CHECK(!pd_rules_cma(&r, k, 512 << 10));
    T_CHECK(!pd_rules_cma(&r, k, (2 << 20) - 1));
    T_CHECK(pd_rules_cma(&r, k, 2 << 20));
    size_t lo, hi;
    pd_rules_cma_gap(&r, k, &lo, &hi);
    T_CHECK(lo == (size_t)512 << 10 && hi == (size_t)2 << 20);
    pd_rules_cma_gap(&r, PD_K_ALLREDUCE, &lo, &hi); /* none for the others */
    T_CHECK(lo == 0 && hi == 0);
    T_CHECK(!pd_rules_cma(NULL, PD_K_REDUCE, (size_t)1 << 30));
}

int
main(void)
{
    printf("test_shm\n");
    bar = mmap(NULL, sizeof(*bar), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (bar == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    T_RUN(test_sync_and_banks);
    T_RUN(test_mismatch_seen_by_every_rank);
    T_RUN(test_timeout);
    T_RUN(test_abort_wakes_sleepers);
    T_RUN(test_rings);
    T_RUN(test_cma);
    T_RUN(test_sweep_stale);
    T_RUN(test_env_bytes);
    T_RUN(test_rules_gap);
    T_RUN(test_pingpong);
    return pd_test_result();
}
