"""Target of torch's `torch.backends` entry point: `import torch` loads the `jax` device.

Kept apart from the rest of the package: when `import bridge` itself triggers
`import torch`, torch calls this while `bridge` is still importing; importing a
partly initialized `bridge` here is then harmless, and `bridge/__init__.py`
registers the device when it finishes.
"""


def autoload() -> None:
  """Called by torch at `import torch` (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)."""
  import bridge  # noqa: F401 - importing bridge registers the jax device
