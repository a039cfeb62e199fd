"""Fuzz target: the envelopes of the object collectives, before unpickling
(pyddp/distributed/_object_collectives.py: _envelope_sizes, _unpickle_concat, _unpickle_rows).

A receiving rank gets the pickles' sizes (int64, announced by the senders), allocates from
them, receives the bytes and unpickles each object.  The input gives the announced sizes (any
int64: negative, huge, summing past 2**63) and the bytes that arrive, and the target runs the
receive side of broadcast_object_list (back-to-back pickles) and of all_gather_object /
gather_object / scatter_object_list (one pickle per padded row) exactly as they run it.
Checked: nothing is allocated from sizes before they are validated (a size of 2**60 is a
DistError, not an allocation), every failure is a clean exception, and a right envelope gives
back the objects that were sent.

What pickle itself does with the bytes is trusted, as in torch (only ranks that know the job
secret get here); the fuzzer's bytes go to a restricted unpickler that refuses every global
(so a mutated pickle cannot run code on the fuzzing machine), which is the one difference from
the real path.

    python tests/fuzz/fuzz_object_envelope.py -runs=20000
"""
import io
import os
import pickle
import struct
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402
import numpy as np  # noqa: E402

with atheris.instrument_imports(include=["pyddp.distributed._object_collectives", "_peers"]):
    import _peers as P  # noqa: E402
    from pyddp.distributed import _object_collectives as dc  # noqa: E402


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"fuzzing: global {module}.{name} refused")


def _safe_loads(b):
    return _NoGlobals(io.BytesIO(b)).load()


# the module's pickle, with loads restricted (everything else as is)
dc.pickle = types.SimpleNamespace(loads=_safe_loads, Pickler=pickle.Pickler,
                                  HIGHEST_PROTOCOL=pickle.HIGHEST_PROTOCOL,
                                  UnpicklingError=pickle.UnpicklingError)
ERRORS = P.allowed_errors() + (pickle.PickleError, AttributeError, RecursionError,
                               struct.error)
GUARD = P.MemoryGuard()
SAMPLES = [0, 1, -1, "x", b"\x00" * 3, [1, 2], {"a": (1, 2.5)}, None, 2**70, "é" * 5]


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    n = fdp.ConsumeIntInRange(0, 5)
    objs = [fdp.PickValueInList(SAMPLES) for _ in range(n)]
    blobs = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objs]
    sizes = [len(b) for b in blobs]
    how = fdp.ConsumeIntInRange(0, 5)
    if how == 1 and n:       # a size that lies
        sizes[fdp.ConsumeIntInRange(0, n - 1)] = fdp.PickValueInList(
            [-1, -2**63, 2**60, 2**63 - 1, 2**40, 2**40 + 1, 0, fdp.ConsumeIntInRange(0, 200)])
    elif how == 2 and n:     # sizes that wrap an int64 sum
        sizes = [2**62] * n
    elif how == 3:           # raw sizes
        sizes = list(struct.unpack(f"<{n}q", fdp.ConsumeBytes(8 * n).ljust(8 * n, b"\0")))
    if fdp.ConsumeIntInRange(0, 3) == 0 and blobs:   # bytes that differ from the pickles
        i = fdp.ConsumeIntInRange(0, n - 1)
        blobs[i] = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    announced = np.array(sizes, dtype=np.int64)
    lie = [len(b) for b in blobs] != sizes
    try:
        ns = dc._envelope_sizes(announced, "fuzz", lambda i: 1)
    except dc.DistError:
        assert any(x < 0 for x in sizes) or sum(max(x, 0) for x in sizes) > dc._MAX_OBJECT_BYTES
        return
    assert all(0 <= x for x in ns) and sum(ns) <= dc._MAX_OBJECT_BYTES
    if sum(ns) > 1 << 20:
        # validated but huge: a real rank would allocate it and the collective would fail on
        # the size mismatch; nothing to unpickle here
        return
    mode = fdp.ConsumeIntInRange(0, 1)
    try:
        if mode == 0:
            # broadcast_object_list: the buffer is sum(sizes); the bytes fill what they can
            data = np.zeros(sum(ns), np.uint8)
            cat = b"".join(blobs)[:data.size]
            data[:len(cat)] = np.frombuffer(cat, np.uint8)
            got = dc._unpickle_concat(data, ns, "fuzz")
        else:
            # all_gather/gather/scatter: rows padded to the longest announced size
            m = max(ns) if ns else 0
            rows = [np.zeros(m, np.uint8) for _ in ns]
            for r, b in zip(rows, blobs):
                b = b[:m]
                r[:len(b)] = np.frombuffer(b, np.uint8)
            got = dc._unpickle_rows(rows, ns, "fuzz")
    except ERRORS:
        assert lie or any(b != pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)
                          for b, o in zip(blobs, objs)), "a right envelope failed"
        return
    finally:
        GUARD.check("after an envelope")
    if not lie:
        same = all(b == pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)
                   for b, o in zip(blobs, objs))
        if same:
            assert got == objs, (got, objs)


def warm():
    if GUARD.base is None:
        GUARD.arm()


if __name__ == "__main__":
    P.main(test_one, every=warm)
