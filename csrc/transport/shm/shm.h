/* Shared memory between the ranks of a group on one host.
 *
 * Every rank owns one segment: a control block (single-writer flags, each on
 * its own cache line) followed by two data banks.  Every rank maps every
 * other rank's segment, so a collective moves bytes with plain loads and
 * stores: a rank writes only into its own segment and reads the others'.
 *
 * Synchronisation is one counter per rank (the "step").  A sync point means:
 * bump my step, then wait until every peer's step has reached mine.  Because
 * no rank can pass a sync point before every rank has reached it, a peer is
 * never more than one sync stage ahead; data written for sync s+1 goes to the
 * other bank than data read after sync s, so two banks suffice (the bank
 * bit flips at every copy-in phase, identically on every rank).
 *
 * Waiting spins (busy on a dedicated core, yielding when the host is
 * oversubscribed), then sleeps on a futex on the peer's step word; a rank
 * that publishes wakes the futex only when a peer has said it sleeps.
 *
 * Each rank also publishes the identity of the collective it entered
 * (sequence number, kind, dtype, op, root, count) beside its step, in one of
 * two slots by sequence parity: ranks that called different collectives find
 * out at the first sync point, on every rank.
 *
 * Segments are shm_open'ed under a name derived from the group's random token
 * and unlinked as soon as every rank has mapped them, so nothing is left in
 * /dev/shm whatever happens later.
 *
 * Files: segment.c (segments, banks, sizes, the owner process), wait.c
 * (steps, waits, wakes, abort and leave, pd_shm_entry, the phase probe),
 * ident.c (the identities and the mismatch check), ring.c (byte rings);
 * internal.h holds the segment's layout and the inline helpers they share.
 */
#ifndef PD_SHM_H
#define PD_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../../util/status.h"

#define PD_SHM_LINE 64

/* Identity of one collective, as published by a rank entering it. */
typedef struct pd_shm_ident {
    uint64_t seq;
    uint64_t count;
    uint64_t aux;     /* per-kind extra (e.g. shared-buffer offset) */
    uint8_t kind;
    uint8_t dtype;
    uint8_t op;
    uint8_t phase;    /* rank 0's: the machine's phase (pd_shm_pingpong);
                         not compared between ranks */
    int32_t root;
} pd_shm_ident;

typedef struct pd_shm_ctrl {
    /* line 0: the flags (written only by the owner) */
    _Alignas(PD_SHM_LINE) _Atomic uint32_t step;
    _Atomic uint32_t sleeping;   /* owner sleeps on some peer's step */
    _Atomic uint32_t abort;      /* owner's group failed: status code */
    int32_t pid;
    uint64_t value[2];           /* small per-op value (by seq parity) */
    _Atomic uint32_t left;       /* owner destroyed its group */
    uint32_t cores;              /* 1: the owner counts a core per rank */
    /* the owner's start time (field 22 of /proc/<pid>/stat, 0: unknown):
     * a pid reused, or seen from another pid namespace, is not the owner */
    uint64_t start;
    uint32_t pad0[4];
    /* line 1: identities by seq parity */
    _Alignas(PD_SHM_LINE) pd_shm_ident ident[2];
    /* the owner's error message when abort != 0 */
    _Alignas(PD_SHM_LINE) char abort_msg[PD_ERRMSG_MAX];
    /* cross-memory attach probe (transport/shm/cma.c): the address of a
     * word in the owner's private memory and the value it holds */
    _Alignas(PD_SHM_LINE) uint64_t cma_addr;
    uint64_t cma_cookie;
    /* the phase probe (pd_shm_pingpong): rank 0's ping, rank 1's pong */
    _Alignas(PD_SHM_LINE) _Atomic uint64_t probe;
} pd_shm_ctrl;

typedef struct pd_shm pd_shm;

/* Remove this user's rank segments in dir ("/dev/shm") whose creator died
 * before unlinking them (every rank of a job killed during start-up). */
void pd_shm_sweep_stale(const char *dir);

/* What a waiter checks while it waits. */
typedef struct pd_shm_waiter {
    double deadline;
    /* Called every few milliseconds while sleeping: a non-OK status stops the
     * wait (the group failed, a peer died, ...).  May be NULL. */
    pd_status (*check)(void *ctx);
    /* Called likewise: nonzero means "give up now" (a signal is pending);
     * the wait returns PD_EINTR.  May be NULL. */
    int (*interrupted)(void *ctx);
    void *ctx;
    /* 1: never busy-poll in this wait, whatever the segment's mode (the
     * progress thread on a host with no core to spare: the caller's thread
     * is computing on the core it would burn) */
    int nospin;
} pd_shm_waiter;

