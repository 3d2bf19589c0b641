"""`python -m bridge`: versions, devices, plugins, then one call each way with a gradient."""

from __future__ import annotations

import platform
import sys

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import torch

import bridge
from bridge._src import plugins


def _fmt(values: list[float]) -> str:
  return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _versions() -> None:
  print(
    f"bridge {bridge.__version__} | torch {torch.__version__} | jax {jax.__version__} | "
    f"jaxlib {jaxlib.__version__} | numpy {np.__version__} | python {platform.python_version()}"
  )
  found = plugins.discover()
  if not found:
    print("lowering plugins: none installed (pip install -e ./bridge_ops)")
  for p in found:
    print(
      f"lowering plugin: {p.distribution} {p.version} (entry point {p.name!r}, "
      f"registry API {p.api_version})"
    )
  cuda = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA"
  print(f"JAX devices: {jax.devices()} (default backend {jax.default_backend()}); torch: {cuda}")


def _jax_from_torch() -> float:
  print("\n1. JAX from torch: `bridge.call_jax`, gradient by torch autograd through jax.vjp")

  @bridge.torch_view
  def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

  x = torch.randn(4, 8, requires_grad=True)
  scale = torch.ones(8, requires_grad=True)
  loss = rms_norm(x, scale).pow(2).sum()
  loss.backward()
  x_ref, s_ref = x.detach().requires_grad_(), scale.detach().requires_grad_()
  y_ref = x_ref * torch.rsqrt(x_ref.pow(2).mean(-1, keepdim=True) + 1e-6) * s_ref
  y_ref.pow(2).sum().backward()
  assert x.grad is not None and scale.grad is not None
  assert x_ref.grad is not None and s_ref.grad is not None
  err = max((x.grad - x_ref.grad).abs().max().item(), (scale.grad - s_ref.grad).abs().max().item())
  print(f"   loss {loss.item():.4f}; d loss/d scale[:3] = {_fmt(scale.grad[:3].tolist())}")
  print(f"   max |grad - torch autograd grad| = {err:.2e}")
  return err


def _torch_from_jax() -> float:
  print("\n2. torch from JAX: a torch model inside jax.jit, differentiated by jax.grad")
  torch.manual_seed(0)
  net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
  params, fn = bridge.extract_jax(net)  # the torch module as a pure JAX function
  x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
  loss = lambda p, x: jnp.mean(fn(p, x) ** 2)
  value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
  net(torch.tensor(np.asarray(x))).pow(2).mean().backward()
  err = max(
    float(jnp.max(jnp.abs(grads[name] - p.grad.numpy())))  # type: ignore[union-attr]
    for name, p in net.named_parameters()
  )  # (each has a .grad after backward)
  print(f"   loss {float(value):.4f}; d loss/d bias = {_fmt(np.asarray(grads['2.bias']).tolist())}")
  print(f"   max |jax.grad - torch autograd grad| = {err:.2e}")
  return err


def _zero_copy() -> bool:
  print("\n3. Zero-copy transfers")
  t = torch.empty(2**26)  # 256 MiB
  a = bridge.to_jax(t, copy=False)
  same = a.unsafe_buffer_pointer() == t.data_ptr()
  print(f"   to_jax of a {t.numel() * 4 // 2**20} MiB tensor shares its buffer: {same}")
  return same


def main() -> int:
  """Runs the demo; returns a process exit code."""
  _versions()
  ok = _jax_from_torch() < 1e-4 and _torch_from_jax() < 1e-5 and _zero_copy()
  print("\nall good" if ok else "\nMISMATCH: see above")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
