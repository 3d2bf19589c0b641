"""How much of torch's OpInfo database the lowerings get right: `python -m bridge_ops.testing.coverage`.

Every OpInfo entry of `torch.testing._internal.common_methods_invocations.op_db`
(variants included, by `name.variant_test_name`) is run, for each dtype of
`DTYPES` that torch supports for it on CPU, three ways:

* `eager`: its sample inputs moved to the `jax` torch device, the op called on them;
* `jit`: the op inside `jax.jit` through `bridge.call_torch`, JAX arrays in;
* `grad`: for differentiable ops, in float64 (float32 where torch has no float64
  backward), `jax.grad` through `call_torch` of `sum(out * cotangent)`, against
  torch autograd of the same sum.

and compared with the same op in torch on CPU. Each (op, dtype, mode) gets one
`Outcome`: "pass" (values within tolerance and the exact dtype), "dtype" (right
values, wrong dtype), "wrong" (wrong values: a silent wrong number), or "error"
(the bridge raised; `detail` says what).

A fourth mode, `X64_OFF` ("jit32"), runs the `jit` way with JAX's 64-bit types off (JAX's
default) for `X64_OFF_DTYPES`: the sample's 64-bit tensors enter as the 32-bit arrays such a
program holds (torch's result is computed from the same narrowed sample), an int64 result
may come back as int32 with exact values ("pass"), and the bridge's refusal of a 64-bit
value it cannot hold exactly (`bridge.NarrowingError`) is "refused". It is not in the table. Ops run with `bridge.config(fallback=
"error")`, so an op that only works through the callback fallback counts as missing.

Random ops (`RANDOM`) and uninitialized memory (`UNINITIALIZED`) compare shapes and
dtypes only: their values are checked statistically in the op tests.

Needs `expecttest` (torch's OpInfo module imports it): the test extras have it.

(Over 600 lines: one tool, its per-op tolerance tables beside the comparison that reads them.)

Over 600 lines on purpose: one tool (the sample runner, its comparisons, the outcome table and
the report); it is not on the runtime import path.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import pathlib
import platform
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import torch
from torch.utils import _pytree as pytree

import bridge  # (this tool runs ops on the core's `jax` device)

# The dtypes measured, with the short names the tables use.
DTYPES: dict[torch.dtype, str] = {
  torch.float32: "f32",
  torch.float64: "f64",
  torch.bfloat16: "bf16",
  torch.float16: "f16",
  torch.int64: "i64",
  torch.int32: "i32",
  torch.bool: "bool",
  torch.complex64: "c64",
}
MODES = ("eager", "jit", "grad")
X64_OFF = "jit32"
X64_OFF_DTYPES = (torch.float32, torch.int64, torch.bool)
SAMPLES = {"eager": 2, "jit": 1, "grad": 2, X64_OFF: 1}  # bounded so the test fits in CI

# Ops whose values are random: compared by shape and dtype only.
RANDOM = frozenset(
  {
    "bernoulli",
    "multinomial",
    "normal",
    "normal.number_mean",
    "normal.in_place",
    "rand_like",
    "randn_like",
    "randint_like",
    "randint",
    "uniform",
    "exponential",
    "geometric",
    "cauchy",
    "log_normal",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu",
    "poisson",
    "randn",
    "rand",
    "randperm",
    "nn.functional.multi_head_attention_forward",
    "svd_lowrank",
    "pca_lowrank",  # a random projection inside: the signs of U and V vary
    # random window offsets, drawn by the functional form on each device separately
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
  }
)
# Ops that return uninitialized memory: compared by shape and dtype only.
UNINITIALIZED = frozenset(
  {
    "empty",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_permuted",
    "torch.empty",
    "resize_",
    "resize_as_",
  }
)

# Per-(op, dtype) tolerances where the numerics legitimately differ: (atol, rtol).
TOLERANCES: dict[tuple[str, torch.dtype | None], tuple[float, float]] = {
  # MKL's batched gemm sums the batch in another order: 1.8e-5 absolute on entries ~10.
  ("addbmm", torch.float32): (3e-5, 1.3e-6),
  # complex alpha/beta scale entries to ~750 that cancel to ~4: 7e-5 absolute after rounding.
  ("baddbmm", torch.complex64): (1e-4, 1.3e-6),
  # torch sums its three real convolutions (Gauss's trick) in another order
  ("nn.functional.conv_transpose3d", torch.complex64): (1e-5, 1e-5),
  # cond = s_max / s_min carries s_min's relative error, about cond * eps: on an AVX-512 CPU
  # torch's complex SVD (MKL) gives 60.80986 where float64 gives 60.81000 (the bridge 60.81001).
  ("linalg.cond", torch.complex64): (1e-5, 1e-5),
  # The loss averages float16 terms of size ~1; XLA:CPU on AVX-512 CPUs contracts a product
  # and a sum into one FMA where torch rounds the product: one float16 ulp of a term (1e-3).
  ("nn.functional.multilabel_soft_margin_loss", torch.float16): (1e-3, 1e-3),
}


def _unit_phase(vectors: torch.Tensor) -> torch.Tensor:
  """Eigenvectors (columns) scaled so each one's largest component is real and positive:
  LAPACK builds may return any unit-modulus multiple of an eigenvector."""
  if vectors.numel() == 0:
    return vectors
  big = vectors.abs().argmax(dim=-2, keepdim=True)
  lead = vectors.gather(-2, big)
  phase = lead / lead.abs().clamp_min(torch.finfo(lead.abs().dtype).tiny)
  return vectors / phase


# (op, dtype or None for all) compared normwise, |got - torch| <= tol * max|torch|, where
# small entries carry the rounding of the largest terms that cancelled into them.
NORMWISE: dict[tuple[str, torch.dtype | None], float] = {
  ("matrix_exp", None): 1e-5,  # errors of a matrix function are normwise
  # torch's CPU transposed convolution rounds its partial sums (gemm, then col2im) to 16
  # bits: up to one ulp of the largest partial term.
  **{(f"nn.functional.conv_transpose{d}d", torch.float16): 2e-3 for d in (1, 2, 3)},
  **{(f"nn.functional.conv_transpose{d}d", torch.bfloat16): 1.6e-2 for d in (1, 2, 3)},
  # torch's bfloat16 batch statistics round differently from a float32 accumulation
  ("nn.functional.instance_norm", torch.bfloat16): 1.6e-2,
  # a*b - c*d in float16: XLA:CPU on AVX-512 CPUs rounds c*d and fuses a*b into an FMA, torch
  # rounds both products (as XLA does on AVX2 CPUs); cancellation leaves an ulp of the products.
  **{(op, torch.float16): 2e-3 for op in ("cross", "linalg.cross", "addr")},
}

# Ops whose saved statistics (outputs after the first) torch's CPU kernel makes differently
# from its meta (and CUDA) kernel, which the bridge follows: (0,)-shaped in eval mode on CPU,
# (C,) in meta; float16 on CPU, float32 in meta. Their values are compared where CPU has any,
# their dtypes are not.
META_AUX = frozenset(
  {"native_batch_norm", "_native_batch_norm_legit", "native_layer_norm", "_batch_norm_with_update"}
)

# Samples whose values are random although the op is not (dropout inside attention).
RANDOM_SAMPLES: dict[str, Callable[[Any], bool]] = {
  "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0) > 0,
}

# (op, dtype) pairs not compared, with the reason.
NOT_COMPARED: dict[tuple[str, torch.dtype], str] = {
  ("matrix_exp", torch.float16): "torch's 16-bit matrix_exp gives NaN on the samples (overflow)",
  ("matrix_exp", torch.bfloat16): "torch's 16-bit matrix_exp gives NaN on the samples (overflow)",
}

# Ops whose outputs are defined up to a gauge: both sides are normalized before comparing.
GAUGE: dict[str, Callable[[Any], Any]] = {
  "linalg.eigh": lambda out: (out[0], _unit_phase(out[1])),
  "linalg.eig": lambda out: (out[0], _unit_phase(out[1])),
}

# Ops whose torch backward is itself wrong: op_db marks its gradcheck
# (`TestBwdGradients.test_fn_grad`) as an expected failure. Their gradients are compared with
# central finite differences of torch's forward (float64) instead.
NUMERIC_GRAD: dict[str, str] = {
  "as_strided_scatter": "torch's backward gives the gradient at the overwritten elements "
  "instead of at the kept ones",
}


def _numeric_vjp(
  loss: Callable[[list], torch.Tensor], ins: list, wrt: list, eps: float = 1e-6
) -> list:
  """Central differences of `loss` with respect to `ins[i]` for i in `wrt` (torch, no grad)."""
  out = []
  with torch.no_grad():
    base = [t.detach().clone() for t in ins]
    for i in wrt:
      g = torch.zeros_like(base[i])
      flat = g.view(-1)
      for j in range(flat.numel()):
        values = []
        for step in (eps, -eps):
          moved = list(base)
          moved[i] = base[i].clone()
          moved[i].view(-1)[j] += step
          values.append(float(loss(moved)))
        flat[j] = (values[0] - values[1]) / (2 * eps)
      out.append(g)
  return out


@dataclasses.dataclass(frozen=True)
class Outcome:
  """The result of one (op, dtype, mode): `status` in pass/dtype/wrong/error/skip (and
  refused, in the `X64_OFF` mode)."""

  op: str
  dtype: str
  mode: str
  status: str
  detail: str = ""


def full_name(info: Any) -> str:
  """`name.variant_test_name`, or `name` for an entry without a variant."""
  return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


_FAMILIES = (
  ("special.", "special functions"),
  ("linalg.", "linear algebra"),
  ("fft.", "fft"),
  ("nn.functional.conv", "convolution"),
  ("nn.functional.max_pool", "pooling"),
  ("nn.functional.avg_pool", "pooling"),
  ("nn.functional.adaptive", "pooling"),
  ("nn.functional.fractional", "pooling"),
  ("nn.functional.lp_pool", "pooling"),
  ("max_pool", "pooling"),
  ("nn.functional.interpolate", "interpolation"),
  ("nn.functional.upsample", "interpolation"),
  ("nn.functional.grid_sample", "interpolation"),
  ("nn.functional.affine_grid", "interpolation"),
  ("nn.functional.embedding", "embedding"),
  ("nn.functional.", "nn functional"),
  ("_refs.", "refs"),
  ("_", "private"),
)
_SETS = {
  "linear algebra": {
    "addbmm",
    "addmm",
    "addmv",
    "addr",
    "baddbmm",
    "bmm",
    "mm",
    "mv",
    "matmul",
    "dot",
    "vdot",
    "inner",
    "outer",
    "ger",
    "kron",
    "tensordot",
    "einsum",
    "chain_matmul",
    "matrix_exp",
    "cholesky",
    "cholesky_solve",
    "cholesky_inverse",
    "geqrf",
    "lu",
    "lu_solve",
    "lu_unpack",
    "ormqr",
    "pinverse",
    "qr",
    "svd",
    "svd_lowrank",
    "pca_lowrank",
    "triangular_solve",
    "logdet",
    "det",
    "inverse",
    "trace",
  },
  "reductions and scans": {
    "sum",
    "prod",
    "mean",
    "nanmean",
    "std",
    "var",
    "std_mean",
    "var_mean",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "all",
    "any",
    "norm",
    "nansum",
    "logsumexp",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "logcumsumexp",
    "median",
    "nanmedian",
    "mode",
    "count_nonzero",
    "aminmax",
    "quantile",
    "nanquantile",
    "kthvalue",
    "cumulative_trapezoid",
    "trapz",
    "trapezoid",
    "diff",
    "renorm",
    "dist",
    "histc",
    "bincount",
    "histogram",
    "histogramdd",
  },
  "sorting and search": {
    "sort",
    "argsort",
    "topk",
    "unique",
    "unique_consecutive",
    "searchsorted",
    "bucketize",
    "msort",
    "isin",
  },
  "indexing": {
    "gather",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "index_put",
    "index_add",
    "index_copy",
    "index_fill",
    "index_select",
    "index_reduce",
    "masked_fill",
    "masked_scatter",
    "masked_select",
    "take",
    "take_along_dim",
    "put",
    "__getitem__",
    "nonzero",
    "nonzero_static",
    "argwhere",
    "where",
    "select_scatter",
    "slice_scatter",
    "diagonal_scatter",
    "as_strided_scatter",
    "masked.",
    "select",
  },
}


def family(name: str) -> str:
  """The op family a name belongs to, for the coverage table."""
  base = (
    name.split(".")[0]
    if not name.startswith(("special.", "linalg.", "fft.", "nn.", "_refs.", "masked.", "sparse."))
    else name
  )
  for fam, names in _SETS.items():
    if base in names or name in names or any(name.startswith(n) for n in names if n.endswith(".")):
      return fam
  for prefix, fam in _FAMILIES:
    if name.startswith(prefix):
      return fam
  return "elementwise, shape and other"


# ---------------------------------------------------------------------------- running one op


def _call(info: Any, tree: tuple) -> Any:
  inp, args, kwargs = tree
  return info.op(inp, *args, **kwargs)


def _map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
  return pytree.tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, tree)


def _clone(t: torch.Tensor) -> torch.Tensor:
  return t.detach().clone().requires_grad_(t.requires_grad)


class _Mismatch(Exception):
  """The bridge's result differs from torch's (a silently wrong number)."""


class _TorchRefused(Exception):
  """Torch itself raises on this sample: there is nothing to compare with."""


def _compare(
  name: str, dtype: torch.dtype, actual: Any, expected: Any, values: bool, narrowed: bool = False
) -> str:
  """ "pass" or "dtype" (right values, another dtype); raises `_Mismatch` for wrong values.
  `narrowed`: an int32 result where torch gives int64 (a 32-bit program's) is the dtype."""
  act, exp = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
  if len(act) != len(exp):
    raise _Mismatch(f"{len(act)} outputs where torch gives {len(exp)}")
  status = "pass"
  tol = TOLERANCES.get((name, dtype)) or TOLERANCES.get((name, None))
  kw: dict[str, Any] = {"atol": tol[0], "rtol": tol[1]} if tol else {}
  for i, (a, e) in enumerate(zip(act, exp)):
    if not isinstance(e, torch.Tensor):
      if values and not _same_value(a, e):
        raise _Mismatch(f"output {i} is {a!r}, torch gives {e!r}")
      continue
    if not isinstance(a, torch.Tensor):
      raise _Mismatch(f"output {i} is {type(a).__name__}, torch gives a tensor")
    aux = name in META_AUX and i > 0
    if aux and e.numel() == 0:
      continue
    if tuple(a.shape) != tuple(e.shape):
      raise _Mismatch(f"output {i} has shape {tuple(a.shape)}, torch {tuple(e.shape)}")
    if (
      a.dtype != e.dtype
      and not aux
      and not (narrowed and (e.dtype, a.dtype) == (torch.int64, torch.int32))
    ):
      status = "dtype"
    if not values or e.numel() == 0:
      continue
    normwise = NORMWISE.get((name, dtype), NORMWISE.get((name, None)))
    if normwise is not None:
      kw = {"atol": normwise * float(e.abs().max()), "rtol": 0}
    try:
      torch.testing.assert_close(
        a.detach().cpu().to(e.dtype).resolve_conj().resolve_neg(),
        e.detach().resolve_conj().resolve_neg(),
        equal_nan=True,
        check_device=False,
        check_layout=False,
        check_stride=False,
        **kw,
      )
    except AssertionError as err:
      raise _Mismatch(f"output {i}: " + " ".join(str(err).split("\n")[1:3]).strip()) from None
  return status


def _same_value(a: Any, e: Any) -> bool:
  if isinstance(a, torch.Tensor):
    a = a.item() if a.numel() == 1 else a.tolist()
  if isinstance(e, float) and e != e:
    return a != a
  try:
    return bool(a == e)
  except Exception:  # noqa: BLE001 - values that cannot be compared are a mismatch
    return False


# Ops whose tensor arguments other than the first stay on the CPU, as torch requires
# on every device (`tensor_split(x, indices_tensor)`).
CPU_ARGS = frozenset({"tensor_split"})


def _reference(info: Any, tree: tuple) -> Any:
  try:
    return _call(info, _map(_clone, tree))
  except Exception as err:  # (torch refuses the sample)
    raise _TorchRefused() from err


def _eager(info: Any, tree: tuple) -> Any:
  def move(t):
    return t.detach().clone().to("jax")

  if full_name(info) in CPU_ARGS:
    moved = (move(tree[0]), tree[1], tree[2])
  else:
    moved = _map(move, tree)
  return _map(lambda t: t.cpu(), _call(info, moved))


def _keyed(fn: Callable, *arrays: Any) -> Any:
  """`call_torch(fn, *arrays)` with a key current, for the random ops inside a staged program."""

  with bridge.rng_key(jax.random.key(0)):
    return bridge.call_torch(fn, *arrays)


def _substitute(tree: tuple, select: Callable[[torch.Tensor], bool]) -> tuple[list, Callable]:
  """The tensors of `tree` that `select` picks, and `rebuild(tensors) -> tree` with them replaced
  (the other tensors cloned, so a call never writes into the sample)."""
  leaves, spec = pytree.tree_flatten(tree)
  idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and select(v)]

  def rebuild(ts):
    full = [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in leaves]
    for i, t in zip(idx, ts):
      full[i] = t
    return pytree.tree_unflatten(full, spec)

  return [leaves[i] for i in idx], rebuild


