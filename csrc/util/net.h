/* TCP socket helpers shared by the store and the TCP transport.
 *
 * Every function returns a pd_status and, on failure, a message naming the
 * system call, the address and the port (e.g. "bind 0.0.0.0:29500: Address
 * already in use").  Deadlines are absolute pd_now() seconds; a deadline <= 0
 * means "no deadline".  All calls retry EINTR.
 */
#ifndef PD_UTIL_NET_H
#define PD_UTIL_NET_H

#include <stddef.h>

#include "status.h"

/* Listen on host:port (host NULL or "" = all IPv4 interfaces; port 0 = pick a
 * free port).  SO_REUSEADDR is set.  Port in use -> PD_ENETWORK with
 * "address already in use" and the host:port in the message.  *port_out gets
 * the bound port. */
pd_status pd_net_listen(const char *host, int port, int backlog, int *fd_out,
                        int *port_out);

/* Connect to host:port (name resolved with getaddrinfo, IPv4 and IPv6),
 * retrying ECONNREFUSED / ETIMEDOUT / ENOENT-style failures with a short
 * backoff until deadline.  Sets TCP_NODELAY and FD_CLOEXEC.  Blocking fd. */
pd_status pd_net_connect(const char *host, int port, double deadline,
                         int *fd_out);

/* pd_net_connect to a peer known to be listening (it published the address
 * after it bound it): a refusal means its listener is closed, that is, the
 * peer failed or exited, so ECONNREFUSED fails at once (PD_ENETWORK, the
 * message says "refused") instead of being retried until deadline. */
pd_status pd_net_connect_listening(const char *host, int port,
                                   double deadline, int *fd_out);

/* Accept one connection, waiting until deadline.  Sets TCP_NODELAY, CLOEXEC. */
pd_status pd_net_accept(int lfd, double deadline, int *fd_out);

/* Send / receive exactly n bytes on a blocking or non-blocking fd, waiting
 * with poll() until deadline.  EOF on receive or EPIPE/ECONNRESET ->
 * PD_ENETWORK ("connection closed by peer").  Timeout -> PD_ETIMEOUT.
 * MSG_NOSIGNAL is used: never raises SIGPIPE. */
pd_status pd_net_send_all(int fd, const void *buf, size_t n, double deadline);
pd_status pd_net_recv_all(int fd, void *buf, size_t n, double deadline);

pd_status pd_net_set_nonblock(int fd, int on);
pd_status pd_net_set_nodelay(int fd);

/* Numeric local address of a connected or listening socket ("127.0.0.1"). */
pd_status pd_net_local_addr(int fd, char *buf, size_t len, int *port_out);

/* Fill buf with n cryptographically random bytes (getrandom). */
pd_status pd_random_bytes(void *buf, size_t n);

#endif
