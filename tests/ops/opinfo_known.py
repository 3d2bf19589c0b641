"""Known failures of the OpInfo test (`tests/ops/test_opinfo.py`), in named lists, one reason each.

Each list maps an OpInfo name (`name.variant_test_name`) to a spec of the
(mode, dtype) pairs that fail: `"*"` for every pair the op runs, or
`"eager jit: f16 bf16; grad: *"` (modes, a colon, dtypes or `*`; `;` between groups).
`ERRORS`, `WRONG_DTYPE` and `SILENTLY_WRONG` add the reason after the spec.

The lists only shrink: the test fails when a listed pair starts passing.
`SILENTLY_WRONG` is the list the project holds at zero: a wrong number is worse
than an error, so a lowering that cannot match torch there must raise instead.
"""

from __future__ import annotations

from typing import Any


def _expand(name: str, spec: str, jobs: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str]]:
  pairs = jobs.get(name, [])
  if spec.strip() == "*":
    return list(pairs)
  out = []
  for group in spec.split(";"):
    modes, _, dtypes = group.partition(":")
    modes_ = modes.split()
    dtypes_ = dtypes.split() or ["*"]
    out.extend((m, d) for m, d in pairs if m in modes_ and (dtypes_ == ["*"] or d in dtypes_))
  return out


def expected() -> dict[tuple[str, str, str], tuple[str, str]]:
  """(op, mode, dtype) -> (status, reason) for every listed pair."""
  from bridge_ops import coverage
  jobs: dict[str, list[tuple[str, str]]] = {}
  for info, dtype, mode in coverage.jobs(coverage.op_db()):
    jobs.setdefault(coverage.full_name(info), []).append((mode, coverage.DTYPES[dtype]))
  out: dict[tuple[str, str, str], tuple[str, str]] = {}
  lists: list[tuple[str, dict[str, Any]]] = [
      ("error", {k: (v, "no lowering yet") for k, v in NO_LOWERING.items()}),
      ("error", ERRORS), ("dtype", WRONG_DTYPE), ("wrong", SILENTLY_WRONG)]
  for status, table in lists:
    for name, entry in table.items():
      specs = entry if isinstance(entry, list) else [entry]
      for spec, reason in specs:
        for mode, dtype in _expand(name, spec, jobs):
          out[(name, mode, dtype)] = (status, reason)
  return out


