"""The per-op fallback: an aten op with no lowering and no decomposition runs in eager torch.

When torch code on the `jax` device (eager, or traced by `call_torch`, `compile`,
`extract_jax`) reaches an op that the registry cannot lower and torch cannot
decompose, the op runs through callback mode (`bridge._src.callback`) instead of
failing: one host call inside the JAX program, on CPU tensors sharing its
buffers, differentiable through torch autograd. Each op is reported once per
process with a `FallbackWarning`; `fallback_ops(fn, ...)` lists the ops of a
function that fell back. `bridge.config(fallback="error")` turns the fallback off
(`OperatorNotFound`), and so does a platform whose programs cannot call Python.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import warnings
from typing import Any, Callable, NoReturn

import jax
import torch

from bridge._src import callback, ffi, registry
from bridge._src import tensor as tensor_lib
from bridge._src import tree as tree_lib
from bridge._src import config as config_lib
from bridge._src.errors import FallbackWarning, OperatorNotFound

POLICIES = ("callback", "error")
RECIPE = "recipes/torch_code_in_jax_callback_mode.ipynb"


recording: contextvars.ContextVar[set | None] = contextvars.ContextVar(
  "bridge_fallback_recording", default=None
)
_warned: set[Any] = set()
_lock = threading.Lock()


def op_name(func: Any) -> str:
  """`namespace::name.overload`, e.g. `aten::_fft_c2c.default`."""
  return f"{func._schema.name}.{func._overloadname}"


def available() -> bool:
  """Whether the fallback is on here: the policy says so and the platform can call Python."""
  return config_lib.get_config().fallback == "callback" and ffi.supported()


def why_not() -> str:
  """Why an op with no lowering did not fall back, for `OperatorNotFound`'s message."""
  if config_lib.get_config().fallback != "callback":
    return (
      "The callback fallback, which would run it in eager torch, is off here "
      f"(`bridge.config(fallback='error')`; see {RECIPE})."
    )
  return (
    f"The callback fallback cannot run here: JAX's {ffi.platform()} backend cannot call "
    "back into Python."
  )


def _note(func: Any) -> None:
  rec = recording.get()
  if rec is not None:  # `fallback_ops` asks: it reports, no warning
    rec.add(op_name(func))
    return
  if func in _warned:
    return
  with _lock:
    if func in _warned:
      return
    _warned.add(func)
  warnings.warn(
    f"bridge: {op_name(func)} has no lowering on the `jax` device and torch has no "
    "decomposition for it, so it runs in eager torch through a host callback: the "
    "results and gradients are torch's, but the op is not compiled or fused with the "
    "rest of the program, and its data goes through the host. To run it in JAX, "
    f"register a lowering (`@bridge.register_lowering(torch.ops.{func.namespace}."
    f"{func._schema.name.split('::')[-1]}.{func._overloadname})`); to make this an "
    f"error, use `bridge.config(fallback='error')`. See {RECIPE}.",
    FallbackWarning,
    stacklevel=2,
  )


def _refuse_collectives(func: Any) -> None:
  """torch.distributed's ops (`c10d::allreduce_`, `broadcast_`, `recv_`...) start their
  communication on torch's own buffers and finish it later (`Work.wait()`): run on copies in
  a host call, their results would be lost, silently. They are refused instead."""
  if func.namespace == "c10d":
    raise OperatorNotFound(
      f"bridge: torch.distributed's {op_name(func)} does not run on the `jax` device: its "
      "communication runs asynchronously on torch's own buffers, which a `jax` tensor does "
      "not have (on copies its result would be lost). Communicate CPU tensors (`t.cpu()`, "
      "then `t_jax.copy_(...)`), or use JAX's collectives across a mesh of the devices "
      "(`bridge.shard`, `jax.lax.psum` under `shard_map`)."
    )


