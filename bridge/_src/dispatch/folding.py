"""Constant folding: an op on known values while torch code is staged into a JAX program,
computed by torch's CPU kernel, joins the program as a constant.
"""

from __future__ import annotations

from typing import Any

import jax
import torch

from bridge._src import devices as device_lib
from bridge._src import narrowing, transfer
from bridge._src.dispatch.tensors import FOLD_MAX, factory_device, wrap
from bridge._src.tensor import Tensor
from bridge._src.transfer import ArrayImpl

_tree_flatten = jax.tree_util.tree_flatten


UNKNOWN = object()


class _NotFoldable(Exception):
  """A known value `fold` leaves to the lowering (too large, another dtype view)."""


def fold(func: Any, args: tuple, kwargs: dict, narrow: bool) -> Any:
  """An op on known values while torch code is staged into a JAX program, computed by torch's
  own CPU kernel; `UNKNOWN` if it depends on traced values or is too large.

  Values that do not depend on the program's inputs (positions from `torch.arange`, a
  mask built from them) are then known when the torch code asks for them, as in eager torch:
  code that checks them in Python (Hugging Face's "no packed sequences, so no attention mask"
  test) takes torch's eager path instead of building what the values made unnecessary. Their
  results join the program as constants. Compiling each such op in XLA instead (JAX's eager
  mode) costs milliseconds per op.
  """
  for a in args:  # the common case, an op on traced values, found at once
    if type(a) is Tensor and type(a._storage.array) is not ArrayImpl:
      return UNKNOWN
  leaves = _tree_flatten((args, kwargs))[0]
  device = None
  for leaf in leaves:
    if type(leaf) is Tensor:
      a = leaf._storage.array
      if type(a) is not ArrayImpl or a.size > FOLD_MAX or not _is_cpu_array(a):
        return UNKNOWN
      device = device or leaf._storage.device
    elif isinstance(leaf, torch.Tensor) and not (
      leaf.device.type == "cpu" and leaf.numel() <= FOLD_MAX
    ):
      return UNKNOWN

  def to_cpu(x: Any) -> Any:
    if type(x) is Tensor:
      base = transfer.array_to_torch(x._storage.array, copy=None)
      if base.dtype != x.dtype:
        raise _NotFoldable
      return base.as_strided(x.shape, x.stride(), x.storage_offset())
    return x

  def to_jax(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
      if o.numel() > FOLD_MAX or o.device.type != "cpu":
        raise _NotFoldable
      o, bound = narrowing.known(o.detach(), f"the {o.dtype} result of {func}", narrow)
      a = transfer.tensor_to_jax(o.contiguous(), copy=True)
      return a if bound is None else narrowing.track(a, bound)
    if isinstance(o, (tuple, list)):  # (torch's named tuples become plain ones, as in `wrap`)
      return (list if isinstance(o, list) else tuple)(to_jax(x) for x in o)
    return o

  try:
    cpu_args, cpu_kwargs = jax.tree_util.tree_map(
      to_cpu, (args, kwargs), is_leaf=lambda x: isinstance(x, torch.Tensor)
    )
    if "device" in cpu_kwargs:
      cpu_kwargs["device"] = "cpu"
    with torch.no_grad():
      out = func(*cpu_args, **cpu_kwargs)
    if not isinstance(out, (torch.Tensor, tuple, list)):
      return out  # a Python value
    device = device or factory_device(kwargs)
    index = device.index or 0
    with jax.ensure_compile_time_eval(), jax.enable_x64(True):
      out = jax.tree_util.tree_map(
        lambda a: device_lib.place(a, index) if isinstance(a, jax.Array) else a, to_jax(out)
      )
  except (_NotFoldable, RuntimeError, TypeError, ValueError, NotImplementedError):
    return UNKNOWN  # (torch's CPU kernel refused: the lowering decides)
  return wrap(out, device)


def _is_cpu_array(a: Any) -> bool:
  devices = a.sharding.device_set
  return len(devices) == 1 and next(iter(devices)).platform == "cpu"
