"""Type stubs for pyddp._C, the C11 extension (csrc/python/).

Internal: user code calls pyddp.distributed, pyddp.optim and pyddp.utils.data, which wrap these.
Arrays are anything exposing the buffer protocol (NumPy arrays; torch CPU tensors through NumPy).
"""
import os
from collections.abc import Sequence
from typing import Any, Final, Optional, Union

_Key = Union[str, bytes]
_Value = Union[str, bytes, bytearray, memoryview]
_Keys = Sequence[_Key]
_Array = Any  # a C-contiguous buffer: numpy.ndarray, or anything with the buffer protocol
_InvScale = Union[float, _Array, None]

# ------------------------------------------------------------------------------------- errors
class DistError(RuntimeError):
    """Base of pyddp's distributed errors (a RuntimeError)."""

class DistBackendError(DistError):
    """A backend (collective) failure or timeout."""

class DistNetworkError(DistError):
    """A network failure: dead peer, lost connection, port in use."""

class DistStoreError(DistError):
    """A store failure, e.g. a key that did not appear in time."""

# ------------------------------------------------------------------------------ operation kinds
K_BROADCAST: Final[int]
K_ALLREDUCE: Final[int]
K_REDUCE: Final[int]
K_ALLGATHER: Final[int]
K_GATHER: Final[int]
K_SCATTER: Final[int]
K_REDUCE_SCATTER: Final[int]
K_ALLTOALL: Final[int]
K_BARRIER: Final[int]
K_MONITORED_BARRIER: Final[int]
K_SEND: Final[int]
K_RECV: Final[int]

# The core's tables (csrc/coll/kinds.c, csrc/kernels/dtype.c): the only source of these codes.
# KINDS[name] = {"code", "rooted", "reduces", "shm", "p2p", "splits", "in", "out"}; "in"/"out" is
# "none", "one", "all" (one block per rank) or "root_all" (one per rank on the root only).
KINDS: Final[dict[str, dict[str, Any]]]
DTYPE_CODES: Final[dict[str, int]]  # "bool": 0 ... "complex128": 14 (pd_dtype order)
DTYPE_SIZES: Final[dict[str, int]]  # bytes per element
REDUCE_OPS: Final[dict[str, int]]  # "SUM": 0 ... "BXOR": 7 (pd_redop order)

# --------------------------------------------------------------------------- the array adapter
def describe_array(obj: Any, writable: bool = ..., dlpack: bool = ...) -> dict[str, Any]:
    """How the C adapter views obj: buffer protocol, then DLPack, then __cuda_array_interface__.
    Keys: via, ptr, nbytes, count, itemsize, dtype, device, device_index, readonly, contiguous,
    stream, shape, strides (bytes; None: C order).  dlpack=False skips DLPack."""

def _register_tensor_type(cls: type) -> None:
    """View instances of cls through their ``_data`` array (Python < 3.12 lacks PEP 688)."""

# -------------------------------------------------------------------------------------- stores
class _Store:
    """Methods shared by every store (not a real base class of the C types)."""

    timeout: float
    def set(self, key: _Key, value: _Value) -> None: ...
    def get(self, key: _Key, timeout_s: Optional[float] = ...) -> bytes: ...
    def add(self, key: _Key, value: int) -> int: ...
    def compare_set(self, key: _Key, expected_value: _Value, desired_value: _Value) -> bytes: ...
    def wait(self, keys: _Keys, timeout_s: Optional[float] = ...) -> None: ...
    def check(self, keys: _Keys) -> bool: ...
    def delete_key(self, key: _Key) -> bool: ...
    def num_keys(self) -> int: ...
    def set_timeout(self, seconds: float) -> None: ...

class TCPStore(_Store):
    """A client of a TCP key-value server; the master also runs the server (one thread)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    def __init__(self, host: str, port: int, world_size: Optional[int] = ...,
                 is_master: bool = ..., timeout_s: float = ..., wait_for_workers: bool = ...,
                 secret: Optional[str] = ..., listen_fd: int = ...) -> None: ...
    def local_addr(self) -> str: ...
    def ping(self) -> None: ...

class FileStore(_Store):
    """A store shared by processes through one file."""

    @property
    def path(self) -> str: ...
    def __init__(self, path: Union[str, bytes, os.PathLike[str]], world_size: int = ...,
                 timeout_s: float = ...) -> None: ...

class HashStore(_Store):
    """An in-memory store for the threads of one process."""

    def __init__(self, timeout_s: float = ...) -> None: ...

# ------------------------------------------------------------------------------ process groups
class Work:
    """Handle of an operation submitted to a process group."""

    def wait(self, timeout: Optional[float] = ...) -> bool: ...
    def is_completed(self) -> bool: ...
    def source_rank(self) -> int: ...

class SharedBuffer:
    """This rank's part of a buffer in the group's shared memory (buffer protocol)."""

    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class ProcessGroup:
    """One member of a pyddp process group (C core)."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def port(self) -> int: ...
    @property
    def transport(self) -> str: ...
    def __init__(self, rank: int, size: int, timeout: float,
                 secret: Optional[str] = ...) -> None: ...
    def connect(self, hosts: list[str], ports: list[int], token: int,
                nodes: Optional[list[str]] = ..., transport: int = ...) -> None: ...
    def submit(self, kind: int, dtype: int, op: int, root: int, tag: int, count: int,
               inputs: tuple[_Array, ...], outputs: tuple[_Array, ...], in_splits: Any,
               out_splits: Any, timeout: float, wait_all: bool, name: str,
               blocking: bool = ...) -> Work: ...
    def fast(self, kind: int, array: _Array, arg: int, input: _Array = ..., /) -> bool: ...
    def shared_alloc(self, nbytes: int, /) -> SharedBuffer: ...
    def destroy(self) -> None: ...

