/* The shared-memory link (../link.h): frames between two ranks of one host
 * through the byte rings of their segments (shm.h). */
#ifndef PD_TRANSPORT_LINK_SHM_H
#define PD_TRANSPORT_LINK_SHM_H

#include "../link.h"
#include "../transport.h"
#include "shm.h"

/* A link to local rank `local` through the rings of shm.  bell is the
 * pair's previous link (its data socket), which the new one owns from now on
 * and keeps for doorbells and to see the peer die. */
pd_status pd_shm_link_new(pd_shm *shm, int local, pd_link *bell,
                          pd_link **out);

/* Frames to and from the ranks on this host travel through shared-memory
 * rings from now on: local_of[p] is rank p's index in shm, or -1 (its link
 * stays).  Call when no frame is in flight (right after a barrier). */
pd_status pd_shm_use_links(pd_transport *t, pd_shm *shm,
                           const int *local_of);

#endif