def _narrowed(t: torch.Tensor) -> torch.Tensor:
  """A 64-bit tensor as the 32-bit array a program built with 64-bit types off holds."""
  return t.to(
    {torch.int64: torch.int32, torch.float64: torch.float32, torch.complex128: torch.complex64}.get(
      t.dtype, t.dtype
    )
  )


def _jit(info: Any, tree: tuple, x64: bool = True) -> Any:

  first = tree[0]
  cpu_args = full_name(info) in CPU_ARGS
  tensors, rebuild = _substitute(tree, lambda t: not cpu_args or t is first)
  with jax.enable_x64(True) if x64 else contextlib.nullcontext():
    arrays = [bridge.to_jax(t.detach().clone(), copy=True) for t in tensors]
    found: dict = {}

    def program(*a):
      # Non-tensor results (a `torch.Size`, a Python bool) are known while tracing.
      leaves, found["spec"] = jax.tree_util.tree_flatten(
        _keyed(lambda *ts: _call(info, rebuild(ts)), *a)
      )
      found["leaves"] = [None if isinstance(v, jax.Array) else v for v in leaves]
      return [v for v in leaves if isinstance(v, jax.Array)]

    arrays_out = iter(jax.jit(program)(*arrays))
  leaves = [next(arrays_out) if v is None else v for v in found["leaves"]]
  with jax.enable_x64(True):
    return bridge.to_torch(jax.tree_util.tree_unflatten(found["spec"], leaves), copy=True)


