/* TCP socket helpers shared by the store and the TCP transport (see net.h).
 *
 * Messages follow one shape so users can act on them: "<call> <host>:<port>:
 * <lower-case strerror> (<ERRNO NAME>)", e.g. "bind 0.0.0.0:29500: address
 * already in use (EADDRINUSE)".
 */
#include "net.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/* Longest "host:port" text we format: an IPv6 literal in brackets plus port. */
#define ADDR_TEXT_MAX (INET6_ADDRSTRLEN + 16)

/* Backoff between connection attempts: grows from CONNECT_BACKOFF_MIN to
 * CONNECT_BACKOFF_MAX seconds, so a late server is found quickly without
 * flooding it. */
#define CONNECT_BACKOFF_MIN 0.01
#define CONNECT_BACKOFF_MAX 1.0
/* A name that does not resolve (EAI_NONAME) is a typo far more often than a
 * DNS entry about to appear: retried this long, then an error naming it. */
#define RESOLVE_GRACE 3.0
/* A connection still failing is said after this many seconds, then at
 * growing intervals up to CONNECT_SAY_MAX (a wait that says nothing looks
 * like a hang; one that says too much drowns the log). */
#define CONNECT_SAY_FIRST 3.0
#define CONNECT_SAY_MAX 60.0

static const char *
errno_name(int err)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const char *name = strerrorname_np(err);
    if (name != NULL) {
        return name;
    }
    return "unknown errno";
#else
    switch (err) {
    case EADDRINUSE: return "EADDRINUSE";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case EACCES: return "EACCES";
    case ECONNREFUSED: return "ECONNREFUSED";
    case ECONNRESET: return "ECONNRESET";
    case EPIPE: return "EPIPE";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ENETUNREACH: return "ENETUNREACH";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    default: return "unknown errno";
    }
#endif
}

/* Set this thread's error to "<context>: <strerror, first letter lowered>
 * (<ENAME>)".  err is passed explicitly because formatting the context may
 * clobber errno. */
static pd_status
net_error(pd_status st, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static pd_status
net_error(pd_status st, int err, const char *fmt, ...)
{
    char ctx[512];
    char ebuf[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof(ctx), fmt, ap);
    va_end(ap);
    const char *es = strerror_r(err, ebuf, sizeof(ebuf));
    char lower[128];
    snprintf(lower, sizeof(lower), "%s", es);
    lower[0] = (char)tolower((unsigned char)lower[0]);
    return pd_error(st, "%s: %s (%s)", ctx, lower, errno_name(err));
}

/* "1.2.3.4:80" or "[::1]:80" for a socket address. */
static void
format_sockaddr(const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%d", host, (int)ntohs(in4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%d", host, (int)ntohs(in6->sin6_port));
    } else {
        snprintf(buf, len, "(non-IP socket)");
    }
}

/* "host:port" for a user-given host name, bracketing IPv6 literals. */
static void
format_hostport(const char *host, int port, char *buf, size_t len)
{
    if (strchr(host, ':') != NULL) {
        snprintf(buf, len, "[%s]:%d", host, port);
    } else {
        snprintf(buf, len, "%s:%d", host, port);
    }
}

/* Peer address text for error messages; "peer" when unknown (e.g. a
 * socketpair or a connection already reset). */
static void
peer_text(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)) {
        char a[ADDR_TEXT_MAX];
        format_sockaddr((struct sockaddr *)&ss, a, sizeof(a));
        snprintf(buf, len, "peer %s", a);
    } else {
        snprintf(buf, len, "peer");
    }
}

static void
close_noeintr(int fd)
{
    /* Linux closes the fd even when close() reports EINTR: never retry. */
    if (fd >= 0) {
        (void)close(fd);
    }
}

/* Milliseconds left until deadline for poll(): -1 for no deadline, 0 when
 * passed, rounded up so we never wake a hair before the deadline. */
static int
poll_ms(double deadline)
{
    if (deadline <= 0) {
        return -1;
    }
    double left = deadline - pd_now();
    if (left <= 0) {
        return 0;
    }
    double ms = left * 1000.0;
    if (ms > 2147483646.0) {
        return 2147483647;
    }
    int ims = (int)ms;
    return (double)ims < ms ? ims + 1 : ims; /* round up */
}

