/* Shared machinery of the collective algorithms (one file per algorithm in
 * csrc/coll/, written against the transport interface). */
#ifndef PD_COLL_H
#define PD_COLL_H

#include <stddef.h>
#include <stdlib.h>

#include "op.h"
#include "rules.h"
#include "../transport/shm/cma.h"
#include "../transport/shm/shm.h"
#include "../transport/transport.h"

/* Frames of one chunk: big enough to amortise per-frame costs, small enough
 * to overlap the reduction of one chunk with the transfer of the next. */
#define PD_CHUNK_BYTES (1u << 20)

/* Chunk buffers a ring step receives into at once (cache-resident). */
#define PD_RING_WINDOW 4

/* The algorithms of csrc/coll/, named after their files
 * (<collective>_<name>.c): what coll/select.c chose for a call, which the
 * flight recorder, the DETAIL log and the timeline name (pd_algo_name). */
typedef enum pd_algo {
    PD_ALGO_NONE = 0,    /* nothing to move (one rank), or not a collective */
    PD_ALGO_DIRECT,      /* over the transport: one round, latency-optimal */
    PD_ALGO_RING,
    PD_ALGO_FLAT,        /* broadcast: the root sends to every rank */
    PD_ALGO_CHAIN,       /* broadcast: pipelined along the ranks */
    PD_ALGO_PAIRWISE,    /* all_to_all over the transport */
    PD_ALGO_STAR,        /* monitored_barrier */
    PD_ALGO_SHM,         /* the group's shared-memory banks */
    PD_ALGO_SHM_INPLACE, /* all_reduce of a shared array: no copy-in */
    PD_ALGO_CMA,         /* single copies by cross-memory attach */
    PD_NALGOS
} pd_algo;

const char *pd_algo_name(int algo);

/* What carried a call: the group's shared-memory segment, or frames over
 * its transport (shm links, tcp links, both: "shm+tcp"); "local": one
 * rank (pd_path_name). */
typedef enum pd_path {
    PD_PATH_NONE = 0,
    PD_PATH_LOCAL,
    PD_PATH_SHM,
    PD_PATH_SHM_TCP,
    PD_PATH_TCP,
    PD_NPATHS
} pd_path;

const char *pd_path_name(int path);

/* The one decision of which algorithm runs a collective (coll/select.c),
 * pure so that a group can answer which would run without running it
 * (pd_group_explain).  count: elements of one rank's block (all_to_all: of
 * its longest); shm: the group's shared-memory segment carries the call;
 * cma: single copies are possible there (the group's probe succeeded and
 * a rank table fits a bank); inshm: the input is a shared array.
 * all_to_all in shared memory settles single copies only after its first
 * sync (every rank's longest block): coll/alltoall_shm.c records it. */
pd_algo pd_coll_choose(const pd_rules *r, int kind, int dtype, size_t count,
                       int size, int shm, int cma, int inshm);

typedef struct pd_coll {
    pd_transport *t;
    /* Drive the transport once (up to deadline, at most ~100 ms) and fail
     * with PD_ETIMEOUT past it: the caller's (the group's) progress, so
     * that algorithms never call up into the group. */
    pd_status (*progress)(void *ctx, double deadline);
    void *progress_ctx;
    int rank;
    int size;
    pd_hdr base;     /* identity of the call: kind, dtype, op, root, seq, count */
    pd_dtype rdt;    /* dtype the reduction runs in (float32 for halves) */
    size_t esz;      /* bytes per element of rdt */
    double deadline;
    double timeout;  /* the call's timeout (seconds) */
    const pd_op *op;
    /* shared-memory collectives (coll/<collective>_shm.c) */
    pd_shm *shm;
    pd_shm_waiter waiter;   /* interrupted: honoured by the first sync only */
    pd_shm_ident id;
    int resume;             /* the first sync's bump is already done */
    /* all_reduce of an array in the group's shared memory: every rank's
     * copy of it (own included), or NULL */
    char *const *inshm;
    /* the group's rules of algorithm choice (coll/rules.h); NULL: the
     * defaults */
    const pd_rules *rules;
    /* the peer the wait that timed out waited for (-1: none), so that a
     * rank that entered the collective but never did its part is named */
    int waited_for;
    /* the algorithm that ran (pd_coll_choose's answer; all_to_all in shared
     * memory corrects it after its first sync) */
    pd_algo algo;
} pd_coll;

