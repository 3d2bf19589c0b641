"""The `jax` device's random number generator: a JAX PRNG key, seeded by `torch.manual_seed`.

Each random op takes a fresh subkey split from the current key, so successive
calls differ and no op ever uses a constant key. Before any seeding, the key is
derived from torch's own (random unless seeded) initial seed.

Inside a staged JAX program (`jax.jit`, `lax.scan`, `bridge.compile`) a concrete
key would be baked into the program as a constant, so every run would draw the
same numbers. There the key is state threaded through the program instead: a
`KeyBox` made current by `bridge.rng_key(key)` (or by `bridge.compile`, which
feeds the generator's key in and its successor out). A random op in a staged
program with no key raises and says so.

A box's key is a value of one JAX trace (its "frame": the trace that stages or batches
values, below `jax.grad`'s derivative traces). A random op draws from it only in that
frame: in a nested body (`lax.scan`, `jax.checkpoint`, `custom_vjp`, an inner `jax.jit`),
which JAX traces once and reuses, an outer key would be a constant of the body, and under
`jax.vmap` an unbatched key would give every example the same numbers. There the op raises
and says to open `rng_key` inside, with a key the body receives (`KeyBox.check`).

Keys are JAX's raw uint32[2] key data throughout; random ops draw through them as keys of
the bridge's own PRNG (`IMPL`, below), which compiles far faster than threefry.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Iterator

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax._src import core as _jax_core
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching

from bridge._src import scope
from bridge._src.errors import BridgeError, BridgeTypeError, LeakedTracerError

_lock = threading.RLock()  # also held by a compiled call that draws (`generator_lock`)
_key: Any = None
_seed: int | None = None


def generator_lock() -> Any:
  """The generator's lock, reentrant: a compiled program that draws holds it from reading the
  key to setting its successor, so two threads' calls never draw from the same key."""
  return _lock


def _make_key(seed: int) -> Any:
  # The generator's key is a concrete array even when torch code being traced reseeds it
  # (`torch.manual_seed` inside `jax.jit`): built in the trace, it would be a tracer that
  # outlives the trace and breaks every later draw.
  with jax.enable_x64(True), jax.ensure_compile_time_eval():
    return jax.random.PRNGKey(np.uint64(seed % 2**64).astype(np.int64))


def manual_seed(seed: int) -> None:
  global _key, _seed
  with _lock:
    _seed = seed
    _key = _make_key(seed)


def initial_seed() -> int:
  with _lock:
    if _seed is None:
      return torch.initial_seed()
    return _seed


# --- the generator's PRNG -------------------------------------------------------------
#
# Keys stay JAX's raw uint32[2] arrays (the generator's state, a program's key input and
# output, `torch.jax.get_rng_state`'s bytes), but each random op draws through them as keys
# of a PRNG of the bridge's own (`IMPL`): splitting and folding by a keyed integer hash, and
# bits from Philox-4x32-10 (XLA's RngBitGenerator; the generator torch's CUDA backend uses).
# Threefry, JAX's default, is as good, but XLA:CPU compiles its twenty unrolled rounds slowly
# at every call site: a model with six dropouts took seconds longer to compile.

_GOLDEN = np.uint32(0x9E3779B9)


def _mix(z: Any) -> Any:
  """A bijective 32-bit integer hash with good avalanche (Wellons' "lowbias32")."""
  z = z ^ (z >> 16)
  z = z * np.uint32(0x7FEB352D)
  z = z ^ (z >> 15)
  z = z * np.uint32(0x846CA68B)
  return z ^ (z >> 16)


def _derive(key: Any, x: Any, domain: int) -> Any:
  """uint32[..., 2] keys from `key` and the uint32 values `x`, distinct and independent-looking
  for distinct `x` (and `domain`: splitting and folding in never collide)."""
  k0, k1 = key[0], key[1]
  x = x ^ np.uint32(domain)
  w0 = _mix(_mix(x ^ k0) + k1)
  w1 = _mix(_mix((x + _GOLDEN) ^ k1) + _mix(k0 ^ np.uint32(0x85EBCA6B)))  # (each word mixes both)
  return jnp.stack([w0, w1], axis=-1)


def _impl_seed(seed: Any) -> Any:
  seed = jnp.asarray(seed)
  high = (seed >> 32) if seed.dtype.itemsize == 8 else jnp.zeros_like(seed)
  return jnp.stack([high, seed & 0xFFFFFFFF]).astype(jnp.uint32)


