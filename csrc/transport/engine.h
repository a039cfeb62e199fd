/* The frame engine: the pd_transport implementation shared by every link.
 *
 * It keeps, per peer, the posted sends and receives, the unexpected queue and
 * the frame being read; matches arriving headers to receives and reports
 * mismatches; and speaks the control protocol (abort, sequence queries,
 * goodbye) on a control socket per peer.  Frame bytes go to and from a peer
 * only through that peer's link (link.h), installed by the code that sets up
 * the connections (tcp/tcp.c) and replaced for local peers by shared-memory
 * links (shm/link_shm.h).
 */
#ifndef PD_TRANSPORT_ENGINE_H
#define PD_TRANSPORT_ENGINE_H

#include "link.h"
#include "transport.h"

/* A transport with no peers connected yet. */
pd_status pd_engine_create(int rank, int size, const pd_transport_events *ev,
                           pd_transport **out);

/* State of the code that connects the peers (listening socket, secret...),
 * released by release(state) when the transport closes; NULL if none. */
void pd_engine_set_setup(pd_transport *t, void *state,
                         void (*release)(void *state));
void *pd_engine_setup(pd_transport *t);

/* Peer p's data link (NULL before it is connected). */
pd_link *pd_engine_link(pd_transport *t, int p);
/* Install peer p's data link.  The engine owns it from now on; a link it
 * replaces is not closed (the new one usually wraps it).  Call only while
 * nothing is in flight to or from p (pd_engine_peer_busy). */
void pd_engine_set_link(pd_transport *t, int p, pd_link *l);
/* Does a frame to or from p travel (or wait) on its link now? */
int pd_engine_peer_busy(pd_transport *t, int p);

/* Peer p's control socket (-1 before it is connected); the engine owns it
 * once set and closes it. */
int pd_engine_ctrl_fd(pd_transport *t, int p);
void pd_engine_set_ctrl_fd(pd_transport *t, int p, int fd);

#endif