/* Bytes of one data bank, from PYDDP_SHM_CHUNK; unset, 1 MiB where every
 * local rank has a core of its own (cores_all, as pd_shm_spins), else
 * 256 KiB. */
size_t pd_shm_bank_bytes(int cores_all);
/* A byte size from the environment variable name ("4096", "256K", "8M"),
 * or dflt when unset or outside [lo, hi]. */
size_t pd_shm_env_bytes(const char *name, size_t dflt, size_t lo, size_t hi);
/* Collective outputs from this size up are written with non-temporal
 * stores (PYDDP_SHM_STREAM; default a quarter of the last-level cache the
 * cores share, 8 MiB on an EPYC's 32 MiB CCX, by measurement; allreduce
 * from 4x that: below, its output still gains from staying in cache;
 * all_gather and all_to_all by the group's whole traffic,
 * pd_shm_stream_set). */
size_t pd_shm_stream_bytes(void);

/* Forget the environment read once per process (PYDDP_SHM_CHUNK,
 * PYDDP_SHM_STREAM, PYDDP_CMA, PYDDP_CMA_THRESHOLD), so that a forked child
 * reads its own: the extension runs it in the child of every fork. */
void pd_shm_env_forget(void);

/* Create and map this rank's segment (rank, size: indices in the local set;
 * node: distinguishes the hosts of one group in segment names); *out is
 * half-built until pd_shm_attach succeeds. */
pd_status pd_shm_create(int rank, int size, uint64_t token, uint32_t node,
                        int spin, pd_shm **out);
/* Map every peer's segment (after every rank created its own). */
pd_status pd_shm_attach(pd_shm *s);
/* Unlink this rank's segment name (after every rank attached).  best:
 * also unlink every peer's name, ignoring ENOENT (cleanup after a failure). */
void pd_shm_unlink(pd_shm *s, int all);
/* Unmap everything.  Accepts NULL and half-built objects. */
void pd_shm_close(pd_shm *s);

int pd_shm_rank(const pd_shm *s);
/* 1 when every local rank counted a core of its own at creation (the
 * same answer on every rank: the single-copy shares that depend on it
 * must match), 0 where any did not (an oversubscribed host).  Valid after
 * pd_shm_attach. */
int pd_shm_spins(const pd_shm *s);
int pd_shm_size(const pd_shm *s);
pd_shm_ctrl *pd_shm_ctrl_of(pd_shm *s, int p);

/* The phase probe: ranks 0 and 1 hand a cache line back and forth k times
 * (tag: the same nonzero number on both, below 2^56), each waiting at most
 * until `deadline` (pd_now()).  Rank 0 returns the one-way handoff in ns,
 * or -1 when rank 1 did not answer in time; the other ranks return 0 at
 * once (rank 1 after answering). */
double pd_shm_pingpong(pd_shm *s, uint64_t tag, int k, double deadline);

/* Rank 0's phase as it published it with collective seq (its identity),
 * or `keep` when that identity is not there (seq was not a shared-memory
 * collective).  Call after pd_shm_entry of collective seq + 1. */
int pd_shm_phase_of(pd_shm *s, uint64_t seq, int keep);
/* Data bank b (0/1) of rank p. */
char *pd_shm_bank(pd_shm *s, int p, int b);
/* Flip the bank bit for a new copy-in phase; returns the bank to use. */
int pd_shm_next_bank(pd_shm *s);
int pd_shm_cur_bank(const pd_shm *s);
size_t pd_shm_bank_size(const pd_shm *s);

/* Single copies between the ranks' own memory (transport/shm/cma.c):
 * set by the group once every rank's probe succeeded. */
void pd_shm_set_cma(pd_shm *s, int on);
int pd_shm_cma(const pd_shm *s);
/* A private scratch buffer of at least bytes, kept for the next call (one
 * collective at a time uses it); NULL, error set: out of memory. */
char *pd_shm_scratch(pd_shm *s, size_t bytes);

/* Publish the identity of the collective this rank enters. */
void pd_shm_enter(pd_shm *s, const pd_shm_ident *id, uint64_t value);
/* A sync point: bump this rank's step and wait for every peer to reach it.
 * Returns PD_OK, PD_ETIMEOUT (message names the ranks that did not arrive),
 * a peer's abort status, a check() status, or PD_EINTR. */
pd_status pd_shm_sync(pd_shm *s, const pd_shm_waiter *w);
/* Resume a sync whose bump was already done (after an interrupted wait). */
pd_status pd_shm_sync_wait(pd_shm *s, const pd_shm_waiter *w);
/* Eager variants for one-to-many and many-to-one messages: src -1 waits
 * for everyone (as pd_shm_sync), PD_SHM_ANY for the first rank to arrive
 * (a rank that only sends: it must see one other rank's identity), else
 * for src alone; data: src is the source of the data (likely running now:
 * polled briefly before yielding on an oversubscribed host). */
