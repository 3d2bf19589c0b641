"""The bridge's exception hierarchy, and its warnings: every class the bridge raises or warns
with on purpose is defined here.

Every error the bridge raises on purpose is a `BridgeError`. Each also derives from
the built-in exception a Python user would expect (`TypeError` for a value of the
wrong kind, `ValueError` for a value the operation cannot honour), so existing
`except TypeError:` code keeps working.

One message style: who speaks, what happened, what to do. A message starts with the call
of the user's that failed, in backticks (`` `bridge.compile`: ``, `` `f`: `` for the user's
function; `torch.compile(backend='jax')` for the backend), or with ``bridge: `` where no
call of the user's is the entry (an op on the `jax` device, a plugin, the registry). Where
torch has an error for the same mistake, the error is torch's, type and message
(`TorchRuntimeError`, `TorchIndexError`). `tests/test_code_checks.py` checks the prefixes.
"""

from __future__ import annotations


class BridgeError(Exception):
  """Base class of every error raised by the bridge."""


class BridgeTypeError(BridgeError, TypeError):
  """A value of a kind or dtype the bridge cannot carry across.

  For example a sparse, quantized, nested or meta tensor, a dtype the other
  framework lacks, a 64-bit tensor while JAX's 64-bit types are disabled, or a
  non-tensor argument that cannot be hashed into a static argument.
  """


class TransferError(BridgeError, ValueError):
  """A transfer that cannot be done the way it was asked for.

  For example `copy=False` when zero-copy is impossible (another device, an
  unaligned buffer, a strided view), or tensors on two different devices given
  to one call.
  """


class NarrowingError(BridgeError, RuntimeError):
  """A 64-bit value that a JAX program built with 64-bit types off cannot hold exactly.

  Torch code staged into such a program holds its int64 values as int32 only where the
  bridge shows they fit (while tracing, or with a check when the program runs); a float64
  value, or an int64 one that may not fit, raises this. (A `RuntimeError`, not a
  `TypeError`: torch turns a `TypeError` raised inside an operator into `NotImplemented`
  and then into its own unrelated "unsupported operand" error.)
  """


class PluginError(BridgeError, RuntimeError):
  """A lowering plugin that cannot be loaded (incompatible registry API, bad entry point)."""


class TorchIndexError(BridgeError, IndexError):
  """torch's `IndexError` for a value on the `jax` device (an index out of range), with
  torch's message: raised where eager torch raises it."""


class TorchRuntimeError(BridgeError, RuntimeError):
  """torch's `RuntimeError` for a value on the `jax` device (an index out of range in
  `gather`/`scatter`, an integer division by zero...), with torch's message."""


class OperatorNotFound(BridgeError, NotImplementedError):
  """An aten op reached the `jax` device and there is no lowering or decomposition for it."""


class DeviceMismatchError(BridgeError, RuntimeError):
  """Tensors on different devices in one op (the `jax` device's version of torch's error)."""


class RegistrationError(BridgeError, ValueError):
  """A lowering registered twice without `override=True`, or for something that is not an op."""


class TracedValueError(BridgeError, RuntimeError):
  """Torch code asked for the value of a tensor that JAX is tracing (`.item()`, `if t:`)."""


class LeakedTracerError(BridgeError, RuntimeError):
  """A tensor traced during one `call_torch`/`compile` call was kept and used after it."""


class ShardingError(BridgeError, ValueError):
  """A placement that cannot be made: a shape the mesh does not divide, a wrong sharding."""


# --- warnings ---------------------------------------------------------------------------------


class FallbackWarning(UserWarning):
  """An op ran through the callback fallback (see `bridge.config(fallback=...)`)."""


class CudaAutogradWarning(UserWarning):
  """`bridge.register_jax_device()` named the device where torch can use a CUDA GPU."""