static int
deadline_passed(double deadline)
{
    return deadline > 0 && pd_now() >= deadline;
}

static void
sleep_seconds(double s)
{
    if (s <= 0) {
        return;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Wait for events on fd until deadline.  Returns PD_OK when ready,
 * PD_ETIMEOUT when the deadline passed (message left to the caller). */
static pd_status
wait_fd(int fd, short events, double deadline, const char *what)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        /* At the deadline still poll once with 0 ms: a ready fd wins. */
        int ms = poll_ms(deadline);
        int r = poll(&p, 1, ms);
        if (r > 0) {
            return PD_OK;
        }
        if (r == 0) {
            if (deadline_passed(deadline)) {
                return PD_ETIMEOUT;
            }
            continue;
        }
        if (errno == EINTR) {
            continue;
        }
        return net_error(PD_ESYS, errno, "poll (%s)", what);
    }
}

pd_status
pd_net_set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) {
        return net_error(PD_ESYS, errno, "fcntl(F_GETFL) fd %d", fd);
    }
    int nfl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    if (nfl != fl && fcntl(fd, F_SETFL, nfl) < 0) {
        return net_error(PD_ESYS, errno, "fcntl(F_SETFL) fd %d", fd);
    }
    return PD_OK;
}

pd_status
pd_net_set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
        return net_error(PD_ESYS, errno, "setsockopt(TCP_NODELAY) fd %d", fd);
    }
    return PD_OK;
}

/* Bind and listen one address; on failure the message names the address. */
static pd_status
listen_one(const struct sockaddr *sa, socklen_t sl, int backlog, int *fd_out)
{
    pd_status st = PD_OK;
    char at[ADDR_TEXT_MAX];
    int one = 1;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    format_sockaddr(sa, at, sizeof(at));
    if (fd < 0) {
        st = net_error(PD_ENETWORK, errno, "socket for %s", at);
        goto fail;
    }
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0) {
        st = net_error(PD_ENETWORK, errno, "setsockopt(SO_REUSEADDR) %s", at);
        goto fail;
    }
    if (sa->sa_family == AF_INET6) {
        /* Dual-stack where the system allows it: "::" also takes IPv4. */
        int zero = 0;
        (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (bind(fd, sa, sl) < 0) {
        st = net_error(PD_ENETWORK, errno, "bind %s", at);
        goto fail;
    }
    if (listen(fd, backlog) < 0) {
        st = net_error(PD_ENETWORK, errno, "listen %s", at);
        goto fail;
    }
    *fd_out = fd;
    return PD_OK;
fail:
    close_noeintr(fd);
    return st;
}

pd_status
pd_net_listen(const char *host, int port, int backlog, int *fd_out,
              int *port_out)
{
    pd_status st = PD_OK;
    struct addrinfo *res = NULL;
    int fd = -1;
    char hp[ADDR_TEXT_MAX + 256];

    *fd_out = -1;
    if (port < 0 || port > 65535) {
        return pd_error(PD_EINVAL, "listen: port %d is outside [0, 65535]",
                        port);
    }
    if (backlog <= 0) {
        backlog = SOMAXCONN;
    }
    if (host == NULL || host[0] == '\0') {
        struct sockaddr_in in4;
        memset(&in4, 0, sizeof(in4));
        in4.sin_family = AF_INET;
        in4.sin_addr.s_addr = htonl(INADDR_ANY);
        in4.sin_port = htons((uint16_t)port);
        PD_CHECK_GOTO(listen_one((struct sockaddr *)&in4, sizeof(in4),
                                 backlog, &fd), st, fail);
    } else {
        struct addrinfo hints;
        char service[16];
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        snprintf(service, sizeof(service), "%d", port);
        format_hostport(host, port, hp, sizeof(hp));
        int gai = getaddrinfo(host, service, &hints, &res);
        if (gai != 0) {
            st = pd_error(PD_ENETWORK, "listen %s: cannot resolve host: %s",
                          hp, gai == EAI_SYSTEM ? strerror(errno)
                                                : gai_strerror(gai));
            goto fail;
        }
        /* The first address that works wins; report the first failure,
         * which is usually the most telling (e.g. EADDRINUSE). */
        st = PD_ENETWORK;
        char first[PD_ERRMSG_MAX] = "";
        for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
            st = listen_one(ai->ai_addr, ai->ai_addrlen, backlog, &fd);
            if (st == PD_OK) {
                break;
            }
            if (first[0] == '\0') {
                snprintf(first, sizeof(first), "%s", pd_errmsg());
            }
        }
        if (st != PD_OK) {
            st = pd_error(PD_ENETWORK, "%s", first[0] ? first
                                               : "listen: no usable address");
            goto fail;
        }
    }
    if (port_out != NULL) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
            st = net_error(PD_ENETWORK, errno, "getsockname of listening fd");
            goto fail;
        }
        *port_out = ss.ss_family == AF_INET6
                        ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                        : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    *fd_out = fd;
    fd = -1;
