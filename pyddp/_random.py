"""pyddp's random generators: ``pyddp.Generator``, ``pyddp.default_generator``,
``pyddp.manual_seed`` / ``seed`` / ``initial_seed``, ``pyddp.randperm``.

One generator object carries one seed and serves every draw made from it:

* the integer draws torch's CPU generator makes (randperm, samplers, data
  loading, randint/multinomial for samplers) come from the mt19937 of
  ``torch.Generator`` (csrc/kernels/random.c), so with equal seeds
  ``pyddp.randperm(n, generator=g)`` equals ``torch.randperm(n,
  generator=tg)`` bit for bit, below and above torch's 214,748,364 switch
  between its two shuffles, and ``get_state()`` is torch's 5056-byte state (a
  state moves between torch and pyddp in either direction);
* float samples (randn, rand, randint tensors, dropout, nn.init) come from a
  NumPy Generator the generator owns (``Generator._gen``), seeded from the
  same seed (``manual_seed(s)``: ``numpy.random.default_rng(s)``) or, after
  ``get_state``/``set_state``, from that state; these values are not torch's.
"""
import hashlib
import os
import threading

import numpy as np

from . import _C, _device

__all__ = ["Generator", "default_generator", "manual_seed", "seed",
           "initial_seed", "get_rng_state", "set_rng_state", "randperm"]

_INT64_MASK = (1 << 63) - 1
_np_lock = threading.Lock()   # makes the NumPy engine of a generator once when threads race


def _nondeterministic_seed():
    return int.from_bytes(os.urandom(8), "little")


def _state_seed(state):
    """The NumPy engine's seed for an mt19937 state (bytes)."""
    return int.from_bytes(hashlib.blake2b(state, digest_size=16).digest(), "little")


