"""DataLoader worker processes: the loop each worker runs, its seeding,
get_worker_info(), and the wrapper that carries a worker's exception (with
its traceback) to the main process."""
import os
import pickle
import queue
import random
import sys
import traceback

import numpy as np

from ... import _random

__all__ = ["get_worker_info", "WorkerInfo", "ExceptionWrapper"]

# How often a waiting worker / main process checks that its peer is alive.
MP_STATUS_CHECK_INTERVAL = 0.5


class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker: id, num_workers,
    seed (this worker's seed: base_seed + id) and dataset (the worker's own
    copy).  Read-only."""

    __initialized = False

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.__keys = tuple(kwargs.keys())
        self.__initialized = True

    def __setattr__(self, key, val):
        if self.__initialized:
            raise RuntimeError(
                f"Cannot assign attributes to {self.__class__.__name__} objects")
        return super().__setattr__(key, val)

    def __repr__(self):
        items = [f"{k}={getattr(self, k)}" for k in self.__keys]
        return f"{self.__class__.__name__}({', '.join(items)})"


_worker_info = None


def get_worker_info():
    """The current DataLoader worker's WorkerInfo, or None in the main
    process (torch.utils.data.get_worker_info)."""
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, re-raised in the main process with
    the worker's formatted traceback in its message (torch's format:
    "Caught ValueError in DataLoader worker process 0.\\nOriginal Traceback
    (most recent call last): ...")."""

    def __init__(self, exc_info=None, where="in background"):
        if exc_info is None:
            exc_info = sys.exc_info()
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        """Raise the wrapped exception (its type, or RuntimeError if that
        type cannot be built from a message)."""
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = _KeyErrorMessage(msg)
        elif getattr(self.exc_type, "message", None):
            raise self.exc_type(message=msg)
        try:
            exception = self.exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from None
        raise exception


class _KeyErrorMessage(str):
    """KeyError quotes its message; this keeps the newlines readable."""

    def __repr__(self):
        return self


class _IterableDatasetStopIteration:
    def __init__(self, worker_id):
        self.worker_id = worker_id


class _ResumeIteration:
    """Sent to persistent workers at the start of a new epoch."""


def _generate_state(base_seed, worker_id):
    """torch's NumPy seed for a worker: 4 uint32 words hashed from
    (worker_id, base_seed) (torch/utils/data/_utils/worker.py)."""
    INIT_A = 0x43B0D7E5
    MULT_A = 0x931E8875
    INIT_B = 0x8B51F9DD
    MULT_B = 0x58F38DED
    MIX_MULT_L = 0xCA01F9DD
    MIX_MULT_R = 0x4973F715
    XSHIFT = 4 * 8 // 2
    MASK32 = 0xFFFFFFFF

    entropy = [worker_id, base_seed & MASK32, base_seed >> 32, 0]
    pool = [0] * 4
    hash_const_A = INIT_A

    def hash(value):
        nonlocal hash_const_A
        value = (value ^ hash_const_A) & MASK32
        hash_const_A = (hash_const_A * MULT_A) & MASK32
        value = (value * hash_const_A) & MASK32
        value = (value ^ (value >> XSHIFT)) & MASK32
        return value

    def mix(x, y):
        result_x = (MIX_MULT_L * x) & MASK32
        result_y = (MIX_MULT_R * y) & MASK32
        result = (result_x - result_y) & MASK32
        result = (result ^ (result >> XSHIFT)) & MASK32
        return result

    for i in range(len(pool)):
        pool[i] = hash(entropy[i])
    for i_src in range(len(pool)):
        for i_dst in range(len(pool)):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hash(pool[i_src]))
    hash_const_B = INIT_B
    state = []
    for i_dst in range(4):
        data_val = pool[i_dst]
        data_val = (data_val ^ hash_const_B) & MASK32
        hash_const_B = (hash_const_B * MULT_B) & MASK32
        data_val = (data_val * hash_const_B) & MASK32
        data_val = (data_val ^ (data_val >> XSHIFT)) & MASK32
        state.append(data_val)
    return state