def _impl_split(key: Any, shape: tuple[int, ...]) -> Any:
  n = int(np.prod(shape))
  return _derive(key, lax.iota(jnp.uint32, n), 0x5EED5EED).reshape(*shape, 2)


def _impl_fold_in(key: Any, data: Any) -> Any:
  return _derive(key, jnp.asarray(data).astype(jnp.uint32), 0x0F01D000)


def _impl_bits(key: Any, bit_width: int, shape: tuple[int, ...]) -> Any:
  dtype = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}[bit_width]
  draw = jnp.uint64 if bit_width == 64 else jnp.uint32

  @jax.custom_batching.custom_vmap
  def philox(key: Any) -> Any:
    state = jnp.concatenate([key, jnp.zeros(2, jnp.uint32)])  # Philox: 64-bit key, counter 0
    _, bits = lax.rng_bit_generator(state, shape, draw, algorithm=lax.RandomAlgorithm.RNG_PHILOX)
    return bits

  @philox.def_vmap
  def per_key(axis_size: int, in_batched: list, keys: Any) -> tuple[Any, bool]:
    # JAX batches RngBitGenerator by drawing every example's bits from the first key:
    # under `jax.vmap` over keys, each key draws its own here, as it would alone
    del axis_size
    if not in_batched[0]:
      return philox(keys), False
    return lax.map(philox, keys), True

  return philox(key).astype(dtype)


IMPL = jax.extend.random.define_prng_impl(
  key_shape=(2,),
  seed=_impl_seed,
  split=_impl_split,
  random_bits=_impl_bits,
  fold_in=_impl_fold_in,
  name="bridge_philox",
  tag="bph",
)


def typed(key: Any) -> Any:
  """`key` as a key of the bridge's PRNG: a raw uint32[2] key or a typed key of JAX's own
  with such data is rewrapped; another kind of key (rbg's) stays as it is."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if jax.random.key_impl(key) == IMPL or jax.random.key_data(key).shape[-1:] != (2,):
      return key
    key = jax.random.key_data(key)
  return jax.random.wrap_key_data(key, impl=IMPL)


def raw(key: Any) -> Any:
  """The uint32 data of a key (typed or raw)."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key


@jax.jit
def _split(key: Any) -> tuple[Any, Any]:
  new, sub = jax.random.split(typed(key))
  return raw(new), raw(sub)


# Traces that compute values in their parent trace (`jax.grad`'s, `jax.jvp`'s): a key of the
# parent serves random ops under them as it is.
_DERIVATIVE_TRACES = (_ad.JVPTrace, _ad.LinearizeTrace)


def _frame(trace: Any) -> Any:
  """The trace that stages or batches the values computed at `trace`: `trace` itself, or the
  one below its derivative traces."""
  while isinstance(trace, _DERIVATIVE_TRACES):
    trace = trace.parent_trace
  return trace


def _here() -> Any:
  """The frame random ops draw in now."""
  return _frame(_jax_core.trace_ctx.trace)


class KeyBox:
  """A (possibly traced) key that random ops split from while it is current.

  `home` is the frame the box was opened in: a concrete key serves random ops there (and
  eagerly), a traced key in its own trace's frame (`check`).
  """

  __slots__ = ("key", "used", "home")

  def __init__(self, key: Any):
    self.key = key
    self.used = False
    self.home = _here()

  def check(self, op: Any = None) -> None:
    """Raise unless random ops may draw from the key here: where the key is a value of the
    current frame, never a constant of a nested body or the same for every example of a
    `jax.vmap`; so the box never takes a tracer of a trace that outlives it."""
    here = _here()
    if isinstance(self.key, jax.core.Tracer):
      if _frame(self.key._trace) is here:
        return
    elif self.home is here and not isinstance(here, _batching.BatchTrace):
      return
    if isinstance(here, _batching.BatchTrace):
      raise BridgeError(
        f"bridge: the random op {_name(op)} runs under `jax.vmap` with a key that is not "
        "batched (the `bridge.rng_key` block was opened outside the vmapped function, or "
        "with one key for all), so every example would draw the same numbers (`torch.vmap` "
        "refuses this too: randomness='error'). Map over keys instead: pass "
        "`jax.random.split(key, n)` as a batched argument of the vmapped function and open "
        "`with bridge.rng_key(key):` inside it."
      )
    if isinstance(here, _jax_core.EvalTrace):
      raise LeakedTracerError(
        f"bridge: the random op {_name(op)} runs eagerly, but the current `bridge.rng_key` "
        f"key is a tracer of a JAX trace that has ended ({self.key._trace}): the block was "
        "opened inside a traced function and kept. Open `bridge.rng_key` where the key is "
        "used, inside the traced function or with a concrete key outside it."
      )
    raise BridgeError(
      f"bridge: the random op {_name(op)} runs inside a nested JAX trace (the body of "
      "`lax.scan`/`fori_loop`/`while_loop`/`cond`, a `jax.checkpoint`ed or `custom_vjp` "
      "function, an inner `jax.jit`), but the current `bridge.rng_key` key comes from "
      "outside it. JAX traces such a body once and reuses it (every iteration, every later "
      "call of a `jax.checkpoint`ed function), so that key would be a constant of the body "
      "and repeat the same numbers. Give the body a key of its own, as an argument or carry, "
      "and open `with bridge.rng_key(key):` inside it: "
      "`bridge.rng_key(jax.random.fold_in(key, i))` in iteration `i` of a loop; "
      "`jax.checkpoint(lambda x, key: ...)(x, key)` for a checkpointed function."
    )

  def split(self, op: Any = None) -> Any:
    """A fresh key (of the bridge's PRNG, `IMPL`) for the random op `op`; advances the box."""
    self.check(op)
    new, sub = jax.random.split(typed(self.key))
    self.key = raw(new) if not jax.dtypes.issubdtype(self.key.dtype, jax.dtypes.prng_key) else new
    self.used = True
    return sub


