"""Object collectives (pickled): broadcast_object_list, all_gather_object, gather_object,
scatter_object_list, with objects of different types and sizes on every rank."""
import fractions
import collections

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run
from _tiers import full
from _ref import Checker, assert_clean

pytestmark = pytest.mark.timeout(180)

WORLD_SIZES = [2, 3, *full(4)]   # 4 ranks (oversubscribed): --full

Point = collections.namedtuple("Point", "x y")


class Custom:
    """A module-level class: pickled by reference."""

    def __init__(self, rank, payload):
        self.rank = rank
        self.payload = payload

    def __eq__(self, other):
        return type(other) is Custom and other.rank == self.rank and other.payload == self.payload

    def __repr__(self):
        return f"Custom({self.rank}, <{len(self.payload)} items>)"


def make_obj(rank, salt=0):
    """A different object (type and size) per rank; deterministic, so every rank can predict it."""
    r = (rank + salt) % 6
    if r == 0:
        return {"rank": rank, "salt": salt, "nested": [1, (2, 3), {"k": None}], "text": "héllo ✓"}
    if r == 1:
        return np.arange(1000 * (rank + 1), dtype=np.float32) * (salt + 1)
    if r == 2:
        return Custom(rank, list(range(50 * salt)))
    if r == 3:
        return bytes(range(256)) * (1024 * (salt + 1))  # ~256 KiB+
    if r == 4:
        return (None, True, 3 + 4j, fractions.Fraction(rank, 7), frozenset({rank, salt}), Point(rank, salt))
    return "x" * (rank * 100003 + salt)  # ~100 KB per rank step; '' on rank 0


def _eq(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
            and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _desc(o):
    s = repr(o)
    return s if len(s) < 80 else s[:77] + "..."


def _object_child(rank, ws):
    ck = Checker(rank)
    for salt in range(3):
        # broadcast_object_list: the list is filled in place on every rank
        for src in range(ws):
            want = [make_obj(src, salt), make_obj(src, salt + 1), None, [src] * 3]
            objs = list(want) if rank == src else [None] * len(want)
            label = f"broadcast_object_list salt={salt} src={src}"
            if ck.call(label, lambda: dist.broadcast_object_list(objs, src=src)):
                for i in range(len(want)):
                    ck.expect(f"{label} [{i}]", None if _eq(objs[i], want[i]) else _desc(objs[i]))

        # all_gather_object
        out = [None] * ws
        label = f"all_gather_object salt={salt}"
        if ck.call(label, lambda: dist.all_gather_object(out, make_obj(rank, salt))):
            for r in range(ws):
                ck.expect(f"{label} [{r}]", None if _eq(out[r], make_obj(r, salt)) else _desc(out[r]))

        # gather_object: only dst passes a list
        for dst in range(ws):
            lst = [None] * ws if rank == dst else None
            label = f"gather_object salt={salt} dst={dst}"
            if ck.call(label, lambda: dist.gather_object(make_obj(rank, salt + 2), lst, dst=dst)) and rank == dst:
                for r in range(ws):
                    ck.expect(f"{label} [{r}]", None if _eq(lst[r], make_obj(r, salt + 2)) else _desc(lst[r]))

        # scatter_object_list: rank r gets src's r-th object
        for src in range(ws):
            ins = [make_obj(100 + r, salt + src) for r in range(ws)] if rank == src else None
            out1 = [None]
            label = f"scatter_object_list salt={salt} src={src}"
            if ck.call(label, lambda: dist.scatter_object_list(out1, ins, src=src)):
                want = make_obj(100 + rank, salt + src)
                ck.expect(label, None if _eq(out1[0], want) else _desc(out1[0]))

    # objects of very different sizes in one call, and an empty-ish object
    big = np.random.default_rng(rank).bytes(3 << 20) if rank == ws - 1 else b""
    out = [None] * ws
    if ck.call("all_gather_object mixed sizes", lambda: dist.all_gather_object(out, big)):
        for r in range(ws):
            exp = np.random.default_rng(r).bytes(3 << 20) if r == ws - 1 else b""
            ck.expect(f"all_gather_object mixed sizes [{r}]", None if out[r] == exp else f"{len(out[r])} bytes")
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_object_collectives_move_arbitrary_picklable_objects(ws):
    assert_clean(run(_object_child, ws, timeout=120), min_checks=20)


def _object_group_child(rank, ws):
    ck = Checker(rank)
    ranks = list(range(1, ws))
    g = dist.new_group(ranks)
    ck.expect("get_rank(group)", None if dist.get_rank(g) == (ranks.index(rank) if rank in ranks else -1)
              else str(dist.get_rank(g)))
    if rank in ranks:
        out = [None] * len(ranks)
        if ck.call("all_gather_object in group", lambda: dist.all_gather_object(out, {"r": rank}, group=g)):
            ck.expect("all_gather_object in group",
                      None if out == [{"r": r} for r in ranks] else str(out))
        objs = [make_obj(ranks[-1], 1)] if rank == ranks[-1] else [None]
        if ck.call("broadcast_object_list in group",
                   lambda: dist.broadcast_object_list(objs, src=ranks[-1], group=g)):
            ck.expect("broadcast_object_list in group", None if _eq(objs[0], make_obj(ranks[-1], 1))
                      else _desc(objs[0]))
    # rank 0 serves the store the members' new_group uses: it must not leave first (torch alike)
    ck.call("world barrier", lambda: dist.barrier())
    return ck.report()


@pytest.mark.parametrize("ws", [2, 3])
def test_object_collectives_in_a_subgroup_use_global_src(ws):
    assert_clean(run(_object_group_child, ws))