def lowering(func: Any) -> registry.Lowering | None:
  """A lowering that runs `func` through callback mode, or None where the fallback is off."""
  _refuse_collectives(func)
  if not available():
    return None

  def run(*args: Any, **kwargs: Any) -> Any:
    if not available():  # the policy changed since this op was first seen
      raise_not_found(func)
    _note(func)
    return callback.call(
      func,
      args,
      kwargs,
      name=f"the fallback of {op_name(func)}",
      api=callback.FALLBACK,
      unshaped_now=True,  # (an eager op whose shapes depend on the data: run as torch would)
    )

  run.__name__ = f"fallback_{func._schema.name.split('::')[-1]}"
  # (`dynamic_shape`: not jitted per op, so that the policy is looked at on every call;
  # callback mode caches its own programs)
  return registry.Lowering(op=func, fn=run, source="callback fallback", dynamic_shape=True)


def writing(func: Any) -> Callable[[tuple, dict], tuple] | None:
  """The fallback of an op that writes its tensor arguments and has no functional twin (a
  custom op declared with `mutates_args`): torch runs it in a host call on copies of the
  arguments (callback mode's `return_mutated`). Given the op's own arguments, it returns its
  outputs (JAX values) and (tensor written, its new value) pairs. None where the fallback is
  off, or for written arguments other than tensors (lists of them)."""
  _refuse_collectives(func)
  if not available() or any(
    not isinstance(a.type, torch.TensorType)
    for a in func._schema.arguments
    if a.alias_info is not None and a.alias_info.is_write
  ):
    return None

  def run(args: tuple, kwargs: dict) -> tuple:
    if not available():  # the policy changed since this op was first seen
      raise_not_found(func)
    _note(func)
    leaves, spec = tree_lib.flatten((args, kwargs))
    arrays = [tensor_lib.value(a) if type(a) is tensor_lib.Tensor else a for a in leaves]
    a_args, a_kwargs = tree_lib.unflatten(spec, arrays)
    outs, written = callback.call(
      func,
      a_args,
      a_kwargs,
      name=f"the fallback of {op_name(func)}",
      return_mutated=True,
      api=callback.FALLBACK,
      unshaped_now=True,
    )
    return outs, [(leaves[i], new) for i, new in written.items()]

  return run


def _convolution_backward(*args: Any, **kwargs: Any) -> tuple:
  """torch's CPU kernel of `convolution_backward`, with the gradients `output_mask` leaves out
  as None, as its meta kernel (and the lowering) has them (the CPU kernel computes a weight
  gradient for a bias-only mask)."""
  out = torch.ops.aten.convolution_backward.default(*args, **kwargs)
  mask = kwargs["output_mask"] if "output_mask" in kwargs else args[10]
  return tuple(o if m else None for o, m in zip(out, mask))


def _host_call(func: Any, host: Any, args: tuple, kwargs: dict) -> Any:
  return callback.call(
    host, args, kwargs, name=f"torch's CPU kernel of {op_name(func)}", api=callback.FALLBACK
  )


def _convolution(
  input: Any,
  weight: Any,
  bias: Any,
  stride: Any,
  padding: Any,
  dilation: Any,
  transposed: bool,
  output_padding: Any,
  groups: int,
) -> Any:
  """torch's convolution with its own backward: the gradient is one host call of torch's
  `convolution_backward` on the saved input and weight (callback mode's generic backward
  would run the convolution again under torch autograd first). The backward is itself a
  host call in callback mode, so it differentiates again (torch's double backward)."""
  conv, conv_bwd = torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default
  params = (stride, padding, dilation, transposed, output_padding, groups)
  c_out = weight.shape[1] * groups if transposed else weight.shape[0]

  def forward(x: Any, w: Any, b: Any) -> Any:
    return _host_call(conv, conv, (x, w, b, *params), {})

  @jax.custom_vjp
  def f(x: Any, w: Any, b: Any) -> Any:
    return forward(x, w, b)

  def fwd(x: Any, w: Any, b: Any) -> tuple:
    mask = [x.perturbed, w.perturbed, b is not None and b.perturbed]
    bias = None if b is None else b.value
    return forward(x.value, w.value, bias), (x.value, w.value, bias is not None, mask)

  def bwd(res: tuple, g: Any) -> tuple:
    x, w, has_bias, mask = res
    if isinstance(g, jax.custom_derivatives.SymbolicZero) or not any(mask):
      return (None, None, None)
    sizes = [c_out] if has_bias else None
    grads = _host_call(conv_bwd, _convolution_backward, (g, x, w, sizes, *params, mask), {})
    return tuple(grads[:2]) + ((grads[2],) if has_bias else (None,))

  f.defvjp(fwd, bwd, symbolic_zeros=True)
  return f(input, weight, bias)


