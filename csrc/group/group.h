/* A process group: ranks, a transport, a FIFO of pending work run by one
 * progress thread, and the group's sticky error state (csrc/group/: work.c,
 * progress.c (queue, progress thread, inline path), run.c (one collective),
 * state.c (errors, the waits' poll), setup.c, shm_buffers.c, diag.c).
 *
 * Python (or any caller) builds a pd_op, submits it with pd_group_submit and
 * gets a pd_work back; the progress thread runs collectives in submission
 * order (point-to-point operations are posted and progress alongside).
 * pd_work_wait blocks (the binding releases the GIL around it).
 */
#ifndef PD_GROUP_H
#define PD_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "../coll/op.h"
#include "flight.h"
#include "../util/status.h"

typedef struct pd_group pd_group;
typedef struct pd_work pd_work;

/* Create a group member: the transport's listening socket is open after
 * this; *port_out is the port to advertise through the store.  bind_host:
 * the address to listen on (NULL or "": every interface). */
pd_status pd_group_create(int rank, int size, double timeout_s,
                          const char *secret, const char *bind_host,
                          pd_group **out, int *port_out);

enum { PD_TRANSPORT_AUTO = 0, PD_TRANSPORT_TCP = 1, PD_TRANSPORT_SHM = 2 };

/* Connect to every other rank (addresses indexed by rank) and start the
 * progress thread.  nodes[p]: rank p's host identity (hostname and boot
 * id), or NULL to compare addresses.  When every rank is on this host (and
 * transport is not PD_TRANSPORT_TCP) collectives move through shared
 * memory; the connections stay for point-to-point traffic, aborts and
 * noticing dead peers.  cores: how many cores this host's ranks can keep
 * busy at once (0: the online CPUs); with fewer cores than ranks here,
 * waiters sleep instead of spinning. */
pd_status pd_group_connect(pd_group *g, const char *const *hosts,
                           const int *ports, uint64_t token,
                           const char *const *nodes, int transport,
                           int cores);

/* From another thread, while pd_group_connect runs: it fails soon with
 * PD_EBACKEND and why (a rank it waits for is known to be gone). */
void pd_group_cancel_connect(pd_group *g, const char *why);

/* Fail the group from outside (any thread): a backend of another device
 * on the same ranks (NCCL's) failed, and the peers must learn it at once
 * whatever they wait for.  msg becomes the sticky error (unless the group
 * failed already) and the progress thread sends it to every peer. */
void pd_group_fail(pd_group *g, const char *msg);

/* The group's sticky error: PD_OK, or its status with the message copied
 * into buf (cap bytes).  Any thread; never blocks. */
pd_status pd_group_error(pd_group *g, char *buf, size_t cap);

/* "shm", "tcp" or "local" (one rank). */
const char *pd_group_transport(const pd_group *g);

/* Which transport (*path) and algorithm (*algo) a collective of kind,
 * dtype and count elements (one rank's block; all_to_all: its longest)
 * would run with now, as coll/select.c decides it when the call runs,
 * without running anything (coll/coll.h's pd_path, pd_algo; the rules in
 * force, the phase's included).  An all_reduce of a shared array
 * (pd_group_shm_alloc) runs "shm-inplace" instead.  Any thread: the
 * phase it reads may change with the next collective, as the answer would. */
pd_status pd_group_explain(pd_group *g, int kind, int dtype, size_t count,
                           int *path, int *algo);

/* 1: large shared-memory collectives move with one copy between the ranks
 * (cross-memory attach, transport/shm/cma.h); 0: through the banks. */
int pd_group_single_copy(const pd_group *g);

/* Bytes of one shared-memory bank (PYDDP_SHM_CHUNK, or the default for
 * the host's cores: transport/shm/segment.c); 0 without shared memory. */
size_t pd_group_bank_bytes(const pd_group *g);

/* The rules of algorithm choice (coll/rules.h) of this group: n entries
 * each (n <= the number of kinds), indexed by kind; 0 keeps the default,
 * PD_RULE_NEVER turns single copies off for the kind.  Every rank sets the
 * same rules at the same point (pyddp takes rank 0's through the store).
 * gap_lo/gap_hi (NULL: none): the banks again in [gap_lo, gap_hi) above
 * cma_from.  PD_EINVAL while a collective is queued or running. */
pd_status pd_group_set_rules(pd_group *g, const size_t *cma_from,
                             const size_t *small_bytes, const size_t *gap_lo,
                             const size_t *gap_hi, size_t n);

