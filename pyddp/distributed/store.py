"""Key-value stores for rendezvous, with torch.distributed's names and behaviour.

``TCPStore``, ``FileStore`` and ``HashStore`` are backed by the C core
(``pyddp._C``); ``PrefixStore`` is plain Python over any ``Store``.  Users may
subclass ``Store`` to write their own, as with torch.

Semantics (checked against torch 2.13 in tests/test_store_*.py):

* ``set(key, value)`` takes ``str`` or bytes-like values; ``get`` returns
  ``bytes`` and waits for the key up to the store's timeout.
* ``add(key, n)`` is an atomic int64 counter stored as decimal text
  (``b"3"``); a missing key counts as 0.
* ``compare_set(key, expected, desired)``: a missing key with ``expected``
  empty gets ``desired``; a current value equal to ``expected`` is replaced
  by ``desired``.  Returns the value after the call, except that a missing key
  with a non-empty ``expected`` returns ``expected`` (as torch does).
* ``wait(keys, timeout=None)``; a key that does not appear in time raises
  ``DistStoreError("wait timeout after 1000ms, keys: /foo")``.
* Timeouts are ``datetime.timedelta``; ``timedelta(0)`` means no timeout.

``TCPStore`` connections authenticate with the job secret in the environment
variable ``PYDDP_SECRET`` (both ends must agree); the secret never crosses
the network.
"""
from __future__ import annotations

import datetime
import operator
import os
import threading
import time
import weakref
from typing import List, Optional, Union

from .. import _C, _config
from .._C import DistBackendError, DistError, DistNetworkError, DistStoreError

__all__ = [
    "Store",
    "TCPStore",
    "FileStore",
    "HashStore",
    "PrefixStore",
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "QueueEmptyError",
]

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)

# Keys under which stores keep their queues (left out of list_keys).
_QUEUE_PREFIX = "__pyddp_queue__/"
# A compare_set expected value no stored head ever equals (heads are
# "<count> <hex nonce>"): compare_set with it reads a key without waiting.
_NEVER = b"\x00never"


class QueueEmptyError(DistStoreError):
    """Raised by ``queue_pop(key, block=False)`` on an empty queue (torch's
    ``torch.distributed.QueueEmptyError``)."""


Value = Union[str, bytes, bytearray, memoryview]


def _seconds(timeout, argname: str = "timeout") -> float:
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(
            f"{argname} must be a datetime.timedelta, not {type(timeout).__name__}"
        )
    seconds = timeout.total_seconds()
    if seconds < 0:
        raise ValueError(f"{argname} must not be negative, got {timeout!r}")
    return seconds


def _check_key(key, argname: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{argname} must be str, not {type(key).__name__}")
    return key


def _check_value(value, argname: str = "value"):
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    raise TypeError(f"{argname} must be str or bytes, not {type(value).__name__}")


def _check_keys(keys, argname: str = "keys") -> List[str]:
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{argname} must be a list of str, not a single {type(keys).__name__}")
    try:
        keys = list(keys)
    except TypeError:
        raise TypeError(f"{argname} must be a list of str, not {type(keys).__name__}") from None
    for k in keys:
        if not isinstance(k, str):
            raise TypeError(f"every key in {argname} must be str, not {type(k).__name__}")
    return keys


def _check_int(value, argname: str = "value") -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{argname} must be int, not {type(value).__name__}")
    return operator.index(value)


def job_secret() -> Optional[str]:
    """The job secret that authenticates connections: ``PYDDP_SECRET`` from
    the environment (read here, in one place), or None when unset or empty."""
    return _config.get("PYDDP_SECRET") or None


# ------------------------------------------------------------------ where listeners bind
# A store server and each rank's transport listen for connections.  They bind the one address
# their peers connect to (loopback when that is a loopback address or every rank is on this
# host), never wider unless the address is not one of this host's (behind NAT): then every
# interface.  Without PYDDP_SECRET, a listener beyond loopback is said once per process: anyone
# who reaches it can join the job, and object collectives unpickle what peers send.

_open_warned = [False]


def _addresses(host: str) -> List[str]:
    """The numeric addresses ``host`` resolves to ([] when it does not)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    out = []
    for info in infos:
        addr = info[4][0]
        if addr not in out:
            out.append(addr)
    return out


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback one (False when it resolves to none)."""
    import ipaddress

    addrs = _addresses(host)
    try:
        return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)
    except ValueError:
        return False