# ---------------------------------------------------------------------------- random, sampling
class Generator:
    """torch's CPU random generator (mt19937), bit for bit."""

    def __init__(self, seed: int = ...) -> None: ...
    def manual_seed(self, seed: int) -> None: ...
    def initial_seed(self) -> int: ...
    def get_state(self) -> bytes: ...
    def set_state(self, state: Union[bytes, bytearray, memoryview, _Array]) -> None: ...
    def random(self) -> int: ...
    def random64(self) -> int: ...
    def randperm_into(self, out: _Array, /) -> None: ...
    def randint_into(self, out: _Array, low: int, range: int, /) -> None: ...
    def exponential_into(self, out: _Array, lambd: float, /) -> None: ...
    def multinomial_into(self, weights: _Array, out: _Array, /) -> None: ...

def dist_num_samples(len: int, num_replicas: int, drop_last: bool, /) -> int: ...
def dist_sampler_indices(len: int, num_replicas: int, rank: int, shuffle: bool, seed: int,
                         drop_last: bool, out: _Array, /) -> None: ...

# --------------------------------------------------------------------------- optimizers and amp
def adam_step(params: Sequence[_Array], grads: Sequence[_Array], exp_avgs: Sequence[_Array],
              exp_avg_sqs: Sequence[_Array], max_exp_avg_sqs: Optional[Sequence[_Array]],
              masters: Optional[Sequence[Optional[_Array]]], steps: Sequence[int], lr: float,
              beta1: float, beta2: float, eps: float, weight_decay: float,
              amsgrad: bool = ..., maximize: bool = ..., decoupled: bool = ...,
              bias_correction: bool = ..., inv_scale: _InvScale = ...,
              found_inf: Optional[_Array] = ..., check_finite: bool = ...) -> bool: ...
def sgd_step(params: Sequence[_Array], grads: Sequence[_Array],
             momentum_buffers: Optional[Sequence[Optional[_Array]]],
             masters: Optional[Sequence[Optional[_Array]]], first: Sequence[bool], lr: float,
             momentum: float, dampening: float, weight_decay: float, nesterov: bool = ...,
             maximize: bool = ..., inv_scale: _InvScale = ..., found_inf: Optional[_Array] = ...,
             check_finite: bool = ...) -> bool: ...
def amp_unscale_(arrays: Sequence[_Array], found_inf: Optional[_Array],
                 inv_scale: Union[float, _Array]) -> bool: ...
def cast_(dsts: Sequence[_Array], srcs: Sequence[_Array]) -> None: ...

# ---------------------------------------------------------------- CUDA runtime and NCCL (cuda.c)
# Loaded at run time, once per process (pyddp/cuda/_lib.py builds the candidate paths); every other
# function raises RuntimeError until its library is loaded.  Addresses and streams are ints.
def _cuda_load(paths: Sequence[Union[str, os.PathLike[str]]]) -> dict[str, Any]:
    """{'path', 'runtime_version', 'driver_version'}; RuntimeError: one '<path>: <why>' line per
    path tried."""
def _nccl_load(paths: Sequence[Union[str, os.PathLike[str]]]) -> tuple[str, int]:
    """(path, ncclGetVersion code); NCCL older than 2.18 is refused."""
def cuda_device_count() -> tuple[int, int]:
    """(count, cudaError_t): count 0 when the runtime reports an error."""
def cuda_get_device() -> int: ...
def cuda_set_device(device: int, /) -> None: ...
def cuda_synchronize() -> None: ...
def cuda_stream_synchronize(stream: int, /) -> None: ...
def cuda_memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int, /) -> None: ...
def cuda_pointer_attributes(ptr: int, /) -> tuple[int, int]:
    """(cudaMemoryType: 0 unregistered, 1 host, 2 device, 3 managed; device)."""
def cuda_error_string(code: int, /) -> str: ...
def cuda_host_alloc(nbytes: int, /) -> PinnedBuffer: ...

class PinnedBuffer:
    """Page-locked host memory (cudaHostAlloc, portable), writable through the buffer protocol;
    freed with cudaFreeHost."""

    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

def nccl_version() -> int: ...
def nccl_unique_id() -> bytes: ...
def nccl_error_string(code: int, /) -> str: ...
