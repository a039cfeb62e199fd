/* group: whole process groups between real forked ranks, with their threads
 * busy at once: the progress thread running queued work, the caller's
 * thread running inline collectives and waiting, other threads reading the
 * sticky error and the flight recorder meanwhile, the watchdog failing a
 * collective a rank never joins, and destroy with work still queued.  The
 * test ThreadSanitizer checks (make check TSAN=1). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "group/group.h"
#include "group/internal.h"
#include "kernels/kernels.h"
#include "util/kinds.h"
#include "pd_test.h"
#include "util/sync.h"
#include "util/timeline.h"

#define MAXR 4

typedef struct {
    _Atomic int count;
    _Atomic int gen;
    _Atomic int port[MAXR];
    _Atomic int pid[MAXR];
} shared_t;

static shared_t *sh;

static void
barrier(int n)
{
    int g = atomic_load(&sh->gen);
    if (atomic_fetch_add(&sh->count, 1) == n - 1) {
        atomic_store(&sh->count, 0);
        atomic_fetch_add(&sh->gen, 1);
        return;
    }
    while (atomic_load(&sh->gen) == g) {
        usleep(50);
    }
}

static pd_group *
connect_group(int rank, int n, int transport, double timeout)
{
    pd_group *g = NULL;
    int port = 0;
    T_OK(pd_group_create(rank, n, timeout, NULL, NULL, &g, &port));
    atomic_store(&sh->port[rank], port);
    barrier(n);
    const char *hosts[MAXR];
    int ports[MAXR];
    for (int p = 0; p < n; p++) {
        hosts[p] = "127.0.0.1";
        ports[p] = atomic_load(&sh->port[p]);
    }
    T_OK(pd_group_connect(g, hosts, ports, 0x6a0b0000u + (uint64_t)getppid(),
                          NULL, transport, 0));
    return g;
}

/* An all_reduce (sum) of count doubles in place. */
static pd_op
allreduce_op(double *buf, size_t count, char **in, char **out, size_t *len)
{
    pd_op op;
    memset(&op, 0, sizeof(op));
    op.kind = PD_K_ALLREDUCE;
    op.dtype = PD_FLOAT64;
    op.op = PD_SUM;
    op.count = count;
    *in = (char *)buf;
    *out = (char *)buf;
    *len = count * sizeof(double);
    op.in = in;
    op.out = out;
    op.in_len = len;
    op.out_len = len;
    op.nblocks = 1;
    snprintf(op.name, sizeof(op.name), "all_reduce");
    return op;
}

/* Reads what other threads write while collectives run. */
typedef struct {
    pd_group *g;
    _Atomic int stop;
    long reads;
} watcher;

static void *
watch_main(void *arg)
{
    watcher *w = arg;
    pd_fr_entry rec[16];
    char msg[256];
    while (!atomic_load(&w->stop)) {
        (void)pd_group_error(w->g, msg, sizeof(msg));
        (void)pd_group_flight_records(w->g, rec, 16);
        (void)pd_group_transport(w->g);
        if (pd_tl_enabled()) {
            pd_tl_event("watch", "test", 'i', pd_wall() * 1e6, 0, 1, NULL);
        }
        if (w->reads % 50 == 0) {
            (void)pd_group_flight_dump(w->g, NULL, "test");
        }
        w->reads++;
        usleep(100);
    }
    return NULL;
}

enum { NWORK = 8, ROUNDS = 6 };

typedef struct {
    pd_work *w;
    pd_status st;
} waiter;

static void *
wait_main(void *arg)
{
    waiter *x = arg;
    x->st = pd_work_wait(x->w, 20.0);
    return NULL;
}

