/* The C stores: semantics shared by all (torch's rules), the TCP server with
 * many concurrent clients in threads, timeouts, cancellation, connection
 * loss, authentication, FileStore sharing and cleanup, create/destroy
 * cycles. */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pd_test.h"
#include "store/store.h"
#include "store/tcp_proto.h"
#include "util/auth.h"
#include "util/net.h"

static void
sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int
count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        return -1;
    }
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

static int
count_threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL) {
        return -1;
    }
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

/* get and compare its value with want (a C string). */
static int
get_is(pd_store *s, const char *key, const char *want)
{
    uint8_t *v = NULL;
    size_t n = 0;
    pd_status st = pd_store_get_timeout(s, key, 2.0, &v, &n);
    if (st != PD_OK) {
        fprintf(stderr, "get %s: %s\n", key, pd_errmsg());
        return 0;
    }
    int ok = n == strlen(want) && memcmp(v, want, n) == 0 && v[n] == 0;
    if (!ok) {
        fprintf(stderr, "get %s: got '%.*s' want '%s'\n", key, (int)n,
                (const char *)v, want);
    }
    free(v);
    return ok;
}

static int
cas_is(pd_store *s, const char *key, const char *exp, const char *des,
       const char *want)
{
    uint8_t *v = NULL;
    size_t n = 0;
    pd_status st = pd_store_compare_set(s, key, exp, strlen(exp), des,
                                        strlen(des), &v, &n);
    if (st != PD_OK) {
        fprintf(stderr, "compare_set %s: %s\n", key, pd_errmsg());
        return 0;
    }
    int ok = n == strlen(want) && memcmp(v, want, n) == 0;
    if (!ok) {
        fprintf(stderr, "compare_set %s: got '%.*s' want '%s'\n", key, (int)n,
                (const char *)v, want);
    }
    free(v);
    return ok;
}

/* torch's semantics, for any store.  base_keys: num_keys of a fresh store
 * (internal keys), key_prefix: how the store names user keys in messages. */
static void
semantics(pd_store *s, int64_t base_keys, const char *key_prefix)
{
    int64_t v = 0, nk = -1;
    int b = -1;
    char want[128];

    T_OK(pd_store_num_keys(s, &nk));
    T_CHECK(nk == base_keys);

    T_OK(pd_store_set(s, "a", "x", 1));
    T_CHECK(get_is(s, "a", "x"));
    T_OK(pd_store_set(s, "a", "yy", 2));
    T_CHECK(get_is(s, "a", "yy"));
    T_OK(pd_store_set(s, "empty", "", 0));
    T_CHECK(get_is(s, "empty", ""));
    /* Binary values survive. */
    const uint8_t bin[4] = {0, 255, 0, 7};
    T_OK(pd_store_set(s, "bin", bin, 4));
    uint8_t *val = NULL;
    size_t n = 0;
    T_OK(pd_store_get(s, "bin", &val, &n));
    T_CHECK(n == 4 && val != NULL && memcmp(val, bin, 4) == 0);
    free(val);

    T_OK(pd_store_add(s, "c", 5, &v));
    T_CHECK(v == 5);
    T_OK(pd_store_add(s, "c", -2, &v));
    T_CHECK(v == 3);
    T_OK(pd_store_add(s, "c", 0, &v));
    T_CHECK(v == 3);
    T_CHECK(get_is(s, "c", "3"));
    T_OK(pd_store_set(s, "num", "41", 2));
    T_OK(pd_store_add(s, "num", 1, &v));
    T_CHECK(v == 42);
    T_ST(pd_store_add(s, "a", 1, &v), PD_EINVAL);
    T_MSG_HAS("not an integer");
    T_OK(pd_store_set(s, "big", "9223372036854775807", 19));
    T_ST(pd_store_add(s, "big", 1, &v), PD_EINVAL);
    T_MSG_HAS("overflows");

    /* compare_set: torch's four cases. */
    T_CHECK(cas_is(s, "k", "", "v1", "v1"));     /* missing, expected "" */
    T_CHECK(cas_is(s, "k2", "zz", "v1", "zz"));  /* missing, expected set */
    int ok = -1;
    const char *k2 = "k2";
    T_OK(pd_store_check(s, &k2, 1, &ok));
    T_CHECK(ok == 0);
    T_CHECK(cas_is(s, "k", "v1", "v2", "v2"));   /* match */
    T_CHECK(cas_is(s, "k", "nope", "v3", "v2")); /* mismatch */
    T_CHECK(get_is(s, "k", "v2"));

    const char *both[2] = {"a", "k"};
    const char *some[2] = {"a", "zz"};
    T_OK(pd_store_check(s, both, 2, &ok));
    T_CHECK(ok == 1);
    T_OK(pd_store_check(s, some, 2, &ok));
    T_CHECK(ok == 0);
    T_OK(pd_store_check(s, NULL, 0, &ok));
    T_CHECK(ok == 1);

    T_OK(pd_store_num_keys(s, &nk));
    T_CHECK(nk == base_keys + 7); /* a empty bin c num big k */
    T_OK(pd_store_delete_key(s, "a", &b));
    T_CHECK(b == 1);
    T_OK(pd_store_delete_key(s, "a", &b));
    /* torch: FileStore answers true for a missing key, the others false */
    T_CHECK(b == (strcmp(s->ops->name, "FileStore") == 0));
    T_OK(pd_store_num_keys(s, &nk));
    T_CHECK(nk == base_keys + 6);

    /* append creates, then extends; list_keys shows user keys only */
    T_OK(pd_store_append(s, "ap", "x", 1));
    T_OK(pd_store_append(s, "ap", "yz", 2));
    {
        uint8_t *av = NULL;
        size_t an = 0;
        T_OK(pd_store_get(s, "ap", &av, &an));
        T_CHECK(an == 3 && memcmp(av, "xyz", 3) == 0);
        free(av);
        char **ks = NULL;
        size_t nks = 0;
        T_OK(pd_store_list_keys(s, &ks, &nks));
        T_CHECK((int64_t)nks == 7);
        int seen = 0;
        for (size_t i = 0; i < nks; i++) {
            seen += strcmp(ks[i], "ap") == 0;
            T_CHECK(ks[i][0] != '/'); /* the stores' own prefix is removed */
        }
        T_CHECK(seen == 1);
        pd_store_free_keys(ks, nks);
        T_OK(pd_store_delete_key(s, "ap", &b));
        T_CHECK(b == 1);
    }
    T_OK(pd_store_check(s, both, 2, &ok));
    T_CHECK(ok == 0);

    /* Timeouts name the keys, like torch. */
    double t0 = pd_now();
    T_ST(pd_store_get_timeout(s, "missing", 0.2, &val, &n), PD_ESTORE);
    T_CHECK(pd_now() - t0 >= 0.19 && pd_now() - t0 < 2.0);
    snprintf(want, sizeof(want), "wait timeout after 200ms, keys: %smissing",
             key_prefix);
    T_MSG_HAS(want);
    const char *ws[2] = {"m1", "m2"};
    T_ST(pd_store_wait(s, ws, 2, 0.1), PD_ESTORE);
    snprintf(want, sizeof(want), "keys: %sm1, %sm2", key_prefix, key_prefix);
    T_MSG_HAS(want);
    /* The default timeout applies to get. */
    double old = pd_store_timeout(s);
    pd_store_set_timeout(s, 0.1);
    T_ST(pd_store_get(s, "missing", &val, &n), PD_ESTORE);
    T_MSG_HAS("after 100ms");
    pd_store_set_timeout(s, old);
    /* Still usable after timeouts. */
    T_OK(pd_store_set(s, "missing", "late", 4));
    T_CHECK(get_is(s, "missing", "late"));
    T_OK(pd_store_wait(s, both + 1, 1, 1.0));
}

