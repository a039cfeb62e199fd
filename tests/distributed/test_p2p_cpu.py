"""Point to point: send/recv, recv from any source, isend/irecv, batch_isend_irecv, tags."""
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run
from _tiers import full
from _ref import DTYPE_NAMES, Checker, assert_clean, garbage, kind, large_count, rank_input, same_bytes

pytestmark = pytest.mark.timeout(180)

WORLD_SIZES = [2, 3, *full(4)]   # 4 ranks (oversubscribed): --full


def _ik(name):
    return "normal" if kind(name) in ("float", "complex") else "full"


def _payload(name, n, frm, to, salt=0):
    return rank_input(name, n, 10000 * salt + 100 * frm + to, _ik(name))


def _send_recv_child(rank, ws):
    ck = Checker(rank)
    cases = [(name, n) for name in DTYPE_NAMES for n in (1, 33)]
    cases += [("float32", large_count("float32")), ("uint8", large_count("uint8")), ("float64", 0)]
    for name, n in cases:
        # rank 0 sends to everyone in turn, then everyone answers rank 0
        if rank == 0:
            for j in range(1, ws):
                ck.call(f"send {name} n={n} to {j}", lambda: dist.send(_payload(name, n, 0, j), j))
            for j in range(1, ws):
                buf = garbage(name, n)
                label = f"recv {name} n={n} from {j}"
                got = []
                if ck.call(label, lambda: got.append(dist.recv(buf, src=j))):
                    ck.expect(label + " returns the sender", None if got[0] == j else f"returned {got[0]!r}")
                    ck.expect(label, same_bytes(buf, _payload(name, n, j, 0)))
        else:
            buf = garbage(name, n)
            label = f"recv {name} n={n} from 0"
            got = []
            if ck.call(label, lambda: got.append(dist.recv(buf, src=0))):
                ck.expect(label + " returns the sender", None if got[0] == 0 else f"returned {got[0]!r}")
                ck.expect(label, same_bytes(buf, _payload(name, n, 0, rank)))
            ck.call(f"send {name} n={n} to 0", lambda: dist.send(_payload(name, n, rank, 0), 0))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_send_recv_every_dtype_delivers_bytes_and_recv_returns_sender(ws):
    assert_clean(run(_send_recv_child, ws, timeout=120), min_checks=30)


def _any_source_child(rank, ws):
    ck = Checker(rank)
    n = 9
    for rnd in range(3):
        if rank == 0:
            seen = []
            for _ in range(ws - 1):
                buf = np.zeros(n, dtype=np.int64)
                got = []
                if ck.call(f"round {rnd} recv(src=None)", lambda: got.append(dist.recv(buf))):
                    s = got[0]
                    seen.append(s)
                    ck.expect(f"round {rnd} payload matches returned sender {s}",
                              None if isinstance(s, int) and 0 < s < ws and
                              np.array_equal(buf, np.full(n, 100 * rnd + s)) else f"buf={buf}")
            ck.expect(f"round {rnd} senders", None if sorted(seen) == list(range(1, ws))
                      else f"senders {seen}")
        else:
            # later ranks send first in even rounds, earlier ranks first in odd rounds
            order = (ws - rank) if rnd % 2 == 0 else rank
            time.sleep(0.1 * order)
            ck.call(f"round {rnd} send", lambda: dist.send(np.full(n, 100 * rnd + rank, dtype=np.int64), 0))
        ck.call(f"round {rnd} barrier", lambda: dist.barrier())
    # irecv from any source
    if rank == 0:
        bufs = [np.zeros(2, dtype=np.float32) for _ in range(ws - 1)]
        works = [dist.irecv(b) for b in bufs]
        for w in works:
            ck.call("irecv(src=None) wait", lambda: w.wait())
        got = sorted(int(b[0]) for b in bufs)
        ck.expect("irecv(src=None) payloads", None if got == list(range(1, ws)) else str(got))
    else:
        ck.call("send for irecv", lambda: dist.send(np.full(2, float(rank), dtype=np.float32), 0))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_recv_without_src_receives_from_any_rank_and_returns_the_sender(ws):
    assert_clean(run(_any_source_child, ws))


