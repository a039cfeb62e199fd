/* Private to csrc/group/: the group's and the work's state, and the
 * functions the group's files share.  Nothing outside csrc/group/ includes
 * it. */
#ifndef PD_GROUP_INTERNAL_H
#define PD_GROUP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../coll/coll.h"
#include "group.h"
#include "../transport/shm/shm.h"
#include "../transport/transport.h"
#include "flight.h"

/* How long a waiter polls before sleeping on its condition variable, when
 * the host has a core for every rank on it (oversubscribed: never). */
#define PD_WAIT_SPIN_S 50e-6

struct pd_work {
    atomic_int refs;
    pd_op op;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int done;
    pd_status status;
    char *msg;
    int src;
    double deadline;
    double spin_s;
    pd_req req;
    uint64_t seq;      /* resume: the sequence number already taken */
    int resume;        /* an interrupted inline collective to finish */
    void *owned;       /* block arrays copied for a resumed collective */
    struct pd_group *g;
    uint64_t fr_id;    /* its flight-recorder record (0: none) */
    uint8_t path;      /* what ran it (run_ctx's), for the record */
    uint8_t algo;
    struct pd_work *next;
};

struct pd_group {
    int rank;
    int size;
    double timeout;
    double spin_s;
    int progress_nospin; /* the progress thread's shm waits never spin */
    pd_transport *t;
    pthread_t thr;
    int thr_started;
    pthread_mutex_t mu;
    pd_work *qh, *qt;
    int running;       /* under mu: a collective runs (either thread) */
    int caller;        /* under mu: ... on a caller's thread (inline) */
    atomic_int stopping;
    pd_shm *shm;       /* every rank on this host: shared memory */
    pd_shm *lshm;      /* the ranks on this host (frames through rings) */
    uint64_t token;    /* the group's random id (segment names) */
    /* why shared memory could not be set up and collectives use TCP
     * (PYDDP_TRANSPORT unset), or "" */
    char shm_fallback[PD_ERRMSG_MAX];
    struct shm_buf *bufs;
    uint64_t nbufs;
    /* the thread that runs collectives (progress or inline caller) */
    uint64_t seq;
    /* progress thread only */
    pd_work *active;
    int propagated;
    /* sticky error: claimed once (err_claim 1), message written before err
     * is stored; err_claim 2 once the winner has written its flight records */
    atomic_int err_claim;
    _Atomic int err;
    char errmsg[PD_ERRMSG_MAX];
    pd_fr fr;          /* the flight recorder */
    /* algorithm choice (coll/rules.h): set before the first collective
     * (pd_group_set_rules), read-only after */
    pd_rules rules;
    /* the machine's phases (group/run.c): where pyddp.tools.tune measured
     * a slow phase (data crossing between cores several times slower for
     * minutes on some virtual machines), the rules for it; every rank
     * switches at the same collective, to what rank 0's probe saw */
    pd_rules rules_slow;
    double phase_ns;     /* a handoff above this many ns: slow; 0: no phases */
    int phase_force;     /* PYDDP_TEST_PHASE: -1 none, else rank 0's verdict */
    double phase_weight; /* collectives' weight since the last probe */
    int phase;           /* the phase in force (0 fast, 1 slow) */
    int verdict;         /* rank 0: the phase its last probe saw */
    double probe_ns;     /* rank 0: the last probe's handoff (-1: none) */
    uint64_t probes;     /* probes run, answered or not */
    uint64_t phase_read; /* from this collective on, read rank 0's verdict
                            once (0: read) */
    uint64_t manual_probes; /* pd_group_probe_phase calls */
};

/* The phase probe (group/run.c): due when the collectives since the last
 * one weigh this much (one each, plus one per 256 KiB of message), with
 * this many round trips, rank 0 waiting at most PD_PHASE_WAIT_S for an
 * answer. */
#define PD_PHASE_EVERY 1024.0
#define PD_PHASE_TRIPS 8
#define PD_PHASE_WAIT_S 50e-6

/* Hold the group idle on this thread (no collective starts meanwhile;
 * waits while one runs; PD_ECLOSED once destroyed) and let go of it,
 * waking the progress thread if work was queued meanwhile
 * (group/shm_buffers.c). */
pd_status pd_grp_acquire_idle(pd_group *g, const char *what);
void pd_grp_release_idle(pd_group *g);

/* Buffers in the group's shared memory: allreduce without the copy-in. */
typedef struct shm_buf {
    char *own;
    size_t len;
    uint64_t id;
    char **peer;    /* peer[p]: rank p's buffer as mapped here (own too) */
    struct shm_buf *next;
} shm_buf;

typedef struct run_ctx {
    pd_group *g;
    int on_progress;   /* running on the progress thread (owns transport) */
    double next_poll;
    int (*interrupted)(void *);
    void *ictx;
    /* out: what ran (coll/coll.h's pd_path and pd_algo), for the record */
    uint8_t path;
    uint8_t algo;
} run_ctx;

/* work.c */
void pd_grp_work_complete(pd_work *w, pd_status st, const char *msg);
pd_work *pd_grp_work_new(pd_group *g, const pd_op *op);
pd_status pd_grp_work_own_blocks(pd_group *g, pd_work *w);

/* state.c: the sticky error and the waits' poll (calls nothing above it) */
/* The group's sticky error (PD_OK while it works). */
static inline pd_status
pd_grp_err(pd_group *g)
{
    return (pd_status)atomic_load_explicit(&g->err, memory_order_acquire);
}
void pd_grp_record_fatal(pd_group *g, pd_status st, const char *msg);
void pd_grp_propagate_fatal(pd_group *g);
void pd_grp_set_fatal(pd_group *g, pd_status st, const char *msg);
pd_status pd_grp_progress_once(pd_group *g, double until);
/* pd_shm_waiter check (arg: a run_ctx): stop for a failed or destroyed
 * group; on the progress thread keep the transport moving. */
pd_status pd_grp_shm_check(void *arg);

/* progress.c: the progress thread (calls run.c) */
void *pd_grp_progress_main(void *arg);
uint64_t pd_grp_cb_current_seq(void *ctx);
void pd_grp_cb_on_abort(void *ctx, int peer, int status, const char *msg);

/* setup.c: what carries a collective that does not run in the group's
 * shared memory (coll/coll.h's pd_path) */
int pd_grp_path(const pd_group *g);

/* run.c: one collective on this thread (calls state.c, never progress.c) */
pd_status pd_grp_run_collective(run_ctx *x, const pd_op *op, uint64_t seq,
                                int resume, double deadline, int *published);

/* diag.c: set the error of a collective that timed out (naming the ranks
 * it waited for) and return its status: PD_ETIMEOUT, or that of a peer's
 * failure that came first (reported instead) */
pd_status pd_grp_explain_timeout(pd_group *g, const pd_op *op, uint64_t seq,
                                 double timeout, int on_progress,
                                 int waited_for);

/* shm_buffers.c */
shm_buf *pd_grp_find_shm_buf(pd_group *g, const char *p, size_t len);
void pd_grp_free_shm_buf(shm_buf *b, int size);

#endif