static void
child_busy(int rank, int n, int transport)
{
    char tl[64], fr[64];
    snprintf(tl, sizeof(tl), "/tmp/pd_test_group_tl.%d.%d", (int)getpid(), rank);
    snprintf(fr, sizeof(fr), "/tmp/pd_test_group_fr.%d.%d", (int)getpid(), rank);
    T_OK(pd_tl_open(tl, rank, "test_group"));
    pd_group *g = connect_group(rank, n, transport, 30.0);
    pd_group_set_timeline_track(g, 2);
    T_OK(pd_group_flight_configure(g, fr, "{}"));
    watcher w = {g, 0, 0};
    pthread_t thr;
    T_CHECK(pthread_create(&thr, NULL, watch_main, &w) == 0);
    static double buf[NWORK][1000];
    char *in[NWORK], *out[NWORK];
    size_t len[NWORK];
    for (int round = 0; round < ROUNDS; round++) {
        /* queued work, run by the progress thread */
        pd_work *wk[NWORK];
        for (int i = 0; i < NWORK; i++) {
            size_t count = i % 2 ? 1000 : 3;
            for (size_t j = 0; j < count; j++) {
                buf[i][j] = rank + i + round;
            }
            pd_op op = allreduce_op(buf[i], count, &in[i], &out[i], &len[i]);
            T_OK(pd_group_submit(g, &op, &wk[i]));
        }
        /* another thread waits on the first one too */
        waiter x = {wk[0], PD_OK};
        pthread_t wt;
        T_CHECK(pthread_create(&wt, NULL, wait_main, &x) == 0);
        for (int i = NWORK - 1; i >= 0; i--) {
            if (i == 0) {
                pthread_join(wt, NULL);
                T_OK(x.st);
            }
            T_OK(pd_work_wait(wk[i], 20.0));
            T_CHECK(pd_work_done(wk[i]));
            pd_work_release(wk[i]);
            size_t count = i % 2 ? 1000 : 3;
            double want = 0;
            for (int p = 0; p < n; p++) {
                want += p + i + round;
            }
            for (size_t j = 0; j < count; j++) {
                if (buf[i][j] != want) {
                    T_CHECK(buf[i][j] == want);
                    break;
                }
            }
        }
        /* inline on this thread (shared memory, small), else submitted */
        double v[4] = {rank, rank, rank, rank};
        char *vi, *vo;
        size_t vl;
        pd_op op = allreduce_op(v, 4, &vi, &vo, &vl);
        pd_status st;
        pd_work *h = NULL;
        if (pd_group_inline(g, &op, NULL, NULL, &st, &h)) {
            T_OK(st);
        }
        else {
            T_OK(pd_group_submit(g, &op, &h));
            T_OK(pd_work_wait(h, 20.0));
            pd_work_release(h);
        }
        T_CHECK(v[0] == n * (n - 1) / 2.0);
    }
    atomic_store(&w.stop, 1);
    pthread_join(thr, NULL);
    T_CHECK(w.reads > 0);
    /* every record, queued and inline, names what ran it: what
     * pd_group_explain answers for the same call */
    pd_fr_entry rec[64];
    size_t nrec = pd_group_flight_records(g, rec, 64);
    T_CHECK(nrec == ROUNDS * (NWORK + 1));
    for (size_t k = 0; k < nrec; k++) {
        int path = -1, algo = -1;
        T_OK(pd_group_explain(g, rec[k].kind, rec[k].dtype,
                              (size_t)rec[k].count, &path, &algo));
        T_CHECK(rec[k].path == path && rec[k].algo == algo);
        T_CHECK(rec[k].algo != 0 && rec[k].path != 0);
    }
    pd_group_destroy(g);
    pd_tl_close();
    unlink(tl);
    unlink(fr);
}

/* The last rank never joins the second collective: the others' work fails
 * with a timeout naming it (the watchdog), read by another thread too. */