/* Run op with the algorithm coll/select.c chooses: over the transport, or
 * through shared memory (c->shm set, first sync not yet done unless
 * c->resume). */
pd_status pd_coll_run(pd_coll *c, const pd_op *op);
pd_status pd_coll_run_shm(pd_coll *c, const pd_op *op);

pd_status pd_coll_send(pd_coll *c, pd_req *r, int peer, int tag,
                       const void *buf, size_t len);
pd_status pd_coll_recv(pd_coll *c, pd_req *r, int peer, int tag, void *buf,
                       size_t len);
/* Wait until every request in reqs[0..n) is done. */
pd_status pd_coll_wait(pd_coll *c, pd_req *reqs, size_t n);
pd_status pd_coll_wait_one(pd_coll *c, pd_req *r);

/* Every rank must receive at least one frame in every collective, so that
 * a rank that otherwise only sends (a broadcast root, a gather leaf) still
 * sees a mismatching neighbour instead of completing.  Ranks that receive
 * nothing else get an empty frame from their left neighbour.  root_receives:
 * only the root receives data (gather, reduce); else everyone but the root
 * does (broadcast, scatter).  Unused requests are marked done. */
pd_status pd_coll_ring_check(pd_coll *c, pd_req reqs[2], int root_receives);

/* Per-peer buffers of a direct algorithm: peer p's is at[p] (at NULL: one,
 * the same for every peer), of len[p] bytes (len NULL: each). */
typedef struct pd_peer_bufs {
    char *const *at;
    char *one;
    const size_t *len;
    size_t each;
} pd_peer_bufs;

/* One round in which every rank sends send's block p to every other rank p
 * and receives recv's block p from it; this rank's own block is copied from
 * send to recv (where they differ) while the transfers progress
 * (coll/direct_common.c). */
pd_status pd_coll_exchange(pd_coll *c, const pd_peer_bufs *send,
                           const pd_peer_bufs *recv);
/* One round between the root and every other rank, len bytes each, with the
 * ring check.  to_root (gather, reduce): the root receives blocks[p] from
 * every rank p, which sends mine; else (broadcast, scatter) the root sends
 * blocks[p] to every rank p, which receives into mine.  blocks NULL: mine
 * for every peer (broadcast); else the root's own block is copied between
 * mine and blocks[root].  blocks is read at the root only. */
pd_status pd_coll_rooted(pd_coll *c, int to_root, char **blocks,
                         char *mine, size_t len);
/* c->size blocks of bytes each, blocks[p], in one allocation (free() the
 * array); NULL, error set: out of memory. */
char **pd_coll_scratch_blocks(pd_coll *c, size_t bytes);

#define PD_TAG(step, chunk) ((int)(((step) << 16) | (chunk)))
#define PD_TAG_CHECK 0x7fff0000

/* Algorithms: coll/<collective>_<algorithm>.c.  Buffers follow pd_op. */
pd_status pd_allreduce_direct(pd_coll *c, char *buf, size_t count);
pd_status pd_allreduce_ring(pd_coll *c, char *buf, size_t count);
pd_status pd_reduce_direct(pd_coll *c, const char *in, char *out, size_t count);
pd_status pd_reduce_ring(pd_coll *c, const char *in, char *out, size_t count);
pd_status pd_broadcast_flat(pd_coll *c, char *buf, size_t len);
pd_status pd_broadcast_chain(pd_coll *c, char *buf, size_t len);
pd_status pd_allgather_direct(pd_coll *c, char **blocks, const size_t *len);
pd_status pd_allgather_ring(pd_coll *c, char **blocks, const size_t *len);
pd_status pd_reduce_scatter_direct(pd_coll *c, char **in, char *out,
                                   size_t count);
pd_status pd_reduce_scatter_ring(pd_coll *c, char **in, char *out,
                                 size_t count);
pd_status pd_gather_direct(pd_coll *c, const char *in, size_t len,
                           char **out);