def _differentiable(out: Any) -> list:
  return [
    o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.dtype.is_floating_point
  ]


def _grad(
  info: Any, tree: tuple, seed: int, post: Callable = lambda out: out
) -> tuple[list, list] | None:
  """(bridge's gradients, torch's) of `sum(out * cotangent)` over the floating outputs,
  with respect to the sample's tensors that require grad; None when there are none.
  Every tensor of the sample enters the JAX program as an array; JAX differentiates
  with respect to those that require grad."""

  first, cpu_args = tree[0], full_name(info) in CPU_ARGS
  tensors, rebuild = _substitute(tree, lambda t: not cpu_args or t is first)
  wrt = [i for i, t in enumerate(tensors) if t.requires_grad]
  if not wrt:
    return None
  ins = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
  try:
    floats = _differentiable(post(_call(info, rebuild(ins))))
  except Exception as err:  # (torch refuses the sample)
    raise _TorchRefused() from err
  keep = [i for i, o in enumerate(floats) if o.requires_grad]  # torch's differentiable outputs
  outs = [floats[i] for i in keep]
  if not outs:
    return None
  gen = torch.Generator().manual_seed(seed)
  cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
  if full_name(info) in NUMERIC_GRAD:

    def torch_loss(ts):
      got = _differentiable(post(_call(info, rebuild(ts))))
      return sum((got[i] * c).sum() for i, c in zip(keep, cots))

    expected = _numeric_vjp(torch_loss, ins, wrt)
  else:
    grads = torch.autograd.grad(outs, [ins[i] for i in wrt], cots, allow_unused=True)
    expected = [torch.zeros_like(ins[i]) if g is None else g for i, g in zip(wrt, grads)]

  def loss(*ts):
    got = _differentiable(post(_call(info, rebuild(ts))))
    if len(got) != len(floats):
      raise _Mismatch(f"{len(got)} floating outputs where torch gives {len(floats)}")
    return sum((got[i] * c.to(got[i].device)).sum() for i, c in zip(keep, cots))

  with jax.enable_x64(True):
    arrays = [bridge.to_jax(t.detach().clone(), copy=True) for t in ins]
    grads = jax.jit(jax.grad(lambda *a: _keyed(loss, *a), argnums=tuple(wrt)))(*arrays)
    return [bridge.to_torch(g, copy=True) for g in grads], expected