#define PD_SHM_ANY (-2)
pd_status pd_shm_sync_from(pd_shm *s, const pd_shm_waiter *w, int src,
                           int data);
pd_status pd_shm_sync_wait_from(pd_shm *s, const pd_shm_waiter *w, int src,
                                int data);
/* Before entering a collective: if the last one did not wait for every
 * rank (eager), wait until every rank has entered it and check that they
 * all called the same one (the deferred half of pd_shm_check_ident). */
pd_status pd_shm_entry(pd_shm *s, const pd_shm_waiter *w,
                       const char *(*kind_name)(int));
/* After the first sync of a collective: PD_EMISMATCH (message names both
 * calls) unless every peer entered the same collective. */
pd_status pd_shm_check_ident(pd_shm *s, const pd_shm_ident *id,
                             const char *(*kind_name)(int));
/* The same for the ranks an eager sync waited for (src as there;
 * PD_SHM_ANY: every rank that has arrived); the others are checked at the
 * next pd_shm_entry. */
pd_status pd_shm_check_ident_from(pd_shm *s, const pd_shm_ident *id,
                                  const char *(*kind_name)(int), int src);
/* The value peer p published with its identity for seq. */
uint64_t pd_shm_value(pd_shm *s, int p, uint64_t seq);
/* The local rank the last wait that timed out waited for (-1: none); a
 * rank that entered the collective but never did its part (stopped, or
 * stuck) shows here, not in pd_shm_entered (timeout diagnosis). */
int pd_shm_waited_for(const pd_shm *s);
/* Highest sequence number peer p has entered (timeout diagnosis). */
uint64_t pd_shm_entered(pd_shm *s, int p);
/* Peer p's process as this host's /proc shows it (timeout diagnosis): its
 * state letter ('R', 'S', 'D', 'T' stopped, 't' stopped by a debugger, 'Z'
 * exited...), or 0 when unknown (no /proc, or the pid is not the peer's:
 * reused, or another pid namespace). */
char pd_shm_peer_state(pd_shm *s, int p);
/* The first peer that failed the group (its abort flag), as an error with
 * its status and message; PD_OK when none has (timeout diagnosis: a peer's
 * earlier verdict beats this rank's late one). */
pd_status pd_shm_peer_failure(pd_shm *s);

/* Byte rings for frames between two local ranks (point-to-point messages,
 * and every frame of groups that span hosts).  The ring from r to d lives in
 * r's segment; r alone advances its head, d alone its tail.  A side that
 * runs out of data or space raises its "want" flag and sleeps in poll() on
 * the pair's TCP connection, where the other side sends one doorbell byte
 * when it sees the flag (never otherwise). */
#define PD_SHM_RING_BYTES ((size_t)256 << 10)
/* Copy up to len bytes into the ring to local rank d; returns bytes
 * copied (0: full). */
size_t pd_shm_ring_write(pd_shm *s, int d, const void *buf, size_t len);
/* Copy up to len bytes out of the ring from local rank p (0: empty). */
size_t pd_shm_ring_read(pd_shm *s, int p, void *buf, size_t len);
int pd_shm_ring_readable(pd_shm *s, int p);
int pd_shm_ring_writable(pd_shm *s, int d);
/* This rank waits for data from / space towards local rank p. */
void pd_shm_ring_want(pd_shm *s, int p, int data, int space);
/* Does local rank p wait for my data (data) or for space I free (!data)? */
int pd_shm_ring_peer_waits(pd_shm *s, int p, int data);

/* This rank's group failed: tell peers (they see it at their next wait) and
 * wake anyone sleeping. */
void pd_shm_abort(pd_shm *s, int status, const char *msg);
/* This rank leaves (destroys its group): a peer waiting for it fails with
 * "left the group" instead of waiting for the timeout. */
void pd_shm_leave(pd_shm *s);
/* Wake every waiter sleeping on any rank's step (our own threads too). */
void pd_shm_wake_all(pd_shm *s);

/* Fuzzing support (tests/fuzz/fuzz_shm.py, through _C._fuzz_shm): the sizes
 * of the control block, of one ring's counters and of one ring; and
 * pd_shm_fuzz_publish, which resets this rank's words and overwrites what
 * peer p publishes (its control block, then its ring counters, as laid out
 * in its segment) with bytes, as a corrupt or hostile peer could. */
void pd_shm_fuzz_sizes(size_t *ctrl, size_t *ring_ctl_bytes,
                       size_t *ring_bytes);
void pd_shm_fuzz_publish(pd_shm *s, int p, const void *ctrl, size_t ctrl_len,
                         const void *rings, size_t rings_len);

#endif