pd_status pd_scatter_direct(pd_coll *c, char **in, char *out, size_t len);
pd_status pd_alltoall_pairwise(pd_coll *c, char **in, const size_t *in_len,
                               char **out, const size_t *out_len);
pd_status pd_barrier_direct(pd_coll *c);
pd_status pd_monitored_barrier_star(pd_coll *c, double timeout_s,
                                    int wait_all);

/* Shared-memory algorithms: every rank of the group maps every other's
 * segment (transport/shm/shm.h).  Each starts with a copy-in phase then the
 * first sync, which checks that every rank entered the same collective;
 * with c->resume set the copy-in and the first bump already happened. */
pd_status pd_allreduce_shm(pd_coll *c, const char *in, char *out,
                           size_t count);
/* Allreduce of buffers that already live in shared memory: peer p's copy is
 * at peer[p] (own included); no copy-in. */
pd_status pd_allreduce_shm_inplace(pd_coll *c, char *const *peer,
                                   size_t count);
/* The same, leaving the result in out (this rank's memory) instead of in its
 * shared buffer, which afterwards holds only this rank's reduced slice. */
pd_status pd_allreduce_shm_into(pd_coll *c, char *const *peer, char *out,
                                size_t count);
pd_status pd_reduce_shm(pd_coll *c, const char *in, char *out, size_t count);
/* Both: root < 0 for allreduce, else reduce to root. */
pd_status pd_shm_reduce_rounds(pd_coll *c, const char *in, char *out,
                               size_t count, int root);
pd_status pd_broadcast_shm(pd_coll *c, char *buf, size_t len);
pd_status pd_allgather_shm(pd_coll *c, const char *in, char **out,
                           size_t len);
pd_status pd_reduce_scatter_shm(pd_coll *c, char **in, char *out,
                                size_t count);
pd_status pd_gather_shm(pd_coll *c, const char *in, size_t len, char **out);
pd_status pd_scatter_shm(pd_coll *c, char **in, char *out, size_t len);
pd_status pd_alltoall_shm(pd_coll *c, char **in, const size_t *in_len,
                          char **out, const size_t *out_len);
pd_status pd_barrier_shm(pd_coll *c);

/* Shared helpers of the *_shm algorithms (coll/shm_common.c). */
/* Whether a collective in which every rank reads `in` bytes of input and
 * writes `out` bytes of output copies its output with non-temporal stores:
 * when the group's inputs and outputs together take 2 x
 * pd_shm_stream_bytes() or more (half the last-level cache the ranks share,
 * by default), and written through the cache they would evict the inputs
 * the ranks read next.  all_to_all, alternating runs in the same processes
 * (2-core EPYC, 32 MiB L3): 4 ranks, 2 and 4 MiB each, 15-22% faster with
 * them; 2 ranks 4 MiB 18% faster, 2 MiB 19% slower (8 MiB in all: fits);
 * all_gather of 4 MiB out, 4 ranks 10% faster, 2 ranks 13% slower. */
int pd_shm_stream_set(const pd_coll *c, size_t in, size_t out);
pd_status pd_shm_first_sync(pd_coll *c);
/* Eager first sync of single-round one-to-many / many-to-one messages:
 * wait only for src (-1: everyone): the data's source (data = 1), or
 * PD_SHM_ANY (the first other rank to arrive) for a rank that only sends,
 * so that it sees at least one other rank's identity, as the TCP
 * algorithms' ring check.
 * The identities of the ranks not waited for are checked when the next
 * collective starts. */
pd_status pd_shm_first_sync_from(pd_coll *c, int src, int data);
/* src for a rank whose first sync only publishes (a broadcast's or a
 * scatter's root): see pd_shm_first_sync_from. */
int pd_shm_publisher_src(const pd_coll *c);
pd_status pd_shm_next_sync(pd_coll *c);
/* Bank for this copy-in phase (the current one when resuming). */
int pd_shm_copyin_bank(pd_coll *c);
/* dst = src[0] op src[1] ... op src[n-1] in the op's dtype (halves through
 * float32), AVG divided by the group size when avg is set.  dst may alias
 * src[0] only (or none). */
