"""DataLoader: torch.utils.data.DataLoader for NumPy data.

Same arguments, checks and messages as torch's.  num_workers > 0 starts
worker processes (fork where available, else spawn; or the given
multiprocessing_context), each with its own index queue; batches are handed
out round-robin, prefetch_factor per worker ahead, and yielded in sampler
order, so the batches equal those of num_workers=0.  A worker's exception is
re-raised in the main process with the worker's traceback; a worker that
dies raises RuntimeError naming its pid; every wait has a timeout.  Workers
are stopped (joined, then terminated) when the iterator is exhausted (unless
persistent_workers), deleted or garbage-collected, or fails for good (a dead
worker, a timeout), and exit on their own if the main process disappears.  An
iterator still alive when Python exits (a global, or a local of a frame an
uncaught exception's traceback keeps) only signals its workers, as torch's
does nothing then: a queue put at that point can start a feeder thread that
never runs, and the process would wait for it forever instead of exiting.

Workers are forked even after this process used CUDA, as torch's are (most
workers never touch CUDA): a forked worker that calls pyddp's CUDA functions
gets a RuntimeError saying it cannot (the CUDA runtime refuses a child forked
after its parent initialised CUDA), re-raised here; such a dataset needs
multiprocessing_context="spawn".
"""
import itertools
import multiprocessing as python_multiprocessing
import os
import pickle
import queue
import sys
import warnings

from ... import _random
from . import _collate, _utils
from ._worker import (MP_STATUS_CHECK_INTERVAL, ExceptionWrapper,
                      _create_fetcher, _IterableDatasetStopIteration,
                      _ResumeIteration, _worker_loop)
from .dataset import IterableDataset
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler,
                      _InfiniteConstantSampler)

__all__ = ["DataLoader"]


class _DatasetKind:
    Map = 0
    Iterable = 1


def _default_context():
    methods = python_multiprocessing.get_all_start_methods()
    return python_multiprocessing.get_context(
        "fork" if "fork" in methods else "spawn")


