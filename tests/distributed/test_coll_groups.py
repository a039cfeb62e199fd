"""new_group subsets, group.WORLD, several groups used alternately (real processes)."""
from datetime import timedelta

import numpy as np
import pytest

import pyddp.distributed as dist
from _mp import run
from _tiers import full
from _ref import Checker, assert_clean, garbage, mismatch, rank_input, reduce_ref, same_bytes

pytestmark = pytest.mark.timeout(180)

WORLD_SIZES = [2, 3, *full(4)]   # 4 ranks (oversubscribed): --full


def _subsets(ws):
    """Rank lists handed to new_group, some unsorted (torch sorts them), one of size 1."""
    subsets = [list(range(ws)), [ws - 1, 0], [1]]
    if ws >= 3:
        subsets += [[2, 1], list(range(1, ws))]
    if ws >= 4:
        subsets += [[0, 2], [3, 1, 2]]
    return subsets


def _member_child(rank, ws):
    ck = Checker(rank)
    name = "float64"
    n = 17
    groups = [(sorted(rs), dist.new_group(rs)) for rs in _subsets(ws)]  # every rank creates every group
    for ranks, g in groups:
        tag = f"group {ranks}"
        if rank not in ranks:
            ck.expect(f"{tag} get_rank for non-member", None if dist.get_rank(g) == -1
                      else f"get_rank = {dist.get_rank(g)}, want -1")
            continue
        me = ranks.index(rank)
        ck.expect(f"{tag} get_rank", None if dist.get_rank(g) == me else f"{dist.get_rank(g)} != {me}")
        ck.expect(f"{tag} get_world_size", None if dist.get_world_size(g) == len(ranks)
                  else f"{dist.get_world_size(g)} != {len(ranks)}")
        ck.expect(f"{tag} global rank unchanged", None if dist.get_rank() == rank else "changed")
        ins = {r: rank_input(name, n, r, "small") for r in ranks}

        a = ins[rank].copy()
        ck.call(f"{tag} all_reduce", lambda: dist.all_reduce(a, group=g))
        ck.expect(f"{tag} all_reduce", mismatch(a, reduce_ref([ins[r] for r in ranks], "SUM", name), name))

        a = ins[rank].copy()
        ck.call(f"{tag} all_reduce MAX", lambda: dist.all_reduce(a, op=dist.ReduceOp.MAX, group=g))
        ck.expect(f"{tag} all_reduce MAX", mismatch(a, reduce_ref([ins[r] for r in ranks], "MAX", name), name))

        src = ranks[-1]  # src/dst are GLOBAL ranks, as in torch
        b = ins[rank].copy()
        ck.call(f"{tag} broadcast src={src}", lambda: dist.broadcast(b, src, group=g))
        ck.expect(f"{tag} broadcast src={src}", same_bytes(b, ins[src]))

        outs = [garbage(name, n) for _ in ranks]
        ck.call(f"{tag} all_gather", lambda: dist.all_gather(outs, ins[rank].copy(), group=g))
        for i, r in enumerate(ranks):  # ordered by group rank
            ck.expect(f"{tag} all_gather [{i}]", same_bytes(outs[i], ins[r]))

        c = ins[rank].copy()
        dst = ranks[0]
        ck.call(f"{tag} reduce dst={dst}", lambda: dist.reduce(c, dst, group=g))
        if rank == dst:
            ck.expect(f"{tag} reduce", mismatch(c, reduce_ref([ins[r] for r in ranks], "SUM", name), name))

        gl = [garbage(name, n) for _ in ranks] if rank == dst else None
        ck.call(f"{tag} gather", lambda: dist.gather(ins[rank].copy(), gl, dst=dst, group=g))
        if rank == dst:
            for i, r in enumerate(ranks):
                ck.expect(f"{tag} gather [{i}]", same_bytes(gl[i], ins[r]))

        bigs = {r: rank_input(name, len(ranks) * n, 10 + r, "small") for r in ranks}
        out = garbage(name, n)
        ck.call(f"{tag} reduce_scatter_tensor",
                lambda: dist.reduce_scatter_tensor(out, bigs[rank].copy(), group=g))
        ck.expect(f"{tag} reduce_scatter_tensor", mismatch(
            out, reduce_ref([bigs[r][me * n:(me + 1) * n] for r in ranks], "SUM", name), name))

        out = garbage(name, len(ranks) * n)
        ck.call(f"{tag} all_to_all_single", lambda: dist.all_to_all_single(out, bigs[rank].copy(), group=g))
        ck.expect(f"{tag} all_to_all_single",
                  same_bytes(out, np.concatenate([bigs[r][me * n:(me + 1) * n] for r in ranks])))

        ck.call(f"{tag} barrier", lambda: dist.barrier(group=g))

    # the world group still works after all that
    a = np.full(3, rank + 1.0)
    ck.call("world all_reduce afterwards", lambda: dist.all_reduce(a))
    ck.expect("world all_reduce afterwards", mismatch(a, np.full(3, ws * (ws + 1) / 2), "float64"))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_new_group_members_communicate_only_among_themselves(ws):
    assert_clean(run(_member_child, ws), min_checks=10)