class Generator:
    """A random number generator equal to ``torch.Generator()`` on the CPU.

    ``Generator(device="cpu")`` starts from torch's default seed
    67280421310721, as torch's does.  Seeds are Python ints in
    [-2**63, 2**64): a negative seed is taken as its two's complement, and
    only the low 32 bits reach mt19937 (as in torch), while
    ``initial_seed()`` returns the full 64-bit value.  Methods return ``self``
    where torch's do, so ``Generator().manual_seed(42)`` works.  A generator
    can be pickled (its state travels) and is safe to share between threads.

    Under the CUDA emulation (``PYDDP_CUDA_ON_CPU=1``) ``Generator(device="cuda:N")`` (or
    ``"cuda"``: the current device) is a generator of that emulated device, as torch's on a GPU:
    its own seed and state, ``device`` is ``device(type='cuda', index=N)``, and it draws the
    samples of ``randn``/``rand(..., device="cuda:N", generator=g)``; a generator given for a
    tensor of another device type raises as torch does.  Its state is the same mt19937 layout
    as a CPU generator's (torch's CUDA generators keep a 16-byte Philox seed and offset), and the
    values are pyddp's, not torch's.  Without the emulation a CUDA device raises RuntimeError.
    """

    def __init__(self, device="cpu"):
        self.device = _generator_device(device)
        self._g = _C.Generator()
        self._reseed_np(self._g.initial_seed())

    def _reseed_np(self, seed):
        # the NumPy engine restarts from seed (an int) on its first use
        self._np_seed = seed
        self._np = None

    @property
    def _gen(self):
        """The NumPy Generator behind randn/rand/dropout/init draws from this generator."""
        g = self._np
        if g is None:
            with _np_lock:
                g = self._np
                if g is None:
                    g = self._np = np.random.default_rng(self._np_seed)
        return g

    def manual_seed(self, seed):
        """Seed the generator (torch's ``Generator.manual_seed``); returns self.

        Like torch, a bool or float seed raises RuntimeError; NumPy integers
        are accepted (torch raises TypeError for them)."""
        if isinstance(seed, np.integer):
            seed = int(seed)
        if isinstance(seed, (bool, float)):
            raise RuntimeError(
                f"manual_seed expected a long, but got {type(seed).__name__}")
        self._g.manual_seed(seed)
        self._reseed_np(self._g.initial_seed())
        return self

    def seed(self):
        """Seed from a non-deterministic source and return that seed."""
        s = _nondeterministic_seed()
        self._g.manual_seed(s)
        self._reseed_np(s)
        return s

    def initial_seed(self):
        """The last seed set, as an unsigned 64-bit int."""
        return self._g.initial_seed()

    def get_state(self):
        """The state as a uint8 NumPy array of 5056 bytes (torch's layout).

        ``torch.Generator().set_state(torch.from_numpy(state))`` accepts it.
        The NumPy engine (randn, rand, ...) restarts from this state, so
        ``set_state`` of it later repeats the float draws made after this call
        as well as the mt19937 ones.
        """
        state = self._g.get_state()
        self._reseed_np(_state_seed(state))
        return np.frombuffer(state, dtype=np.uint8).copy()

    def set_state(self, new_state):
        """Restore a state from ``get_state()`` (pyddp's or torch's: a uint8
        array, a torch ByteTensor or bytes); returns self."""
        if not isinstance(new_state, (bytes, bytearray, memoryview)):
            if hasattr(new_state, "numpy") and hasattr(new_state, "dtype"):
                new_state = new_state.detach().cpu().numpy()  # torch tensor
            arr = np.asarray(new_state)
            if arr.dtype != np.uint8:
                raise TypeError(
                    "expected a uint8 array (a ByteTensor in torch) as the RNG "
                    f"state, but got dtype {arr.dtype}")
            new_state = np.ascontiguousarray(arr).tobytes()
        self._g.set_state(new_state)
        self._reseed_np(_state_seed(bytes(new_state)))
        return self

    # -- the draws torch's samplers make (used by pyddp.utils.data) --------

    def _random(self):
        return self._g.random()

    def _random64(self):
        return self._g.random64()

    def _random_int64(self):
        """``torch.empty((), dtype=torch.int64).random_(generator=self)``."""
        return self._g.random64() & _INT64_MASK

    def __getstate__(self):
        return {"state": self._g.get_state(), "np_seed": self._np_seed,
                "np_state": None if self._np is None else self._np.bit_generator.state,
                "device": str(self.device)}

    def __setstate__(self, d):
        self._g = _C.Generator()
        self._g.set_state(d["state"])
        self._reseed_np(d.get("np_seed", self._g.initial_seed()))
        if d.get("np_state") is not None:
            self._gen.bit_generator.state = d["np_state"]
        self.device = _device.device(d.get("device", "cpu"))

    def __repr__(self):
        where = "" if self.device.type == "cpu" else f" device={self.device}"
        return f"<pyddp.Generator{where} initial_seed={self.initial_seed()}>"


def _generator_device(dev):
    """The device of ``Generator(device=dev)``: the CPU, or an emulated CUDA device (its index:
    the current device when none is given)."""
    d = _device.device(dev) if not isinstance(dev, _device.device) else dev
    if d.type == "cpu":
        return _device.device("cpu")
    from .cuda import _emulation
    if d.type == "cuda" and _emulation.enabled():
        from .cuda import _runtime
        return _device.device("cuda", _runtime._index_or_current(d.index))
    raise RuntimeError(
        f"pyddp.Generator supports the CPU (and 'cuda' devices under the CUDA emulation, "
        f"PYDDP_CUDA_ON_CPU=1), got device={str(dev)!r}")


def _check_generator_device(generator, dev):
    """torch's check that a generator belongs to the device type of the tensor it fills
    (``dev``: the tensor's device, None for the CPU)."""
    gdev = getattr(generator, "device", None)
    if not isinstance(generator, Generator) or gdev is None:
        return
    want = "cpu" if dev is None else _device._check_device(dev).type
    if gdev.type != want:
        raise RuntimeError(
            f"Expected a '{want}' device type for generator but found '{gdev.type}'")


# Like torch's default CPU generator: seeded non-deterministically at start.
# A forked child keeps the parent's state (DataLoader workers reseed it).
default_generator = Generator()
default_generator.manual_seed(_nondeterministic_seed())