fail:
    if (res != NULL) {
        freeaddrinfo(res);
    }
    close_noeintr(fd);
    return st;
}

static int
connect_error_retryable(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case ETIMEDOUT:
    case ECONNRESET:
    case ECONNABORTED:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
    case EAGAIN:
    case EADDRNOTAVAIL:
    case ENOENT:
        return 1;
    default:
        return 0;
    }
}

/* A TCP socket connecting to a free port on its own host can connect to
 * itself (simultaneous open).  Such a socket is useless: detect it. */
static int
is_self_connected(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t la = sizeof(a), lb = sizeof(b);
    if (getsockname(fd, (struct sockaddr *)&a, &la) < 0 ||
        getpeername(fd, (struct sockaddr *)&b, &lb) < 0) {
        return 0;
    }
    return la == lb && memcmp(&a, &b, la) == 0;
}

/* One non-blocking connect attempt bounded by deadline.  Returns PD_OK with
 * *fd_out set, or sets *err (errno of the failure) and returns
 * PD_ENETWORK. */
static pd_status
connect_one(const struct addrinfo *ai, double deadline, int *fd_out,
            int *err)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    0);
    if (fd < 0) {
        *err = errno;
        return PD_ENETWORK;
    }
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r < 0 && errno != EINPROGRESS && errno != EINTR) {
        *err = errno;
        close_noeintr(fd);
        return PD_ENETWORK;
    }
    if (r < 0) {
        /* Cap one attempt so a black-holed address does not eat the whole
         * deadline before the next address is tried. */
        double cap = pd_now() + 5.0;
        double dl = (deadline <= 0 || cap < deadline) ? cap : deadline;
        if (wait_fd(fd, POLLOUT, dl, "connect") != PD_OK) {
            *err = ETIMEDOUT;
            close_noeintr(fd);
            return PD_ENETWORK;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) {
            soerr = errno;
        }
        if (soerr != 0) {
            *err = soerr;
            close_noeintr(fd);
            return PD_ENETWORK;
        }
    }
    if (is_self_connected(fd)) {
        *err = ECONNREFUSED;
        close_noeintr(fd);
        return PD_ENETWORK;
    }
    *fd_out = fd;
    return PD_OK;
}

