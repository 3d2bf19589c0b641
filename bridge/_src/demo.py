"""`python -m bridge`: versions, devices, plugins, then one call each way with a gradient."""

from __future__ import annotations

import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch

import bridge
from bridge._src import plugins


def _fmt(values: list[float]) -> str:
  return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _versions() -> None:
  import jaxlib
  print(f"bridge {bridge.__version__} | torch {torch.__version__} | jax {jax.__version__} | "
        f"jaxlib {jaxlib.__version__} | numpy {np.__version__} | python {platform.python_version()}")
  found = plugins.discover()
  if not found:
    print("lowering plugins: none installed (pip install -e ./bridge_ops)")
  for p in found:
    print(f"lowering plugin: {p.distribution} {p.version} (entry point {p.name!r}, "
          f"registry API {p.api_version})")
  cuda = (f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available()
          else "no CUDA")
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
  err = max((x.grad - x_ref.grad).abs().max().item(), (scale.grad - s_ref.grad).abs().max().item())
  print(f"   loss {loss.item():.4f}; d loss/d scale[:3] = {_fmt(scale.grad[:3].tolist())}")
  print(f"   max |grad - torch autograd grad| = {err:.2e}")
  return err


def _torch_from_jax() -> float:
  print("\n2. torch from JAX: a JAX array through a torch function, its gradient back to JAX")
  a = jnp.linspace(-2.0, 2.0, 5)
  t = bridge.to_torch(a).requires_grad_()  # zero-copy view of JAX's buffer
  y = torch.nn.functional.softplus(t).sum()
  y.backward()
  g = bridge.to_jax(t.grad)  # zero-copy back
  g_ref = jax.grad(lambda a: jnp.sum(jax.nn.softplus(a)))(a)
  err = float(jnp.max(jnp.abs(g - g_ref)))
  print(f"   softplus sum {y.item():.4f}; gradient {_fmt(np.asarray(g).tolist())}")
  print(f"   max |torch grad - jax.grad| = {err:.2e}")
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
