"""The entry of dispatch: one plan per aten overload, chosen once by what its schema says.

`bridge.Tensor.__torch_dispatch__` reads the plan from `tensor._PLANS` and asks `get_plan`
for a missing one (`tensor._get_plan` is this module's `get_plan` once it is imported).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from bridge._src import narrowing
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch import higher_order
from bridge._src.dispatch import mutation
from bridge._src.dispatch import special
from bridge._src.dispatch.functional import FunctionalPlan
from bridge._src.dispatch.schema import is_view, mutated_args
from bridge._src.dispatch.tensors import LIKE_OPS, made_elsewhere
from bridge._src.dispatch.views import ViewPlan

_scope_var = scope._ACTIVE
_PLANS: dict[Any, Callable] = tensor_lib._PLANS
_plans_lock = threading.Lock()


def get_plan(func: Any) -> Callable:
  """The plan of aten overload `func`: a callable of (args, kwargs), made on first use."""
  plan = _PLANS.get(func)
  if plan is None:
    if func in _SPECIAL:
      plan = _SPECIAL[func]
      if func in special.NEW_VALUES:
        plan = _proven(func, plan)
    elif is_view(func):
      plan = ViewPlan(func)
    elif mutated_args(func):
      view = mutation.restride_twin(func)
      plan = (
        mutation.RestridePlan(func, view, get_plan)
        if view is not None
        else mutation.MutatingPlan(func, get_plan)
      )
    else:  # (a composite op without a lowering, reached below autograd: `special.composite`)
      plan = special.composite(func) or FunctionalPlan(func)
    if func in LIKE_OPS:
      plan = _placed(func, plan)
    with _plans_lock:
      plan = _PLANS.setdefault(func, plan)
  return plan


_SPECIAL = special.table(get_plan)


def _placed(func: Any, plan: Callable) -> Callable:
  """`plan` of a `_like`/`new_` op, whose result `plan` makes where its input is; one given
  `device=` (another device than its input's), `pin_memory=True` or `layout=` goes through
  `tensors.made_elsewhere`, where torch puts it. The common call passes neither (torch's
  binding passes `pin_memory=False`): three dictionary reads."""

  def like(args: tuple, kwargs: dict) -> Any:
    if kwargs.get("device") is None and not kwargs.get("pin_memory") and "layout" not in kwargs:
      return plan(args, kwargs)
    return made_elsewhere(func, plan, args, kwargs)

  return like


def _proven(func: Any, plan: Callable) -> Callable:
  """`plan` (a special op's that makes new tensors), whose int64 results in a 32-bit program
  are proven exact or refused (`narrowing`; the other plans do it themselves)."""

  def proven(args: tuple, kwargs: dict) -> Any:
    out = plan(args, kwargs)
    if _scope_var.get().narrow:
      narrowing.after_call(func, args, kwargs, out)
    return out

  return proven


# `bridge.Tensor.__torch_dispatch__` looks plans up in `_PLANS` and builds missing ones here.
tensor_lib.set_planner(get_plan)
# torch's higher-order operators (`torch.cond`...) reach `bridge.Tensor` by their own table.
higher_order.register()
