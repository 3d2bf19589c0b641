"""What every op-family module of bridge-ops uses: the `lowering` decorator and dtype helpers.

`@lowering(aten.add.Tensor, ...)` records a lowering; `plugin.register(registry)`
hands every record to the core's registry. The contract (arguments, returns,
`random`, `static_argnames`, `dynamic_shape`) is documented in
`bridge._src.registry`. Lowerings run only while JAX traces them (the core jits
and caches them), so Python work inside a lowering costs nothing per call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes


class Missing:
  """An op that this torch does not have (it came in a later torch): `lowering` skips it, and
  calling it raises."""

  def __init__(self, name: str):
    self.name = name

  def __getattr__(self, attr: str) -> "Missing":
    if attr.startswith("__"):
      raise AttributeError(attr)
    return self  # every overload of a missing op is missing

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(f"{self.name} does not exist in torch {torch.__version__}.")

  def __repr__(self) -> str:
    return f"<missing op {self.name}>"


class Ops:
  """A `torch.ops` namespace in which an op this torch lacks is a `Missing` rather than an
  AttributeError: the plugin supports torch 2.5 and later, and one op that a torch does not
  have yet must not keep all the others of its module from registering."""

  def __init__(self, namespace: Any, name: str):
    self._namespace, self._name = namespace, name

  def __getattr__(self, name: str) -> Any:
    try:
      op = getattr(self._namespace, name)  # (ops may be dunders: `aten.__lshift__`)
    except (AttributeError, RuntimeError):
      if name.startswith("__"):  # Python asking about the object itself
        raise AttributeError(name) from None
      op = Missing(f"{self._name}::{name}")
    setattr(self, name, op)  # (later lookups are plain attribute reads)
    return op


aten = Ops(torch.ops.aten, "aten")


@dataclasses.dataclass(frozen=True)
class Record:
  op: Any
  fn: Callable[..., Any]
  options: dict


RECORDS: list[Record] = []

# torch dtype -> JAX dtype: the core's own map (`registry.dtypes`), which `plugin.register`
# installs here; the plugin keeps no copy (see `install_dtypes`).
_DTYPES: dict[str, Mapping[Any, Any]] = {}


def install_dtypes(torch_to_jax: Mapping[torch.dtype, Any]) -> None:
  """Installs the core's torch -> JAX dtype map, which every dtype helper here reads."""
  _DTYPES["to_jax"] = torch_to_jax
  _DTYPES["to_torch"] = {np.dtype(v): k for k, v in torch_to_jax.items()}


def _dtype_map(direction: str) -> Mapping[Any, Any]:
  try:
    return _DTYPES[direction]
  except KeyError:
    raise RuntimeError(
      "bridge_ops: no dtype map is installed. The core hands its torch -> JAX dtype map to "
      "`bridge_ops.plugin.register(registry)` (`registry.dtypes`) when it loads the plugin; "
      "to call a lowering outside the core, install one first: "
      "`bridge_ops.plugin.install_dtypes(bridge._src.registry.REGISTRY.dtypes)`."
    ) from None


def lowering(
  *ops: Any,
  override: bool = False,
  random: bool = False,
  static_argnames: tuple[str, ...] = (),
  dynamic_shape: bool | str = False,
) -> Callable[[Callable], Callable]:
  """Records the decorated function as the lowering of aten `ops` (overloads or packets)."""

  def decorate(fn: Callable) -> Callable:
    for op in ops:
      if isinstance(op, Missing):
        continue  # an op of a later torch
      RECORDS.append(
        Record(
          op,
          fn,
          dict(
            override=override,
            random=random,
            static_argnames=static_argnames,
            dynamic_shape=dynamic_shape,
          ),
        )
      )
    return fn

  return decorate


# The core traces this plugin's lowerings with `jax.disable_jit()` on (plugin.TRACE_JIT_FREE):
# jnp's own jitted helpers then trace inline instead of as nested programs. Under it JAX runs
# `lax.fori_loop`/`scan` (and a `while_loop` with a concrete condition) as Python loops, which
# would unroll them into the program: lowerings call these instead, which stage the loop.


