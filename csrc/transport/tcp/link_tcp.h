/* The TCP link (../link.h): frames on the pair's data socket. */
#ifndef PD_TRANSPORT_LINK_TCP_H
#define PD_TRANSPORT_LINK_TCP_H

#include "../link.h"
#include "../../util/status.h"

/* A link over connected socket fd (non-blocking), which it owns from now on
 * (closed here on failure too). */
pd_status pd_tcp_link_new(int fd, pd_link **out);
/* The socket of a link made by pd_tcp_link_new. */
int pd_tcp_link_fd(const pd_link *l);

#endif
