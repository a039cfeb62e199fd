/* util/net.h: listen / connect / accept / send / recv with deadlines and
 * the exact error messages users see. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pd_test.h"
#include "util/net.h"

static void
test_listen_port_in_use(void)
{
    int fd, port, fd2 = -1, port2;
    char want[64];
    T_OK(pd_net_listen(NULL, 0, 16, &fd, &port));
    T_CHECK(port > 0);
    T_ST(pd_net_listen(NULL, port, 16, &fd2, &port2), PD_ENETWORK);
    snprintf(want, sizeof(want), "bind 0.0.0.0:%d: address already in use "
             "(EADDRINUSE)", port);
    T_MSG_HAS(want);
    T_CHECK(fd2 == -1);
    T_ST(pd_net_listen("127.0.0.1", port, 16, &fd2, &port2), PD_ENETWORK);
    snprintf(want, sizeof(want), "bind 127.0.0.1:%d", port);
    T_MSG_HAS(want);
    T_MSG_HAS("EADDRINUSE");
    T_ST(pd_net_listen(NULL, 70000, 16, &fd2, &port2), PD_EINVAL);
    close(fd);
}

static void
test_connect_refused_until_deadline(void)
{
    int fd, port, cfd = -1;
    char want[64];
    /* Find a free port, then close it so nobody listens there. */
    T_OK(pd_net_listen("127.0.0.1", 0, 1, &fd, &port));
    close(fd);
    double t0 = pd_now();
    T_ST(pd_net_connect("127.0.0.1", port, pd_now() + 0.3, &cfd),
         PD_ENETWORK);
    double dt = pd_now() - t0;
    T_CHECK(dt >= 0.29 && dt < 2.0);
    snprintf(want, sizeof(want), "connect 127.0.0.1:%d", port);
    T_MSG_HAS(want);
    T_MSG_HAS("timed out");
    T_MSG_HAS("ECONNREFUSED");
    T_CHECK(cfd == -1);
}

/* A peer that published its address listened there: its refusal is final,
 * said at once instead of retried until the deadline. */
static void
test_connect_listening_refused_at_once(void)
{
    int fd, port, cfd = -1;
    T_OK(pd_net_listen("127.0.0.1", 0, 1, &fd, &port));
    close(fd);
    double t0 = pd_now();
    T_ST(pd_net_connect_listening("127.0.0.1", port, pd_now() + 5.0, &cfd),
         PD_ENETWORK);
    T_CHECK(pd_now() - t0 < 1.0);
    T_MSG_HAS("ECONNREFUSED");
    T_CHECK(cfd == -1);
    /* and a listening peer is reached as by pd_net_connect */
    T_OK(pd_net_listen("127.0.0.1", 0, 1, &fd, &port));
    T_OK(pd_net_connect_listening("127.0.0.1", port, pd_now() + 5.0, &cfd));
    close(cfd);
    close(fd);
}

typedef struct late {
    int port;
    int fd;
} late;

static void *
late_listener(void *arg)
{
    late *l = arg;
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int port;
    if (pd_net_listen("127.0.0.1", l->port, 4, &l->fd, &port) != PD_OK) {
        l->fd = -1;
    }
    return NULL;
}

static void
test_connect_retries_until_server_appears(void)
{
    int fd, port, cfd = -1, sfd = -1;
    pthread_t th;
    T_OK(pd_net_listen("127.0.0.1", 0, 1, &fd, &port));
    close(fd);
    late l = {port, -1};
    pthread_create(&th, NULL, late_listener, &l);
    T_OK(pd_net_connect("127.0.0.1", port, pd_now() + 5.0, &cfd));
    pthread_join(th, NULL);
    T_CHECK(l.fd >= 0);
    if (l.fd >= 0) {
        T_OK(pd_net_accept(l.fd, pd_now() + 2.0, &sfd));
        close(sfd);
        close(l.fd);
    }
    if (cfd >= 0) {
        close(cfd);
    }
}