def fori_loop(*args: Any, **kwargs: Any) -> Any:
  """`lax.fori_loop`, staged as a loop (see above)."""
  with jax.disable_jit(False):
    return jax.lax.fori_loop(*args, **kwargs)


def while_loop(*args: Any, **kwargs: Any) -> Any:
  """`lax.while_loop`, staged as a loop (see above)."""
  with jax.disable_jit(False):
    return jax.lax.while_loop(*args, **kwargs)


def scan(*args: Any, **kwargs: Any) -> Any:
  """`lax.scan`, staged as a loop (see above)."""
  with jax.disable_jit(False):
    return jax.lax.scan(*args, **kwargs)


# --- torch's errors for invalid values ------------------------------------------------------
#
# torch raises for an index out of range, an integer division by zero... A lowering declares
# such a rule with `check`; the core enforces it (see `plugin.install_checks`): at once on
# concrete values, through one "any broken" flag returned by an eager op's jitted program, and
# inside `jax.jit` only where asked to. Without a core (a lowering called directly), unchecked.

_REPORT: list[Callable[..., None] | None] = [None]  # the core's, from `plugin.install_checks`


def check(
  bad: Any, values: Any, error: type[Exception], message: Any, *, kind: str = "value"
) -> None:
  """torch raises `error(message)` where the bool array `bad` is True.

  `values` (`bad`'s shape, or None) holds the offending values; `message` is torch's text,
  a str formatted with `value` (the first offending value, in C order) and `position` (its
  flat position), or a function of (value, position). `kind`: "index" for an index out of
  range, or "value" (it names what is checked in the core's messages). Inside `jax.jit`,
  both are checked only with `bridge.config(check_indices=True)`.
  """
  report = _REPORT[0]
  if report is not None:
    report(bad, values, error, message, kind)


def check_index(
  index: Any, size: int, error: type[Exception], message: Any, *, negative: bool = False
) -> None:
  """`check` that `index` lies in [0, size), or with `negative` in [-size, size) (torch's
  negative indices count from the end)."""
  if _REPORT[0] is None or np.size(index) == 0:
    return
  index = jnp.asarray(index)
  bad = (index >= size) | (index < (-size if negative else 0))
  check(bad, index, error, message, kind="index")


def with_derivative(
  fn: Callable[..., Any], tangent: Callable[[Any, tuple, tuple], Any]
) -> Callable[..., Any]:
  """`fn` (a function of arrays) differentiated by `tangent(out, primals, tangents)` instead
  of JAX's rules, for ops whose torch derivative takes another value at a kink, a tie or a
  zero (`abs` at 0 has derivative 0 in torch, 1 in JAX). `tangent` must be linear in
  `tangents`: JAX transposes it for reverse mode, so `jax.grad`, `jax.jvp` and a compiled
  module's backward all follow torch; it may ignore the tangents of integer arguments."""
  f = jax.custom_jvp(fn)

  @f.defjvp
  def _jvp(primals: tuple, tangents: tuple) -> tuple:
    out = f(*primals)  # (itself: its derivative inside `tangent` follows torch too)
    return out, tangent(out, primals, tangents)

  return f


def x_times_log(log: Callable[[Any], Any], pole: float) -> Callable[[Any, Any], Any]:
  """torch's `xlogy` (log = jnp.log, pole 0) or `xlog1py` (jnp.log1p, pole -1): x * log(y),
  nan where y is nan, else 0 where x == 0; derivative torch's, log(y) dx (0 where x == 0 and
  y <= pole) + x / (y - pole) dy (a `where` in the value would give dx 0 at every x == 0)."""

  def value(x: Any, y: Any) -> Any:
    out = jnp.where(x == 0, jnp.zeros((), x.dtype), x * log(y))
    return jnp.where(jnp.isnan(y), y, out)

  def tangent(out: Any, p: tuple, t: tuple) -> Any:
    x, y = p
    dx = jnp.where((x == 0) & (y <= pole), jnp.zeros((), out.dtype), log(y))
    return t[0] * dx + t[1] * (x / (y - pole))

  return with_derivative(value, tangent)