def _samples(info: Any, dtype: torch.dtype, requires_grad: bool, n: int) -> list:
  torch.manual_seed(0)
  out = []
  try:
    for s in info.sample_inputs("cpu", dtype, requires_grad=requires_grad):
      out.append(s)
      if len(out) >= n:
        break
  except Exception:  # noqa: BLE001 - torch's own sample generator failing is torch's business
    pass
  return out


def _first_line(err: BaseException) -> str:
  msg = str(err).strip().split("\n")[0][:160]
  return f"{type(err).__name__}: {msg}"


def grad_dtype(info: Any) -> torch.dtype | None:
  """The dtype the grad mode runs in, or None when the op is not differentiable here."""
  if not info.supports_autograd:
    return None
  back = info.supported_backward_dtypes("cpu")
  for d in (torch.float64, torch.float32):
    if d in back:
      return d
  return None


def _run(info: Any, dtype: torch.dtype, mode: str, sample: Any, k: int, values: bool) -> str | None:
  """The status of one sample ("pass" or "dtype"), None when there is nothing to compare."""
  name = full_name(info)
  tree = (sample.input, sample.args, sample.kwargs)
  torch.manual_seed(k)
  if mode == "grad":
    # The sample's own `output_process_fn_grad` (torch's gradient tests use it too) makes
    # the differentiated outputs well defined: e.g. eigenvectors up to their sign.
    pair = _grad(info, tree, k, sample.output_process_fn_grad)
    return None if pair is None else _compare(name, dtype, pair[0], pair[1], values)
  if mode == X64_OFF:
    tree = _map(_narrowed, tree)
  expected = _reference(info, tree)
  torch.manual_seed(k)
  got = _eager(info, tree) if mode == "eager" else _jit(info, tree, x64=mode != X64_OFF)
  if name in GAUGE:
    got, expected = GAUGE[name](got), GAUGE[name](expected)
  return _compare(name, dtype, got, expected, values, narrowed=mode == X64_OFF)


