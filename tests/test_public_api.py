"""The public surface is pinned: a change to it must be deliberate (edit this list)."""

from __future__ import annotations

import doctest
import inspect
import os
import subprocess
import sys

import pytest

import bridge
from bridge._src import config as config_lib
from bridge._src import call_torch, compile as compile_lib, modules, rng, transfer
from bridge._src import call_jax as interop  # (the module of call_jax; once named interop.py)

PUBLIC = [
  "BridgeError",
  "BridgeTypeError",
  "CompileStats",
  "Compiled",
  "CudaAutogradWarning",
  "DeviceLoader",
  "DeviceMismatchError",
  "Exported",
  "FallbackWarning",
  "LeakedTracerError",
  "NarrowingError",
  "OperatorNotFound",
  "PluginError",
  "RegistrationError",
  "ShardingError",
  "Tensor",
  "TracedValueError",
  "TransferError",
  "__version__",
  "call_jax",
  "call_torch",
  "compile",
  "compile_stats",
  "config",
  "constrain",
  "export",
  "extract_jax",
  "fallback_ops",
  "get_config",
  "jax_view",
  "load",
  "register_jax_device",
  "register_lowering",
  "rng_key",
  "shard",
  "to_jax",
  "to_torch",
  "torch_view",
]


def test_public_surface_is_pinned():
  assert sorted(bridge.__all__) == PUBLIC
  for name in PUBLIC:
    assert hasattr(bridge, name), name


def test_public_functions_have_type_hints_and_docstrings():
  for name in PUBLIC:
    obj = getattr(bridge, name)
    if inspect.isfunction(obj):
      assert obj.__doc__ and obj.__doc__.strip(), name
      hints = inspect.get_annotations(obj)
      assert "return" in hints, name


def test_errors_form_one_hierarchy():
  for name in (
    "BridgeTypeError",
    "TransferError",
    "PluginError",
    "OperatorNotFound",
    "DeviceMismatchError",
    "RegistrationError",
    "TracedValueError",
    "LeakedTracerError",
    "ShardingError",
    "NarrowingError",
  ):
    assert issubclass(getattr(bridge, name), bridge.BridgeError)
  assert issubclass(bridge.BridgeTypeError, TypeError)
  assert issubclass(bridge.TransferError, ValueError)
  assert issubclass(bridge.NarrowingError, RuntimeError)  # (torch swallows a TypeError)


def test_package_ships_py_typed():
  import importlib.resources

  assert importlib.resources.files("bridge").joinpath("py.typed").is_file()


@pytest.mark.parametrize(
  "module",
  [transfer, interop, config_lib, call_torch, modules, compile_lib, rng],
  ids=lambda m: m.__name__,
)
def test_docstring_examples_run(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  assert result.attempted > 0 and result.failed == 0


def test_import_changes_no_global_jax_config():
  import subprocess
  import sys

  code = (
    "import jax; before = dict(jax.config.values); import bridge; "
    "changed = {k for k in before if jax.config.values[k] != before[k]}; "
    "print(sorted(changed))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


def test_import_keeps_jax_from_preallocating_the_gpu_unless_the_user_set_it():
  code = "import os, bridge; print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"
  env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
  for given, want in ((None, "false"), ("true", "true"), ("false", "false")):
    run_env = dict(env) if given is None else {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": given}
    out = subprocess.run(
      [sys.executable, "-c", code],
      env=run_env,
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
    )
    assert out.stdout.strip() == want


def test_every_exported_exception_is_defined_with_the_others():
  # (discovered, not listed: a new public error or warning must live in bridge/_src/errors.py
  # and fit the hierarchy)
  from bridge._src import errors

  exported = {
    name: getattr(bridge, name)
    for name in bridge.__all__
    if isinstance(getattr(bridge, name), type) and issubclass(getattr(bridge, name), BaseException)
  }
  assert len(exported) >= 12
  for name, cls in exported.items():
    assert cls.__module__ == errors.__name__, f"{name} is defined in {cls.__module__}"
    assert getattr(errors, name) is cls
    if issubclass(cls, Warning):
      assert issubclass(cls, UserWarning), name
    else:
      assert issubclass(cls, bridge.BridgeError), name
