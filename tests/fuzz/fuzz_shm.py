"""Fuzz target: what a rank reads from a peer's shared-memory segment
(csrc/transport/shm/: wait.c, ident.c, ring.c): the control block (step, abort status and
message, "left" flag, per-op values, the identities of the collectives it entered) and the
ring counters (head, tail, wait flags).

_C._fuzz_shm keeps two real in-process segments (rank 0 and rank 1, mapped as a job maps
them), overwrites rank 1's published words with bytes built from the input, and runs rank 0's
code on them: the identity check, a sync point whose deadline has passed (it still checks every peer before timing out) (all ranks, any rank, or
rank 1 as the data source), the per-op value, ring reads and writes of up to 4 ring sizes.
Checked: no crash (ASan in CI: no access outside the segments), clean messages, a ring never
reads or writes more than one ring's worth whatever the peer's counters say.

    python tests/fuzz/fuzz_shm.py -runs=20000
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402

from pyddp import _C  # noqa: E402

SIZES = _C._fuzz_shm_sizes()
RING = SIZES["ring"]
# pd_shm_ctrl: line 0 = step, sleeping, abort, pid (u32 x4), value[2] (u64), left (u32); line 1 =
# ident[2] (seq, count, aux: u64; kind, dtype, op, pad: u8; root: i32); then the abort message
IDENT = struct.Struct("<QQQBBBBi")


def pack_ident(v):
    seq, count, aux, kind, dtype, op, root = v
    return IDENT.pack(seq, count, aux, kind, dtype, op, 0, root)


@atheris.instrument_func
def ident(fdp, base):
    """Our identity, or a variation of it (a mismatching peer)."""
    vals = list(base)
    if fdp.ConsumeIntInRange(0, 2) == 0:
        i = fdp.ConsumeIntInRange(0, 6)
        lim = [2**64 - 1] * 3 + [255] * 3
        vals[i] = fdp.ConsumeIntInRange(-2**31, 2**31 - 1) if i == 6 else \
            fdp.ConsumeIntInRange(0, lim[i])
    return vals


@atheris.instrument_func
def test_one(data):
    fdp = atheris.FuzzedDataProvider(data)
    mine = (fdp.PickValueInList([1, 2, 3, 2**64 - 1]), fdp.ConsumeIntInRange(0, 64),
            fdp.ConsumeIntInRange(0, 3), fdp.ConsumeIntInRange(0, 12),
            fdp.ConsumeIntInRange(0, 16), fdp.ConsumeIntInRange(0, 9),
            fdp.ConsumeIntInRange(-1, 2))
    if fdp.ConsumeIntInRange(0, 4) == 0:
        ctrl = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, SIZES["ctrl"]))
    else:
        step = fdp.PickValueInList([0, 1, 2, 2**31, 2**32 - 1])
        abort = fdp.PickValueInList([0, 0, 0, 5, 9, 13, 2**32 - 1])
        line0 = struct.pack("<IIIiQQI", step, fdp.ConsumeIntInRange(0, 1), abort,
                            fdp.ConsumeIntInRange(-2**31, 2**31 - 1),
                            fdp.ConsumeIntInRange(0, 2**64 - 1),
                            fdp.ConsumeIntInRange(0, 2**64 - 1), fdp.ConsumeIntInRange(0, 2))
        line0 = line0.ljust(64, b"\0")
        ids = [pack_ident(ident(fdp, mine)) for _ in range(2)]
        if fdp.ConsumeBool():   # put our sequence number's slot where the check looks
            ids[mine[0] & 1] = pack_ident(ident(fdp, mine))
        msg = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, SIZES["errmsg"]))
        if fdp.ConsumeBool():
            msg = msg.ljust(SIZES["errmsg"], b"x")   # no NUL anywhere
        ctrl = line0 + b"".join(ids) + msg
    # ring counters, as rank 1's segment lays them out: entry p (128 bytes: head, then tail on
    # the next line, then the wait flags) concerns peer p; rank 0 reads entry 0
    rings = b""
    for _ in range(2):
        head = fdp.PickValueInList([0, 1, RING - 1, RING, RING + 1, 2**32, 2**63, 2**64 - 1,
                                    fdp.ConsumeIntInRange(0, 2**64 - 1)])
        tail = fdp.PickValueInList([0, 1, RING, 2**64 - 1, fdp.ConsumeIntInRange(0, 2**64 - 1)])
        rings += (struct.pack("<Q", head).ljust(64, b"\0")
                  + struct.pack("<QII", tail, fdp.ConsumeIntInRange(0, 1),
                                fdp.ConsumeIntInRange(0, 1))).ljust(SIZES["ring_ctl"], b"\0")
    mode = fdp.ConsumeIntInRange(0, 2)
    readlen = fdp.PickValueInList([0, 1, 100, RING, 2 * RING, 4 * RING])
    writelen = fdp.PickValueInList([0, 1, 100, RING, 2 * RING, 4 * RING])
    r = _C._fuzz_shm(ctrl, rings, mine, mode, readlen, writelen)
    for k in ("check", "sync"):
        code, msg = r[k]
        assert (code == 0) == (msg is None), r
        assert msg is None or isinstance(msg, str)
    assert 0 <= r["read"] <= min(readlen, RING), r
    assert 0 <= r["written"] <= min(writelen, RING), r


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _peers as P
    P.main(test_one)
