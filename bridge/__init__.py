"""bridge: PyTorch and JAX in one process, each calling the other.

Public API. The implementation lives in `bridge._src`; this module only re-exports.
"""

from bridge._src.errors import BridgeError as BridgeError
from bridge._src.errors import BridgeTypeError as BridgeTypeError
from bridge._src.errors import PluginError as PluginError
from bridge._src.errors import TransferError as TransferError
from bridge._src.interop import call_jax as call_jax
from bridge._src.interop import torch_view as torch_view
from bridge._src.transfer import to_jax as to_jax
from bridge._src.transfer import to_torch as to_torch

__version__ = "0.1.0"

__all__ = [
    "BridgeError",
    "BridgeTypeError",
    "PluginError",
    "TransferError",
    "__version__",
    "call_jax",
    "to_jax",
    "to_torch",
    "torch_view",
]
