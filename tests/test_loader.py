"""`bridge.DeviceLoader`: batches placed on the devices ahead of use, in order, errors raised."""

import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import bridge
from tests import xla

ROOT = pathlib.Path(__file__).parent.parent


def _mesh():
  return Mesh(np.array(jax.devices()[:1]), ("data",))


def _loader(n=24, batch=4):
  data = torch.utils.data.TensorDataset(
    torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n)
  )
  return torch.utils.data.DataLoader(data, batch_size=batch)


def _threads():
  return [t for t in threading.enumerate() if t.name == "bridge-DeviceLoader"]


def test_batches_arrive_on_the_jax_device_in_order_with_their_dtypes():
  loader = _loader()
  device_loader = bridge.DeviceLoader(loader, NamedSharding(_mesh(), P("data")), prefetch=3)
  assert len(device_loader) == len(loader) == 6
  got = list(device_loader)
  want = list(loader)
  assert len(got) == len(want)
  for (x, y), (wx, wy) in zip(got, want):
    assert x.device.type == "jax" and y.device.type == "jax"
    assert x.dtype == torch.float32 and y.dtype == torch.int64  # exact: no int64 -> int32
    torch.testing.assert_close(x.cpu(), wx)
    torch.testing.assert_close(y.cpu(), wy)
  assert not _threads()


def test_leaving_the_loop_early_stops_the_thread():
  it = iter(bridge.DeviceLoader(_loader(n=400), NamedSharding(_mesh(), P("data"))))
  next(it)
  it.close()
  assert not _threads()


def test_an_error_in_the_loader_is_raised_at_its_batch():
  class Flaky(torch.utils.data.Dataset):
    def __len__(self):
      return 12

    def __getitem__(self, i):
      if i == 9:
        raise KeyError("sample 9 is corrupt")
      return torch.full((2,), float(i))

  batches = torch.utils.data.DataLoader(Flaky(), batch_size=4)
  seen = []
  with pytest.raises(KeyError, match="sample 9 is corrupt"):
    for x in bridge.DeviceLoader(batches, NamedSharding(_mesh(), P("data"))):
      seen.append(x.cpu()[:, 0].tolist())
  assert seen == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
  assert not _threads()


def test_bad_arguments():
  with pytest.raises(bridge.BridgeTypeError, match="prefetch=0"):
    bridge.DeviceLoader(_loader(), NamedSharding(_mesh(), P("data")), prefetch=0)
  with pytest.raises(bridge.BridgeTypeError, match="sharding=None"):
    bridge.DeviceLoader(_loader(), None)


SHARDED = textwrap.dedent("""
    import jax, numpy as np, torch, bridge
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    assert len(jax.devices()) == 8
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    data = torch.utils.data.TensorDataset(torch.randn(40, 6), torch.arange(40))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    spec = NamedSharding(mesh, P("data"))
    order = []
    for x, y in bridge.DeviceLoader(loader, spec):
        a = bridge.jax_view(x)
        assert a.sharding.is_equivalent_to(spec, 2), a.sharding
        assert len(a.addressable_shards) == 8 and a.addressable_shards[0].data.shape == (2, 6)
        order += y.cpu().tolist()
    assert order == list(range(40)), order
    try:
        list(bridge.DeviceLoader(torch.utils.data.DataLoader(data, batch_size=6), spec))
    except bridge.ShardingError as e:
        assert "cannot be split 4 ways" in str(e), e
    else:
        raise AssertionError("a batch of 6 on 4 data shards must be refused")
    print("sharded loader ok")
""")


def test_batches_arrive_sharded_along_the_batch_axis_on_eight_devices():
  env = dict(
    os.environ,
    XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=8"),
    OMP_WAIT_POLICY="PASSIVE",
  )
  out = subprocess.run(
    [sys.executable, "-c", SHARDED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0 and "sharded loader ok" in out.stdout, out.stderr[-3000:]
