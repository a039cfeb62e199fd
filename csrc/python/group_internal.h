/* Private to the ProcessGroup binding (csrc/python/group*.c, work.c,
 * shared_buffer.c): the objects' layouts and the functions those files
 * share.  One concern a file:
 *
 *   group.c          the ProcessGroup type: lifecycle, connect, state
 *                    getters, and its method and attribute tables
 *   group_fast.c     the fast path: blocking collectives run on the
 *                    calling thread (fast(), and submit's blocking case)
 *   group_submit.c   submit(): any operation, lengths checked, a Work back
 *   group_rules.c    algorithm choice: the rules tables, the phase probe,
 *                    explain()
 *   group_flight.c   the flight recorder and the timeline track
 *   work.c           the Work type
 *   shared_buffer.c  the SharedBuffer type and shared_alloc()
 *
 * The methods are defined in their concern's file and listed in group.c's
 * tables; what runs on every call (pg_state, pg_check) is inline here.
 */
#ifndef PD_PYTHON_GROUP_INTERNAL_H
#define PD_PYTHON_GROUP_INTERNAL_H

#include "binding.h"
#include "../group/group.h"

typedef struct {
    PyObject_HEAD
    pd_group *g;
    int port;
    int rank;
    int size;
    long pid; /* creator: a forked child must not touch the parent's thread */
    PyObject *handoffs; /* Works of interrupted inline collectives */
    pd_module_state *st; /* the defining module's state (the fast path's) */
    PyObject *weakrefs; /* weak references (the flight recorder's registry) */
} PGObject;

typedef struct {
    PyObject_HEAD
    pd_work *w;
    pd_view *views;  /* buffers.c views, released when the work is done */
    int nviews;
    char **ptrs;   /* in blocks then out blocks */
    size_t *lens;  /* same layout */
    PyObject *keep; /* objects to keep alive (the arrays) */
    int kind;
} WorkObject;

static inline pd_module_state *
pg_state(PyObject *self)
{
    return pd_state_from_type(Py_TYPE(self));
}

/* 0, or -1 with DistError set when the group has been destroyed. */
static inline int
pg_check(PGObject *self)
{
    if (self->g == NULL) {
        pd_py_set_error(pg_state((PyObject *)self), PD_ECLOSED,
                        "the process group has been destroyed");
        return -1;
    }
    return 0;
}

/* work.c: a new Work with nothing attached, tracked by the GC; the type. */
WorkObject *pd_py_work_alloc(pd_module_state *st);
int pd_py_work_add_type(PyObject *m, pd_module_state *st);

/* shared_buffer.c */
int pd_py_shared_buffer_add_type(PyObject *m, pd_module_state *st);
PyObject *pd_pg_shared_alloc(PGObject *self, PyObject *arg);

/* group_fast.c.  pd_pg_run_inline runs o on this thread if the group
 * allows: 0: not eligible (no exception); 1: done; -1: exception set.  On
 * an interrupt the collective goes on in the progress thread: *handoff then
 * holds its work, whose arrays pd_pg_keep_handoff keeps alive (in w). */
int pd_pg_run_inline(PGObject *self, pd_op *o, pd_work **handoff);
void pd_pg_keep_handoff(PGObject *self, PyObject *w);
PyObject *pd_pg_fast(PGObject *self, PyObject *const *args,
                     Py_ssize_t nargs);

/* group_submit.c */
PyObject *pd_pg_submit(PGObject *self, PyObject *args, PyObject *kwds);

/* group_rules.c */
PyObject *pd_pg_explain(PGObject *self, PyObject *args);
PyObject *pd_pg_set_rules(PGObject *self, PyObject *args);
PyObject *pd_pg_set_slow_rules(PGObject *self, PyObject *args);
PyObject *pd_pg_probe_phase(PGObject *self, PyObject *ignored);
PyObject *pd_pg_get_rules(PGObject *self, void *closure);
PyObject *pd_pg_get_slow_rules(PGObject *self, void *closure);
PyObject *pd_pg_get_phase(PGObject *self, void *closure);

/* group_flight.c */
PyObject *pd_pg_flight_records(PGObject *self, PyObject *ignored);
PyObject *pd_pg_flight_via(PGObject *self, PyObject *args);
PyObject *pd_pg_flight_note(PGObject *self, PyObject *const *args,
                            Py_ssize_t nargs);
PyObject *pd_pg_flight_update(PGObject *self, PyObject *const *args,
                              Py_ssize_t nargs);
PyObject *pd_pg_flight_configure(PGObject *self, PyObject *args);
PyObject *pd_pg_flight_dump(PGObject *self, PyObject *args);
PyObject *pd_pg_set_timeline_track(PGObject *self, PyObject *arg);

#endif