/* ------------------------------------------------------------ threads */

typedef struct worker {
    pd_store *s;
    int id;
    int iters;
    pd_status st;
    char msg[PD_ERRMSG_MAX];
    int64_t last;
} worker;

static void *
adder(void *arg)
{
    worker *w = arg;
    w->st = PD_OK;
    for (int i = 0; i < w->iters && w->st == PD_OK; i++) {
        w->st = pd_store_add(w->s, "counter", 1, &w->last);
    }
    snprintf(w->msg, sizeof(w->msg), "%s", pd_errmsg());
    return NULL;
}

/* Several threads hammer add on one store object. */
static void
concurrent_adds(pd_store *s, int nthreads, int iters)
{
    pthread_t th[32];
    worker w[32];
    int64_t v = 0;
    for (int i = 0; i < nthreads; i++) {
        w[i] = (worker){.s = s, .id = i, .iters = iters};
        pthread_create(&th[i], NULL, adder, &w[i]);
    }
    for (int i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        if (w[i].st != PD_OK) {
            fprintf(stderr, "adder %d: %s\n", i, w[i].msg);
        }
        T_ST(w[i].st, PD_OK);
    }
    T_OK(pd_store_add(s, "counter", 0, &v));
    T_CHECK(v == (int64_t)nthreads * iters);
}

typedef struct setter {
    pd_store *s;
    const char *key;
    int delay_ms;
} setter;

static void *
set_later(void *arg)
{
    setter *x = arg;
    sleep_ms(x->delay_ms);
    pd_store_set(x->s, x->key, "now", 3);
    return NULL;
}

/* get blocks until another thread sets the key. */
static void
blocking_get(pd_store *getter, pd_store *writer)
{
    static int calls; /* each call waits for a fresh key */
    char key[32];
    pthread_t th;
    snprintf(key, sizeof(key), "later%d", calls++);
    setter x = {writer, key, 100};
    pthread_create(&th, NULL, set_later, &x);
    double t0 = pd_now();
    T_CHECK(get_is(getter, key, "now"));
    T_CHECK(pd_now() - t0 >= 0.09);
    pthread_join(th, NULL);
}

/* --------------------------------------------------------------- hash */