static void
test_connect_bad_host(void)
{
    int cfd = -1;
    double t0 = pd_now();
    pd_status st = pd_net_connect("no-such-host.invalid", 1234,
                                  pd_now() + 0.3, &cfd);
    T_ST(st, PD_ENETWORK);
    T_MSG_HAS("no-such-host.invalid:1234");
    T_CHECK(pd_now() - t0 < 5.0);
}

static void
test_send_recv(void)
{
    int lfd, port, cfd, sfd;
    char buf[16], addr[64];
    int lport;
    T_OK(pd_net_listen(NULL, 0, 4, &lfd, &port));
    T_ST(pd_net_accept(lfd, pd_now() + 0.05, &sfd), PD_ETIMEOUT);
    T_OK(pd_net_connect("localhost", port, pd_now() + 5.0, &cfd));
    T_OK(pd_net_accept(lfd, pd_now() + 5.0, &sfd));
    T_OK(pd_net_local_addr(cfd, addr, sizeof(addr), &lport));
    T_CHECK(strcmp(addr, "127.0.0.1") == 0);
    T_CHECK(lport > 0);

    T_OK(pd_net_send_all(cfd, "hello", 5, pd_now() + 1.0));
    T_OK(pd_net_recv_all(sfd, buf, 5, pd_now() + 1.0));
    T_CHECK(memcmp(buf, "hello", 5) == 0);

    double t0 = pd_now();
    T_ST(pd_net_recv_all(sfd, buf, 1, pd_now() + 0.1), PD_ETIMEOUT);
    T_MSG_HAS("timed out");
    T_CHECK(pd_now() - t0 >= 0.099);

    /* A large transfer through a non-blocking pair, both directions. */
    size_t big = 8u << 20;
    char *src = malloc(big), *dst = malloc(big);
    for (size_t i = 0; i < big; i++) {
        src[i] = (char)(i * 31);
    }
    T_OK(pd_net_set_nonblock(cfd, 1));
    pid_t pid = fork();
    if (pid == 0) {
        pd_status st = pd_net_send_all(cfd, src, big, pd_now() + 10.0);
        _exit(st == PD_OK ? 0 : 1);
    }
    T_OK(pd_net_recv_all(sfd, dst, big, pd_now() + 10.0));
    T_CHECK(memcmp(src, dst, big) == 0);
    int status = 0;
    waitpid(pid, &status, 0);
    T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    free(src);
    free(dst);

    /* Peer gone: EOF on recv, EPIPE on send, and no SIGPIPE. */
    close(cfd);
    T_ST(pd_net_recv_all(sfd, buf, 1, pd_now() + 1.0), PD_ENETWORK);
    T_MSG_HAS("connection closed by peer");
    pd_status st = PD_OK;
    for (int i = 0; i < 100 && st == PD_OK; i++) {
        st = pd_net_send_all(sfd, buf, sizeof(buf), pd_now() + 1.0);
    }
    T_ST(st, PD_ENETWORK);
    close(sfd);
    close(lfd);
}

static void
test_random(void)
{
    unsigned char a[32], b[32];
    T_OK(pd_random_bytes(a, sizeof(a)));
    T_OK(pd_random_bytes(b, sizeof(b)));
    T_CHECK(memcmp(a, b, sizeof(a)) != 0);
    size_t n = 1u << 20;
    unsigned char *big = calloc(1, n);
    T_OK(pd_random_bytes(big, n));
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++) {
        zeros += big[i] == 0;
    }
    T_CHECK(zeros < n / 128); /* about n/256 expected */
    free(big);
}

int
main(void)
{
    printf("test_net\n");
    T_RUN(test_listen_port_in_use);
    T_RUN(test_connect_refused_until_deadline);
    T_RUN(test_connect_listening_refused_at_once);
    T_RUN(test_connect_retries_until_server_appears);
    T_RUN(test_connect_bad_host);
    T_RUN(test_send_recv);
    T_RUN(test_random);
    return pd_test_result();
}