void pd_shm_reduce(pd_coll *c, char *dst, char *const *src, int n,
                   size_t count, int avg);
/* Elements of one bank, rounded down to a multiple of 64 bytes. */
size_t pd_shm_bank_elems(pd_coll *c, size_t esz);

/* The rounds of a bank-copying shared-memory algorithm: len units (bytes
 * or elements) move in rounds of m <= per units, [done, done + m).  A
 * round: fill copies its chunk into this rank's bank (the first round's
 * before the first sync, not when resuming: that happened before the
 * interruption); a sync (the first: pd_shm_first_sync_from(c, src, data),
 * then start); reduce and a sync; drain reads the chunk out of the peers'
 * banks.  Each round fills the bank the round before did not use: the
 * peers' reads of it ended before the last sync.  Hooks may be NULL: a
 * rank that only publishes has no drain, one that only reads no fill. */
typedef struct pd_shm_round_ops {
    void (*fill)(pd_coll *c, void *ctx, int bank, size_t done, size_t m);
    /* after the first sync, before the first drain: check what the peers
     * published; may set *len (the first fill got m = min(len, per) of the
     * len passed in) */
    pd_status (*start)(pd_coll *c, void *ctx, int bank, size_t *len);
    void (*reduce)(pd_coll *c, void *ctx, int bank, size_t done, size_t m);
    void (*drain)(pd_coll *c, void *ctx, int bank, size_t done, size_t m);
} pd_shm_round_ops;

/* Inline, so that an algorithm's hooks are direct calls the compiler can
 * inline: the one-round small messages cost what they did before. */
static inline pd_status
pd_shm_rounds(pd_coll *c, const pd_shm_round_ops *ops, void *ctx, size_t len,
              size_t per, int src, int data)
{
    size_t done = 0;
    size_t m = len < per ? len : per;
    int b = pd_shm_copyin_bank(c);
    if (!c->resume && ops->fill != NULL) {
        ops->fill(c, ctx, b, 0, m);
    }
    PD_CHECK(pd_shm_first_sync_from(c, src, data));
    if (ops->start != NULL) {
        PD_CHECK(ops->start(c, ctx, b, &len));
        m = len < per ? len : per;
    }
    for (;;) {
        if (ops->reduce != NULL) {
            ops->reduce(c, ctx, b, done, m);
            PD_CHECK(pd_shm_next_sync(c));
        }
        if (ops->drain != NULL) {
            ops->drain(c, ctx, b, done, m);
        }
        done += m;
        m = len - done < per ? len - done : per;
        if (m == 0) {
            return PD_OK;
        }
        b = pd_shm_next_bank(c->shm);
        if (ops->fill != NULL) {
            ops->fill(c, ctx, b, done, m);
        }
        PD_CHECK(pd_shm_next_sync(c));
    }
}
/* A fill of bytes for a ctx that starts with the source (char *):
 * [done, done + m) of it into this rank's bank. */
void pd_shm_fill_bytes(pd_coll *c, void *ctx, int bank, size_t done,
                       size_t m);

/* Room for one pointer per rank: stack (PD_SHM_STACK_RANKS entries) when
 * the group fits, else the heap (NULL, error set: out of memory).  Release
 * with pd_shm_ptrs_free. */
#define PD_SHM_STACK_RANKS 16
static inline char **
pd_shm_ptrs(pd_coll *c, char **stack)
{
    if (c->size <= PD_SHM_STACK_RANKS) {
        return stack;
    }
    char **p = malloc(sizeof(char *) * (size_t)c->size);
    if (p == NULL) {
        pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
    }
    return p;
}

static inline void
pd_shm_ptrs_free(char **ptrs, char **stack)
{
    if (ptrs != stack) {
        free(ptrs);
    }
}

/* Single-copy algorithms (coll/<collective>_cma.c, helpers in
 * coll/cma_common.c): the ranks publish their buffers' addresses in their
 * banks, one sync, bytes move by cross-memory attach straight between the
 * user buffers, one sync.  For messages of pd_cma_threshold() bytes and up
 * (else the kind's threshold in coll/rules.c) when the group's probe
 * succeeded. */