def _isend_irecv_child(rank, ws):
    """Every rank isends to and irecvs from every other rank at once, then waits."""
    ck = Checker(rank)
    for name, n in (("float32", 5), ("int16", 1000), ("complex128", 3), ("float64", large_count("float64"))):
        recvs = {j: garbage(name, n) for j in range(ws) if j != rank}
        works = []
        for j in range(ws):
            if j != rank:
                works.append(("irecv", j, dist.irecv(recvs[j], src=j)))
                works.append(("isend", j, dist.isend(_payload(name, n, rank, j), dst=j)))
        for what, j, w in works:
            if ck.call(f"{what} {name} n={n} peer {j} wait", lambda: w.wait()):
                ck.expect(f"{what} {name} n={n} peer {j} is_completed",
                          None if w.is_completed() else "False after wait")
        for j, buf in recvs.items():
            ck.expect(f"irecv {name} n={n} from {j}", same_bytes(buf, _payload(name, n, j, rank)))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_isend_irecv_full_exchange_between_all_pairs(ws):
    assert_clean(run(_isend_irecv_child, ws, timeout=120))


def _ring_child(rank, ws):
    ck = Checker(rank)
    right, left = (rank + 1) % ws, (rank - 1) % ws
    for name, n in (("float32", 1), ("int64", 100), ("bfloat16" if "bfloat16" in DTYPE_NAMES else "float16", 77),
                    ("uint8", large_count("uint8")), ("float32", large_count("float32"))):
        to_right = _payload(name, n, rank, right, salt=1)
        to_left = _payload(name, n, rank, left, salt=2)
        from_left = garbage(name, n)
        from_right = garbage(name, n)
        ops = [dist.P2POp(dist.isend, to_right, right),
               dist.P2POp(dist.irecv, from_left, left),
               dist.P2POp(dist.isend, to_left, left),
               dist.P2POp(dist.irecv, from_right, right)]
        reqs = []
        if ck.call(f"batch_isend_irecv {name} n={n}", lambda: reqs.extend(dist.batch_isend_irecv(ops))):
            for i, w in enumerate(reqs):
                ck.call(f"batch_isend_irecv {name} n={n} req {i} wait", lambda: w.wait())
            ck.expect(f"ring {name} n={n} from left", same_bytes(from_left, _payload(name, n, left, rank, salt=1)))
            ck.expect(f"ring {name} n={n} from right", same_bytes(from_right, _payload(name, n, right, rank, salt=2)))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_batch_isend_irecv_ring_exchange_in_both_directions(ws):
    assert_clean(run(_ring_child, ws, timeout=120))


def _tags_child(rank, ws):
    ck = Checker(rank)
    if rank == 0:
        a = np.full(4, 1.0)
        b = np.full(4, 2.0)
        w1 = dist.isend(a, 1, tag=1)
        w2 = dist.isend(b, 1, tag=2)
        ck.call("isend tag=1 wait", lambda: w1.wait())
        ck.call("isend tag=2 wait", lambda: w2.wait())
        # blocking sends; the receiver has posted both irecvs (tags in the opposite order)
        ck.call("send tag=5", lambda: dist.send(np.full(3, 5, dtype=np.int32), 1, tag=5))
        ck.call("send tag=6", lambda: dist.send(np.full(3, 6, dtype=np.int32), 1, tag=6))
    elif rank == 1:
        b = np.zeros(4)
        a = np.zeros(4)
        ck.call("recv tag=2 first", lambda: dist.recv(b, 0, tag=2))
        ck.call("recv tag=1 second", lambda: dist.recv(a, 0, tag=1))
        ck.expect("tag=2 message", None if np.all(b == 2.0) else str(b))
        ck.expect("tag=1 message", None if np.all(a == 1.0) else str(a))
        six = np.zeros(3, dtype=np.int32)
        five = np.zeros(3, dtype=np.int32)
        w6 = dist.irecv(six, 0, tag=6)
        w5 = dist.irecv(five, 0, tag=5)
        ck.call("irecv tag=6 wait", lambda: w6.wait())
        ck.call("irecv tag=5 wait", lambda: w5.wait())
        ck.expect("tag=6 message", None if np.all(six == 6) else str(six))
        ck.expect("tag=5 message", None if np.all(five == 5) else str(five))
    ck.call("barrier", lambda: dist.barrier())
    return ck.report()


