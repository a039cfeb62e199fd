"""ZeroRedundancyOptimizer (torch.distributed.optim.ZeroRedundancyOptimizer) for pyddp.

The optimizer state is sharded: the parameters are split among the ranks of the process group
(torch's partition: per parameter group, largest first, each to the rank holding the fewest
elements so far); every rank runs ``optimizer_class`` on its own shard only, then each rank's
updated parameters are broadcast from it. For optimizers that update each parameter on its own
(SGD, Adam, AdamW, ...) the parameters are the same as with the unsharded optimizer, while each
rank keeps about 1/world_size of the state. ``consolidate_state_dict(to)`` gathers the shards on
one rank, whose ``state_dict()`` then has the unsharded optimizer's layout; ``load_state_dict``
takes such a dict on every rank (each keeps its shard).
"""
from __future__ import annotations

import copy
from itertools import chain

import numpy as np

from ..._interop import host_array
from ...optim.optimizer import Optimizer, _state_value
from .. import distributed_c10d as c10d
from ..algorithms.join import Join, Joinable, JoinHook

__all__ = ["ZeroRedundancyOptimizer"]


class _ZeROJoinHook(JoinHook):
    """A joined rank still steps (its shard, with the gradients DDP's join hook installed) and
    broadcasts its parameters, as the active ranks expect."""

    def __init__(self, zero):
        self.zero = zero

    def main_hook(self):
        self.zero.step()