static void
child_timeout(int rank, int n, int transport)
{
    pd_group *g = connect_group(rank, n, transport, 1.0);
    watcher w = {g, 0, 0};
    pthread_t thr;
    T_CHECK(pthread_create(&thr, NULL, watch_main, &w) == 0);
    double v[4] = {1, 1, 1, 1};
    char *vi, *vo;
    size_t vl;
    pd_op op = allreduce_op(v, 4, &vi, &vo, &vl);
    pd_work *h = NULL;
    T_OK(pd_group_submit(g, &op, &h));
    T_OK(pd_work_wait(h, 20.0));
    pd_work_release(h);
    if (rank != n - 1) {
        pd_status st;
        h = NULL;
        if (!pd_group_inline(g, &op, NULL, NULL, &st, &h)) {
            T_OK(pd_group_submit(g, &op, &h));
            st = pd_work_wait(h, 20.0);
        }
        T_CHECK(st != PD_OK);
        char msg[512];
        T_CHECK(pd_group_error(g, msg, sizeof(msg)) != PD_OK);
        T_CHECK(strstr(msg, "2") != NULL); /* names the missing rank */
        if (h != NULL) {
            pd_work_release(h);
        }
        /* the group is broken: the next collective fails at once */
        double t0 = pd_now();
        T_OK(pd_group_submit(g, &op, &h));
        T_CHECK(pd_work_wait(h, 20.0) != PD_OK);
        T_CHECK(pd_now() - t0 < 5.0);
        pd_work_release(h);
    }
    barrier(n);
    atomic_store(&w.stop, 1);
    pthread_join(thr, NULL);
    pd_group_destroy(g);
}

/* The last rank enters the second collective and is stopped inside it
 * (SIGSTOP, its progress thread waiting for the others): its sequence
 * number is the others' and it answers nothing, yet every other rank's
 * timeout names it (issue 50), and so does its own error once continued:
 * its peers' verdict, not its own late one blaming the ranks that gave up
 * on it. */
static void
child_stopped(int rank, int n, int transport)
{
    pd_group *g = connect_group(rank, n, transport, 1.0);
    /* 1 MiB: several rounds through the banks (and ring steps over TCP),
     * so that the others need rank 2 after it entered */
    static double v[1 << 17];
    char *vi, *vo;
    size_t vl;
    pd_op op = allreduce_op(v, 1 << 17, &vi, &vo, &vl);
    pd_work *h = NULL;
    T_OK(pd_group_submit(g, &op, &h));
    T_OK(pd_work_wait(h, 20.0));
    pd_work_release(h);
    atomic_store(&sh->pid[rank], (int)getpid());
    barrier(n);
    char msg[512];
    if (rank == n - 1) {
        T_OK(pd_group_submit(g, &op, &h));
        usleep(200000); /* the progress thread has entered it */
        raise(SIGSTOP);
        T_CHECK(pd_work_wait(h, 20.0) != PD_OK);
        pd_work_release(h);
        T_CHECK(pd_group_error(g, msg, sizeof(msg)) != PD_OK);
        T_CHECK(strstr(msg, "timed out") != NULL);
        T_CHECK(strstr(msg, "[2]") != NULL);
    }
    else {
        usleep(500000); /* rank 2 is stopped */
        pd_status st;
        h = NULL;
        if (!pd_group_inline(g, &op, NULL, NULL, &st, &h)) {
            T_OK(pd_group_submit(g, &op, &h));
            st = pd_work_wait(h, 20.0);
        }
        T_CHECK(st != PD_OK);
        if (h != NULL) {
            pd_work_release(h);
        }
        T_CHECK(pd_group_error(g, msg, sizeof(msg)) != PD_OK);
        /* with shared memory /proc says so; over TCP it did not answer */
        T_CHECK(strstr(msg, transport == PD_TRANSPORT_TCP
                                ? "did not answer: [2]"
                                : "ranks stopped (SIGSTOP or a debugger): "
                                  "[2]") != NULL);
        if (rank == 0) {
            usleep(300000); /* rank 1 has its error too */
            kill(atomic_load(&sh->pid[n - 1]), SIGCONT);
        }
    }
    if (pd_test_failures) {
        fprintf(stderr, "rank %d: %s\n", rank, msg);
    }
    barrier(n);
    pd_group_destroy(g);
}