# Ops whose torch CPU kernel beats XLA:CPU's code for them (oneDNN's convolutions): in a
# program for one CPU device they run as torch's kernel through a host call, as a fallback
# op does (`bridge.config(cpu_convolution=...)`), each op by the function here.
TORCH_ON_CPU: dict[Any, Callable[..., Any]] = {
  torch.ops.aten.convolution.default: _convolution,
  torch.ops.aten.convolution_backward.default: lambda *args, **kwargs: _host_call(
    torch.ops.aten.convolution_backward.default, _convolution_backward, args, kwargs
  ),
}


# where each op's weight and geometry sit among its positional arguments
_CONV_ARGS = {
  torch.ops.aten.convolution.default: dict(weight=1, stride=3, padding=4, transposed=6),
  torch.ops.aten.convolution_backward.default: dict(weight=2, stride=4, padding=5, transposed=7),
}


def _pointwise(func: Any, args: tuple, kwargs: dict) -> bool:
  """A 1x1 convolution with stride 1 and no padding: a matrix product, which XLA fuses with
  its neighbours (MobileNetV3-small's forward: 7.8 ms with these in XLA, 17 ms with every
  convolution a host call; torch eager 15-18 ms in the same process)."""
  get = {n: kwargs[n] if n in kwargs else args[i] for n, i in _CONV_ARGS[func].items()}
  return (
    not get["transposed"]
    and all(k == 1 for k in get["weight"].shape[2:])
    and all(s == 1 for s in get["stride"])
    and not any(get["padding"])
  )


def torch_on_cpu(func: Any, lowering: registry.Lowering) -> registry.Lowering:
  """`lowering`, except where programs run on one CPU device and `cpu_convolution="torch"`:
  there, unless the convolution is a pointwise matrix product, torch's own kernel, called
  from inside the program on XLA's buffers (no warning: not a missing lowering). Several
  devices (sharding) keep the lowering: XLA would gather a host call's inputs and replicate
  its result. Decided at each trace (not jitted per op), so the setting in force when a
  program is built is the one it gets."""
  xla, host = lowering.fn, TORCH_ON_CPU[func]

  def run(*args: Any, **kwargs: Any) -> Any:
    if (
      config_lib.get_config().cpu_convolution == "torch"
      and ffi.platform() == "cpu"
      and jax.local_device_count() == 1
      and not _pointwise(func, args, kwargs)
    ):
      return host(*args, **kwargs)
    return xla(*args, **kwargs)

  run.__name__ = f"torch_on_cpu_{func._schema.name.split('::')[-1]}"
  return dataclasses.replace(lowering, fn=run, dynamic_shape=True)


def raise_not_found(func: Any, reason: str | None = None) -> NoReturn:
  """Raise `OperatorNotFound` for `func`: no lowering, no decomposition, no fallback
  (`reason`: why not, where it is not `why_not()`'s)."""
  name = func._schema.name.split("::")[-1]
  raise OperatorNotFound(
    f"bridge: there is no lowering for {func} on the `jax` device (and torch has no "
    f"decomposition for it). {reason or why_not()} Register a lowering, in your code or "
    "a plugin:\n\n"
    "    import bridge, torch, jax.numpy as jnp\n"
    f"    @bridge.register_lowering(torch.ops.{func.namespace}.{name}.{func._overloadname})\n"
    f"    def {name}(*args, **kwargs): ...  # JAX code\n\n"
    "Arguments arrive as in the aten schema with JAX arrays for tensors: "
    f"{func._schema}"
  )
