/* TCP: a full mesh of connections between the ranks of a group, two per
 * pair of ranks (data and control), set up through addresses the group
 * exchanged in the store; the transport is the frame engine (../engine.h)
 * with a TCP link (link_tcp.h) to every peer.  Works within and across
 * hosts. */
#ifndef PD_TRANSPORT_TCP_H
#define PD_TRANSPORT_TCP_H

#include <stdint.h>

#include "../transport.h"

/* Create the transport and its listening socket (on bind_host, or on all
 * interfaces when it is NULL or ""; a free port); *port_out is the port to
 * advertise. */
pd_status pd_tcp_create(int rank, int size, const char *secret,
                        const char *bind_host, const pd_transport_events *ev,
                        pd_transport **out, int *port_out);

/* Connect the mesh: rank r connects to every lower rank and accepts every
 * higher one.  Connections must authenticate (PYDDP_SECRET) and present the
 * group token; strangers are dropped.  hosts/ports are indexed by rank. */
pd_status pd_tcp_connect(pd_transport *t, const char *const *hosts,
                         const int *ports, uint64_t token, double deadline);

/* From another thread: make a pd_tcp_connect that waits for higher ranks
 * fail within a fraction of a second with PD_EBACKEND and why (the caller
 * learnt that one of them is gone).  Only the first call counts. */
void pd_tcp_cancel_connect(pd_transport *t, const char *why);

#endif