@pytest.mark.parametrize("ws", [2, 3])
def test_tags_match_messages_regardless_of_posting_order(ws):
    assert_clean(run(_tags_child, ws))


def _p2p_then_collective_child(rank, ws):
    """A small isend queued before a collective must not stop the collective from running."""
    ck = Checker(rank)
    a = np.full(4, float(rank + 1))
    if rank == 0:
        w = dist.isend(np.arange(6.0), 1)
        ck.call("all_reduce after isend", lambda: dist.all_reduce(a))
        ck.call("isend wait", lambda: w.wait())
    elif rank == 1:
        ck.call("all_reduce before recv", lambda: dist.all_reduce(a))
        buf = np.zeros(6)
        ck.call("recv after all_reduce", lambda: dist.recv(buf, 0))
        ck.expect("recv after all_reduce", None if np.array_equal(buf, np.arange(6.0)) else str(buf))
    else:
        ck.call("all_reduce", lambda: dist.all_reduce(a))
    ck.expect("all_reduce", None if np.all(a == ws * (ws + 1) / 2) else str(a))
    return ck.report()


@pytest.mark.parametrize("ws", [2, 3])
def test_pending_small_isend_does_not_block_a_later_collective(ws):
    assert_clean(run(_p2p_then_collective_child, ws))


# ----------------------------------------------------------------------------------------------
# issue 35: the dtype and element count must agree, not only the bytes (gloo is silent here)

_MISMATCH = {
    # case: (what rank 0 sends, what rank 1 receives into); same byte count in each
    "float32_into_int32": (lambda: np.ones(10, np.float32), lambda: np.zeros(10, np.int32)),
    "count_differs": (lambda: np.ones(10, np.float32), lambda: np.zeros(5, np.float64)),
    "any_source": (lambda: np.ones(8, np.int64), lambda: np.zeros(8, np.float64)),
    "irecv": (lambda: np.ones(6, np.uint16), lambda: np.zeros(6, np.float16)),
}


def _p2p_mismatch_child(rank, ws, case):
    make_send, make_recv = _MISMATCH[case]
    out = {}
    try:
        if rank == 0:
            dist.send(make_send(), 1)
        else:
            buf = make_recv()
            if case == "any_source":
                dist.recv(buf)
            elif case == "irecv":
                dist.irecv(buf, 0).wait()
            else:
                dist.recv(buf, 0)
            out["received"] = buf.tolist()
        dist.barrier()   # the sender's send has left: it learns at its next call
        out["barrier"] = "ok"
    except Exception as e:
        out["type"], out["msg"] = type(e).__name__, str(e)
        out["is_dist"] = isinstance(e, dist.DistError)
    if rank == 1 and "received" not in out:
        out["untouched"] = not np.any(buf)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("case", sorted(_MISMATCH))
def test_send_recv_with_different_dtype_or_count_raises_on_both_sides(case, transport):
    outs = run(_p2p_mismatch_child, 2, case, env={"PYDDP_TRANSPORT": transport}, timeout=60)
    sent, recvd = _MISMATCH[case][0](), _MISMATCH[case][1]()
    for rank, out in enumerate(outs):
        assert "msg" in out, f"rank {rank} saw no error; every rank's outcome: {outs}"
        assert out["is_dist"], out
        msg = out["msg"]
        assert "send/recv mismatch" in msg, msg
        assert f"dtype={sent.dtype.name}, count={sent.size}" in msg, msg
        assert f"dtype={recvd.dtype.name}, count={recvd.size}" in msg, msg
    assert outs[1]["untouched"], "the receive buffer was written despite the mismatch"