/* Work still queued when the group is destroyed fails, never hangs; a
 * thread waiting on it wakes. */

static void
child_destroy_busy(int rank, int n, int transport)
{
    pd_group *g = connect_group(rank, n, transport, 30.0);
    static double v[4];
    char *vi, *vo;
    size_t vl;
    pd_op op = allreduce_op(v, 4, &vi, &vo, &vl);
    waiter x = {NULL, PD_OK};
    pthread_t thr;
    if (rank == 0) {
        /* the others never submit it: it stays pending */
        T_OK(pd_group_submit(g, &op, &x.w));
        T_CHECK(pthread_create(&thr, NULL, wait_main, &x) == 0);
        usleep(20000);
    }
    barrier(n);
    pd_group_destroy(g);
    if (rank == 0) {
        pthread_join(thr, NULL);
        T_CHECK(x.st != PD_OK);
        pd_work_release(x.w);
    }
}

typedef void (*child_fn)(int rank, int n, int transport);

static void
run(int n, int transport, child_fn fn)
{
    atomic_store(&sh->count, 0);
    pid_t pids[MAXR];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            pd_test_failures = 0; /* this rank's own checks, not the parent's */
            alarm(60); /* never hang the suite */
            fn(r, n, transport);
            _exit(pd_test_failures ? 1 : 0);
        }
    }
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "transport %d: rank %d of %d failed (status "
                    "%#x)\n", transport, r, n, status);
            pd_test_failures++;
        }
    }
}

static void
test_busy_shm(void)
{
    run(3, PD_TRANSPORT_AUTO, child_busy);
}

static void
test_busy_tcp(void)
{
    run(3, PD_TRANSPORT_TCP, child_busy);
}

static void
test_timeout_shm(void)
{
    run(3, PD_TRANSPORT_AUTO, child_timeout);
}

static void
test_timeout_tcp(void)
{
    run(3, PD_TRANSPORT_TCP, child_timeout);
}

static void
test_stopped_shm(void)
{
    run(3, PD_TRANSPORT_AUTO, child_stopped);
}

static void
test_stopped_tcp(void)
{
    run(3, PD_TRANSPORT_TCP, child_stopped);
}

static void
test_destroy_with_pending_work(void)
{
    run(3, PD_TRANSPORT_AUTO, child_destroy_busy);
}

/* The sticky error, claimed by one thread while another reports its own:
 * the one that loses the claim returns only once the winner's error is
 * there.  Before, it returned at once and its caller read the group's
 * error as PD_OK, so a collective whose mismatch that thread had found
 * returned as if it had worked (a rank's progress thread had claimed the
 * abort a peer sent about the same mismatch). */
static void *
slow_winner(void *arg)
{
    pd_group *g = arg;
    usleep(50 * 1000); /* between its claim and its store */
    snprintf(g->errmsg, sizeof(g->errmsg), "%s", "the winner's error");
    atomic_store_explicit(&g->err, (int)PD_ENETWORK, memory_order_release);
    return NULL;
}

static void
test_fatal_claim_loser_waits(void)
{
    pd_group *g = calloc(1, sizeof(*g));
    T_CHECK(g != NULL);
    if (g == NULL) {
        return;
    }
    atomic_init(&g->err, PD_OK);
    atomic_init(&g->err_claim, 1); /* claimed, not yet stored */
    pthread_t t;
    T_CHECK(pthread_create(&t, NULL, slow_winner, g) == 0);
    pd_grp_record_fatal(g, PD_EMISMATCH, "this thread's error");
    T_CHECK(pd_grp_err(g) == PD_ENETWORK);
    T_CHECK(strcmp(g->errmsg, "the winner's error") == 0);
    pthread_join(t, NULL);
    free(g);
}