# ------------------------------------------------------------- fetchers

class _MapDatasetFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last

    def fetch(self, possibly_batched_index):
        if self.auto_collation:
            if callable(getattr(self.dataset, "__getitems__", None)):
                data = self.dataset.__getitems__(possibly_batched_index)
            else:
                data = [self.dataset[idx] for idx in possibly_batched_index]
        else:
            data = self.dataset[possibly_batched_index]
        return self.collate_fn(data)


class _IterableDatasetFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.dataset_iter = iter(dataset)
        self.ended = False

    def fetch(self, possibly_batched_index):
        if self.ended:
            raise StopIteration
        if self.auto_collation:
            data = []
            for _ in possibly_batched_index:
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
            if len(data) == 0 or (
                    self.drop_last and len(data) < len(possibly_batched_index)):
                raise StopIteration
        else:
            data = next(self.dataset_iter)
        return self.collate_fn(data)


def _create_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last):
    cls = _IterableDatasetFetcher if iterable else _MapDatasetFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)


def _dumps(obj):
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _worker_loop(iterable, dataset, index_queue, data_queue, done_event,
                 auto_collation, collate_fn, drop_last, base_seed, init_fn,
                 worker_id, num_workers, parent_pid):
    """Run in each worker: fetch the batches whose indices arrive on
    index_queue and put (task index, pickled batch or ExceptionWrapper) on
    data_queue, until None arrives, done_event is set or the parent dies."""
    global _worker_info
    try:
        seed = base_seed + worker_id
        random.seed(seed)
        _random.default_generator.manual_seed(seed)
        np.random.seed(_generate_state(base_seed, worker_id))
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers,
                                  seed=seed, dataset=dataset)
        where = f"in DataLoader worker process {worker_id}"
        init_exception = None
        fetcher = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = _create_fetcher(iterable, dataset, auto_collation,
                                      collate_fn, drop_last)
        except Exception:
            init_exception = ExceptionWrapper(where=where)
        iteration_end = False
        while True:
            try:
                r = index_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
            except queue.Empty:
                if os.getppid() != parent_pid:
                    break  # the main process is gone: do not linger
                continue
            if r is None:
                break
            if isinstance(r, _ResumeIteration):
                data_queue.put((r, None))
                iteration_end = False
                if fetcher is not None:  # init_fn succeeded
                    try:
                        fetcher = _create_fetcher(iterable, dataset,
                                                  auto_collation, collate_fn,
                                                  drop_last)
                    except Exception:
                        init_exception = ExceptionWrapper(where=where)
                continue
            if done_event.is_set() or iteration_end:
                continue
            idx, index = r
            if init_exception is not None:
                data = init_exception
                init_exception = None
            else:
                try:
                    data = fetcher.fetch(index)
                except Exception as e:
                    if isinstance(e, StopIteration) and iterable:
                        data = _IterableDatasetStopIteration(worker_id)
                        iteration_end = True
                    else:
                        data = ExceptionWrapper(where=where)
            try:
                payload = _dumps(data)
            except Exception:
                payload = _dumps(ExceptionWrapper(
                    where=f"pickling a batch {where}"))
            data_queue.put((idx, payload))
            del data, idx, index, r, payload
    except KeyboardInterrupt:
        pass
    # The queue's feeder thread holds the queue's write lock, shared with
    # the other workers, while it writes.  Exiting without joining it can
    # leave that lock taken forever and hang every other worker, so it is
    # only skipped when nobody reads any more (shutdown, or the main
    # process is gone); otherwise the exit waits for the last put to reach
    # the pipe.
    if done_event.is_set() or os.getppid() != parent_pid:
        data_queue.cancel_join_thread()
    data_queue.close()