def _bindable(addr: str) -> bool:
    """Whether ``addr`` is one of this host's addresses (a socket can bind it)."""
    import socket

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((addr, 0))
        return True
    except OSError:
        return False


def bind_address(host: str, what: str) -> str:
    """The address a listener (``what``, for the warning) binds so that peers reach it at ``host``:
    ``host``'s own address when it is one of this host's (a loopback one included), else ''
    (every interface).  Without a secret, a listener beyond loopback is reported once."""
    addrs = _addresses(host)
    if not addrs:
        return "127.0.0.1"  # the client's connection reports the name that does not resolve
    chosen = next((a for a in addrs if _bindable(a)), "")
    if chosen and is_loopback(chosen) and not _literal_loopback(host):
        # a host name this host maps to loopback (Debian's 127.0.1.1 for its own name) may name
        # a routable address on the other hosts: every interface, as torch
        chosen = ""
    if not (chosen and is_loopback(chosen)):
        warn_open_listener(what, chosen or "every interface")
    return chosen


def _literal_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address written out, or 'localhost'."""
    import ipaddress

    if host.strip().lower().rstrip(".") in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def warn_open_listener(what: str, where: str) -> None:
    """Say once per process that ``what`` listens on ``where`` (beyond loopback) without
    PYDDP_SECRET; nothing when a secret is set."""
    if job_secret() is not None or _open_warned[0]:
        return
    _open_warned[0] = True
    import warnings

    warnings.warn(
        f"pyddp: {what} listens on {where} without a secret (PYDDP_SECRET is unset): anyone who "
        f"can reach it can join this job, and object collectives unpickle what peers send, so "
        f"they could run code in every rank. Give every rank the same PYDDP_SECRET (pyddp-run, "
        f"pyddp.multiprocessing.spawn and notebook_launcher do this for you), e.g. export "
        f"PYDDP_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))'), or use a "
        f"loopback MASTER_ADDR (127.0.0.1) when every rank is on this host.",
        RuntimeWarning, stacklevel=3)


class Store:
    """Base class of all stores (subclass it to write your own, as in torch).

    Subclasses override ``set``, ``get``, ``add``, ``compare_set``, ``wait``,
    ``check``, ``delete_key`` and ``num_keys``.
    """

    def __init__(self) -> None:
        self._timeout = _DEFAULT_TIMEOUT

    def set(self, key: str, value: Value) -> None:
        """Store ``value`` (str or bytes) under ``key``, replacing any earlier value."""
        raise NotImplementedError(f"{type(self).__name__}.set")

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store's timeout for it to be set."""
        raise NotImplementedError(f"{type(self).__name__}.get")

    def add(self, key: str, value: int) -> int:
        """Atomically add ``value`` to the integer counter ``key`` (created at 0); returns the new
        count."""
        raise NotImplementedError(f"{type(self).__name__}.add")

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        """Set ``key`` to ``desired_value`` if its current value equals ``expected_value`` (torch's
        rules for a missing key); returns the value the key holds afterwards."""
        raise NotImplementedError(f"{type(self).__name__}.compare_set")

    def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
        """Block until every key of ``keys`` is set, up to ``timeout`` (default: the store's
        timeout)."""
        raise NotImplementedError(f"{type(self).__name__}.wait")

    def check(self, keys: List[str]) -> bool:
        """Whether every key of ``keys`` is set, without waiting."""
        raise NotImplementedError(f"{type(self).__name__}.check")

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; returns whether it existed."""
        raise NotImplementedError(f"{type(self).__name__}.delete_key")

    def num_keys(self) -> int:
        """The number of keys in the store (internal keys included, as in torch)."""
        raise NotImplementedError(f"{type(self).__name__}.num_keys")

    def multi_get(self, keys: List[str]) -> List[bytes]:
        """Values of several keys (each waited for, as by ``get``)."""
        return [self.get(k) for k in _check_keys(keys)]

    def multi_set(self, keys: List[str], values: List[Value]) -> None:
        """Set each key of ``keys`` to the value at the same position of ``values``."""
        keys = _check_keys(keys)
        values = list(values)
        if len(keys) != len(values):
            raise ValueError(
                f"keys and values must have the same length, got {len(keys)} and {len(values)}"
            )
        for k, v in zip(keys, values):
            self.set(k, v)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Set the default timeout of get and wait (a timedelta)."""
        _seconds(timeout)
        self._timeout = timeout

    def append(self, key: str, value: Value) -> None:
        """Append ``value`` to the value of ``key`` (a missing key starts empty)."""
        raise NotImplementedError(f"{type(self).__name__}.append")

    def list_keys(self) -> List[str]:
        """The keys in the store (the store's internal keys left out)."""
        raise NotImplementedError(f"{type(self).__name__}.list_keys")

    def has_extended_api(self) -> bool:
        """Whether the store offers torch's extended API (queues), as torch answers."""
        return False

    def clone(self) -> "Store":
        """A new object on the same underlying store, for use from another thread."""
        raise NotImplementedError(f"{type(self).__name__}.clone")

    def queue_push(self, key: str, value: Value) -> None:
        """Push ``value`` onto the queue ``key``."""
        raise NotImplementedError("queue support is not implemented.")

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """Pop the oldest value of queue ``key``; waits up to the store's timeout
        (``block=True``) or raises ``QueueEmptyError`` when it is empty."""
        raise NotImplementedError("queue support is not implemented.")

    def queue_len(self, key: str) -> int:
        """The number of values in the queue ``key``."""
        raise NotImplementedError("queue support is not implemented.")

    def barrier(self, key: str, world_size: int,
                timeout: Optional[datetime.timedelta] = None) -> None:
        """Block until ``world_size`` callers have called ``barrier`` with ``key``
        (up to ``timeout``, default the store's); ``DistStoreError`` otherwise."""
        key = _check_key(key)
        world_size = _check_int(world_size, "world_size")
        if world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size}")
        seconds = _seconds(timeout if timeout is not None else self.timeout)
        last = f"{key}/last_member"
        if self.add(f"{key}/num_members", 1) == world_size:
            self.set(last, "<val_ignored>")
        try:
            self.wait([last], datetime.timedelta(seconds=seconds))
        except DistStoreError:
            raise DistStoreError(
                f"barrier timeout after {int(seconds * 1000)}ms, key: {key}"
            ) from None

    @property
    def timeout(self) -> datetime.timedelta:
        """The default timeout of get and wait (a timedelta)."""
        return getattr(self, "_timeout", _DEFAULT_TIMEOUT)