def power_of_abs(a: Any, p: float) -> Any:
  """`a ** p` for `a >= 0` (an absolute value) and a static `p > 0`, with a zero gradient at
  `a == 0`, where `p < 1` makes the plain derivative infinite (inf * 0 = nan through `abs`):
  torch's norm and distance backwards give 0 there."""
  zero = a == 0
  return jnp.where(zero, jnp.zeros((), a.dtype), jnp.where(zero, 1, a) ** p)


def root(s: Any, p: float) -> Any:
  """`s ** (1 / p)` (`sqrt` for p == 2) with a zero gradient at `s == 0`, as torch's norm and
  distance backwards (the root's derivative there is inf)."""
  zero = s == 0
  r = jnp.sqrt(jnp.where(zero, 1, s)) if p == 2 else jnp.where(zero, 1, s) ** (1.0 / p)
  return jnp.where(zero, jnp.zeros((), s.dtype), r)


def p_norm(a: Any, p: float, axis: Any, keepdims: bool = False) -> Any:
  """(sum a ** p) ** (1 / p) over `axis` of `a >= 0` (an absolute value) for a static p > 0,
  with torch's zero gradients at a zero element and at a zero norm (`power_of_abs`, `root`)."""
  powered = a * a if p == 2 else power_of_abs(a, p)
  return root(jnp.sum(powered, axis=axis, keepdims=keepdims), p)


def literal(value: Any) -> bool:
  """`value` is a Python number, known while tracing (a traced scalar's value is not): a
  lowering may then skip work its value makes moot (a multiply by the default alpha of 1)."""
  return type(value) in (int, float, bool)


def expand_param(param: Any, n: int) -> list[int]:
  """torch's `expand_param_if_needed`: a one-element list stands for all `n` spatial dims."""
  param = [int(param)] if isinstance(param, int) else [int(p) for p in param]
  return param * n if len(param) == 1 else param


def lowest(dtype: Any) -> Any:
  """The smallest value of `dtype` (-inf for floats, False for bool): a max's neutral start."""
  dtype = np.dtype(dtype)
  if dtype.kind == "f" or dtype == jnp.bfloat16:
    return -np.inf
  if dtype.kind == "b":
    return False
  return np.iinfo(dtype).min


def highest(dtype: Any) -> Any:
  """The largest value of `dtype` (inf for floats, True for bool): a min's neutral start."""
  dtype = np.dtype(dtype)
  if dtype.kind == "f" or dtype == jnp.bfloat16:
    return np.inf
  if dtype.kind == "b":
    return True
  return np.iinfo(dtype).max


def torch_sign(x: Any) -> Any:
  """torch's sign of a real array: 0 at 0 and at NaN (jnp.sign(nan) is nan)."""
  return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


# torch's derivative of |x| is sgn(x): 0 at 0 (where JAX's rule gives 1) and at NaN.
_abs_real = with_derivative(jnp.abs, lambda out, x, t: torch_sign(x[0]) * t[0])