static void
test_hash_store(void)
{
    pd_store *s = NULL;
    T_OK(pd_hash_store_new(5.0, &s));
    semantics(s, 0, "");
    concurrent_adds(s, 8, 2000);
    blocking_get(s, s);
    pd_store_destroy(s);
}

/* --------------------------------------------------------------- file */

static void
tmp_path(char *buf, size_t len, const char *tag)
{
    snprintf(buf, len, "/tmp/pyddp_test_store_%d_%s", (int)getpid(), tag);
    unlink(buf);
}

static void
test_file_store(void)
{
    char path[256];
    pd_store *s = NULL, *s2 = NULL;
    struct stat sb;

    tmp_path(path, sizeof(path), "sem");
    T_OK(pd_file_store_new(path, -1, 5.0, &s));
    semantics(s, 1, "/"); /* "refcount" is counted, as in torch */

    /* A second store on the same file shares the keys. */
    T_OK(pd_file_store_new(path, -1, 5.0, &s2));
    T_CHECK(get_is(s2, "k", "v2"));
    T_OK(pd_store_set(s2, "from2", "hi", 2));
    T_CHECK(get_is(s, "from2", "hi"));
    blocking_get(s, s2);

    /* add is atomic across store objects (separate flocks). */
    pthread_t th[8];
    worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){.s = i % 2 ? s : s2, .id = i, .iters = 200};
        pthread_create(&th[i], NULL, adder, &w[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        T_ST(w[i].st, PD_OK);
    }
    int64_t v = 0;
    T_OK(pd_store_add(s, "counter", 0, &v));
    T_CHECK(v == 1600);
    pd_store_destroy(s2);
    pd_store_destroy(s);
    T_CHECK(stat(path, &sb) == 0); /* world_size -1: never deleted */
    unlink(path);

    T_ST(pd_file_store_new("/nonexistent-dir/x", -1, 1.0, &s), PD_ESYS);
    T_MSG_HAS("/nonexistent-dir/x");
    T_ST(pd_file_store_new("", -1, 1.0, &s), PD_EINVAL);
}

static void
test_file_store_cleanup(void)
{
    char path[256];
    pd_store *a = NULL, *b = NULL;
    struct stat sb;
    tmp_path(path, sizeof(path), "cleanup");
    T_OK(pd_file_store_new(path, 2, 5.0, &a));
    T_OK(pd_file_store_new(path, 2, 5.0, &b));
    T_OK(pd_store_set(a, "x", "1", 1));
    pd_store_destroy(a);
    T_CHECK(stat(path, &sb) == 0); /* one user left */
    T_CHECK(get_is(b, "x", "1"));
    pd_store_destroy(b);
    T_CHECK(stat(path, &sb) != 0); /* the last of world_size removed it */
}

/* ---------------------------------------------------------------- tcp */

static pd_status
tcp_new(int port, int world_size, int is_master, double timeout,
        int wait_workers, const char *secret, pd_store **out)
{
    pd_tcp_store_opts o;
    pd_tcp_store_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = port;
    o.world_size = world_size;
    o.is_master = is_master;
    o.timeout = timeout;
    o.wait_for_workers = wait_workers;
    o.secret = secret;
    return pd_tcp_store_new(&o, out);
}

static void
test_tcp_semantics(void)
{
    pd_store *m = NULL, *c = NULL;
    T_OK(tcp_new(0, 1, 1, 5.0, 1, NULL, &m));
    if (m == NULL) {
        return;
    }
    int port = pd_tcp_store_port(m);
    T_CHECK(port > 0);
    semantics(m, 1, "/"); /* "init/" is counted, as in torch */
    T_OK(tcp_new(port, -1, 0, 5.0, 0, NULL, &c));
    T_CHECK(get_is(c, "k", "v2"));
    blocking_get(c, m);
    blocking_get(m, c);
    T_OK(pd_tcp_store_ping(c));
    char addr[64];
    T_OK(pd_tcp_store_local_addr(c, addr, sizeof(addr)));
    T_CHECK(strcmp(addr, "127.0.0.1") == 0);

    /* A large value. */
    size_t big = 16u << 20;
    char *src = malloc(big);
    for (size_t i = 0; i < big; i++) {
        src[i] = (char)(i * 13);
    }
    T_OK(pd_store_set(c, "big", src, big));
    uint8_t *v = NULL;
    size_t n = 0;
    T_OK(pd_store_get(m, "big", &v, &n));
    T_CHECK(n == big && v != NULL && memcmp(v, src, big) == 0);
    free(v);
    free(src);
    pd_store_destroy(c);
    pd_store_destroy(m);
}

typedef struct tcp_worker {
    int port;
    int id;
    int nworkers;
    pd_status st;
    char msg[PD_ERRMSG_MAX];
} tcp_worker;

/* A worker with its own connection: join, add, publish a key, wait for all
 * others' keys, read them. */