def _nonmember_child(rank, ws):
    ck = Checker(rank)
    g = dist.new_group([0])
    if rank == 0:
        ck.expect("member get_rank", None if dist.get_rank(g) == 0 else str(dist.get_rank(g)))
        a = np.arange(4.0)
        ck.call("single-member all_reduce", lambda: dist.all_reduce(a, group=g))
        ck.expect("single-member all_reduce", mismatch(a, np.arange(4.0), "float64"))
    else:
        ck.expect("non-member get_rank", None if dist.get_rank(g) == -1 else str(dist.get_rank(g)))
        ck.expect("non-member group is not the world", None if g is not dist.group.WORLD else "is WORLD")
        try:
            ws_g = dist.get_world_size(g)
        except Exception as e:
            ws_g = f"raised {type(e).__name__}: {e}"
        ck.expect("non-member get_world_size", None if ws_g == -1 else f"{ws_g} (torch gives -1)")
        # torch: a collective on a group the caller is not in warns and returns without touching data
        a = np.arange(4.0)
        try:
            dist.all_reduce(a, group=g)
        except (ValueError, RuntimeError):
            pass
        ck.expect("non-member all_reduce leaves the array alone", mismatch(a, np.arange(4.0), "float64"))
    b = np.full(2, rank + 1.0)
    ck.call("world all_reduce", lambda: dist.all_reduce(b))
    ck.expect("world all_reduce", mismatch(b, np.full(2, ws * (ws + 1) / 2), "float64"))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_non_members_get_a_sentinel_group_with_rank_minus_one(ws):
    assert_clean(run(_nonmember_child, ws))