def manual_seed(seed):
    """Seed the default generator (``torch.manual_seed``); returns it."""
    return default_generator.manual_seed(seed)


def seed():
    """Seed the default generator non-deterministically; returns the seed."""
    return default_generator.seed()


def initial_seed():
    """The initial seed of the default generator (``torch.initial_seed``)."""
    return default_generator.initial_seed()


def get_rng_state():
    """The default generator's state (``torch.get_rng_state``)."""
    return default_generator.get_state()


def set_rng_state(new_state):
    """Restore the default generator's state (``torch.set_rng_state``)."""
    default_generator.set_state(new_state)


def _gen(generator):
    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise TypeError(
            "generator must be a pyddp.Generator (or None), not "
            f"{type(generator).__name__}")
    return generator


def _np_gen(generator=None):
    """The NumPy Generator float samples are drawn from: the default
    generator's, a ``pyddp.Generator``'s, or a ``numpy.random.Generator``
    itself (an object of another type: the default generator's, as before)."""
    if generator is None:
        return default_generator._gen
    if isinstance(generator, np.random.Generator):
        return generator
    return getattr(generator, "_gen", None) or default_generator._gen


def _check_n(n, name="n"):
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(n).__name__}")
    n = int(n)
    if n < 0:
        raise RuntimeError(f"randperm expects n >= 0, but got n={n}")
    return n


def randperm(n, *, generator=None, dtype=np.int64, device=None):
    """``torch.randperm(n, generator=generator)`` as a NumPy array.

    The values are identical to torch's CPU randperm for the same generator
    state (forward Fisher-Yates with 32-bit draws for n < 214,748,364,
    inside-out Fisher-Yates with 64-bit draws above), and the generator
    advances by the same number of draws.  Computed in C with the GIL
    released.  dtype (default int64) is the result's dtype; ``device`` a CPU device or None
    (a CUDA device raises as in torch's CPU build).
    """
    if device is not None:
        from ._device import _check_device
        _check_device(device)
    n = _check_n(n)
    g = _gen(generator)
    out = np.empty(n, dtype=np.int64)
    g._g.randperm_into(out)
    if np.dtype(dtype) != np.int64:
        out = out.astype(dtype)
    return out


def _randint(high, size, generator=None, low=0):
    """``torch.randint(low, high, (size,), dtype=torch.int64, generator=...)``."""
    g = _gen(generator)
    if high <= low:
        raise RuntimeError(
            f"random_ expects 'from' to be less than 'to', but got from={low} "
            f">= to={high}")
    out = np.empty(int(size), dtype=np.int64)
    if size:
        g._g.randint_into(out, int(low), int(high) - int(low))
    return out


def _multinomial(weights, num_samples, replacement, generator=None):
    """``torch.multinomial`` of a 1-d float64 weight vector (CPU algorithm).

    With replacement and num_samples >= 2: inverse-CDF sampling, one 53-bit
    uniform per draw (bit-identical to torch).  Otherwise torch's
    exponential trick: argmax / top-k of ``w / Exp(1)``; ties (zero weights)
    are broken by the lower index, where torch's top-k order is unspecified.
    """
    g = _gen(generator)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > w.shape[0]:
        raise RuntimeError(
            "cannot sample n_sample > prob_dist.size(-1) samples without "
            "replacement")
    if w.shape[0] > (1 << 24):
        raise RuntimeError("number of categories cannot exceed 2^24")
    out = np.empty(int(num_samples), dtype=np.int64)
    if replacement and num_samples > 1:
        try:
            g._g.multinomial_into(w, out)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        return out
    if w.size == 0 or not (np.all(w >= 0) and np.all(w < np.inf)):
        raise RuntimeError(
            "probability tensor contains either `inf`, `nan` or element < 0")
    if w.sum() == 0:
        raise RuntimeError(
            "invalid multinomial distribution (sum of probabilities <= 0)")
    q = np.empty_like(w)
    g._g.exponential_into(q, 1.0)
    q = w / q
    if num_samples == 1:
        out[0] = int(np.argmax(q))
    else:
        out[:] = np.argsort(-q, kind="stable")[:num_samples]
    return out