static void *
tcp_worker_main(void *arg)
{
    tcp_worker *w = arg;
    pd_store *s = NULL;
    char key[32], val[32];
    pd_status st = tcp_new(w->port, w->nworkers + 1, 0, 10.0, 1, NULL, &s);
    for (int i = 0; st == PD_OK && i < 100; i++) {
        int64_t v;
        st = pd_store_add(s, "sum", 1, &v);
    }
    if (st == PD_OK) {
        snprintf(key, sizeof(key), "rank%d", w->id);
        snprintf(val, sizeof(val), "value%d", w->id);
        st = pd_store_set(s, key, val, strlen(val));
    }
    for (int j = 0; st == PD_OK && j < w->nworkers; j++) {
        uint8_t *v = NULL;
        size_t n;
        snprintf(key, sizeof(key), "rank%d", j);
        snprintf(val, sizeof(val), "value%d", j);
        st = pd_store_get_timeout(s, key, 10.0, &v, &n);
        if (st == PD_OK && (n != strlen(val) || memcmp(v, val, n) != 0)) {
            st = pd_error(PD_ESTORE, "wrong value for %s", key);
        }
        free(v);
    }
    w->st = st;
    snprintf(w->msg, sizeof(w->msg), "%s", pd_errmsg());
    pd_store_destroy(s);
    return NULL;
}

static void
test_tcp_many_clients(void)
{
    enum { N = 24 };
    pd_store *m = NULL;
    pthread_t th[N];
    tcp_worker w[N];
    int fd, port;
    int64_t v;

    /* The master waits for N workers in its constructor: start the workers
     * first on a port we pick. */
    T_OK(pd_net_listen(NULL, 0, 1, &fd, &port));
    close(fd);
    for (int i = 0; i < N; i++) {
        w[i] = (tcp_worker){.port = port, .id = i, .nworkers = N};
        pthread_create(&th[i], NULL, tcp_worker_main, &w[i]);
    }
    T_OK(tcp_new(port, N + 1, 1, 10.0, 1, NULL, &m));
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (w[i].st != PD_OK) {
            fprintf(stderr, "worker %d: %s\n", i, w[i].msg);
        }
        T_ST(w[i].st, PD_OK);
    }
    if (m != NULL) {
        T_OK(pd_store_add(m, "sum", 0, &v));
        T_CHECK(v == N * 100);
        concurrent_adds(m, 8, 300); /* threads sharing one client */
    }
    pd_store_destroy(m);
}

static void
test_tcp_wait_for_workers_timeout(void)
{
    pd_store *m = NULL;
    double t0 = pd_now();
    T_ST(tcp_new(0, 3, 1, 0.3, 1, NULL, &m), PD_ESTORE);
    T_MSG_HAS("waiting for clients");
    T_MSG_HAS("1/3 clients joined");
    T_CHECK(pd_now() - t0 < 3.0);
    T_CHECK(m == NULL);
}

/* A timed-out get is cancelled on the server; the late value does not
 * confuse later requests on the same connection. */