/* A device backend's calls in a ring (flight.h: pd_fr_via, _note, _update,
 * _fail_open): what ran them named per record, their own sequence numbers,
 * states and times; a failure fails the open ones only, never the ring's
 * own (via 0). */
static void
test_flight_device_calls(void)
{
    pd_fr fr;
    T_OK(pd_fr_init(&fr, 8));
    int v = pd_fr_via(&fr, "nccl", "nccl", "auto");
    int p = pd_fr_via(&fr, "nccl", "nccl", "p2p");
    T_CHECK(v == 1 && p == 2);
    T_CHECK(pd_fr_via(&fr, "nccl", "nccl", "auto") == v);
    uint64_t a = pd_fr_note(&fr, v, PD_K_ALLREDUCE, PD_FLOAT32, PD_SUM, 0, 4, 16,
                            "all_reduce", 1);
    (void)pd_fr_note(&fr, p, PD_K_SEND, PD_FLOAT32, 0, 1, 4, 16, "send", 0); /* s */
    uint64_t b = pd_fr_note(&fr, v, PD_K_BROADCAST, PD_FLOAT32, 0, 1, 4, 16,
                            "broadcast", 1);
    pd_fr_update(&fr, a, PD_FR_STARTED, PD_OK);
    pd_fr_update(&fr, a, PD_FR_COMPLETED, PD_OK);
    pd_fr_update(&fr, a, PD_FR_FAILED, PD_ETIMEOUT); /* ended: stays */
    pd_fr_update(&fr, b, PD_FR_STARTED, PD_OK);
    T_CHECK(pd_fr_fail_open(&fr, PD_ETIMEOUT) == 2); /* s and b */
    pd_fr_entry rec[8];
    T_CHECK(pd_fr_snapshot(&fr, rec, 8) == 3);
    const char *be, *tr, *al;
    pd_fr_names(&fr, &rec[0], &be, &tr, &al);
    T_CHECK(strcmp(be, "nccl") == 0 && strcmp(al, "auto") == 0);
    pd_fr_names(&fr, &rec[1], &be, &tr, &al);
    T_CHECK(strcmp(al, "p2p") == 0);
    T_CHECK(rec[0].seq == 1 && rec[1].seq == 0 && rec[2].seq == 2);
    T_CHECK(rec[0].state == PD_FR_COMPLETED && rec[0].status == PD_OK);
    T_CHECK(rec[0].t_enqueued > 0 && rec[0].t_started >= rec[0].t_enqueued &&
            rec[0].t_ended >= rec[0].t_started);
    T_CHECK(rec[1].state == PD_FR_FAILED && rec[1].status == PD_ETIMEOUT);
    T_CHECK(rec[2].state == PD_FR_FAILED && rec[2].status == PD_ETIMEOUT);
    for (int k = 3; k < PD_FR_VIAS; k++) {
        char name[16];
        snprintf(name, sizeof(name), "a%d", k);
        T_CHECK(pd_fr_via(&fr, "x", "y", name) == k);
    }
    T_CHECK(pd_fr_via(&fr, "x", "y", "full") == -1);
    T_CHECK(pd_fr_note(&fr, PD_FR_VIAS, PD_K_BARRIER, 0, 0, 0, 0, 0, "b",
                       1) == 0);
    pd_fr_free(&fr);
}

int
main(void)
{
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    printf("test_group\n");
    fflush(stdout); /* not again in every forked rank */
    T_RUN(test_busy_shm);
    T_RUN(test_busy_tcp);
    T_RUN(test_timeout_shm);
    T_RUN(test_timeout_tcp);
    T_RUN(test_stopped_shm);
    T_RUN(test_stopped_tcp);
    T_RUN(test_destroy_with_pending_work);
    T_RUN(test_fatal_claim_loser_waits);
    T_RUN(test_flight_device_calls);
    return pd_test_result();
}