_BOX: contextvars.ContextVar[KeyBox | None] = contextvars.ContextVar("bridge_rng_box", default=None)


class rng_key:  # (used like a function: `with bridge.rng_key(key):`)
  """Context manager: random torch ops in the block draw from the JAX key `key`.

  Inside `jax.jit` torch's random ops (`dropout`, `torch.randn`, `bernoulli`...)
  run by `bridge.call_torch` or an `extract_jax` function need a key that is an
  input of the program; otherwise each run would repeat the same numbers. The
  block splits `key` as it goes, so successive ops get different subkeys; `jax.grad`
  and `jax.value_and_grad` inside the block draw from it too. Outside a staged
  program the `jax` device's generator (seeded by `torch.manual_seed`) is used
  when no key is given.

  The key serves the trace the block was opened in. A body that JAX traces once and
  reuses (`lax.scan`, `fori_loop`, `while_loop`, `cond`, a `jax.checkpoint`ed function,
  an inner `jax.jit`) needs a block of its own, opened inside it with a key it receives
  as an argument or carry (`bridge.rng_key(jax.random.fold_in(key, i))` in iteration
  `i`); under `jax.vmap`, with a batched key (`jax.random.split(key, n)` passed to the
  vmapped function), so each example draws from its own key. A random op that would
  draw from a key of another trace raises `BridgeError` and says so.

  Args:
    key: a JAX PRNG key (`jax.random.key(0)` or `jax.random.PRNGKey(0)`), typically
      an argument of the jitted function (or of the loop body, checkpointed or vmapped
      function). Its data keys the bridge's PRNG (Philox bits), whatever JAX's
      implementation of it.

  Example:
    >>> import jax, torch, bridge
    >>> @jax.jit
    ... def noisy(x, key):
    ...   with bridge.rng_key(key):
    ...     return bridge.call_torch(torch.nn.functional.dropout, x, 0.5)
    >>> noisy(jax.numpy.ones(4), jax.random.key(0)).shape
    (4,)
    >>> def body(key, i):  # a loop body: a block of its own, with a key per iteration
    ...   with bridge.rng_key(jax.random.fold_in(key, i)):
    ...     return key, bridge.call_torch(torch.nn.functional.dropout, jax.numpy.ones(4), 0.5)
    >>> jax.lax.scan(body, jax.random.key(0), jax.numpy.arange(3))[1].shape
    (3, 4)
  """

  def __init__(self, key: Any):
    _check_key(key)
    self.box = KeyBox(key)
    self._token: Any = None

  def __enter__(self) -> KeyBox:
    self.box.home = _here()
    self._token = _BOX.set(self.box)
    return self.box

  def __exit__(self, *exc: Any) -> None:
    _BOX.reset(self._token)


def _check_key(key: Any) -> None:
  """Refuse what is not a JAX PRNG key: a typed key, or raw uint32 data of shape (..., 2)."""
  dtype = getattr(key, "dtype", None)
  if isinstance(key, (jax.Array, np.ndarray)) and dtype is not None:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      return
    if np.dtype(dtype) == np.uint32 and tuple(key.shape[-1:]) == (2,):
      return
  what = (
    f"a {type(key).__name__} of dtype {dtype} and shape {tuple(key.shape)}"
    if dtype is not None and hasattr(key, "shape")
    else f"{type(key).__name__} {key!r}"
  )
  raise BridgeTypeError(
    f"`bridge.rng_key`: `key` must be a JAX PRNG key (`jax.random.key(seed)`, or the raw "
    f"uint32[2] of `jax.random.PRNGKey(seed)`), got {what}. To draw from a seed, make a key "
    "of it: `bridge.rng_key(jax.random.key(seed))`."
  )