def check(info: Any, dtype: torch.dtype, mode: str) -> Outcome:
  """Runs one (op, dtype, mode) on up to `SAMPLES[mode]` samples and says how it went."""

  name, short = full_name(info), DTYPES[dtype]
  values = name not in RANDOM and name not in UNINITIALIZED
  status, detail, ran = "pass", "", 0
  if (name, dtype) in NOT_COMPARED:
    return Outcome(name, short, mode, "skip", NOT_COMPARED[(name, dtype)])
  with warnings.catch_warnings(), bridge.config(fallback="error"):
    warnings.simplefilter("ignore")
    for k, sample in enumerate(_samples(info, dtype, mode == "grad", SAMPLES[mode])):
      try:
        random = name in RANDOM_SAMPLES and RANDOM_SAMPLES[name](sample)
        s = _run(info, dtype, mode, sample, k, values and not random)
      except _TorchRefused:
        continue
      except _Mismatch as err:
        return Outcome(name, short, mode, "wrong", f"sample {k}: {err}")
      except bridge.NarrowingError as err:  # (the `X64_OFF` mode's refusal, while tracing)
        return Outcome(name, short, mode, "refused", f"sample {k}: {_first_line(err)}")
      except Exception as err:  # noqa: BLE001 - every failure of the bridge is recorded
        # (a run-time check of the `X64_OFF` mode fails the program's run: JAX's error)
        refused = mode == X64_OFF and "NarrowingError" in str(err)
        return Outcome(
          name, short, mode, "refused" if refused else "error", f"sample {k}: {_first_line(err)}"
        )
      if s is None:
        continue
      ran += 1
      if s == "dtype" and status == "pass":
        status, detail = "dtype", f"sample {k}: dtype differs"
  if not ran:
    return Outcome(name, short, mode, "skip", "no sample torch runs")
  return Outcome(name, short, mode, status, detail)