class _QueueMixin:
    """torch's store queues over set/add/compare_set/wait (TCPStore, HashStore).

    Queue ``key`` keeps a counter of pushes (``.../tail``), one key per item
    and a head ``"<pops> <nonce>"``.  A pop claims the next item by
    compare_set of the head to a value with its own nonce, so exactly one
    caller gets each item, from any number of processes.
    """

    def _qkey(self, key: str, part: str) -> str:
        return f"{_QUEUE_PREFIX}{_check_key(key)}/{part}"

    def _qstate(self, key: str):
        cur = self.compare_set(self._qkey(key, "head"), _NEVER, _NEVER)
        if cur == _NEVER:
            cur = b""
        head = int(cur.split(b" ", 1)[0]) if cur else 0
        tail = self.add(self._qkey(key, "tail"), 0)
        return cur, head, tail

    def queue_push(self, key: str, value: Value) -> None:
        value = _check_value(value)
        n = self.add(self._qkey(key, "tail"), 1)
        self.set(self._qkey(key, str(n)), value)

    def queue_len(self, key: str) -> int:
        _, head, tail = self._qstate(key)
        return max(tail - head, 0)

    def _try_pop(self, key: str):
        """(value, None) when an item was taken; (None, next_slot) when empty."""
        while True:
            cur, head, tail = self._qstate(key)
            if tail <= head:
                return None, head + 1
            new = f"{head + 1} {os.urandom(8).hex()}".encode()
            if self.compare_set(self._qkey(key, "head"), cur, new) == new:
                item = self._qkey(key, str(head + 1))
                value = self.get(item)
                self.delete_key(item)
                return value, None

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        key = _check_key(key)
        value, slot = self._try_pop(key)
        if value is not None:
            return value
        if not block:
            raise QueueEmptyError("queue is empty")
        seconds = self.timeout.total_seconds()
        deadline = None if seconds <= 0 else time.monotonic() + seconds
        while True:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                raise DistStoreError(
                    f"wait timeout after {int(seconds * 1000)}ms, keys: /{key}")
            try:
                # Bounded slices: another popper may take (and delete) the
                # awaited item first, and then the next slot is the one to watch.
                self.wait([self._qkey(key, str(slot))], datetime.timedelta(seconds=left))
            except DistStoreError:
                pass
            value, slot = self._try_pop(key)
            if value is not None:
                return value

    def has_extended_api(self) -> bool:
        return True


