"""`DeviceLoader`: batches from a torch `DataLoader`, placed on the devices ahead of their use.

A background thread takes batches from the loader and starts their transfer to
the devices (sharded along the batch axis when a sharding says so) while the
training step runs on the previous ones, as torch_xla's `MpDeviceLoader` does for
XLA devices. JAX transfers are asynchronous, so the thread only has to keep
`prefetch` batches in flight; the consumer gets `jax`-device tensors.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator

import torch

from bridge._src import sharding as sharding_lib
from bridge._src.errors import BridgeTypeError

_DONE = object()


class DeviceLoader:
  """Wraps an iterable of batches (a `torch.utils.data.DataLoader`, usually) so that each
  batch arrives as `jax`-device tensors, placed by `bridge.shard(batch, sharding)`.

  Iterating starts a thread that stays `prefetch` batches ahead of the consumer: the
  next batches load and cross to the devices while the current step computes. Batches
  come in the loader's order; an exception raised by the loader (or by a placement:
  a batch the mesh does not divide) is raised by the iteration at that batch. Leaving
  the loop early stops the thread.

  Args:
    loader: any iterable of batches (pytrees of tensors, arrays and other values).
    sharding: a `jax.sharding.Sharding` for every tensor (e.g.
      `NamedSharding(mesh, PartitionSpec("data"))` splits the batch axis over "data"),
      or a function `(path, tensor) -> Sharding | None`, as in `bridge.shard`.
    prefetch: how many batches to keep in flight (at least 1).

  Example:
    >>> import jax, numpy as np, torch, bridge
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8))
    >>> batches = torch.utils.data.DataLoader(data, batch_size=4)
    >>> for x, y in bridge.DeviceLoader(batches, NamedSharding(mesh, P("data"))):
    ...   assert x.device.type == "jax" and y.dtype == torch.int64
  """

  def __init__(self, loader: Iterable[Any], sharding: Any, *, prefetch: int = 2):
    if sharding is None:
      raise BridgeTypeError(
        "`bridge.DeviceLoader`: sharding=None; pass a `jax.sharding.Sharding` (e.g. "
        "`NamedSharding(mesh, PartitionSpec('data'))`, or `SingleDeviceSharding(device)`) or "
        "a function `(path, tensor) -> Sharding`."
      )
    if not isinstance(prefetch, int) or prefetch < 1:
      raise BridgeTypeError(f"`bridge.DeviceLoader`: prefetch={prefetch!r}; expected an int >= 1.")
    self.loader, self.sharding, self.prefetch = loader, sharding, prefetch

  def __len__(self) -> int:
    return len(self.loader)  # type: ignore[arg-type]

  def __iter__(self) -> Iterator[Any]:
    return _Prefetcher(iter(self.loader), self.sharding, self.prefetch)


class _Prefetcher:
  """One pass over the loader: a thread placing batches into a bounded queue."""

  def __init__(self, batches: Iterator[Any], sharding: Any, prefetch: int):
    self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
    self._stop = threading.Event()
    self._thread = threading.Thread(
      target=self._run, args=(batches, sharding), daemon=True, name="bridge-DeviceLoader"
    )
    self._finished = False
    self._thread.start()

  def _put(self, item: Any) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self, batches: Iterator[Any], sharding: Any) -> None:
    try:
      for batch in batches:
        if self._stop.is_set():
          return
        with torch.no_grad():
          placed = sharding_lib.shard(batch, sharding)
        if not self._put((placed, None)):
          return
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
      self._put((None, e))
      return
    self._put((_DONE, None))

  def __iter__(self) -> "_Prefetcher":
    return self

  def __next__(self) -> Any:
    if self._finished:
      raise StopIteration
    batch, error = self._queue.get()
    if error is not None:
      self.close()
      raise error
    if batch is _DONE:
      self.close()
      raise StopIteration
    return batch

  def close(self) -> None:
    """Stop the thread (leaving a loop early does this when the iterator is dropped)."""
    self._finished = True
    self._stop.set()
    while True:  # unblock a thread waiting on a full queue
      try:
        self._queue.get_nowait()
      except queue.Empty:
        break
    if self._thread is not threading.current_thread():
      self._thread.join(timeout=5)

  def __del__(self) -> None:
    if not self._finished:
      self._stop.set()