static pd_status
net_connect(const char *host, int port, double deadline, int refused_final,
            int *fd_out)
{
    pd_status st = PD_OK;
    char hp[ADDR_TEXT_MAX + 256];
    char service[16];
    struct addrinfo hints;
    int fd = -1;
    int last_err = 0;
    int last_gai = 0;
    double backoff = CONNECT_BACKOFF_MIN;
    double start = pd_now();
    double say_gap = CONNECT_SAY_FIRST;
    double say_at = start + say_gap;

    *fd_out = -1;
    if (host == NULL || host[0] == '\0') {
        return pd_error(PD_EINVAL, "connect: empty host name");
    }
    if (port <= 0 || port > 65535) {
        return pd_error(PD_EINVAL, "connect %s: port %d is outside [1, 65535]",
                        host, port);
    }
    format_hostport(host, port, hp, sizeof(hp));
    snprintf(service, sizeof(service), "%d", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;

    for (;;) {
        struct addrinfo *res = NULL;
        int gai = getaddrinfo(host, service, &hints, &res);
        if (gai != 0) {
            /* A name may appear late (cluster DNS): retry like a refused
             * connection, except for errors that cannot go away. */
            last_gai = gai;
            last_err = gai == EAI_SYSTEM ? errno : 0;
            int noname = gai == EAI_NONAME
#ifdef EAI_NODATA
                         || gai == EAI_NODATA
#endif
                ;
            if (gai != EAI_AGAIN && !noname && gai != EAI_SYSTEM) {
                return pd_error(PD_ENETWORK, "connect %s: cannot resolve host "
                                "'%s': %s", hp, host, gai_strerror(gai));
            }
            if (noname && pd_now() - start >= RESOLVE_GRACE) {
                return pd_error(PD_ENETWORK, "connect %s: cannot resolve host "
                                "'%s': %s (for %.0f s; is the name right?)",
                                hp, host, gai_strerror(gai), RESOLVE_GRACE);
            }
        } else {
            /* Try every address (e.g. ::1 then 127.0.0.1); give up early
             * only when no address failed in a way that may heal. */
            int retryable = 0;
            int hard_err = 0;
            last_gai = 0;
            for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
                int err = 0;
                if (connect_one(ai, deadline, &fd, &err) == PD_OK) {
                    break;
                }
                if (connect_error_retryable(err)) {
                    retryable = 1;
                    /* An attempt cut short by the deadline says less than
                     * the refusal before it. */
                    if (err != ETIMEDOUT || last_err == 0) {
                        last_err = err;
                    }
                } else if (hard_err == 0) {
                    hard_err = err;
                }
            }
            freeaddrinfo(res);
            if (fd >= 0) {
                break;
            }
            if (!retryable) {
                return net_error(PD_ENETWORK, hard_err, "connect %s", hp);
            }
            if (refused_final && last_err == ECONNREFUSED) {
                return net_error(PD_ENETWORK, last_err, "connect %s", hp);
            }
        }
        if (deadline_passed(deadline)) {
            double waited = pd_now() - start;
            if (last_gai != 0) {
                return pd_error(PD_ENETWORK,
                                "connect %s: timed out after %.0fms: cannot "
                                "resolve host: %s", hp, waited * 1000.0,
                                last_gai == EAI_SYSTEM ? strerror(last_err)
                                                       : gai_strerror(last_gai));
            }
            return net_error(PD_ENETWORK, last_err,
                             "connect %s: timed out after %.0fms; last error",
                             hp, waited * 1000.0);
        }
        double now = pd_now();
        if (now >= say_at) {
            char why[256];
            if (last_gai != 0) {
                snprintf(why, sizeof(why), "cannot resolve host: %s",
                         last_gai == EAI_SYSTEM ? strerror(last_err)
                                                : gai_strerror(last_gai));
            }
            else {
                snprintf(why, sizeof(why), "%s", strerror(last_err));
            }
            if (deadline > 0) {
                PD_NOTICE("net", "still connecting to %s after %.0f s (%s); "
                          "giving up in %.0f s", hp, now - start, why,
                          deadline - now);
            }
            else {
                PD_NOTICE("net", "still connecting to %s after %.0f s (%s)",
                          hp, now - start, why);
            }
            say_gap = say_gap * 3 > CONNECT_SAY_MAX ? CONNECT_SAY_MAX
                                                    : say_gap * 3;
            say_at = now + say_gap;
        }
        double pause = backoff;
        if (deadline > 0 && pd_now() + pause > deadline) {
            pause = deadline - pd_now();
        }
        sleep_seconds(pause);
        backoff = backoff * 2 > CONNECT_BACKOFF_MAX ? CONNECT_BACKOFF_MAX
                                                    : backoff * 2;
    }

    PD_CHECK_GOTO(pd_net_set_nonblock(fd, 0), st, fail);
    PD_CHECK_GOTO(pd_net_set_nodelay(fd), st, fail);
    *fd_out = fd;
    return PD_OK;
fail:
    pd_error_prefix("connect %s", hp);
    close_noeintr(fd);
    return st;
}

pd_status
pd_net_connect(const char *host, int port, double deadline, int *fd_out)
{
    return net_connect(host, port, deadline, 0, fd_out);
}

pd_status
pd_net_connect_listening(const char *host, int port, double deadline,
                         int *fd_out)
{
    return net_connect(host, port, deadline, 1, fd_out);
}