int pd_cma_use(pd_coll *c, size_t bytes);
/* Whether single copies can run at all in c's shared memory (the group's
 * probe succeeded and a rank table fits a bank), whatever the size. */
int pd_cma_possible(const pd_coll *c);
/* Rank p's published table in bank b: words PD_CMA_IN(n, q) (its input,
 * block q), PD_CMA_LEN(n, q) (a length), PD_CMA_OUT(n, q) (its output). */
#define PD_CMA_IN(n, q) ((size_t)(q))
#define PD_CMA_LEN(n, q) ((size_t)(n) + (size_t)(q))
#define PD_CMA_OUT(n, q) (2 * (size_t)(n) + (size_t)(q))
uint64_t *pd_cma_table(pd_coll *c, int p, int b);
/* What this rank publishes: in[q] (in_each) or in[0] for every q, in_len,
 * out likewise; NULL: nothing. */
typedef struct pd_cma_pub {
    char *const *in;
    int in_each;
    const size_t *in_len;
    char *const *out;
    int out_each;
} pd_cma_pub;
/* Publish (not when resuming) and the first sync; *bank: the tables'. */
pd_status pd_cma_begin(pd_coll *c, const pd_cma_pub *pub, int *bank);
/* The last sync: nobody touches this rank's buffers any more. */
pd_status pd_cma_end(pd_coll *c);
/* One rank's share of a reduction: count elements, its own at mine, peer
 * p's at from[p] (its address space); the result into res (this rank's;
 * may alias mine) or, res NULL, a scratch chunk; then written to to[p] in
 * peer p where to is set and to[p] != 0.  Chunked through the cache. */
typedef struct pd_cma_red {
    const char *mine;
    const uint64_t *from;
    char *res;
    const uint64_t *to;
} pd_cma_red;
pd_status pd_cma_reduce(pd_coll *c, const pd_cma_red *x, size_t count);
/* Room for one address per rank (as pd_shm_ptrs). */
static inline uint64_t *
pd_cma_addrs(pd_coll *c, uint64_t *stack)
{
    if (c->size <= PD_SHM_STACK_RANKS) {
        return stack;
    }
    uint64_t *p = calloc((size_t)c->size, sizeof(uint64_t));
    if (p == NULL) {
        pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
    }
    return p;
}

static inline void
pd_cma_addrs_free(uint64_t *a, uint64_t *stack)
{
    if (a != stack) {
        free(a);
    }
}

pd_status pd_broadcast_cma(pd_coll *c, char *buf, size_t len);
pd_status pd_allgather_cma(pd_coll *c, const char *in, char **out,
                           size_t len);
pd_status pd_gather_cma(pd_coll *c, const char *in, size_t len, char **out);
pd_status pd_scatter_cma(pd_coll *c, char **in, char *out, size_t len);
pd_status pd_allreduce_cma(pd_coll *c, const char *in, char *out,
                           size_t count);
pd_status pd_reduce_cma(pd_coll *c, const char *in, char *out, size_t count);
pd_status pd_reduce_scatter_cma(pd_coll *c, char **in, char *out,
                                size_t count);

/* Ring building blocks over per-rank segments (seg[p], seglen[p] bytes).
 * Physical segment of logical index L is (L + rot) mod size.
 * reduce_scatter: afterwards rank r holds the reduction of logical segment
 * r+1 (avg: divided by size): in place in seg[] when in is NULL, else the
 * read-only input segments in[] are reduced and the result lands in final
 * (seg unused).  allgather: rank r starts with logical r+1. */
pd_status pd_ring_reduce_scatter(pd_coll *c, char **seg, const size_t *seglen,
                                 int rot, int step0, char *const *in,
                                 char *final);
pd_status pd_ring_allgather(pd_coll *c, char **seg, const size_t *seglen,
                            int rot, int step0);

/* out = reduction of blocks[0..n) in rank order (identical on every rank). */
void pd_coll_reduce_blocks(pd_coll *c, char *out, char **blocks, size_t count);
/* AVG: divide once, at the end. */
void pd_coll_finish(pd_coll *c, char *buf, size_t count);

/* Split count elements into size near-equal segments: offsets in elements. */
void pd_coll_split(size_t count, int size, size_t *off /* size+1 */);

#endif
