"""`torch.autocast(device_type="jax")`: torch's mixed-precision policy on the `jax` device.

Torch ships autocast kernels for its own backends only; for an out-of-tree one
the `AutocastPrivateUse1` key has none, so every op would fail inside
`torch.autocast`. The bridge registers a fallthrough for all ops and, for the
ops torch's CPU autocast handles (read from torch's own registrations, so they
follow the installed torch), a kernel with the same policy:

* matrix products and convolutions (`mm`, `linear`, `conv2d`, ...) run in the
  autocast dtype (bfloat16 by default);
* `cat`, `stack`, `index_copy` promote to their widest floating input;
* every other op on torch's CPU list (losses, `prod`, FFTs, linear algebra...)
  runs in float32.

As in torch, only floating tensors that are not float64 are cast, and only
those on the `jax` device (and, inside `call_torch`/`compile`, the CPU tensors
that become constants of the program).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from bridge._src import scope
from bridge._src import tensor as tensor_lib

_LOWER = frozenset(
  {
    "_addmm_activation",
    "_convolution.deprecated",
    "_native_multi_head_attention",
    "addbmm",
    "addmm",
    "baddbmm",
    "bmm",
    "conv1d",
    "conv1d.padding",
    "conv2d",
    "conv2d.padding",
    "conv3d",
    "conv3d.padding",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "linalg_vecdot",
    "linear",
    "matmul",
    "mkldnn_rnn_layer",
    "mm",
    "prelu",
    "scaled_dot_product_attention",
  }
)
_PROMOTE = frozenset({"cat", "stack", "index_copy"})
# Ops torch's CPU autocast reaches below the op itself: CPU's `lstm` runs oneDNN's
# `mkldnn_rnn_layer` (on `_LOWER`), so its outputs come in the autocast dtype; the
# bridge lowers `lstm` whole, so it gets the same policy at the op.
_LOWER_BELOW = ("lstm.input", "lstm.data")
_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined]
_library: Any = None


def _eligible(t: Any) -> bool:
  # In a trace scope CPU tensors are constants of the program, on the jax device in effect.
  return (
    isinstance(t, torch.Tensor)
    and t.is_floating_point()
    and t.dtype != torch.float64
    and (
      t.device.type == tensor_lib.device_type()
      or (t.device.type == "cpu" and scope.active() is not None)
    )
  )


def _cast(tree: Any, dtype: torch.dtype) -> Any:
  if isinstance(tree, (list, tuple)):
    return type(tree)(_cast(t, dtype) for t in tree)
  return tree.to(dtype) if _eligible(tree) and tree.dtype != dtype else tree


def _widest(args: tuple) -> torch.dtype | None:
  tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a]) if _eligible(t)]
  if not tensors:
    return None
  return functools.reduce(torch.promote_types, [t.dtype for t in tensors])


def _kernel(policy: str, op: Any, *args: Any, **kwargs: Any) -> Any:
  dtype: torch.dtype | None
  if policy == "lower":
    dtype = torch.get_autocast_dtype(tensor_lib.device_type())
  elif policy == "promote":
    dtype = _widest(args)
  else:
    dtype = torch.float32
  if dtype is not None:
    args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
  with torch._C._ExcludeDispatchKeyGuard(_KEY):
    return op(*args, **kwargs)


def register() -> None:
  """Install the fallthrough and the policy kernels (called once, by the device registration)."""
  global _library
  fallthrough = torch.library.Library("_", "IMPL")
  fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
  kernels = torch.library.Library("aten", "IMPL", "AutocastPrivateUse1")
  for name in torch._C._dispatch_get_all_op_names():
    if not name.startswith("aten::") or not torch._C._dispatch_has_kernel_for_dispatch_key(
      name, "AutocastCPU"
    ):
      continue
    short = name[len("aten::") :]
    packet, _, overload = short.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default", None)
    if op is None:
      continue
    policy = "lower" if short in _LOWER else "promote" if short in _PROMOTE else "fp32"
    kernels.impl(short, functools.partial(_kernel, policy, op))
  for short in _LOWER_BELOW:
    packet, _, overload = short.partition(".")
    kernels.impl(
      short, functools.partial(_kernel, "lower", getattr(getattr(torch.ops.aten, packet), overload))
    )
  _library = (fallthrough, kernels)