static void
test_tcp_timeout_then_reuse(void)
{
    pd_store *m = NULL, *c = NULL;
    uint8_t *v = NULL;
    size_t n;
    T_OK(tcp_new(0, -1, 1, 5.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    T_OK(tcp_new(pd_tcp_store_port(m), -1, 0, 5.0, 0, NULL, &c));
    for (int i = 0; i < 20; i++) {
        T_ST(pd_store_get_timeout(c, "slow", 0.01, &v, &n), PD_ESTORE);
    }
    T_MSG_HAS("wait timeout after 10ms, keys: /slow");
    const char *ks[2] = {"slow", "slow2"};
    T_ST(pd_store_wait(c, ks, 2, 0.05), PD_ESTORE);
    T_OK(pd_store_set(m, "slow", "S", 1));
    T_OK(pd_store_set(c, "other", "O", 1));
    T_CHECK(get_is(c, "other", "O"));
    T_CHECK(get_is(c, "slow", "S"));
    int64_t nk = 0;
    T_OK(pd_store_num_keys(c, &nk));
    T_CHECK(nk == 2); /* the cancelled waits left no empty entries behind */
    pd_store_destroy(c);
    pd_store_destroy(m);
}

/* Waiters parked by a client that disappears are cleaned up; the server
 * keeps serving. */
static void *
doomed_waiter(void *arg)
{
    pd_store *c = arg;
    uint8_t *v = NULL;
    size_t n;
    (void)pd_store_get_timeout(c, "never", 0.5, &v, &n);
    return NULL;
}

static void
test_tcp_server_gone(void)
{
    pd_store *m = NULL, *c = NULL;
    char port_text[32];
    T_OK(tcp_new(0, -1, 1, 5.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    int port = pd_tcp_store_port(m);
    T_OK(tcp_new(port, -1, 0, 5.0, 0, NULL, &c));
    pd_store_destroy(m);
    double t0 = pd_now();
    T_ST(pd_store_set(c, "x", "1", 1), PD_ENETWORK);
    snprintf(port_text, sizeof(port_text), "127.0.0.1:%d", port);
    T_MSG_HAS(port_text);
    T_ST(pd_store_set(c, "x", "1", 1), PD_ENETWORK); /* stays broken, fast */
    T_MSG_HAS("lost during");
    T_CHECK(pd_now() - t0 < 2.0);
    pd_store_destroy(c);

    /* A client whose server never existed. */
    t0 = pd_now();
    T_ST(tcp_new(port, -1, 0, 0.3, 0, NULL, &c), PD_ENETWORK);
    T_MSG_HAS(port_text);
    T_CHECK(pd_now() - t0 < 3.0);
}

static void
test_tcp_port_in_use(void)
{
    pd_store *m = NULL, *m2 = NULL;
    char want[64];
    T_OK(tcp_new(0, -1, 1, 5.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    int port = pd_tcp_store_port(m);
    T_ST(tcp_new(port, -1, 1, 1.0, 0, NULL, &m2), PD_ENETWORK);
    snprintf(want, sizeof(want), "bind 0.0.0.0:%d: address already in use",
             port);
    T_MSG_HAS(want);
    T_CHECK(m2 == NULL);
    pd_store_destroy(m);
}

static void
test_tcp_auth(void)
{
    pd_store *m = NULL, *good = NULL, *bad = NULL;
    T_OK(tcp_new(0, -1, 1, 5.0, 0, "job-secret", &m));
    if (m == NULL) {
        return;
    }
    int port = pd_tcp_store_port(m);
    T_OK(tcp_new(port, -1, 0, 5.0, 0, "job-secret", &good));
    double t0 = pd_now();
    T_ST(tcp_new(port, -1, 0, 5.0, 0, "wrong", &bad), PD_EAUTH);
    T_MSG_HAS("authentication");
    T_ST(tcp_new(port, -1, 0, 5.0, 0, NULL, &bad), PD_EAUTH);
    T_MSG_HAS("requires a secret");
    T_CHECK(pd_now() - t0 < 2.0);
    T_CHECK(bad == NULL);

    /* A stranger that connects and says nothing, and one that sends junk,
     * do not disturb the others. */
    int silent = -1, junk = -1;
    T_OK(pd_net_connect("127.0.0.1", port, pd_now() + 2.0, &silent));
    T_OK(pd_net_connect("127.0.0.1", port, pd_now() + 2.0, &junk));
    T_OK(pd_net_send_all(junk, "GET / HTTP/1.0\r\n\r\n", 18, pd_now() + 1.0));
    if (good != NULL) {
        T_OK(pd_store_set(good, "k", "v", 1));
        T_CHECK(get_is(m, "k", "v"));
    }
    char b;
    /* The server hangs up on the junk sender. */
    pd_status st = pd_net_recv_all(junk, &b, 1, pd_now() + 2.0);
    uint8_t hello[48];
    (void)hello;
    T_CHECK(st == PD_ENETWORK || st == PD_OK); /* hello bytes, then EOF */
    close(silent);
    close(junk);
    pd_store_destroy(good);
    pd_store_destroy(m);
}

/* Every cycle starts and stops a server thread and two sockets per side:
 * nothing may leak. */
static void
test_tcp_create_destroy_cycles(void)
{
    int fds0 = count_fds(), th0 = count_threads();
    for (int i = 0; i < 1000; i++) {
        pd_store *m = NULL;
        pd_status st = tcp_new(0, 1, 1, 5.0, 1, NULL, &m);
        if (st != PD_OK) {
            T_OK(st);
            break;
        }
        pd_store_destroy(m);
    }
    T_CHECK(count_fds() == fds0);
    T_CHECK(count_threads() == th0);
}

static void
test_tcp_parked_waiter_client_dies(void)
{
    pd_store *m = NULL, *c = NULL;
    pthread_t th;
    T_OK(tcp_new(0, -1, 1, 5.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    T_OK(tcp_new(pd_tcp_store_port(m), -1, 0, 5.0, 0, NULL, &c));
    pthread_create(&th, NULL, doomed_waiter, c);
    pthread_join(th, NULL);
    pd_store_destroy(c);
    sleep_ms(20);
    int64_t nk = -1;
    T_OK(pd_store_num_keys(m, &nk));
    T_CHECK(nk == 0);
    T_OK(pd_store_set(m, "never", "x", 1));
    pd_store_destroy(m);
}

/* A will: the server sets its key when the client's connection closes (a
 * waiter parked on it wakes), not before; a dropped will never fires; a
 * second will on the same key replaces the first. */
static void
test_tcp_will(void)
{
    pd_store *m = NULL, *c = NULL;
    T_OK(tcp_new(0, -1, 1, 5.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    T_OK(tcp_new(pd_tcp_store_port(m), -1, 0, 5.0, 0, NULL, &c));
    T_OK(pd_tcp_store_will(c, "gone/1", "old", 3, 1));
    T_OK(pd_tcp_store_will(c, "gone/1", "rank 1", 6, 1));
    T_OK(pd_tcp_store_will(c, "dropped", "x", 1, 1));
    T_OK(pd_tcp_store_will(c, "dropped", NULL, 0, 0));
    T_OK(pd_tcp_store_will(c, "empty", "", 0, 1));
    T_OK(pd_tcp_store_will(m, "x", "x", 1, 1));
    T_OK(pd_tcp_store_will(m, "x", NULL, 0, 0));
    const char *k = "gone/1";
    int there = 1;
    T_OK(pd_store_check(m, &k, 1, &there));
    T_CHECK(!there);
    pd_store_destroy(c);
    T_OK(pd_store_wait(m, &k, 1, 5.0));
    T_CHECK(get_is(m, "gone/1", "rank 1"));
    k = "empty";
    T_OK(pd_store_wait(m, &k, 1, 5.0));
    k = "dropped";
    T_OK(pd_store_check(m, &k, 1, &there));
    T_CHECK(!there);
    pd_store_destroy(m);
}

typedef struct shared_getter {
    pd_store *s;
    int id;
    pd_status st;
    char msg[PD_ERRMSG_MAX];
} shared_getter;

/* Odd threads wait for a key that never comes (and time out), even threads
 * wait for keys that the main thread sets through the same client. */
static void *
shared_get_main(void *arg)
{
    shared_getter *g = arg;
    char key[32];
    uint8_t *v = NULL;
    size_t n;
    snprintf(key, sizeof(key), "%s%d", g->id % 2 ? "never" : "soon", g->id);
    g->st = pd_store_get_timeout(g->s, key, g->id % 2 ? 0.3 : 10.0, &v, &n);
    snprintf(g->msg, sizeof(g->msg), "%s", pd_errmsg());
    free(v);
    return NULL;
}

/* One client shared by threads: a blocked get does not hold up others. */
static void
test_tcp_shared_client_does_not_serialise(void)
{
    enum { N = 12 };
    pd_store *m = NULL;
    pthread_t th[N];
    shared_getter g[N];
    T_OK(tcp_new(0, -1, 1, 10.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    for (int i = 0; i < N; i++) {
        g[i] = (shared_getter){.s = m, .id = i};
        pthread_create(&th[i], NULL, shared_get_main, &g[i]);
    }
    sleep_ms(50);
    double t0 = pd_now();
    for (int i = 0; i < N; i += 2) {
        char key[32];
        snprintf(key, sizeof(key), "soon%d", i);
        T_OK(pd_store_set(m, key, "x", 1)); /* same client as the waiters */
    }
    T_CHECK(pd_now() - t0 < 0.25);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (i % 2) {
            T_ST(g[i].st, PD_ESTORE);
            T_CHECK(strstr(g[i].msg, "keys: /never") != NULL);
        } else {
            T_ST(g[i].st, PD_OK);
        }
    }
    int64_t nk = -1;
    T_OK(pd_store_num_keys(m, &nk));
    T_CHECK(nk == N / 2);
    pd_store_destroy(m);
}

/* A child made by fork() that tears down its copy of the master's store
 * must not stop the parent's server thread. */
static void
test_tcp_fork_child_destroy(void)
{
    pd_store *m = NULL;
    T_OK(tcp_new(0, -1, 1, 5.0, 0, NULL, &m));
    if (m == NULL) {
        return;
    }
    T_OK(pd_store_set(m, "before", "1", 1));
    pid_t pid = fork();
    if (pid == 0) {
        pd_store_destroy(m);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    T_OK(pd_store_set(m, "after", "2", 1));
    T_CHECK(get_is(m, "before", "1"));
    pd_store *c = NULL;
    T_OK(tcp_new(pd_tcp_store_port(m), -1, 0, 5.0, 0, NULL, &c));
    T_CHECK(c != NULL && get_is(c, "after", "2"));
    pd_store_destroy(c);
    pd_store_destroy(m);
}

/* ------------------------------------------------ the wire, byte for byte */

/* A raw authenticated connection to srv. */
static int
wire_connect(pd_tcp_server *srv)
{
    int fd = -1;
    double deadline = pd_now() + 5.0;
    if (pd_net_connect("127.0.0.1", pd_tcp_server_port(srv), deadline,
                       &fd) != PD_OK) {
        return -1;
    }
    if (pd_auth_client(fd, NULL, deadline) != PD_OK) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Send the frame in b (begun at 0) and free it. */
static int
wire_send(int fd, pd_wbuf *b)
{
    pd_wbuf_end(b, 0);
    pd_status st = pd_net_send_all(fd, b->p, b->len, pd_now() + 5.0);
    pd_wbuf_free(b);
    return st == PD_OK ? 0 : -1;
}

/* Read one reply; its body (malloc'd) goes to *body.  -1 on EOF/error. */
static int
wire_recv(int fd, uint8_t **body, size_t *len)
{
    uint8_t hdr[4];
    *body = NULL;
    if (pd_net_recv_all(fd, hdr, 4, pd_now() + 5.0) != PD_OK) {
        return -1;
    }
    *len = pd_rd32(hdr);
    *body = malloc(*len ? *len : 1);
    if (*body == NULL ||
        pd_net_recv_all(fd, *body, *len, pd_now() + 5.0) != PD_OK) {
        free(*body);
        *body = NULL;
        return -1;
    }
    return 0;
}

/* Send b, read the reply, check its status and seq; the payload reader
 * (over *body, which the caller frees) goes to *rd. */
static int
wire_call(int fd, pd_wbuf *b, uint32_t seq, uint8_t status, uint8_t **body,
          pd_rbuf *rd)
{
    size_t len = 0;
    if (wire_send(fd, b) < 0 || wire_recv(fd, body, &len) < 0) {
        return -1;
    }
    *rd = (pd_rbuf){.p = *body, .n = len, .off = PD_TS_HDR, .bad = 0};
    if (len < PD_TS_HDR || (*body)[0] != status || pd_rd32(*body + 1) != seq) {
        return -1;
    }
    return 0;
}

/* The server closed the connection (after a malformed request) without
 * answering: EOF within 5 s, not a reply or silence. */
static int
wire_closed(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
    uint8_t c;
    return poll(&pf, 1, 5000) == 1 && recv(fd, &c, 1, 0) == 0;
}

/* Every command and reply as the protocol of tcp_proto.h lays them out,
 * the order of late replies, and malformed requests closing the
 * connection. */
static void
test_tcp_wire(void)
{
    pd_tcp_server *srv = NULL;
    T_OK(pd_tcp_server_start(NULL, 0, -1, NULL, &srv));
    if (srv == NULL) {
        return;
    }
    int fd = wire_connect(srv);
    T_CHECK(fd >= 0);
    pd_wbuf b = {0};
    uint8_t *body = NULL;
    pd_rbuf rd;
    size_t n;
    const uint8_t *v;

    pd_wbuf_begin(&b, PD_TS_SET, 1);
    pd_wbuf_str(&b, "", "/a");
    pd_wbuf_bytes(&b, "1", 1);
    T_CHECK(wire_call(fd, &b, 1, 0, &body, &rd) == 0 && rd.n == PD_TS_HDR);
    free(body);

    pd_wbuf_begin(&b, PD_TS_GET, 2);
    pd_wbuf_str(&b, "", "/a");
    T_CHECK(wire_call(fd, &b, 2, 0, &body, &rd) == 0);
    v = pd_rbuf_bytes(&rd, &n);
    T_CHECK(!rd.bad && n == 1 && v[0] == '1' && rd.off == rd.n);
    free(body);

    pd_wbuf_begin(&b, PD_TS_ADD, 3);
    pd_wbuf_str(&b, "", "/n");
    pd_wbuf_i64(&b, 5);
    T_CHECK(wire_call(fd, &b, 3, 0, &body, &rd) == 0);
    T_CHECK(pd_rbuf_i64(&rd) == 5 && !rd.bad && rd.off == rd.n);
    free(body);

    pd_wbuf_begin(&b, PD_TS_CAS, 4);
    pd_wbuf_str(&b, "", "/a");
    pd_wbuf_bytes(&b, "1", 1);
    pd_wbuf_bytes(&b, "22", 2);
    T_CHECK(wire_call(fd, &b, 4, 0, &body, &rd) == 0);
    v = pd_rbuf_bytes(&rd, &n);
    T_CHECK(!rd.bad && n == 2 && memcmp(v, "22", 2) == 0);
    free(body);

    pd_wbuf_begin(&b, PD_TS_CHECK, 5);
    pd_wbuf_u32(&b, 2);
    pd_wbuf_str(&b, "", "/a");
    pd_wbuf_str(&b, "", "/zz");
    T_CHECK(wire_call(fd, &b, 5, 0, &body, &rd) == 0);
    T_CHECK(pd_rbuf_u8(&rd) == 0 && !rd.bad && rd.off == rd.n);
    free(body);

    pd_wbuf_begin(&b, PD_TS_CHECK, 6);
    pd_wbuf_u32(&b, 1);
    pd_wbuf_str(&b, "", "/a");
    T_CHECK(wire_call(fd, &b, 6, 0, &body, &rd) == 0);
    T_CHECK(pd_rbuf_u8(&rd) == 1);
    free(body);

    /* An error reply: status, then the message as a str. */
    pd_wbuf_begin(&b, PD_TS_ADD, 7);
    pd_wbuf_str(&b, "", "/a");
    pd_wbuf_i64(&b, INT64_MAX);
    T_CHECK(wire_call(fd, &b, 7, PD_EINVAL, &body, &rd) == 0);
    const char *msg = pd_rbuf_str(&rd, &n);
    T_CHECK(msg != NULL && strstr(msg, "overflows int64") != NULL);
    free(body);

    pd_wbuf_begin(&b, PD_TS_DELETE, 8);
    pd_wbuf_str(&b, "", "/a");
    T_CHECK(wire_call(fd, &b, 8, 0, &body, &rd) == 0);
    T_CHECK(pd_rbuf_u8(&rd) == 1);
    free(body);

    pd_wbuf_begin(&b, PD_TS_NUM_KEYS, 9);
    T_CHECK(wire_call(fd, &b, 9, 0, &body, &rd) == 0);
    T_CHECK(pd_rbuf_i64(&rd) == 1 && rd.off == rd.n);
    free(body);

    /* PING ignores bytes after its header. */
    pd_wbuf_begin(&b, PD_TS_PING, 10);
    pd_wbuf_u32(&b, 0xdeadbeef);
    T_CHECK(wire_call(fd, &b, 10, 0, &body, &rd) == 0 && rd.n == PD_TS_HDR);
    free(body);

    /* A parked GET that is cancelled never answers; the SET that would
     * have woken it answers alone. */
    pd_wbuf_begin(&b, PD_TS_GET, 11);
    pd_wbuf_str(&b, "", "/w");
    T_CHECK(wire_send(fd, &b) == 0);
    pd_wbuf_begin(&b, PD_TS_CANCEL, 12);
    pd_wbuf_u32(&b, 11);
    T_CHECK(wire_call(fd, &b, 12, 0, &body, &rd) == 0 && rd.n == PD_TS_HDR);
    free(body);
    pd_wbuf_begin(&b, PD_TS_SET, 13);
    pd_wbuf_str(&b, "", "/w");
    pd_wbuf_bytes(&b, "w", 1);
    T_CHECK(wire_call(fd, &b, 13, 0, &body, &rd) == 0);
    free(body);

    /* A parked WAIT and GET are answered, before the SET that woke them. */
    pd_wbuf_begin(&b, PD_TS_WAIT, 14);
    pd_wbuf_u32(&b, 2);
    pd_wbuf_str(&b, "", "/w");
    pd_wbuf_str(&b, "", "/x");
    T_CHECK(wire_send(fd, &b) == 0);
    pd_wbuf_begin(&b, PD_TS_GET, 15);
    pd_wbuf_str(&b, "", "/x");
    T_CHECK(wire_send(fd, &b) == 0);
    pd_wbuf_begin(&b, PD_TS_SET, 16);
    pd_wbuf_str(&b, "", "/x");
    pd_wbuf_bytes(&b, "xy", 2);
    T_CHECK(wire_send(fd, &b) == 0);
    uint32_t order[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        T_CHECK(wire_recv(fd, &body, &n) == 0 && n >= PD_TS_HDR &&
                body[0] == 0);
        if (body != NULL) {
            order[i] = pd_rd32(body + 1);
            if (order[i] == 15) {
                rd = (pd_rbuf){.p = body, .n = n, .off = PD_TS_HDR, .bad = 0};
                v = pd_rbuf_bytes(&rd, &n);
                T_CHECK(!rd.bad && n == 2 && memcmp(v, "xy", 2) == 0);
            }
        }
        free(body);
        body = NULL;
    }
    T_CHECK(order[2] == 16 && order[0] + order[1] == 29);

    /* Bytes after NUM_KEYS' header: malformed, the connection is closed. */
    pd_wbuf_begin(&b, PD_TS_NUM_KEYS, 17);
    pd_wbuf_u8(&b, 0);
    T_CHECK(wire_send(fd, &b) == 0 && wire_closed(fd));
    close(fd);

    /* An unknown command. */
    fd = wire_connect(srv);
    pd_wbuf_begin(&b, PD_TS_CANCEL + 1, 1);
    T_CHECK(fd >= 0 && wire_send(fd, &b) == 0 && wire_closed(fd));
    close(fd);

    /* A SET whose value runs past the frame. */
    fd = wire_connect(srv);
    pd_wbuf_begin(&b, PD_TS_SET, 1);
    pd_wbuf_str(&b, "", "/t");
    pd_wbuf_u32(&b, 100);
    pd_wbuf_put(&b, "abc", 3);
    T_CHECK(fd >= 0 && wire_send(fd, &b) == 0 && wire_closed(fd));
    close(fd);

    /* A WAIT claiming more keys than the frame can hold. */
    fd = wire_connect(srv);
    pd_wbuf_begin(&b, PD_TS_WAIT, 1);
    pd_wbuf_u32(&b, 1000);
    pd_wbuf_str(&b, "", "/t");
    T_CHECK(fd >= 0 && wire_send(fd, &b) == 0 && wire_closed(fd));
    close(fd);

    /* The server still serves. */
    fd = wire_connect(srv);
    pd_wbuf_begin(&b, PD_TS_GET, 1);
    pd_wbuf_str(&b, "", "/x");
    T_CHECK(fd >= 0 && wire_call(fd, &b, 1, 0, &body, &rd) == 0);
    free(body);
    close(fd);
    pd_tcp_server_stop(srv);
}

int
main(void)
{
    printf("test_store\n");
    T_RUN(test_hash_store);
    T_RUN(test_file_store);
    T_RUN(test_file_store_cleanup);
    T_RUN(test_tcp_semantics);
    T_RUN(test_tcp_many_clients);
    T_RUN(test_tcp_wait_for_workers_timeout);
    T_RUN(test_tcp_timeout_then_reuse);
    T_RUN(test_tcp_parked_waiter_client_dies);
    T_RUN(test_tcp_will);
    T_RUN(test_tcp_shared_client_does_not_serialise);
    T_RUN(test_tcp_server_gone);
    T_RUN(test_tcp_port_in_use);
    T_RUN(test_tcp_auth);
    T_RUN(test_tcp_wire);
    T_RUN(test_tcp_fork_child_destroy);
    T_RUN(test_tcp_create_destroy_cycles);
    return pd_test_result();
}
