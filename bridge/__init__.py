"""bridge: PyTorch and JAX in one process, each calling the other.

Public API. The implementation lives in `bridge._src`; this module only re-exports.
Importing it makes `jax` a torch device (where torch can use a CUDA GPU, only after
`bridge.register_jax_device()`: see its docstring) and sets one default: JAX does not preallocate
most of a GPU's memory (`XLA_PYTHON_CLIENT_PREALLOCATE=false`, unless the variable is
already set), so that torch and JAX can share one GPU. It changes no other setting.
"""

import os as _os

# (read when JAX starts its GPU backend: effective if bridge is imported before JAX first
# touches a device; a user's own value is kept)
_os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from bridge._src import device as _device
from bridge._src import dynamo as _dynamo
from bridge._src.config import config as config
from bridge._src.config import get_config as get_config
from bridge._src.errors import BridgeError as BridgeError
from bridge._src.errors import BridgeTypeError as BridgeTypeError
from bridge._src.errors import CudaAutogradWarning as CudaAutogradWarning
from bridge._src.errors import DeviceMismatchError as DeviceMismatchError
from bridge._src.errors import FallbackWarning as FallbackWarning
from bridge._src.errors import LeakedTracerError as LeakedTracerError
from bridge._src.errors import NarrowingError as NarrowingError
from bridge._src.errors import OperatorNotFound as OperatorNotFound
from bridge._src.errors import PluginError as PluginError
from bridge._src.errors import RegistrationError as RegistrationError
from bridge._src.errors import ShardingError as ShardingError
from bridge._src.errors import TracedValueError as TracedValueError
from bridge._src.errors import TransferError as TransferError
from bridge._src.call_torch import call_torch as call_torch
from bridge._src.compile import Compiled as Compiled
from bridge._src.compile import compile as compile
from bridge._src.device import register_jax_device as register_jax_device
from bridge._src.export import Exported as Exported
from bridge._src.export import export as export
from bridge._src.export import load as load
from bridge._src.dynamo import CompileStats as CompileStats
from bridge._src.dynamo import compile_stats as compile_stats
from bridge._src.call_torch import fallback_ops as fallback_ops
from bridge._src.call_jax import call_jax as call_jax
from bridge._src.loader import DeviceLoader as DeviceLoader
from bridge._src.modules import extract_jax as extract_jax
from bridge._src.registry import register_lowering as register_lowering
from bridge._src.rng import rng_key as rng_key
from bridge._src.sharding import constrain as constrain
from bridge._src.sharding import shard as shard
from bridge._src.tensor import Tensor as Tensor
from bridge._src.transfer import to_jax as to_jax
from bridge._src.transfer import to_torch as to_torch
from bridge._src.views import jax_view as jax_view
from bridge._src.views import torch_view as torch_view

__version__ = "0.1.0"

_device.register()
_dynamo.teach_dynamo()

__all__ = [
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
  "OperatorNotFound",
  "NarrowingError",
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