def _world_child(rank, ws):
    ck = Checker(rank)
    W = dist.group.WORLD
    ck.expect("get_rank(WORLD)", None if dist.get_rank(W) == rank else str(dist.get_rank(W)))
    ck.expect("get_world_size(WORLD)", None if dist.get_world_size(W) == ws else str(dist.get_world_size(W)))
    a = np.full(5, rank + 1, dtype=np.int32)
    ck.call("all_reduce group=WORLD", lambda: dist.all_reduce(a, group=W))
    ck.expect("all_reduce group=WORLD", mismatch(a, np.full(5, ws * (ws + 1) // 2, np.int32), "int32"))
    b = np.full(5, rank, dtype=np.int32)
    ck.call("broadcast group=WORLD", lambda: dist.broadcast(b, ws - 1, group=W))
    ck.expect("broadcast group=WORLD", mismatch(b, np.full(5, ws - 1, np.int32), "int32"))
    g = dist.new_group()  # ranks=None: everyone
    ck.expect("new_group() rank", None if dist.get_rank(g) == rank else str(dist.get_rank(g)))
    ck.expect("new_group() size", None if dist.get_world_size(g) == ws else str(dist.get_world_size(g)))
    c = np.full(5, rank + 1, dtype=np.int32)
    ck.call("all_reduce new_group()", lambda: dist.all_reduce(c, group=g))
    ck.expect("all_reduce new_group()", mismatch(c, np.full(5, ws * (ws + 1) // 2, np.int32), "int32"))
    g2 = dist.new_group(list(range(ws)), timeout=timedelta(seconds=60))
    d = np.full(5, rank + 1, dtype=np.int32)
    ck.call("all_reduce new_group(timeout=)", lambda: dist.all_reduce(d, group=g2))
    ck.expect("all_reduce new_group(timeout=)", mismatch(d, np.full(5, ws * (ws + 1) // 2, np.int32), "int32"))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_group_world_and_new_group_without_ranks_cover_every_rank(ws):
    assert_clean(run(_world_child, ws))


def _alternate_child(rank, ws):
    """Two overlapping groups (and the world) used alternately, blocking and async."""
    ck = Checker(rank)
    r1 = [0, 1]
    r2 = list(range(1, ws)) if ws >= 3 else [0, 1]  # ws=2: a second, distinct group on the same ranks
    g1 = dist.new_group(r1)
    g2 = dist.new_group(r2)
    for it in range(20):
        pend = []
        for ranks, g, base in ((r1, g1, 1000), (r2, g2, 2000)):
            if rank not in ranks:
                continue
            n = 5 + (it * 7) % 50 + (30000 if it % 5 == 0 else 0)
            xs = {r: rank_input("float32", n, base + 10 * it + r, "small") for r in ranks}
            a = xs[rank].copy()
            want = reduce_ref([xs[r] for r in ranks], "SUM", "float32")
            label = f"iteration {it} group {ranks}"
            if it % 2:
                pend.append((label, dist.all_reduce(a, group=g, async_op=True), a, want))
            else:
                ck.call(label, lambda: dist.all_reduce(a, group=g))
                ck.expect(label, mismatch(a, want, "float32"))
        for label, w, a, want in pend:
            if ck.call(label + " wait", lambda: w.wait()):
                ck.expect(label, mismatch(a, want, "float32"))
        if it % 4 == 3:
            b = np.full(3, float(it + rank))
            ck.call(f"iteration {it} world", lambda: dist.all_reduce(b))
            ck.expect(f"iteration {it} world", mismatch(b, np.full(3, float(sum(it + r for r in range(ws)))),
                                                        "float64"))
    return ck.report()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_two_overlapping_groups_used_alternately_stay_independent(ws):
    assert_clean(run(_alternate_child, ws), min_checks=20)


# ------------------------------------------------------------ use_local_synchronization (issue 50)

def _sum_in(g, rank, ranks):
    a = np.full(3, rank + 1.0)
    dist.all_reduce(a, group=g)
    return a, np.full(3, float(sum(r + 1 for r in ranks)))


def _local_disjoint_child(rank, ws, rounds):
    """Ranks 0,1 make [0, 1] while ranks 2,3 make [2, 3], each pair alone (the pattern the
    option exists for), several times over (a repeated rank list gets a name of its own)."""
    ck = Checker(rank)
    mine = [0, 1] if rank < 2 else [2, 3]
    names = []
    for it in range(rounds):
        g = dist.new_group(mine, use_local_synchronization=True)
        names.append(g.group_name)
        got, want = _sum_in(g, rank, mine)
        ck.expect(f"round {it}: all_reduce in {mine}", mismatch(got, want, "float64"))
        if it % 2:
            dist.destroy_process_group(g)
    ck.expect("each round's group has a name of its own",
              None if len(set(names)) == len(names) else f"names repeat: {names}")
    return ck.report(), names


def test_local_synchronization_groups_of_disjoint_ranks_made_at_once_stay_apart():
    outs = run(_local_disjoint_child, 4, 6, timeout=120, init_kwargs={"timeout": timedelta(seconds=30)})
    assert_clean([o[0] for o in outs], min_checks=7)
    names = [o[1] for o in outs]
    assert names[0] == names[1] and names[2] == names[3], names   # members agree on the name
    assert not set(names[0]) & set(names[2]), names                # the two pairs never share one


def _local_overlap_child(rank, ws):
    """Overlapping groups, each made by its members only: [0, 1] by ranks 0 and 1 and [1, 2] by
    ranks 1 and 2 (rank 1 makes both); rank 3 makes none.  Then a group every rank makes (its
    name comes from a count every rank advances: the local groups must not have moved it)."""
    ck = Checker(rank)
    made = {}
    for ranks in ([0, 1], [1, 2]):
        if rank in ranks:
            made[tuple(ranks)] = dist.new_group(ranks, use_local_synchronization=True)
    # a non-member's call with the option returns at once, without the members
    other = dist.new_group([0, 1], use_local_synchronization=True) if rank == 3 else None
    if rank == 3:
        ck.expect("non-member gets NON_GROUP_MEMBER",
                  None if other is dist.GroupMember.NON_GROUP_MEMBER else repr(other))
    for ranks, g in made.items():
        for it in range(3):
            got, want = _sum_in(g, rank, ranks)
            ck.expect(f"all_reduce {it} in {list(ranks)}", mismatch(got, want, "float64"))
    everyone = dist.new_group([3, 2, 1, 0])
    got, want = _sum_in(everyone, rank, range(ws))
    ck.expect("all_reduce in a group every rank made afterwards", mismatch(got, want, "float64"))
    sub = dist.new_group([0, 2])
    if rank in (0, 2):
        got, want = _sum_in(sub, rank, [0, 2])
        ck.expect("all_reduce in [0, 2] made by every rank", mismatch(got, want, "float64"))
    return ck.report()


def test_local_synchronization_groups_overlapping_and_then_a_group_of_every_rank():
    assert_clean(run(_local_overlap_child, 4, timeout=120,
                     init_kwargs={"timeout": timedelta(seconds=20)}), min_checks=2)


def _local_names_child(rank, ws):
    # the same rank list made twice by its members: two groups, both live, each its own
    g1 = dist.new_group([0, 1], use_local_synchronization=True)
    g2 = dist.new_group([0, 1], use_local_synchronization=True)
    a, b = np.full(2, rank + 1.0), np.full(2, 10.0 * (rank + 1))
    w1 = dist.all_reduce(a, group=g1, async_op=True)
    w2 = dist.all_reduce(b, group=g2, async_op=True)
    w2.wait(timeout=30)
    w1.wait(timeout=30)
    return g1.group_name, g2.group_name, a.tolist(), b.tolist()


def test_local_synchronization_names_follow_torch_and_repeat_lists_get_new_ones():
    import hashlib

    outs = run(_local_names_child, 2, timeout=60)
    first = hashlib.sha1(b"0_1").hexdigest()   # torch's _hash_ranks_to_str
    second = hashlib.sha1((first + "_").encode()).hexdigest()
    for n1, n2, a, b in outs:
        assert (n1, n2) == (first, second)
        assert a == [3.0, 3.0] and b == [30.0, 30.0]


def _key_count_child(rank, ws, cycles):
    store = dist.distributed_c10d._get_default_store()
    counts = []
    for it in range(cycles):
        g = dist.new_group(list(range(ws)))
        a = np.ones(2)
        dist.all_reduce(a, group=g)
        dist.destroy_process_group(g)
        if rank in (0, 1):
            h = dist.new_group([0, 1], use_local_synchronization=True)
            dist.all_reduce(a, group=h)
            dist.destroy_process_group(h)
        dist.barrier()
        if rank == 0:
            counts.append(store.num_keys())
        dist.barrier()   # nobody starts the next cycle's keys before rank 0 counted
    return counts


def test_destroyed_groups_leave_no_keys_in_the_store():
    counts = run(_key_count_child, 3, 30, timeout=120)[0]
    # keys are deleted when every rank has connected: after the first cycles the count stays put
    assert counts[-1] == counts[2], f"the store grew from {counts[2]} to {counts[-1]} keys: {counts}"
