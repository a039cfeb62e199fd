/* The flight recorder: each group keeps its last N operations in a ring
 * (sequence number, kind, sizes, dtype, state, timestamps), as torch's NCCL
 * flight recorder does.  Written by the thread that enqueues an operation
 * and by the one that runs it (one small mutex); read by Python
 * (ProcessGroup.flight_records) and written to a file when the group fails
 * or times out (pd_fr_dump), so that the files of all ranks tell which rank
 * diverged, on which collective (python -m pyddp.tools.flight_recorder).
 *
 * The same events feed the timeline (util/timeline.h) when it is on.
 *
 * Device backends record their calls in the ring of the host group they
 * keep beside them ("nccl"), or in a ring of their own ("mpi":
 * _C.FlightRecorder): each registers what runs its calls once (pd_fr_via:
 * backend, transport, algorithm), then notes each call (pd_fr_note) and
 * moves it to started, completed or failed (pd_fr_update).  The ring's own
 * operations (the group's) are via 0: backend "cpu", coll/select.c's path
 * and algorithm. */
#ifndef PD_GROUP_FLIGHT_H
#define PD_GROUP_FLIGHT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../coll/op.h"
#include "../util/status.h"

enum {
    PD_FR_ENQUEUED = 0,
    PD_FR_STARTED = 1,
    PD_FR_COMPLETED = 2,
    PD_FR_FAILED = 3
};

typedef struct pd_fr_entry {
    uint64_t id;      /* record number, from 1; 0: an empty slot */
    uint64_t seq;     /* the collective's sequence number (0: p2p, or not
                         started yet) */
    uint64_t count;
    uint64_t bytes;
    double t_enqueued; /* wall clock, seconds since the epoch; 0: unset */
    double t_started;
    double t_ended;
    int32_t root;
    int32_t status;   /* pd_status when it ended */
    uint8_t kind;
    uint8_t dtype;
    uint8_t op;
    uint8_t state;
    /* what ran it (coll/coll.h's pd_path, pd_algo; set when it ended):
     * coll/select.c decides, the record keeps it */
    uint8_t path;
    uint8_t algo;
    uint8_t via;      /* 0: the group's own; k: the k-th pd_fr_via */
    char name[40];
} pd_fr_entry;

#define PD_FR_VIAS 8      /* via 0 (the group's own) and 7 registered */
#define PD_FR_VIA_LEN 48  /* each name, NUL included */

typedef struct pd_fr {
    pthread_mutex_t mu;
    size_t cap;       /* 0: off */
    uint64_t next;    /* the last record number handed out */
    pd_fr_entry *e;
    char *dump_path;  /* where pd_fr_dump writes on failure (NULL: nowhere) */
    char *meta;       /* a JSON object the dump carries (rank, group, ...) */
    int dumped;
    /* timeline: this group's track, when the timeline is on */
    int tl_pid;
    int tl_tid;
    /* registered vias (append-only: names never change once nvia counts
     * them) and each one's collective sequence numbers */
    int nvia;
    char via[PD_FR_VIAS][3][PD_FR_VIA_LEN];
    uint64_t via_seq[PD_FR_VIAS];
} pd_fr;

/* Capacity from PYDDP_FLIGHT_RECORDER_SIZE (else TORCH_FR_BUFFER_SIZE, else
 * 2000); 0 turns the recorder off. */
size_t pd_fr_default_capacity(void);
pd_status pd_fr_init(pd_fr *fr, size_t cap);
void pd_fr_free(pd_fr *fr);

/* A new record for op (state enqueued, or started when seq != 0); its
 * number, 0 when the recorder is off. */
uint64_t pd_fr_add(pd_fr *fr, const pd_op *op, uint64_t seq, int size);
/* The record id started running as collective seq (0: p2p). */
void pd_fr_start(pd_fr *fr, uint64_t id, uint64_t seq);
/* The record id ended with st, having run over path with algorithm algo
 * (coll/coll.h; 0, 0: unknown, as a point-to-point operation). */
void pd_fr_end(pd_fr *fr, uint64_t id, pd_status st, int path, int algo);

/* A device backend's calls: what runs them (backend, transport,
 * algorithm; each cut to PD_FR_VIA_LEN - 1 bytes), registered once; its
 * via number (1..PD_FR_VIAS - 1; the same triple gives the same number),
 * or -1 when every slot is taken. */
int pd_fr_via(pd_fr *fr, const char *backend, const char *transport,
              const char *algorithm);
/* A new record of a call of via (enqueued now); collective: it takes the
 * via's next sequence number (else seq 0, as point-to-point).  Its id, 0
 * when the recorder is off or via is not registered. */
uint64_t pd_fr_note(pd_fr *fr, int via, int kind, int dtype, int op,
                    int root, uint64_t count, uint64_t bytes,
                    const char *name, int collective);
/* Record id moves to state (PD_FR_STARTED, _COMPLETED or _FAILED with st);
 * a record that ended stays as it is. */
void pd_fr_update(pd_fr *fr, uint64_t id, int state, pd_status st);
/* Every record of a registered via (never the group's own) that has not
 * ended fails with st (its backend failed); their number. */
size_t pd_fr_fail_open(pd_fr *fr, pd_status st);
/* The names of what ran e (via 0: "cpu", its path and algorithm). */
void pd_fr_names(const pd_fr *fr, const pd_fr_entry *e, const char **backend,
                 const char **transport, const char **algorithm);

/* Copy the records, oldest first, into out (at most cap); their number. */
size_t pd_fr_snapshot(pd_fr *fr, pd_fr_entry *out, size_t cap);

/* Where to dump on failure, and the JSON object the file carries. */
pd_status pd_fr_configure(pd_fr *fr, const char *path, const char *meta);
/* Write the records as JSON to path (NULL: the configured path; nothing
 * when none).  reason: why (a short string).  once: only the first time. */
pd_status pd_fr_dump(pd_fr *fr, const char *path, const char *reason,
                     int once);

const char *pd_fr_state_name(int state);

#endif
