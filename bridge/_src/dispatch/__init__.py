"""Dispatch: every aten op that reaches a `bridge.Tensor` runs as JAX code.

Each overload gets a plan once, by what its schema says it does:

* view ops (`view`, `t`, `select`, `expand`...) share the input's storage; their
  metadata comes from torch's own meta kernels (`bridge._src.tensor`);
* functional ops run a lowering from the registry, or torch's decomposition,
  jitted and cached per (static arguments, argument structure); JAX caches per
  shapes and dtypes. Results are cast to the dtype torch's meta kernel gives;
* in-place and `out=` ops run their functional twin and store the result;
* where torch raises for a value (an index out of range, an integer division by zero), the
  lowering declares the rule and the op raises torch's error (see "value checks" below).

`Scalar` arguments are traced, so a changing learning rate does not recompile.
All of it runs with JAX's 64-bit types enabled for the duration of the op only,
so int64/float64 tensors keep their dtype without touching global JAX config.

The modules, each with one job (lower ones first; none imports one listed after it):

* `schema`: what an overload's schema says (views, written arguments, traced types), and
  JAX's 64-bit types for the bridge's own computations;
* `fallback`: an op with no lowering and no decomposition runs in eager torch (callback mode);
* `tensors`: tensors in and out: device checks, placement, JAX results as `bridge.Tensor`s;
* `meta`: torch's meta kernels, and a lowering's results cast to their dtypes;
* `checks`: the value checks lowerings declare (torch's errors for out-of-range indices...);
* `resolve`: an overload to a function of JAX arrays: a lowering, torch's decomposition, or
  the fallback;
* `executable`: one op for one argument structure, jitted (eager, staged, checked);
* `folding`: ops on known values while a program is staged, computed by torch's CPU kernel;
* `functional`: the plan of an op that writes nothing;
* `views`: the plan of a view op (shares its input's storage);
* `mutation`: the plans of in-place and `out=` ops (the functional twin, then a store);
* `special`: the ops the core itself must implement (copies, `.item()`, dtype views...);
* `higher_order`: torch's higher-order operators, reached through their own tables, not plans:
  control flow (`torch.cond`, `while_loop`, `scan`, `map`) as `lax.cond` / `lax.while_loop` /
  `lax.scan`, `flex_attention` by torch's math implementation;
* `plans`: the entry: the plan of each overload, chosen once.
"""
