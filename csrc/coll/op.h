/* What one operation is: the description a caller submits to a group and
 * the collective algorithms read (kinds in util/kinds.h, dtypes and reduce ops in
 * kernels/kernels.h). */
#ifndef PD_COLL_OP_H
#define PD_COLL_OP_H

#include <stddef.h>

#include "../kernels/kernels.h"
#include "../util/kinds.h"

/* One operation.  Buffers are described per rank as blocks so that the list
 * forms (all_gather(list), scatter(list), ...) and the tensor forms share one
 * algorithm: in[p] / out[p] point to block p, in_len[p] / out_len[p] are its
 * byte sizes.  Single-buffer operations (broadcast, all_reduce, reduce,
 * send, recv) use in[0] / out[0] only.  Arrays are owned by the caller and
 * must stay valid until the work completes. */
typedef struct pd_op {
    pd_kind kind;
    pd_dtype dtype;
    pd_redop op;
    int root;          /* root / src / dst / peer; recv: -1 = any source */
    int tag;           /* send / recv */
    size_t count;      /* elements that identify the call across ranks */
    char **in;
    char **out;
    size_t *in_len;
    size_t *out_len;
    int nblocks;       /* entries in in/out arrays (1 or group size) */
    double timeout;    /* seconds; <= 0: the group's timeout */
    int wait_all;      /* monitored_barrier(wait_all_ranks=...) */
    char name[40];     /* API name used in messages, e.g. "all_reduce" */
} pd_op;

#endif