class _CStore(Store):
    """A Store whose operations run in a C store object (self._c)."""

    _c = None

    def append(self, key: str, value: Value) -> None:
        self._c.append(_check_key(key), _check_value(value))

    def list_keys(self) -> List[str]:
        return [k for k in self._c.list_keys() if not k.startswith(_QUEUE_PREFIX)]

    def multi_set(self, keys: List[str], values: List[Value]) -> None:
        keys = _check_keys(keys)
        values = list(values)
        if len(keys) != len(values):
            # torch's TCPStore message (its other stores abort the process).
            raise DistStoreError("multiSet keys and values vectors must be of same size")
        for k, v in zip(keys, values):
            self.set(k, v)

    def _clone_sharing(self):
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        return other

    def set(self, key: str, value: Value) -> None:
        self._c.set(_check_key(key), _check_value(value))

    def get(self, key: str) -> bytes:
        return self._c.get(_check_key(key))

    def add(self, key: str, value: int) -> int:
        return self._c.add(_check_key(key), _check_int(value))

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        return self._c.compare_set(
            _check_key(key),
            _check_value(expected_value, "expected_value"),
            _check_value(desired_value, "desired_value"),
        )

    def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
        keys = _check_keys(keys)
        self._c.wait(keys, None if timeout is None else _seconds(timeout))

    def check(self, keys: List[str]) -> bool:
        return self._c.check(_check_keys(keys))

    def delete_key(self, key: str) -> bool:
        return self._c.delete_key(_check_key(key))

    def num_keys(self) -> int:
        return self._c.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._c.set_timeout(_seconds(timeout))

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._c.timeout)


class _ServerHolder:
    """Keeps a master's C store (and so its server thread) alive for every
    multi_tenant TCPStore sharing it."""

    __slots__ = ("c", "__weakref__")

    def __init__(self, c) -> None:
        self.c = c


# port -> weak reference to the _ServerHolder of a multi_tenant master in
# this process (torch shares one server per port between such stores).
_tenants: "dict[int, weakref.ref]" = {}
_tenants_lock = threading.Lock()