pd_status
pd_net_accept(int lfd, double deadline, int *fd_out)
{
    pd_status st = PD_OK;
    *fd_out = -1;
    for (;;) {
        st = wait_fd(lfd, POLLIN, deadline, "accept");
        if (st == PD_ETIMEOUT) {
            return pd_error(PD_ETIMEOUT,
                            "accept: no connection arrived before the deadline");
        }
        PD_CHECK(st);
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            /* Transient: interrupted, a connection reset before we took it,
             * or another thread won the race on a shared listener. */
            if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK ||
                err == ECONNABORTED || err == EPROTO) {
                continue;
            }
            return net_error(err == EMFILE || err == ENFILE ? PD_ESYS
                                                            : PD_ENETWORK,
                             err, "accept");
        }
        /* Linux does not inherit O_NONBLOCK from the listener via accept4
         * without SOCK_NONBLOCK, so fd is blocking here. */
        st = pd_net_set_nodelay(fd);
        if (st != PD_OK) {
            close_noeintr(fd);
            return st;
        }
        *fd_out = fd;
        return PD_OK;
    }
}

pd_status
pd_net_send_all(int fd, const void *buf, size_t n, double deadline)
{
    const char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        int err = r == 0 ? EAGAIN : errno;
        if (err == EINTR) {
            continue;
        }
        if (err == EAGAIN || err == EWOULDBLOCK) {
            pd_status st = wait_fd(fd, POLLOUT, deadline, "send");
            if (st == PD_ETIMEOUT) {
                char pt[ADDR_TEXT_MAX + 8];
                peer_text(fd, pt, sizeof(pt));
                return pd_error(PD_ETIMEOUT,
                                "send to %s: timed out (%zu of %zu bytes sent)",
                                pt, done, n);
            }
            PD_CHECK(st);
            continue;
        }
        char pt[ADDR_TEXT_MAX + 8];
        peer_text(fd, pt, sizeof(pt));
        if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
            return net_error(PD_ENETWORK, err,
                             "send to %s: connection closed by peer", pt);
        }
        return net_error(PD_ENETWORK, err, "send to %s", pt);
    }
    return PD_OK;
}

pd_status
pd_net_recv_all(int fd, void *buf, size_t n, double deadline)
{
    char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = recv(fd, p + done, n - done, MSG_DONTWAIT);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        char pt[ADDR_TEXT_MAX + 8];
        if (r == 0) {
            peer_text(fd, pt, sizeof(pt));
            return pd_error(PD_ENETWORK,
                            "recv from %s: connection closed by peer (EOF after "
                            "%zu of %zu bytes)", pt, done, n);
        }
        int err = errno;
        if (err == EINTR) {
            continue;
        }
        if (err == EAGAIN || err == EWOULDBLOCK) {
            pd_status st = wait_fd(fd, POLLIN, deadline, "recv");
            if (st == PD_ETIMEOUT) {
                peer_text(fd, pt, sizeof(pt));
                return pd_error(PD_ETIMEOUT,
                                "recv from %s: timed out (%zu of %zu bytes "
                                "received)", pt, done, n);
            }
            PD_CHECK(st);
            continue;
        }
        peer_text(fd, pt, sizeof(pt));
        if (err == ECONNRESET || err == ENOTCONN || err == EPIPE) {
            return net_error(PD_ENETWORK, err,
                             "recv from %s: connection closed by peer", pt);
        }
        return net_error(PD_ENETWORK, err, "recv from %s", pt);
    }
    return PD_OK;
}

pd_status
pd_net_local_addr(int fd, char *buf, size_t len, int *port_out)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN];
    int port = 0;

    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        return net_error(PD_ENETWORK, errno, "getsockname fd %d", fd);
    }
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
        port = ntohs(in4->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        port = ntohs(in6->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            /* Peers may only speak IPv4: advertise the plain form. */
            inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof(host));
        } else {
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        }
    } else {
        return pd_error(PD_EINVAL, "local address of fd %d: not an IP socket",
                        fd);
    }
    if (strlen(host) + 1 > len) {
        return pd_error(PD_EINVAL, "local address %s does not fit in %zu bytes",
                        host, len);
    }
    memcpy(buf, host, strlen(host) + 1);
    if (port_out != NULL) {
        *port_out = port;
    }
    return PD_OK;
}

pd_status
pd_random_bytes(void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return net_error(PD_ESYS, errno, "getrandom");
        }
        p += r;
        n -= (size_t)r;
    }
    return PD_OK;
}