# No lowering yet: the op (the aten overload in the comment) raises OperatorNotFound.
NO_LOWERING: dict = {
    '_segment_reduce.lengths': '*',  # aten.segment_reduce.default
    '_segment_reduce.offsets': '*',  # aten.segment_reduce.default
    '_upsample_bilinear2d_aa': '*',  # aten._upsample_bilinear2d_aa.default
    'allclose': '*',  # aten.allclose.default
    'angle': '*',  # aten.angle.default
    'as_strided_scatter': '*',  # 
    'bincount': '*',  # aten.bincount.default
    'cdist': '*',  # aten._cdist_forward.default
    'cholesky': '*',  # aten.cholesky.default
    'cholesky_inverse': '*',  # aten.cholesky_inverse.default
    'cholesky_solve': '*',  # aten.cholesky_solve.default
    'conj_physical': 'eager jit: c64',  # aten._conj_physical.default
    'corrcoef': '*',  # aten.equal.default
    'cov': '*',  # aten.equal.default
    'diagonal_scatter': '*',  # 
    'digamma': '*',  # 
    'equal': '*',  # aten.equal.default
    'fft.fft': 'eager jit: *',  # aten._fft_c2c.default, aten._fft_r2c.default
    'fft.fft2': 'eager jit: *',  # aten._fft_c2c.default
    'fft.fftn': 'eager jit: *',  # aten._fft_c2c.default
    'fft.hfft': '*',  # aten._fft_c2r.default
    'fft.hfft2': '*',  # aten._fft_c2c.default
    'fft.hfftn': '*',  # aten._fft_c2c.default
    'fft.ifft': 'eager jit: *',  # aten._fft_c2c.default, aten._fft_r2c.default
    'fft.ifft2': 'eager jit: *',  # aten._fft_c2c.default
    'fft.ifftn': 'eager jit: *',  # aten._fft_c2c.default
    'fft.ihfft': 'eager jit: *',  # aten._fft_r2c.default
    'fft.ihfft2': 'eager jit: *',  # aten._fft_r2c.default
    'fft.ihfftn': 'eager jit: *',  # aten._fft_r2c.default
    'fft.irfft': '*',  # aten._fft_c2r.default
    'fft.irfft2': '*',  # aten._fft_c2r.default
    'fft.irfftn': '*',  # aten._fft_c2r.default
    'fft.rfft': 'eager jit: *',  # aten._fft_r2c.default
    'fft.rfft2': 'eager jit: *',  # aten._fft_r2c.default
    'fft.rfftn': 'eager jit: *',  # aten._fft_r2c.default
    'frexp': '*',  # 
    'gcd': '*',  # 
    'geqrf': '*',  # aten.geqrf.default
    'grid_sampler_3d': '*',  # aten.grid_sampler_3d.default
    'hash_tensor': '*',  # aten.hash_tensor.default
    'histc': '*',  # aten.histc.default
    'histogram': '*',  # aten.histogram.bin_ct
    'histogramdd': '*',  # aten._histogramdd_bin_edges.default
    'i0': '*',  # 
    'igamma': '*',  # 
    'igammac': '*',  # 
    'istft': '*',  # aten._fft_c2r.default
    'lcm': '*',  # 
    'lgamma': '*',  # 
    'linalg.cholesky': '*',  # aten.linalg_cholesky_ex.default
    'linalg.cholesky_ex': '*',  # aten.linalg_cholesky_ex.default
    'linalg.cond': '*',  # aten._linalg_svd.default
    'linalg.det': '*',  # aten._linalg_det.default
    'linalg.eig': 'eager jit: *',  # aten.linalg_eig.default
    'linalg.eigh': '*',  # aten._linalg_eigh.default
    'linalg.eigvals': 'eager jit: *',  # aten.linalg_eig.default
    'linalg.eigvalsh': '*',  # aten._linalg_eigh.default
    'linalg.householder_product': '*',  # aten.linalg_householder_product.default
    'linalg.inv': '*',  # aten.linalg_inv_ex.default
    'linalg.inv_ex': '*',  # aten.linalg_inv_ex.default
    'linalg.ldl_factor': '*',  # aten.linalg_ldl_factor_ex.default
    'linalg.ldl_factor_ex': '*',  # aten.linalg_ldl_factor_ex.default
    'linalg.ldl_solve': '*',  # aten.linalg_ldl_solve.default
    'linalg.lstsq': '*',  # aten.linalg_lstsq.default
    'linalg.lstsq.grad_oriented': '*',  # aten.linalg_lstsq.default
    'linalg.lu': '*',  # aten.linalg_lu.default
    'linalg.lu_factor': '*',  # aten.linalg_lu_factor_ex.default
    'linalg.lu_factor_ex': '*',  # aten.linalg_lu_factor_ex.default
    'linalg.lu_solve': '*',  # aten.linalg_lu_solve.default
    'linalg.matrix_rank': '*',  # aten._linalg_svd.default
    'linalg.matrix_rank.hermitian': '*',  # aten._linalg_eigh.default
    'linalg.pinv': '*',  # aten.linalg_pinv.atol_rtol_tensor
    'linalg.pinv.hermitian': '*',  # aten.linalg_pinv.atol_rtol_tensor
    'linalg.pinv.singular': 'eager: f32 c64; jit grad: *',  # aten.linalg_pinv.atol_rtol_tensor
    'linalg.qr': '*',  # aten.linalg_qr.default
    'linalg.slogdet': '*',  # aten._linalg_slogdet.default
    'linalg.solve': '*',  # aten._linalg_solve_ex.default
    'linalg.solve_ex': '*',  # aten._linalg_solve_ex.default
    'linalg.solve_triangular': '*',  # aten.linalg_solve_triangular.default
    'linalg.svd': '*',  # aten._linalg_svd.default
    'linalg.svdvals': '*',  # aten._linalg_svd.default
    'linalg.tensorinv': '*',  # aten.linalg_inv_ex.default
    'linalg.tensorsolve': '*',  # aten._linalg_solve_ex.default
    'logdet': '*',  # aten._linalg_slogdet.default
    'lu': '*',  # aten.linalg_lu_factor_ex.default
    'lu_solve': '*',  # aten.linalg_lu_solve.default
    'lu_unpack': '*',  # aten.lu_unpack.default
    'matrix_exp': '*',  # aten.linalg_matrix_exp.default
    'mvlgamma.mvlgamma_p_1': '*',  # 
    'mvlgamma.mvlgamma_p_3': '*',  # 
    'mvlgamma.mvlgamma_p_5': '*',  # 
    'nextafter': '*',  # 
    'nn.functional.adaptive_avg_pool3d': '*',  # aten._adaptive_avg_pool3d.default
    'nn.functional.avg_pool3d': '*',  # aten.avg_pool3d.default
    'nn.functional.bilinear': '*',  # aten._trilinear.default
    'nn.functional.ctc_loss': '*',  # aten._ctc_loss.default
    'nn.functional.embedding_bag': '*',  # aten._embedding_bag_forward_only.default
    'nn.functional.fractional_max_pool2d': 'eager: *',  # aten.fractional_max_pool2d.default
    'nn.functional.fractional_max_pool3d': 'eager: *',  # aten.fractional_max_pool3d.default
    'nn.functional.linear_cross_entropy.chunked': '*',  # 
    'nn.functional.linear_cross_entropy.chunked_none': '*',  # 
    'nn.functional.pdist': '*',  # aten._pdist_forward.default
    'nn.functional.rrelu': '*',  # aten.rrelu_with_noise_functional.default
    'norm.nuc': '*',  # aten._linalg_svd.default
    'ormqr': '*',  # aten.ormqr.default
    'pca_lowrank': 'eager: *',  # aten.linalg_qr.default
    'pinverse': '*',  # aten.linalg_pinv.atol_rtol_tensor
    'polygamma.polygamma_n_0': '*',  # aten.polygamma.default
    'polygamma.polygamma_n_1': '*',  # aten.polygamma.default
    'polygamma.polygamma_n_2': '*',  # aten.polygamma.default
    'polygamma.polygamma_n_3': '*',  # aten.polygamma.default
    'polygamma.polygamma_n_4': '*',  # aten.polygamma.default
    'put': '*',  # aten.put.default
    'qr': '*',  # aten.linalg_qr.default
    'renorm': 'eager jit: bf16 f16',  # 
    'resize_': '*',  # aten.resize.default
    'resize_as_': '*',  # aten.resize.default
    'signbit': '*',  # 
    'special.airy_ai': '*',  # aten.special_airy_ai.default
    'special.bessel_j0': '*',  # 
    'special.bessel_j1': '*',  # 
    'special.bessel_y0': '*',  # aten.special_bessel_y0.default
    'special.bessel_y1': '*',  # aten.special_bessel_y1.default
    'special.chebyshev_polynomial_t': '*',  # aten.special_chebyshev_polynomial_t.default
    'special.chebyshev_polynomial_u': '*',  # aten.special_chebyshev_polynomial_u.default
    'special.chebyshev_polynomial_v': '*',  # aten.special_chebyshev_polynomial_v.default
    'special.chebyshev_polynomial_w': '*',  # aten.special_chebyshev_polynomial_w.default
    'special.erfcx': '*',  # 
    'special.hermite_polynomial_h': '*',  # aten.special_hermite_polynomial_h.default
    'special.hermite_polynomial_he': '*',  # aten.special_hermite_polynomial_he.default
    'special.i0e': '*',  # 
    'special.i1': '*',  # 
    'special.i1e': '*',  # 
    'special.laguerre_polynomial_l': '*',  # aten.special_laguerre_polynomial_l.default
    'special.legendre_polynomial_p': '*',  # aten.special_legendre_polynomial_p.default
    'special.log_ndtr': '*',  # 
    'special.modified_bessel_i0': '*',  # aten.special_modified_bessel_i0.default
    'special.modified_bessel_i1': '*',  # aten.special_modified_bessel_i1.default
    'special.modified_bessel_k0': '*',  # aten.special_modified_bessel_k0.default
    'special.modified_bessel_k1': '*',  # aten.special_modified_bessel_k1.default
    'special.ndtri': '*',  # 
    'special.polygamma.special_polygamma_n_0': '*',  # aten.polygamma.default
    'special.scaled_modified_bessel_k0': '*',  # aten.special_scaled_modified_bessel_k0.default
    'special.scaled_modified_bessel_k1': '*',  # aten.special_scaled_modified_bessel_k1.default
    'special.shifted_chebyshev_polynomial_t': '*',  # aten.special_shifted_chebyshev_polynomial_t.default
    'special.shifted_chebyshev_polynomial_u': '*',  # aten.special_shifted_chebyshev_polynomial_u.default
    'special.shifted_chebyshev_polynomial_v': '*',  # aten.special_shifted_chebyshev_polynomial_v.default
    'special.shifted_chebyshev_polynomial_w': '*',  # aten.special_shifted_chebyshev_polynomial_w.default
    'special.spherical_bessel_j0': '*',  # 
    'special.zeta': '*',  # 
    'stft': '*',  # aten._fft_c2c.default, aten._fft_r2c.default
    'svd': '*',  # aten._linalg_svd.default
    'svd_lowrank': 'eager: *',  # aten.linalg_qr.default
    'to_sparse': '*',  # aten._to_sparse.default
    'triangular_solve': '*',  # aten.triangular_solve.default
    'unique': '*',  # aten._unique2.default
    'unique_consecutive': '*',  # aten.unique_consecutive.default
}