/* Rules for the machine's slow phase, as pd_group_set_rules, and the
 * phase threshold: every few collectives ranks 0 and 1 hand a cache line
 * back and forth (when every rank has a core to spin on); a one-way
 * handoff above phase_ns ns is the slow phase, and from the next
 * collective but one every rank uses these rules instead (rank 0's
 * verdict travels in its collective identity, so every rank switches at
 * the same collective).  phase_ns 0: no phases, the rules only. */
pd_status pd_group_set_slow_rules(pd_group *g, const size_t *cma_from,
                                  const size_t *small_bytes,
                                  const size_t *gap_lo, const size_t *gap_hi,
                                  size_t n, double phase_ns);

/* The phase probe now, on every rank at the same point (after a barrier):
 * *ns the one-way handoff between ranks 0 and 1 on rank 0, -1 elsewhere
 * or unanswered (the tuner records it beside its rounds).  PD_EINVAL while
 * a collective is queued or running. */
pd_status pd_group_probe_phase(pd_group *g, double *ns);

/* The phase in force (0 fast, 1 slow), rank 0's last probe (ns; -1: none
 * or unanswered; other ranks: -1), the threshold (0: no phases) and the
 * probes run so far. */
void pd_group_phase(const pd_group *g, int *phase, double *probe_ns,
                    double *phase_ns, uint64_t *probes);

/* The thresholds in force for kind (slow: of the slow phase's table): single copies from *cma_from bytes
 * (PD_RULE_NEVER: never; PYDDP_CMA_THRESHOLD, the rules, the default, in
 * that order), except in [*gap_lo, *gap_hi) (0, 0: no gap), direct
 * algorithms over the transport up to *small bytes. */
void pd_group_rules_in_force(const pd_group *g, int slow, int kind,
                             size_t *cma_from, size_t *small, size_t *gap_lo,
                             size_t *gap_hi);

/* Why the group fell back to TCP because a rank could not set up shared
 * memory (its /dev/shm full or unwritable; PYDDP_TRANSPORT unset), or
 * NULL when it did not. */
const char *pd_group_shm_fallback(const pd_group *g);

/* Run a blocking collective on the calling thread when the group is idle
 * and the message is small (shared memory only).  Returns 0 when it did not
 * (submit it instead), else 1 with its status in *out.  interrupted(ictx) is
 * polled while the first sync waits; when it returns nonzero the collective
 * is handed to the progress thread (*handoff: a work handle to wait on or
 * release) and *out is PD_EINTR. */
int pd_group_inline(pd_group *g, const pd_op *op, int (*interrupted)(void *),
                    void *ictx, pd_status *out, pd_work **handoff);

/* Collective: every rank allocates len bytes that every other rank maps.
 * *out is this rank's buffer (the caller owns the mapping of *maplen bytes
 * and munmaps it after pd_group_shm_forget); all_reduce on (part of) it
 * needs no copy-in.  A rank that cannot allocate fails the call on every
 * rank, and the group goes on. */
pd_status pd_group_shm_alloc(pd_group *g, size_t len, void **out,
                             size_t *maplen);
void pd_group_shm_forget(pd_group *g, void *own);

/* Submit op; *out receives a work handle (one reference, release with
 * pd_work_release).  Errors found while running surface from the work. */
pd_status pd_group_submit(pd_group *g, const pd_op *op, pd_work **out);

/* Stop the progress thread (pending work fails with "process group
 * destroyed"), say goodbye to peers and free everything.  Accepts NULL and
 * half-built groups. */
void pd_group_destroy(pd_group *g);

/* The flight recorder (group/flight.h): a copy of the records, oldest
 * first (at most cap; their number); where to dump them when the group
 * fails, with the JSON object the file carries; a dump now (path NULL: the
 * configured one); this group's timeline track. */
size_t pd_group_flight_capacity(pd_group *g);
/* The ring itself: device backends note their calls there (flight.h). */
pd_fr *pd_group_flight(pd_group *g);
size_t pd_group_flight_records(pd_group *g, pd_fr_entry *out, size_t cap);
pd_status pd_group_flight_configure(pd_group *g, const char *path,
                                    const char *meta);
pd_status pd_group_flight_dump(pd_group *g, const char *path,
                               const char *reason);
void pd_group_set_timeline_track(pd_group *g, int tid);

int pd_group_rank(const pd_group *g);
int pd_group_size(const pd_group *g);

/* Wait until the work completes or timeout_s passes (< 0: forever).
 * Returns the work's status (message in this thread's error buffer), or
 * PD_ETIMEOUT if it was still running. */
pd_status pd_work_wait(pd_work *w, double timeout_s);
int pd_work_done(pd_work *w);
/* recv(src=None): the rank the message came from (valid once done). */
int pd_work_source(pd_work *w);
void pd_work_release(pd_work *w);

#endif