class ZeroRedundancyOptimizer(Optimizer, Joinable):
    """``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
    parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults)``: ``optimizer_class``
    (e.g. pyddp.optim.Adam) built with ``**defaults`` over this rank's shard of ``params``.

    ``parameters_as_bucket_view=True`` broadcasts each rank's shard as one flat buffer instead of
    one broadcast per parameter (the parameters are the same either way). ``overlap_with_ddp=True``
    (stepping inside DDP's communication hook) is not supported: it raises ValueError.
    """

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults):
        if overlap_with_ddp:
            raise ValueError("ZeroRedundancyOptimizer(overlap_with_ddp=True) is not supported by "
                             "pyddp (it steps inside DDP's communication hook); use "
                             "overlap_with_ddp=False, which gives the same parameters")
        if not isinstance(optimizer_class, type) or not issubclass(optimizer_class, Optimizer):
            raise TypeError("ZeroRedundancyOptimizer: optimizer_class must be a pyddp.optim "
                            f"Optimizer class (e.g. pyddp.optim.SGD), got {optimizer_class!r}")
        params = self._verify_and_init_params(params)
        self._verify_same_dense_param_type()
        self.initialized = False
        Optimizer.__init__(self, params, defaults)
        Joinable.__init__(self)
        if process_group is None:
            if not c10d.is_initialized():
                raise RuntimeError("Default process group has not been initialized, please make "
                                   "sure to call init_process_group.")
            process_group = c10d._default_pg()
        self.process_group = process_group
        self.world_size = c10d.get_world_size(process_group)
        self.rank = c10d.get_rank(process_group)
        if self.rank < 0:
            raise ValueError("ZeroRedundancyOptimizer: this process is not a member of "
                             "process_group")
        self.global_rank = c10d.get_global_rank(process_group, self.rank)
        self._overlap_with_ddp = False
        self._optim_defaults = defaults
        self._optim_constructor = optimizer_class
        self._partition_cache = []
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._init_local_optimizer()
        self._all_state_dicts = []
        self.initialized = True

    # ------------------------------------------------------------------ construction helpers

    def _verify_and_init_params(self, params):
        if isinstance(getattr(params, "_data", None), np.ndarray) or hasattr(params, "__array__"):
            raise TypeError("`params` argument should be an iterable of Tensors, but got "
                            f"{type(params).__name__}")
        try:
            all_params = list(params)
        except TypeError as e:
            raise TypeError("`params` argument should be an iterable of Tensors or dicts, but "
                            f"got {type(params).__name__}") from e
        if not all_params:
            raise ValueError("ZeroRedundancyOptimizer got an empty parameter list")
        all_dicts = all(isinstance(p, dict) for p in all_params)
        if all_dicts:
            self._all_params = []
            for g in all_params:
                if "params" not in g:
                    raise ValueError("Each parameter group passed-in via `params` must have a "
                                     "'params' key mapping to the parameters in the group")
                self._all_params.extend(list(g["params"]))
        elif any(isinstance(p, dict) for p in all_params):
            raise TypeError("`params` argument should be an iterable of Tensors or dicts")
        else:
            self._all_params = all_params
        return all_params

    def _verify_same_dense_param_type(self):
        dtypes = {str(host_array(p).dtype) for p in self._all_params}
        if len(dtypes) > 1:
            raise ValueError("ZeroRedundancyOptimizer only supports using the same dense type for "
                             f"all parameters but got {sorted(dtypes)}")

    def _clear_cache(self):
        self._partition_cache = []

    def _partition_parameters(self):
        """Per rank, the list of its parameter groups (copies of ours holding its parameters)."""
        if not self._partition_cache:
            parts = [[] for _ in range(self.world_size)]
            sizes = [0] * self.world_size
            for group in self.param_groups:
                per_rank = [[] for _ in range(self.world_size)]
                for p in sorted(group["params"], key=lambda t: host_array(t).size, reverse=True):
                    r = min(range(self.world_size), key=lambda i: (sizes[i], i))
                    per_rank[r].append(p)
                    sizes[r] += host_array(p).size
                for r, ps in enumerate(per_rank):
                    g = copy.copy(group)
                    g["params"] = ps
                    parts[r].append(g)
            self._partition_cache = parts
        return self._partition_cache

    @property
    def _param_to_rank(self):
        return {id(p): r for r, groups in enumerate(self._partition_parameters())
                for g in groups for p in g["params"]}

    @property
    def _index_to_param(self):
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    @property
    def _param_to_index(self):
        return {id(p): i for i, p in enumerate(self._index_to_param)}

    def _init_local_optimizer(self):
        groups = self._partition_parameters()[self.rank]
        self.optim = self._optim_constructor(groups, **self._optim_defaults)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)

    @staticmethod
    def _sync_param_groups(src, dst):
        if len(src) != len(dst):
            raise AssertionError("Mismatch between number of source and destination parameter "
                                 "groups")
        for s, d in zip(src, dst):
            for k in s:
                if k != "params":
                    d[k] = s[k]

    def add_param_group(self, param_group):
        """Add a parameter group (partitioned anew; the new group's shard joins the local
        optimizer)."""
        super().add_param_group(param_group)
        if getattr(self, "initialized", False):
            self._clear_cache()
            groups = self._partition_parameters()[self.rank]
            if len(groups) == len(self.optim.param_groups) + 1:
                self.optim.add_param_group(groups[-1])

    # -------------------------------------------------------------------------------- step

    def step(self, closure=None, **kwargs):
        """Step the local shard, then broadcast every rank's updated parameters from it.
        Returns ``closure()``'s value when given."""
        Join.notify_join_context(self)
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        loss = self.optim.step(**kwargs) if closure is None else \
            self.optim.step(closure=closure, **kwargs)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._sync_params()
        return loss

    def _sync_params(self):
        pg = self.process_group
        for r, groups in enumerate(self._partition_parameters()):
            src = c10d.get_global_rank(pg, r)
            arrays = [host_array(p) for g in groups for p in g["params"]]
            if not arrays:
                continue
            if self.parameters_as_bucket_view:
                flat = np.empty(sum(a.size for a in arrays), dtype=arrays[0].dtype)
                if r == self.rank:
                    np.concatenate([a.reshape(-1) for a in arrays], out=flat)
                c10d.broadcast(flat, src, group=pg)
                if r != self.rank:
                    off = 0
                    for a in arrays:
                        a[...] = flat[off:off + a.size].reshape(a.shape)
                        off += a.size
            else:
                works = [c10d.broadcast(a, src, group=pg, async_op=True) for a in arrays]
                for w in works:
                    w.wait()

    # ------------------------------------------------------------------------- state dicts

    def consolidate_state_dict(self, to=0):
        """Gather every rank's shard of the optimizer state on group rank ``to`` (a collective:
        call it on every rank); then ``state_dict()`` works there."""
        if not isinstance(to, int) or not 0 <= to < self.world_size:
            raise ValueError(f"consolidate_state_dict: to must be a rank of the group "
                             f"(0..{self.world_size - 1}), got {to!r}")
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        self._all_state_dicts = []
        pg = self.process_group
        for r in range(self.world_size):
            obj = [self.optim.state_dict() if r == self.rank else None]
            c10d.broadcast_object_list(obj, src=c10d.get_global_rank(pg, r), group=pg)
            if self.rank == to:
                self._all_state_dicts.append(copy.deepcopy(obj[0]))

    def state_dict(self):
        """The whole optimizer's state in the unsharded optimizer's layout (only on the rank
        that ``consolidate_state_dict`` gathered to)."""
        if not self._all_state_dicts:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. Please call "
                f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand if you meant "
                "to save the global state.")
        sd = super().state_dict()
        index = self._param_to_index
        for r, local in enumerate(self._all_state_dicts):
            global_groups = self._partition_parameters()[r]
            if len(local["param_groups"]) != len(global_groups):
                raise AssertionError("Mismatch between number of local and global parameter "
                                     "groups")
            for lg, gg in zip(local["param_groups"], global_groups):
                for li, p in zip(lg["params"], gg["params"]):
                    if li in local["state"]:
                        sd["state"][index[id(p)]] = local["state"][li]
        sd["state"] = dict(sorted(sd["state"].items()))
        return sd

    def load_state_dict(self, state_dict):
        """Load a (consolidated) state dict on every rank; each keeps its own shard's state."""
        params = self._index_to_param
        owner = self._param_to_rank
        for i, value in state_dict["state"].items():
            if not 0 <= int(i) < len(params):
                raise ValueError(f"load_state_dict: state for parameter index {i}, but the "
                                 f"optimizer has {len(params)} parameters")
            p = params[int(i)]
            if owner[id(p)] == self.rank:
                pdt = np.dtype(host_array(p).dtype).name
                self.optim.state[p] = {k: _state_value(k, v, pdt) for k, v in value.items()}
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        self._clear_cache()
        self._sync_param_groups(self.param_groups, self.optim.param_groups)

    # ------------------------------------------------------------------------------- join

    def join_hook(self, **kwargs):
        """The JoinHook: a joined rank keeps stepping its shard and broadcasting it."""
        return _ZeROJoinHook(self)

    @property
    def join_device(self):
        """The device of the join context's collectives (the CPU)."""
        return "cpu"

    @property
    def join_process_group(self):
        """The process group the shards are broadcast over."""
        return self.process_group