# The bridge raises another error: the reason is the error.
ERRORS: dict = {
    '_batch_norm_with_update': ('grad: *', "TypeError: unsupported operand type(s) for +: 'Tensor' and 'DynamicJaxprTracer'"),
    '_native_batch_norm_legit': ('grad: *', 'NotImplementedError: Cannot copy out of meta tensor; no data!'),
    '_unsafe_masked_index_put_accumulate': ('eager jit: bool', 'TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
    'argwhere': ('jit: *', "TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (an op whose result's shape depends on tensor values"),
    'bernoulli': ('jit grad: *', "BridgeError: bridge: the random op aten.bernoulli.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's gene"),
    'bitwise_left_shift': ('eager: *', 'TypeError: shift_left: arrays must have the same number of dimensions, got {1, 2}'),
    'bitwise_right_shift': ('eager: *', 'TypeError: shift_right_arithmetic: arrays must have the same number of dimensions, got {1, 2}'),
    'broadcast_shapes': ('jit: *', "TypeError: function <lambda> at /work/main/bridge_ops/src/bridge_ops/coverage.py:233 traced for jit returned a value of type <class 'torch.Size'>, whi"),
    'cauchy': ('jit: *', "BridgeError: bridge: the random op aten.cauchy.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's generat"),
    'chalf': ('eager jit: *', 'BridgeTypeError: `Tensor.to`: the requested dtype has dtype torch.complex32, which JAX has no exact equivalent for. Cast it to a supported dtype first'),
    'combinations': ('jit grad: *', 'NonConcreteBooleanIndexError: Array boolean indices must be concrete; got bool[1]'),
    'complex': ('eager jit: f16', 'KeyError: torch.complex32'),
    'div.floor_rounding': [
        ('eager: f32 f64 bf16 f16', 'TypeError: rem: arrays must have the same number of dimensions, got {1, 2}'),
        ('eager: i64 i32', 'TypeError: div: arrays must have the same number of dimensions, got {1, 2}'),
    ],
    'div.trunc_rounding': ('eager: i64 i32', 'TypeError: div: arrays must have the same number of dimensions, got {1, 2}'),
    'exponential': ('jit: *', "BridgeError: bridge: the random op aten.exponential.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's ge"),
    'floor_divide': [
        ('eager: f32 f64 bf16 f16', 'TypeError: rem: arrays must have the same number of dimensions, got {1, 2}'),
        ('eager: i64 i32', 'TypeError: div: arrays must have the same number of dimensions, got {1, 2}'),
    ],
    'fmod': ('eager: *', 'TypeError: rem: arrays must have the same number of dimensions, got {1, 2}'),
    'geometric': ('jit: *', "BridgeError: bridge: the random op aten.geometric.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's gene"),
    'grid_sampler_2d': [
        ('eager jit: bf16', 'TypeError: Indexer must have integer or boolean type, got indexer with type bfloat16'),
        ('eager jit: f16', 'TypeError: Indexer must have integer or boolean type, got indexer with type float16'),
        ('eager jit: f32', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
        ('eager jit: f64; grad: *', 'TypeError: Indexer must have integer or boolean type, got indexer with type float64'),
    ],
    'index_add': ('eager jit: bool', 'TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
    'index_put': ('eager: bool', 'TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
    'index_reduce.prod': ('grad: *', 'NotImplementedError: scatter_mul gradients are only implemented if `unique_indices=True`'),
    'item': ('jit: *', 'TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (`.item()`, `bool(t)`, `if t:`, `int(t)` or `float(t'),
    'linalg.pinv.singular': ('eager: f64', 'RuntimeError: expected m1 and m2 to have the same dtype, but got: double != float'),
    'log_normal': ('jit: *', "BridgeError: bridge: the random op aten.log_normal.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's gen"),
    'masked_select': ('jit grad: *', 'NonConcreteBooleanIndexError: Array boolean indices must be concrete; got bool[10,10]'),
    'multinomial': ('jit: *', "BridgeError: bridge: the random op aten.multinomial.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's ge"),
    'narrow': ('jit: *', 'TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (`.item()`, `bool(t)`, `if t:`, `int(t)` or `float(t'),
    'native_batch_norm': ('grad: *', 'NotImplementedError: Cannot copy out of meta tensor; no data!'),
    'native_dropout_backward': [
        ('eager jit: *', 'BridgeTypeError: `Tensor.copy_`: the source is a meta tensor (it has no data); JAX has only dense arrays. Convert it first (e.g. `t.to_dense()`, `t.de'),
        ('grad: *', "AttributeError: 'jaxlib._jax.ArrayImpl' object has no attribute 'type_as'"),
    ],
    'nn.functional.adaptive_max_pool1d': [
        ('eager: *', "TypeError: function run at /work/main/bridge/_src/dispatch.py:355 traced for jit returned a value of type <class 'NotImplementedType'>, which is not a"),
        ('jit grad: *', "TypeError: Multiple dispatch failed for 'torch._ops.aten.adaptive_max_pool2d.default'; all __torch_dispatch__ handlers returned NotImplemented:"),
    ],
    'nn.functional.adaptive_max_pool2d': [
        ('eager: *', "TypeError: function run at /work/main/bridge/_src/dispatch.py:355 traced for jit returned a value of type <class 'NotImplementedType'>, which is not a"),
        ('jit grad: *', "TypeError: Multiple dispatch failed for 'torch._ops.aten.adaptive_max_pool2d.default'; all __torch_dispatch__ handlers returned NotImplemented:"),
    ],
    'nn.functional.batch_norm': ('grad: *', 'NotImplementedError: Cannot copy out of meta tensor; no data!'),
    'nn.functional.feature_alpha_dropout.with_train': ('jit grad: *', "BridgeError: bridge: the random op aten.bernoulli_.float runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's gener"),
    'nn.functional.fractional_max_pool2d': ('jit grad: *', "BridgeError: bridge: the random op aten.uniform.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's genera"),
    'nn.functional.fractional_max_pool3d': ('jit grad: *', "BridgeError: bridge: the random op aten.uniform.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's genera"),
    'nn.functional.gaussian_nll_loss': ('jit grad: *', 'TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (`.item()`, `bool(t)`, `if t:`, `int(t)` or `float(t'),
    'nn.functional.grid_sample': [
        ('eager jit: bf16', 'TypeError: Indexer must have integer or boolean type, got indexer with type bfloat16'),
        ('eager jit: f16', 'TypeError: Indexer must have integer or boolean type, got indexer with type float16'),
        ('eager jit: f32', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
        ('eager jit: f64; grad: *', 'TypeError: Indexer must have integer or boolean type, got indexer with type float64'),
    ],
    'nn.functional.instance_norm': ('grad: *', 'NotImplementedError: Cannot copy out of meta tensor; no data!'),
    'nn.functional.interpolate.bicubic': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.interpolate.bilinear': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.interpolate.linear': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.interpolate.nearest': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.interpolate.nearest-exact': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.interpolate.trilinear': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.max_unpool1d': ('grad: *', 'RuntimeError: elements in indices should be type int64 but got: int64'),
    'nn.functional.max_unpool1d.grad': ('grad: *', 'RuntimeError: elements in indices should be type int64 but got: int64'),
    'nn.functional.max_unpool2d': ('grad: *', 'RuntimeError: elements in indices should be type int64 but got: int64'),
    'nn.functional.max_unpool2d.grad': ('grad: *', 'RuntimeError: elements in indices should be type int64 but got: int64'),
    'nn.functional.max_unpool3d': ('grad: *', 'RuntimeError: elements in indices should be type int64'),
    'nn.functional.max_unpool3d.grad': ('grad: *', 'RuntimeError: elements in indices should be type int64'),
    'nn.functional.multi_head_attention_forward': ('jit grad: *', "BridgeError: bridge: the random op aten.native_dropout.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's"),
    'nn.functional.multi_margin_loss': ('grad: *', 'TypeError: atleast_1d() received an invalid combination of arguments - got (jaxlib._jax.ArrayImpl), but expected one of:'),
    'nn.functional.multilabel_margin_loss': ('grad: *', 'TypeError: atleast_2d() received an invalid combination of arguments - got (jaxlib._jax.ArrayImpl), but expected one of:'),
    'nn.functional.one_hot': ('jit: *', 'TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (`.item()`, `bool(t)`, `if t:`, `int(t)` or `float(t'),
    'nn.functional.pad.circular': [
        ('eager: f64', 'TypeError: lax.dynamic_update_slice requires arguments to have the same dtypes, got float64, float32.'),
        ('eager: i64', 'TypeError: lax.dynamic_update_slice requires arguments to have the same dtypes, got int64, int32.'),
    ],
    'nn.functional.prelu': ('grad: *', "TypeError: unsupported operand type(s) for *: 'jaxlib._jax.ArrayImpl' and 'Tensor'"),
    'nn.functional.soft_margin_loss': ('grad: *', "TypeError: unsupported operand type(s) for *: 'Tensor' and 'jaxlib._jax.ArrayImpl'"),
    'nn.functional.upsample_bilinear': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nn.functional.upsample_nearest': ('*', 'TypeError: Indexer must have integer or boolean type, got indexer with type float32'),
    'nonzero': ('jit: *', "TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (an op whose result's shape depends on tensor values"),
    'normal': ('jit grad: *', "BridgeError: bridge: the random op aten.normal.Tensor_Tensor runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's g"),
    'normal.in_place': ('jit: *', "BridgeError: bridge: the random op aten.normal_.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's genera"),
    'pca_lowrank': ('jit grad: *', "BridgeError: bridge: the random op aten.normal_.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's genera"),
    'rand_like': ('jit: *', "BridgeError: bridge: the random op aten.randn_like.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's gen"),
    'randint_like': ('jit: *', "BridgeError: bridge: the random op aten.randint_like.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's g"),
    'randn_like': ('jit: *', "BridgeError: bridge: the random op aten.randn_like.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's gen"),
    'remainder': ('eager: *', 'TypeError: rem: arrays must have the same number of dimensions, got {1, 2}'),
    'scatter': ('eager jit: bool', 'TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
    'scatter_add': ('eager jit: bool', 'TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
    'scatter_reduce.prod': [
        ('eager jit: bool', 'TypeError: mul does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
        ('grad: *', 'NotImplementedError: scatter_mul gradients are only implemented if `unique_indices=True`'),
    ],
    'scatter_reduce.sum': ('eager jit: bool', 'TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating.'),
    'sparse.mm.reduce': [
        ('eager: bf16', "TypeError: Cannot interpret 'torch.bfloat16' as a data type"),
        ('eager: f16', "TypeError: Cannot interpret 'torch.float16' as a data type"),
        ('eager: f32', "TypeError: Cannot interpret 'torch.float32' as a data type"),
        ('eager: f64', "TypeError: Cannot interpret 'torch.float64' as a data type"),
        ('jit grad: *', 'BridgeTypeError: `bridge.to_jax`: the tensor is a sparse tensor (layout torch.sparse_csr); JAX has only dense arrays. Convert it first (e.g. `t.to_den'),
    ],
    'sparse.sampled_addmm': [
        ('eager: c64', "TypeError: Cannot interpret 'torch.complex64' as a data type"),
        ('eager: f32', "TypeError: Cannot interpret 'torch.float32' as a data type"),
        ('eager: f64', "TypeError: Cannot interpret 'torch.float64' as a data type"),
        ('jit grad: *', 'BridgeTypeError: `bridge.to_jax`: the tensor is a sparse tensor (layout torch.sparse_csr); JAX has only dense arrays. Convert it first (e.g. `t.to_den'),
    ],
    'special.entr': ('eager jit: bool', 'TypeError: neg does not accept dtype bool. Accepted dtypes are subtypes of integer, floating, complexfloating.'),
    'svd_lowrank': ('jit grad: *', "BridgeError: bridge: the random op aten.normal_.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's genera"),
    'take_along_dim': ('grad: *', 'RuntimeError: Expected tensor to have jax:0 Device, but got tensor with cpu Device (while checking arguments for torch.take_along_dim():)'),
    'tensor_split': ('eager jit: *', "RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on jax:0"),
    'to': ('jit grad: *', 'TracedValueError: `bridge.call_torch`: torch code needs the value of a tensor that JAX is tracing (a copy to cpu: `.cpu()`, `.tolist()`, `.numpy()`, `'),
    'uniform': ('jit: *', "BridgeError: bridge: the random op aten.uniform.default runs inside a staged JAX program (`jax.jit`, `lax.scan`, ...), where the `jax` device's genera"),
    'unravel_index': ('*', 'TypeError: div: arrays must have the same number of dimensions, got {1, 3}'),
    'view_as_complex': ('eager jit: f16', 'TypeError: complex does not accept dtype float16 at position 0. Accepted dtypes at position 0 are subtypes of float32, float64.'),
}

# Right values, wrong dtype.
WRONG_DTYPE: dict = {
    'native_layer_norm': ('eager jit: bf16 f16', 'dtype differs'),
    'nn.functional.adaptive_avg_pool1d': ('eager: f64', 'dtype differs'),
}

# Wrong values: to be fixed or made to raise (the project's target is zero).
SILENTLY_WRONG: dict = {
    '__rmod__': ('eager: *', 'output 0 is NotImplementedType, torch gives a tensor'),
    '_batch_norm_with_update': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 7 / 125 (5.6%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 12 / 125 (9.6%)'),
    ],
    '_native_batch_norm_legit': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 3 / 125 (2.4%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 6 / 125 (4.8%)'),
        ('eager jit: f32 f64', 'output 1 has shape (2,), torch (0,)'),
    ],
    'addbmm': [
        ('eager jit: f32 bf16', 'output 0: Mismatched elements: 1 / 50 (2.0%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 2 / 50 (4.0%)'),
        ('eager: i64 i32', 'output 0: Mismatched elements: 50 / 50 (100.0%)'),
    ],
    'addmv': ('eager jit: i64 i32', 'output 0: Mismatched elements: 5 / 5 (100.0%)'),
    'addr': [
        ('eager: bf16', 'output 0: Mismatched elements: 3 / 50 (6.0%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 1 / 50 (2.0%)'),
    ],
    'argsort': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 7113 / 8000 (88.9%)'),
        ('eager jit: bool', 'output 0: Mismatched elements: 7999 / 8000 (100.0%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 3917 / 8000 (49.0%)'),
    ],
    'baddbmm': [
        ('eager jit: c64', 'output 0: Mismatched elements: 2 / 250 (0.8%)'),
        ('eager: i64 i32', 'output 0: Mismatched elements: 247 / 250 (98.8%)'),
    ],
    'complex': [
        ('eager jit: f32', 'output 0: Expected (-8.478373527526855-1.765825867652893j) but got (-1.765825867652893+0j).'),
        ('eager jit: f64', 'output 0: Expected (-4.826984902407649-7.582430495695129j) but got (-7.582430495695129+0j).'),
    ],
    'kthvalue': ('eager jit: i64 i32', 'output 1: Mismatched elements: 6 / 25 (24.0%)'),
    'linalg.norm.subgradients_at_zero': ('grad: *', 'output 0: Mismatched elements: 5 / 5 (100.0%)'),
    'log_softmax': ('eager: bf16 f16', 'output 0: Mismatched elements: 1 / 25 (4.0%)'),
    'logaddexp': ('eager: c64', 'output 0: Mismatched elements: 6 / 25 (24.0%)'),
    'logcumsumexp': ('eager jit: c64', 'output 0: Mismatched elements: 64 / 125 (51.2%)'),
    'logit': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 3 / 125 (2.4%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 17 / 125 (13.6%)'),
    ],
    'logsumexp': ('eager jit: c64', 'output 0: Mismatched elements: 3 / 5 (60.0%)'),
    'native_batch_norm': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 3 / 125 (2.4%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 6 / 125 (4.8%)'),
        ('eager jit: f32 f64', 'output 1 has shape (2,), torch (0,)'),
    ],
    'native_layer_norm': ('grad: *', '3 differentiable outputs where torch gives 1'),
    'nn.functional.adaptive_avg_pool2d': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 13 / 280 (4.6%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 24 / 280 (8.6%)'),
    ],
    'nn.functional.avg_pool1d': ('eager jit: bf16 f16', 'output 0: Mismatched elements: 1 / 18 (5.6%)'),
    'nn.functional.avg_pool2d': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 17 / 243 (7.0%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 43 / 243 (17.7%)'),
    ],
    'nn.functional.batch_norm': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 3 / 125 (2.4%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 6 / 125 (4.8%)'),
    ],
    'nn.functional.channel_shuffle': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 196 / 400 (49.0%)'),
        ('eager jit: bool', 'output 0: Mismatched elements: 92 / 400 (23.0%)'),
        ('eager jit: f32 f64 f16 c64; grad: *', 'output 0: Mismatched elements: 200 / 400 (50.0%)'),
        ('eager jit: i64 i32', 'output 0: Mismatched elements: 192 / 400 (48.0%)'),
    ],
    'nn.functional.conv3d': ('eager jit: f16', 'output 0: Mismatched elements: 2 / 64 (3.1%)'),
    'nn.functional.conv_transpose1d': [
        ('eager: bf16', 'output 0: Mismatched elements: 3 / 176 (1.7%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 2 / 18 (11.1%)'),
    ],
    'nn.functional.conv_transpose2d': [
        ('eager: bf16', 'output 0: Mismatched elements: 31 / 3872 (0.8%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 8 / 108 (7.4%)'),
    ],
    'nn.functional.conv_transpose3d': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 3 / 648 (0.5%)'),
        ('eager jit: c64', 'output 0: Mismatched elements: 2 / 648 (0.3%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 72 / 648 (11.1%)'),
    ],
    'nn.functional.instance_norm': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 7 / 125 (5.6%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 6 / 125 (4.8%)'),
    ],
    'nn.functional.max_pool3d': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 8 / 12 (66.7%)'),
        ('eager jit: f32 f16', 'output 0: Mismatched elements: 12 / 12 (100.0%)'),
        ('eager jit: f64', 'output 0: Mismatched elements: 10 / 12 (83.3%)'),
        ('eager jit: i64 i32', 'output 0: Mismatched elements: 6 / 12 (50.0%)'),
        ('grad: *', 'output 0: Mismatched elements: 13 / 180 (7.2%)'),
    ],
    'nn.functional.pixel_shuffle': [
        ('eager jit: f32 f64 bf16 f16 c64; grad: *', 'output 0: Mismatched elements: 34 / 36 (94.4%)'),
        ('eager jit: bool', 'output 0: Mismatched elements: 18 / 36 (50.0%)'),
        ('eager jit: i64 i32', 'output 0: Mismatched elements: 31 / 36 (86.1%)'),
    ],
    'nn.functional.pixel_unshuffle': [
        ('eager jit: f32 f64 bf16 f16 c64; grad: *', 'output 0: Mismatched elements: 34 / 36 (94.4%)'),
        ('eager jit: bool', 'output 0: Mismatched elements: 18 / 36 (50.0%)'),
        ('eager jit: i64 i32', 'output 0: Mismatched elements: 31 / 36 (86.1%)'),
    ],
    'nn.functional.scaled_dot_product_attention': [
        ('eager: bf16 f16', 'output 0: Mismatched elements: 40 / 96 (41.7%)'),
        ('eager: f32', 'output 0: Mismatched elements: 49 / 96 (51.0%)'),
        ('eager: f64', 'output 0: Mismatched elements: 48 / 96 (50.0%)'),
    ],
    'polar': [
        ('eager jit: f32', 'output 0: Expected (-0.05054442584514618-0.25586867332458496j) but got (-0.25586867332458496+0j).'),
        ('eager jit: f64', 'output 0: Expected (0.5596556930009833-2.010049565676183j) but got (-2.010049565676183+0j).'),
    ],
    'sinc': [
        ('eager jit: bf16', 'output 0: Mismatched elements: 10 / 20 (50.0%)'),
        ('eager jit: f16', 'output 0: Mismatched elements: 12 / 20 (60.0%)'),
    ],
    'sort': [
        ('eager jit: bf16', 'output 1: Mismatched elements: 7113 / 8000 (88.9%)'),
        ('eager jit: bool', 'output 1: Mismatched elements: 7999 / 8000 (100.0%)'),
        ('eager jit: f16', 'output 1: Mismatched elements: 3917 / 8000 (49.0%)'),
    ],
    'topk': [
        ('eager jit: bf16', 'output 1: Mismatched elements: 4 / 75 (5.3%)'),
        ('eager jit: i64 i32', 'output 1: Mismatched elements: 16 / 150 (10.7%)'),
    ],
    'torch.ops.aten._safe_softmax.default': ('grad: *', 'output 0: Mismatched elements: 9 / 24 (37.5%)'),
}