class TCPStore(_QueueMixin, _CStore):
    """A TCP key-value store: the master runs the server (one thread in this
    process), every instance is a client.  The server listens on the address
    ``host_name`` resolves to when that is one of this host's (so a loopback
    ``host_name`` keeps it on loopback), else on every interface.

    ``port=0`` on the master picks a free port (see ``.port``).  With
    ``wait_for_workers`` and a ``world_size``, the master's constructor waits
    until ``world_size`` stores (itself included) have connected.
    """

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: Optional[int] = None,
        is_master: bool = False,
        timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: Optional[int] = None,
        use_libuv: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(host_name, str):
            raise TypeError(f"host_name must be str, not {type(host_name).__name__}")
        if not host_name:
            raise ValueError("host_name must not be empty")
        port = _check_int(port, "port")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        if world_size is not None:
            world_size = _check_int(world_size, "world_size")
            if world_size == -1:
                world_size = None
            elif world_size < 1:
                raise ValueError(f"world_size must be a positive int or None, got {world_size}")
        is_master = bool(is_master)
        if not is_master and port == 0:
            raise ValueError("port must not be 0 for a client (is_master=False)")
        seconds = _seconds(timeout)
        listen_fd = -1
        if master_listen_fd is not None:
            listen_fd = _check_int(master_listen_fd, "master_listen_fd")
            if not is_master:
                raise ValueError("master_listen_fd is only valid with is_master=True")
        secret = job_secret()
        # the server binds the address clients connect to (host_name), no wider where it can
        bind = bind_address(host_name, "the TCPStore server") if is_master and listen_fd < 0 else ""

        self._use_libuv = bool(use_libuv)
        self._holder = None
        # whether this object runs the server (a failing setup keeps it up a moment, so the
        # others read why: distributed._setup_watch)
        self._serves = False
        if is_master and multi_tenant:
            with _tenants_lock:
                ref = _tenants.get(port) if port != 0 else None
                holder = ref() if ref is not None else None
                if holder is not None:
                    # Share the running server: this instance is a client.
                    self._holder = holder
                    self._c = _C.TCPStore(host_name, port, world_size, False, seconds,
                                          bool(wait_for_workers), secret, -1)
                    return
                self._c = _C.TCPStore(host_name, port, world_size, True, seconds,
                                      bool(wait_for_workers), secret, listen_fd, bind)
                self._serves = True
                self._holder = _ServerHolder(self._c)
                _tenants[self._c.port] = weakref.ref(self._holder)
                return
        self._c = _C.TCPStore(host_name, port, world_size, is_master, seconds,
                              bool(wait_for_workers), secret, listen_fd, bind)
        self._serves = is_master

    @property
    def host(self) -> str:
        """The host name or address of the store's server."""
        return self._c.host

    @property
    def port(self) -> int:
        """The port of the store's server."""
        return self._c.port

    @property
    def libuvBackend(self) -> bool:  # noqa: N802 (torch's name)
        """False: pyddp's server is its own epoll loop (torch's attribute, for compatibility)."""
        return self._use_libuv

    def local_addr(self) -> str:
        """Numeric local IP of this client's connection to the server: the
        address by which peers on the server's network can reach this host."""
        return self._c.local_addr()

    def clone(self) -> "TCPStore":
        """A new client connection to the same server, with this store's timeout."""
        other = object.__new__(TCPStore)
        Store.__init__(other)
        other._use_libuv = self._use_libuv
        other._holder = self._holder
        other._serves = False
        other._c = _C.TCPStore(self.host, self.port, None, False, self._c.timeout,
                               False, job_secret(), -1)
        return other

    def __repr__(self) -> str:
        return f"TCPStore(host={self.host!r}, port={self.port})"