class DataLoader:
    """Combines a dataset and a sampler and iterates over batches.

    Arguments as torch.utils.data.DataLoader: dataset, batch_size=1,
    shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
    collate_fn=None (default_collate: pyddp Tensor batches), pin_memory=False,
    drop_last=False, timeout=0, worker_init_fn=None,
    multiprocessing_context=None, generator=None, and keyword-only
    prefetch_factor=None (2 with workers), persistent_workers=False,
    pin_memory_device="", in_order=True.

    pin_memory: torch tensors in a batch are pinned (``Tensor.pin_memory()``,
    so ``.cuda(non_blocking=True)`` copies asynchronously, as with torch's
    loader) when torch sees a CUDA device; without one nothing is pinned (as
    torch's loader, which then warns). pyddp Tensors live in ordinary host
    memory and are left as they are.

    Each iterator draws a 63-bit base seed from generator (or the default
    generator) as torch does, so with shuffle=True and a seeded generator the
    batch order equals torch's; worker i seeds Python's random and pyddp's
    default generator with base_seed + i and NumPy's global RNG with torch's
    derived state.
    """

    __initialized = False

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=None,
                 persistent_workers=False, pin_memory_device="",
                 in_order=True):
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; "
                "use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in "
                "multiprocessing.let num_workers > 0 to enable "
                "multiprocessing, otherwise set prefetch_factor to None.")
        elif num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        if isinstance(dataset, IterableDataset):
            self._dataset_kind = _DatasetKind.Iterable
            if shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified "
                    f"shuffle option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified "
                    f"sampler option, but got sampler={sampler}")
            elif batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified "
                    f"batch_sampler option, but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = _DatasetKind.Map

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")

        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive "
                    "with batch_size, shuffle, sampler, and "
                    "drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None:
            if drop_last:
                raise ValueError(
                    "batch_size=None option disables auto-batching "
                    "and is mutually exclusive with drop_last")

        if sampler is None:
            if self._dataset_kind == _DatasetKind.Iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)

        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator

        if collate_fn is None:
            if self._auto_collation:
                collate_fn = _collate.default_collate
            else:
                collate_fn = _collate.default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self.__initialized = True
        self._IterableDataset_len_called = None
        self._iterator = None
        self.check_worker_number_rationality()

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        self.check_worker_number_rationality()
        return _MultiProcessingDataLoaderIter(self)

    @property
    def multiprocessing_context(self):
        """The multiprocessing context workers start from (None: fork where
        available, else spawn)."""
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, multiprocessing_context):
        if multiprocessing_context is not None:
            if self.num_workers > 0:
                if isinstance(multiprocessing_context, str):
                    valid = python_multiprocessing.get_all_start_methods()
                    if multiprocessing_context not in valid:
                        raise ValueError(
                            "multiprocessing_context option should specify a "
                            f"valid start method in {valid!r}, but got "
                            f"multiprocessing_context={multiprocessing_context!r}")
                    multiprocessing_context = python_multiprocessing.get_context(
                        multiprocessing_context)
                if not isinstance(multiprocessing_context,
                                  python_multiprocessing.context.BaseContext):
                    raise TypeError(
                        "multiprocessing_context option should be a valid "
                        "context object or a string specifying the start "
                        "method, but got "
                        f"multiprocessing_context={multiprocessing_context}")
            else:
                raise ValueError(
                    "multiprocessing_context can only be used with "
                    "multi-process loading (num_workers > 0), but got "
                    f"num_workers={self.num_workers}")
        self.__multiprocessing_context = multiprocessing_context

    def __setattr__(self, attr, val):
        if self.__initialized and attr in (
                "batch_size", "batch_sampler", "sampler", "drop_last",
                "dataset", "persistent_workers"):
            raise ValueError(
                f"{attr} attribute should not be set after "
                f"{self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    def __iter__(self):
        """A new iterator over the batches (with persistent_workers, the
        same one, reset)."""
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        if self._auto_collation:
            return self.batch_sampler
        return self.sampler

    def __len__(self):
        if self._dataset_kind == _DatasetKind.Iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    length = length // self.batch_size
                else:
                    length = -(-length // self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self):
        """Warn when num_workers exceeds the CPUs this process may use."""
        if not self.num_workers:
            return
        if hasattr(os, "sched_getaffinity"):
            try:
                max_workers = len(os.sched_getaffinity(0))
                cpuset_checked = True
            except Exception:
                max_workers, cpuset_checked = os.cpu_count(), False
        else:
            max_workers, cpuset_checked = os.cpu_count(), False
        if max_workers is None or self.num_workers > max_workers:
            suggest = (
                f"Our suggested max number of worker in current system is "
                f"{max_workers}{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}"
                ", which is smaller than what this DataLoader is going to create."
                if max_workers is not None else
                "DataLoader is not able to compute a suggested max number of "
                "worker in current system.")
            warnings.warn(
                f"This DataLoader will create {self.num_workers} worker "
                f"processes in total. {suggest} Please be aware that excessive "
                "worker creation might get DataLoader running slow or even "
                "freeze, lower the worker number to avoid potential "
                "slowness/freeze if necessary.", stacklevel=3)


def _pinning_available() -> bool:
    """Whether pin_memory pins: torch is loaded (the batches can hold its tensors) and sees CUDA."""
    from ..._detect import loaded_torch

    torch = loaded_torch()
    return torch is not None and torch.cuda.is_available()


def _pin(data):
    """torch's pin_memory of a batch: torch tensors in nested tuples, lists and dicts pinned."""
    from ..._detect import is_torch_tensor

    if is_torch_tensor(data):
        return data if data.is_pinned() else data.pin_memory()
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_pin(d) for d in data)
    if isinstance(data, dict):
        return type(data)((k, _pin(v)) for k, v in data.items())
    return data


class _BaseDataLoaderIter:
    def __init__(self, loader):
        self._dataset = loader.dataset
        self._dataset_kind = loader._dataset_kind
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._sampler_iter = iter(self._index_sampler)
        gen = loader.generator if loader.generator is not None \
            else _random.default_generator
        self._base_seed = gen._random_int64()
        self._persistent_workers = loader.persistent_workers
        self._num_yielded = 0
        self._pin = bool(loader.pin_memory) and _pinning_available()
        self._profile_name = f"enumerate(DataLoader)#{self.__class__.__name__}.__next__"

    def __iter__(self):
        return self

    def _reset(self, loader, first_iter=False):
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _next_index(self):
        return next(self._sampler_iter)

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        if self._sampler_iter is None:
            self._reset()
        data = self._next_data()
        if isinstance(data, ExceptionWrapper):
            # Raise from a frame that no longer refers to the iterator, so
            # a caught exception (its traceback) does not keep the iterator
            # and its workers alive after the caller drops it.
            del self
            data.reraise()
        if self._pin:
            data = _pin(data)
        self._num_yielded += 1
        if (self._dataset_kind == _DatasetKind.Iterable
                and self._IterableDataset_len_called is not None
                and self._num_yielded > self._IterableDataset_len_called):
            warnings.warn(
                f"Length of IterableDataset {self._dataset} was reported to "
                f"be {self._IterableDataset_len_called} (when accessing "
                f"len(dataloader)), but {self._num_yielded} samples have been "
                "fetched. ", stacklevel=2)
        return data

    def __len__(self):
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{self.__class__.__name__} cannot be pickled")


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._dataset_fetcher = _create_fetcher(
            self._dataset_kind == _DatasetKind.Iterable, self._dataset,
            self._auto_collation, self._collate_fn, self._drop_last)

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        return self._dataset_fetcher.fetch(index)  # may raise StopIteration


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        ctx = loader.multiprocessing_context or _default_context()
        self._worker_init_fn = loader.worker_init_fn
        self._shutdown = False
        self._workers = []
        self._index_queues = []
        self._worker_result_queue = ctx.Queue()
        self._workers_done_event = ctx.Event()
        self._workers_status = []
        try:
            for i in range(self._num_workers):
                index_queue = ctx.Queue()
                index_queue.cancel_join_thread()
                w = ctx.Process(
                    target=_worker_loop,
                    args=(self._dataset_kind == _DatasetKind.Iterable,
                          self._dataset, index_queue,
                          self._worker_result_queue, self._workers_done_event,
                          self._auto_collation, self._collate_fn,
                          self._drop_last, self._base_seed,
                          self._worker_init_fn, i, self._num_workers,
                          os.getpid()),
                    daemon=True)
                w.start()
                self._index_queues.append(index_queue)
                self._workers.append(w)
                self._workers_status.append(True)
        except BaseException:
            self._shutdown_workers()
            raise
        self._data_queue = self._worker_result_queue
        self._reset(loader, first_iter=True)

    def _reset(self, loader, first_iter=False):
        super()._reset(loader, first_iter)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True for _ in range(self._num_workers)]
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            for idx in range(self._num_workers):
                self._index_queues[idx].put(_ResumeIteration())
            resume_iteration_cnt = self._num_workers
            while resume_iteration_cnt > 0:
                return_idx, _ = self._get_data(raw=True)
                if isinstance(return_idx, _ResumeIteration):
                    resume_iteration_cnt -= 1
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_get_data(self, timeout=MP_STATUS_CHECK_INTERVAL):
        try:
            return True, self._data_queue.get(timeout=timeout)
        except Exception as e:
            failed = [w for wid, w in enumerate(self._workers)
                      if self._workers_status[wid] and not w.is_alive()]
            if failed:
                pids = ", ".join(str(w.pid) for w in failed)
                codes = ", ".join(str(w.exitcode) for w in failed)
                # The iterator cannot go on: stop the other workers now
                # rather than when the exception's traceback is freed.
                self._shutdown_workers()
                raise RuntimeError(
                    f"DataLoader worker (pid(s) {pids}) exited unexpectedly "
                    f"(exit code(s) {codes})") from e
            if isinstance(e, queue.Empty):
                return False, None
            raise

    def _get_data(self, raw=False):
        if self._timeout > 0:
            ok, item = self._try_get_data(self._timeout)
            if not ok:
                # As torch: raise at once; the workers are shut down with the
                # iterator (shutting them down first took seconds).
                raise RuntimeError(
                    f"DataLoader timed out after {self._timeout} seconds")
        else:
            while True:
                ok, item = self._try_get_data()
                if ok:
                    break
        idx, payload = item
        if payload is not None and not isinstance(idx, _ResumeIteration):
            payload = pickle.loads(payload)
        return idx, payload

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx, None)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration

            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

            assert not self._shutdown and self._tasks_outstanding > 0
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if (self._dataset_kind == _DatasetKind.Iterable
                    and isinstance(data, _IterableDatasetStopIteration)):
                if self._persistent_workers:
                    self._workers_status[data.worker_id] = False
                else:
                    self._mark_worker_as_unavailable(data.worker_id)
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if not self._in_order:
                    worker_id = self._task_info.pop(idx)[0]
                    return self._process_data(data, worker_id)
                if idx in self._task_info:
                    self._task_info[idx] += (data,)
                continue
            worker_id = self._task_info.pop(idx)[0]
            self._rcvd_idx += 1
            return self._process_data(data, worker_id)

    def _try_put_index(self):
        assert self._tasks_outstanding < self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_queue_idx = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_queue_idx]:
                break
        else:
            return  # no active worker left
        self._index_queues[worker_queue_idx].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _process_data(self, data, worker_idx):
        # An ExceptionWrapper is returned: __next__ raises it.
        self._try_put_index()
        return data

    def _mark_worker_as_unavailable(self, worker_id, shutdown=False):
        q = self._index_queues[worker_id]
        q.put(None)
        self._workers_status[worker_id] = False

    def _shutdown_workers(self):
        """Stop every worker: ask, join with a timeout, then terminate and
        kill what is left.  Safe to call more than once."""
        if getattr(self, "_shutdown", True):
            return
        self._shutdown = True
        if _utils is None or _utils.python_exit_status is not False or sys.is_finalizing():
            # Python is exiting (torch returns here too): no queue put, which could start a
            # feeder thread, and a thread started while the interpreter finalises never runs,
            # so Thread.start would wait for it forever and the process never exit.  Signal the
            # workers, without a thread and without waiting; multiprocessing's exit hook (or
            # the workers' own check of their parent) ends them in any case.
            for w in self._workers:
                try:
                    w.terminate()
                except Exception:
                    pass
            return
        try:
            self._workers_done_event.set()
            for worker_id in range(len(self._workers)):
                if self._persistent_workers or self._workers_status[worker_id]:
                    try:
                        self._mark_worker_as_unavailable(worker_id,
                                                         shutdown=True)
                    except Exception:
                        pass
            for w in self._workers:
                w.join(timeout=2 * MP_STATUS_CHECK_INTERVAL + 1.0)
        finally:
            for w in self._workers:
                if w.is_alive():
                    w.terminate()
                    w.join(timeout=2.0)
                if w.is_alive():
                    w.kill()
                    w.join(timeout=2.0)
            for q in self._index_queues:
                q.cancel_join_thread()
                q.close()
            self._worker_result_queue.cancel_join_thread()
            self._worker_result_queue.close()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:
            # At interpreter exit the modules used here may be gone; the
            # workers are daemonic and exit with the parent anyway.
            pass