def jobs(infos: Sequence[Any], modes: Iterable[str] = MODES) -> list[tuple[Any, torch.dtype, str]]:
  """Every (op, dtype, mode) the coverage runs for `infos`."""
  out = []
  for info in infos:
    supported = info.supported_dtypes("cpu")
    for mode in modes:
      if mode == "grad":
        d = grad_dtype(info)
        if d is not None:
          out.append((info, d, mode))
        continue
      dtypes = X64_OFF_DTYPES if mode == X64_OFF else DTYPES
      out.extend((info, d, mode) for d in dtypes if d in supported)
  return out


def op_db() -> list:
  """torch's OpInfo entries, sorted by full name."""
  from torch.testing._internal.common_methods_invocations import op_db as db  # (heavy)

  return sorted(db, key=full_name)


# ---------------------------------------------------------------------------- the report


def summarize(outcomes: Sequence[Outcome]) -> dict[str, dict[str, collections.Counter]]:
  """family -> mode -> Counter(status)."""
  table: dict = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
  for o in outcomes:
    if o.status != "skip":
      table[family(o.op)][o.mode][o.status] += 1
  return table


def markdown(outcomes: Sequence[Outcome]) -> str:
  """The coverage table, per family and mode: passing pairs over all pairs."""
  table = summarize(outcomes)
  lines = ["| family | eager | jit | grad | silently wrong |", "|---|---|---|---|---|"]
  totals: dict = collections.defaultdict(collections.Counter)

  def cell(c: collections.Counter) -> str:
    n = sum(c.values())
    return f"{c['pass']}/{n} ({100 * c['pass'] / n:.1f}%)" if n else "-"

  for fam in sorted(table):
    row = table[fam]
    wrong = sum(row[m]["wrong"] for m in MODES)
    for m in MODES:
      totals[m].update(row[m])
    lines.append(f"| {fam} | " + " | ".join(cell(row[m]) for m in MODES) + f" | {wrong} |")
  lines.append(
    "| **all** | "
    + " | ".join(f"**{cell(totals[m])}**" for m in MODES)
    + f" | **{sum(totals[m]['wrong'] for m in MODES)}** |"
  )
  return "\n".join(lines)