def torch_abs(x: Any) -> Any:
  """`jnp.abs` with torch's derivative (0 at 0) for real floating arrays."""
  return _abs_real(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.abs(x)


def jax_dtype(dtype: torch.dtype | None, default: Any = None) -> Any:
  """The JAX dtype for a torch dtype argument (`None` -> `default`)."""
  if dtype is None:
    return default
  return _dtype_map("to_jax")[dtype]


def torch_dtype(dtype: Any) -> torch.dtype:
  return _dtype_map("to_torch")[np.dtype(dtype)]


def scalar_type_name(dtype: Any) -> str:
  """torch's name of a JAX `dtype` as its messages spell it ("Float", "Long", "ComplexDouble")."""
  meta = torch.empty(0, dtype=torch_dtype(dtype), device="meta")
  return meta.type().removeprefix("torch.meta.")[: -len("Tensor")]


def default_float() -> Any:
  """torch's default floating dtype, as a JAX dtype."""
  return _dtype_map("to_jax")[torch.get_default_dtype()]


def opmath(dtype: Any) -> np.dtype:
  """torch's compute dtype ("opmath") for `dtype`: float32 for the floats narrower than 32 bits
  (float16, bfloat16, the float8s), as torch's `opmath_type`; else `dtype` itself."""
  dtype = np.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
    return np.dtype(np.float32)
  return dtype


def real_dtype(dtype: Any) -> np.dtype:
  """The real dtype of `dtype`: float32 for complex64, float64 for complex128, else itself (the
  dtype of torch's abs, norms and the parts of a complex sample)."""
  dtype = np.dtype(dtype)
  return np.dtype(jnp.finfo(dtype).dtype) if jnp.issubdtype(dtype, jnp.complexfloating) else dtype


def _is_array(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray))


def weak(x: Any) -> bool:
  """`x` is weakly typed (a Python scalar, or a traced one)."""
  return bool(getattr(getattr(x, "aval", x), "weak_type", False))


def _as_torch_arg(x: Any) -> Any:
  """A stand-in torch value with the same promotion behaviour as `x` (its dtype and rank: the
  sizes play no part, and may be symbolic in `bridge.export`)."""
  if _is_array(x) and not (weak(x) and np.ndim(x) == 0):
    return torch.empty((1,) * np.ndim(x), dtype=torch_dtype(x.dtype), device="meta")
  dtype = np.dtype(getattr(x, "dtype", type(x)))
  if dtype.kind == "b":
    return True
  if dtype.kind in "iu":
    return 1
  if dtype.kind == "f":
    return 1.0
  return 1j


def result_dtypes(*args: Any, kind: str = "default") -> tuple[Any, Any]:
  """torch's (computation dtype, result dtype) for elementwise `args`, as JAX dtypes.

  `kind` is a torch `ELEMENTWISE_TYPE_PROMOTION_KIND` name: "default",
  "int_to_float", "always_bool", "complex_to_float", "bool_to_long", "no_opmath".
  Traced Python scalars (weakly typed 0-d values) count as Python scalars.
  """
  fakes = [_as_torch_arg(a) for a in args if a is not None]
  compute, result = elementwise_dtypes(
    *fakes, type_promotion_kind=getattr(ELEMENTWISE_TYPE_PROMOTION_KIND, kind.upper())
  )
  to_jax = _dtype_map("to_jax")
  for dtype in (compute, result):
    if dtype not in to_jax:  # complex32: a float16 tensor with a complex scalar or tensor
      # (RuntimeError, as torch's dtype errors: a TypeError in `x + 1j` would become
      # Python's "unsupported operand type(s)")
      raise RuntimeError(
        f"torch's type promotion gives {dtype} here, and JAX has no such type. Cast the "
        f"inputs first (float16 to float32 for a complex64 result); the inputs: "
        + ", ".join(
          str(f.dtype) if isinstance(f, torch.Tensor) else type(f).__name__ for f in fakes
        )
        + "."
      )
  return to_jax[compute], to_jax[result]


def promote(*names: str, kind: str = "default") -> Callable[[Callable], Callable]:
  """Decorator: cast the arguments `names` to torch's computation dtype before the lowering runs.

  Tensor arguments are cast with `astype`; scalar arguments are left to JAX's weak
  typing, which then follows the tensors' dtype as torch does.
  """

  def decorate(fn: Callable) -> Callable:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      bound = sig.bind(*args, **kwargs)
      values = [bound.arguments[n] for n in names if n in bound.arguments]
      compute, _ = result_dtypes(*values, kind=kind)
      for n in names:
        v = bound.arguments.get(n)
        if v is not None and _is_array(v) and not (weak(v) and np.ndim(v) == 0):
          bound.arguments[n] = jnp.asarray(v).astype(compute)
      return fn(*bound.args, **bound.kwargs)

    return wrapper

  return decorate