def current_box() -> KeyBox | None:
  """The current `rng_key` block's key box, if any (control flow threads its key through)."""
  return _BOX.get()


def _name(op: Any) -> str:
  return f"`{op}`" if op is not None else "here"


def next_key(op: Any = None) -> Any:
  """A fresh PRNG key for one random op; advances the generator (or the current `rng_key`)."""
  box = _BOX.get()
  if box is not None:
    return box.split(op)
  if isinstance(_here(), _batching.BatchTrace):
    raise BridgeError(
      f"bridge: the random op {_name(op)} runs under `jax.vmap`, where the `jax` device's "
      "generator would give every example the same numbers (`torch.vmap` refuses this too: "
      "randomness='error'). Map over keys: pass `jax.random.split(key, n)` as a batched "
      "argument of the vmapped function and open `with bridge.rng_key(key):` inside it."
    )
  if scope.is_staged():
    raise BridgeError(
      f"bridge: the random op {_name(op)} runs inside a staged JAX program (`jax.jit`, "
      "`lax.scan`, ...), where the `jax` device's generator would be baked in as a constant "
      "key and repeat the same numbers on every run. Pass a key into the program and make "
      "it current with `with bridge.rng_key(key): ...` around the call, or use "
      "`bridge.compile`, which threads the generator through for you."
    )
  return _next_global_key()


def _key_locked() -> Any:
  """The generator's key, made from torch's initial seed on first use (hold `_lock`); inside
  `from_torch_generator`, drawn from torch's generator."""
  global _key
  if _key is None:
    device = _from_torch.device
    _key = _make_key(torch.initial_seed()) if device is None else _torch_key(device)
  return _key


class _FromTorch(threading.local):
  device: torch.device | None = None


_from_torch = _FromTorch()


@contextlib.contextmanager
def from_torch_generator(device: torch.device) -> Iterator[None]:
  """Programs run in this block that draw take their key from torch's own generator of
  `device` (the CPU's, or the CUDA device's), which the draw advances, as a torch kernel's
  would: `torch.manual_seed` and `torch.set_rng_state` replay them. The `jax` device's
  generator is left as it was. (Holds the generator's lock throughout.)"""
  global _key
  with _lock:
    saved, previous = _key, _from_torch.device
    _key, _from_torch.device = None, device
    try:
      yield
    finally:
      _key, _from_torch.device = saved, previous


def _torch_key(device: torch.device) -> Any:
  """A key of 64 bits drawn from torch's generator of `device`."""
  if device.type == "cuda":
    generator = torch.cuda.default_generators[device.index or 0]
    if hasattr(generator, "get_offset"):  # (philox: seed and offset, advanced without a sync)
      offset = generator.get_offset()
      generator.set_offset(offset + 4)
      bits = generator.initial_seed() * 0x9E3779B97F4A7C15 + offset
      return _raw_key(bits)
  return _raw_key(int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)))


def _raw_key(bits: int) -> Any:
  """A raw uint32[2] key of the low 64 bits of `bits`."""
  bits %= 2**64
  return jnp.asarray(np.array([bits >> 32, bits & 0xFFFFFFFF], dtype=np.uint32))


def _next_global_key() -> Any:
  global _key
  with _lock, jax.ensure_compile_time_eval():  # concrete, as in `_make_key`
    _key, sub = _split(_key_locked())
    return sub


def current_key() -> Any:
  """The generator's key (not advanced): what `bridge.compile` feeds into a program."""
  with _lock:
    return _key_locked()


def set_key(key: Any) -> None:
  """Make `key` (a program's successor key) the generator's key."""
  global _key
  with _lock:
    _key = key


STATE_BYTES = 8  # the generator's state: its raw uint32[2] key (`get_state`)


def get_state() -> bytes:
  with _lock:
    key = _key if _key is not None else _make_key(torch.initial_seed())
    return np.asarray(key, dtype=np.uint32).tobytes()


def set_state(state: bytes) -> None:
  global _key
  with _lock, jax.ensure_compile_time_eval():  # concrete, as in `_make_key`
    _key = jax.numpy.asarray(np.frombuffer(state, dtype=np.uint32).copy())