def _worker(names: list[str], modes: tuple) -> list[Outcome]:

  infos = [i for i in op_db() if full_name(i) in set(names)]
  return [check(i, d, m) for i, d, m in jobs(infos, modes)]


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m bridge_ops.testing.coverage", description=__doc__.split("\n")[0]
  )
  parser.add_argument("--ops", nargs="*", help="only these OpInfo names (default: all)")
  parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
  parser.add_argument(
    "--out",
    default=None,
    help="where the markdown page goes (default: COVERAGE.md beside bridge_ops' "
    "pyproject.toml in a source checkout, else ./COVERAGE.md)",
  )
  parser.add_argument(
    "--failures", action="store_true", help="print every failing (op, dtype, mode)"
  )
  parser.add_argument("--json", default=None, help="write every outcome here as JSON lines")
  parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
  args = parser.parse_args(argv)

  infos = op_db()
  if args.ops:
    infos = [i for i in infos if full_name(i) in args.ops or i.name in args.ops]
  names = [full_name(i) for i in infos]
  start = time.time()
  if args.jobs > 1:
    chunks = [names[k :: args.jobs * 8] for k in range(args.jobs * 8)]
    with concurrent.futures.ProcessPoolExecutor(
      args.jobs, mp_context=multiprocessing.get_context("spawn")
    ) as ex:
      outcomes = [
        o for part in ex.map(_worker, chunks, [tuple(args.modes)] * len(chunks)) for o in part
      ]
  else:
    outcomes = _worker(names, tuple(args.modes))
  if args.failures:
    for o in sorted(outcomes, key=lambda o: (o.op, o.mode, o.dtype)):
      if o.status not in ("pass", "skip"):
        print(f"{o.op:45s} {o.mode:5s} {o.dtype:4s} {o.status:5s} {o.detail}")
  if args.json:
    with open(args.json, "w") as f:
      for o in outcomes:
        f.write(json.dumps(dataclasses.asdict(o)) + "\n")
  text = markdown(outcomes)
  print(text)
  took = time.time() - start
  print(f"\n{len(infos)} OpInfo entries, {len(outcomes)} (op, dtype, mode) runs in {took:.0f} s")
  if not args.ops:  # a partial run does not replace the page
    out = args.out or _default_page()
    with open(out, "w") as f:
      f.write(_page(text, len(infos)))
    print(f"wrote {out}")
  return 0


