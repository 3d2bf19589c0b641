"""Across processes, as probed: torch.distributed's collectives refuse `jax` tensors by name
(run on copies through the per-op fallback, their results were lost, silently: each rank kept
its own values), and a function compiled where it is defined (`@bridge.compile`) pickles by
its name, so it can be sent to a spawned process."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
import torch.distributed as dist

import bridge


@bridge.compile
def _doubled_sine(x):
  return torch.sin(x) * 2


def test_a_function_compiled_where_it_is_defined_pickles_by_name():
  back = pickle.loads(pickle.dumps(_doubled_sine))
  assert back is _doubled_sine
  torch.testing.assert_close(back(torch.ones(2)), torch.sin(torch.ones(2)) * 2)
  other = bridge.compile(lambda x: x + 1)  # (no name to find it by: pickled as its target)
  with pytest.raises((pickle.PicklingError, AttributeError)):
    pickle.dumps(other)


@pytest.fixture
def one_process_group(tmp_path):
  dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
  yield
  dist.destroy_process_group()


def test_collectives_refuse_jax_tensors_and_name_the_way(one_process_group):
  t = torch.full((3,), 2.0, device="jax")
  calls = {
    "allreduce_": lambda: dist.all_reduce(t),
    "broadcast_": lambda: dist.broadcast(t, src=0),
    "allgather_": lambda: dist.all_gather([torch.empty(3, device="jax")], t),
  }
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for name, call in calls.items():
      with pytest.raises(
        bridge.OperatorNotFound, match=f"c10d::{name}.* does not run on the `jax`"
      ):
        call()
  c = t.cpu()  # the way the message gives
  dist.all_reduce(c)
  t.copy_(c)
  assert t.cpu().tolist() == [2.0, 2.0, 2.0]