class FileStore(_CStore):
    """A store shared by the processes that open the same file.

    With ``world_size >= 0`` the file is deleted when the last of
    ``world_size`` users closes it (torch's rule); with -1 it is kept.
    """

    def __init__(self, file_name: Union[str, "os.PathLike[str]"], world_size: int = -1) -> None:
        super().__init__()
        if not isinstance(file_name, (str, os.PathLike)):
            raise TypeError(f"file_name must be str, not {type(file_name).__name__}")
        file_name = os.fspath(file_name)
        if not file_name:
            raise ValueError("file_name must not be empty")
        world_size = _check_int(world_size, "world_size")
        if world_size < -1 or world_size == 0:
            raise ValueError(f"world_size must be -1 or a positive int, got {world_size}")
        self._c = _C.FileStore(file_name, world_size, _seconds(_DEFAULT_TIMEOUT))

    @property
    def path(self) -> str:
        """The file the store lives in."""
        return self._c.path

    def clone(self) -> "FileStore":
        """Another object on the same store (pyddp's stores are thread-safe; the
        clone shares this one's file handle and timeout)."""
        return self._clone_sharing()

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"


class HashStore(_QueueMixin, _CStore):
    """An in-memory store for the threads of one process."""

    def __init__(self) -> None:
        super().__init__()
        self._c = _C.HashStore(_seconds(_DEFAULT_TIMEOUT))

    def clone(self) -> "HashStore":
        """Another object on the same keys (and timeout)."""
        return self._clone_sharing()

    def __repr__(self) -> str:
        return "HashStore()"


class PrefixStore(Store):
    """A view of ``store`` in which every key is ``f"{prefix}/{key}"``."""

    def __init__(self, prefix: str, store: Store) -> None:
        super().__init__()
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be str, not {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"store must be a pyddp Store, not {type(store).__name__}")
        self._prefix = prefix
        self._store = store

    @property
    def underlying_store(self) -> Store:
        """The store this one prefixes its keys into."""
        return self._store

    def _k(self, key: str) -> str:
        return f"{self._prefix}/{_check_key(key)}"

    def set(self, key: str, value: Value) -> None:
        self._store.set(self._k(key), value)

    def get(self, key: str) -> bytes:
        return self._store.get(self._k(key))

    def add(self, key: str, value: int) -> int:
        return self._store.add(self._k(key), value)

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        return self._store.compare_set(self._k(key), expected_value, desired_value)

    def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
        keys = [self._k(k) for k in _check_keys(keys)]
        if timeout is None:
            self._store.wait(keys)
        else:
            self._store.wait(keys, timeout)

    def check(self, keys: List[str]) -> bool:
        return self._store.check([self._k(k) for k in _check_keys(keys)])

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(self._k(key))

    def num_keys(self) -> int:
        # As torch: the count of the whole underlying store.
        return self._store.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """As torch: sets the timeout of the underlying store."""
        self._store.set_timeout(timeout)

    @property
    def timeout(self) -> datetime.timedelta:
        return self._store.timeout

    def append(self, key: str, value: Value) -> None:
        self._store.append(self._k(key), value)

    def multi_get(self, keys: List[str]) -> List[bytes]:
        return self._store.multi_get([self._k(k) for k in _check_keys(keys)])

    def multi_set(self, keys: List[str], values: List[Value]) -> None:
        self._store.multi_set([self._k(k) for k in _check_keys(keys)], values)

    def list_keys(self) -> List[str]:
        """The keys under this prefix, prefix removed (as torch)."""
        p = self._prefix + "/"
        return [k[len(p):] for k in self._store.list_keys() if k.startswith(p)]

    def has_extended_api(self) -> bool:
        return self._store.has_extended_api()

    def clone(self) -> "PrefixStore":
        return PrefixStore(self._prefix, self._store.clone())

    def queue_push(self, key: str, value: Value) -> None:
        self._store.queue_push(self._k(key), value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._store.queue_pop(self._k(key), block)

    def queue_len(self, key: str) -> int:
        return self._store.queue_len(self._k(key))

    def __repr__(self) -> str:
        return f"PrefixStore({self._prefix!r}, {self._store!r})"
