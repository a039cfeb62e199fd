"""pyddp._C's heap types: immutable (as CPython's own extension types), and garbage-collected where
they hold Python objects (Work holds its arrays, ProcessGroup its handed-off works, SharedBuffer its
group), so reference cycles through them are freed."""
import gc
import weakref

import numpy as np
import pytest

from pyddp import _C

IMMUTABLE = 1 << 8   # Py_TPFLAGS_IMMUTABLETYPE
HAVE_GC = 1 << 14    # Py_TPFLAGS_HAVE_GC


@pytest.mark.parametrize("name", ["Work", "ProcessGroup", "SharedBuffer"])
def test_types_holding_objects_are_gc_and_immutable(name):
    tp = getattr(_C, name)
    assert tp.__flags__ & HAVE_GC
    assert tp.__flags__ & IMMUTABLE
    with pytest.raises(TypeError):
        setattr(tp, "extra", 1)


@pytest.mark.parametrize("name", ["TCPStore", "FileStore", "HashStore", "Generator"])
def test_other_types_are_immutable(name):
    with pytest.raises(TypeError):
        setattr(getattr(_C, name), "extra", 1)


def test_a_cycle_through_a_work_is_collected():
    pg = _C.ProcessGroup(0, 1, 30.0)
    try:
        pg.connect(["127.0.0.1"], [pg.port], 1, None, 0)
        assert gc.is_tracked(pg)

        class Arr(np.ndarray):  # an exporter that can refer back to the Work holding its view
            pass

        a = np.ones(4, np.float32).view(Arr)
        # an asynchronous all_reduce: the Work holds a view of its array until it is freed
        w = pg.submit(_C.K_ALLREDUCE, _C.DTYPE_CODES["float32"], _C.REDUCE_OPS["SUM"], 0, 0, 4,
                      (), (a,), None, None, 30.0, False, "all_reduce")
        w.wait(30.0)
        assert gc.is_tracked(w)
        a.work = w            # the cycle: array -> Work -> its view of the array -> array
        ref = weakref.ref(a)
        del a, w
        gc.collect()
        assert ref() is None, "a cycle through a Work was not collected"
    finally:
        pg.destroy()