def _default_page() -> str:

  checkout = pathlib.Path(__file__).resolve().parents[3]
  if (checkout / "pyproject.toml").exists() and checkout.name == "bridge_ops":
    return str(checkout / "COVERAGE.md")
  return "COVERAGE.md"


def _page(table: str, n_ops: int) -> str:

  dtypes = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
  return (
    "# bridge_ops coverage of torch's OpInfo database\n\n"
    f"Written by `python -m bridge_ops.testing.coverage` (torch {torch.__version__}, JAX {jax.__version__}, "
    f"{platform.machine()} CPU). Each of the {n_ops} OpInfo entries of `op_db` (variants "
    f"included) runs for every dtype torch supports for it on CPU among {dtypes}, on up to "
    f"{SAMPLES['eager']} sample inputs eagerly on the `jax` device, {SAMPLES['jit']} under "
    "`jax.jit` through `bridge.call_torch`, and, for differentiable ops, "
    f"{SAMPLES['grad']} under `jax.grad` (float64) against torch autograd. A pair passes "
    "when every sample gives torch's values (torch.testing tolerances) with torch's exact "
    "dtype. *Silently wrong* counts (op, dtype, mode) results with wrong values; a pair that "
    "raises is a failure, not a wrong number. The failures, each with its reason, are listed "
    "in [`tests/ops/opinfo_known.py`](../tests/ops/opinfo_known.py).\n\n" + table + "\n"
  )


if __name__ == "__main__":
  sys.exit(main())
