"""`bridge.compile` and the `jax` device on two standard torch modules a probe found failing
with torch's own internal errors or a message that did not say where: `nn.TransformerEncoder`'s
nested-tensor fast path, and BatchNorm's cumulative average (`momentum=None`)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import bridge


def _encoder(nested: bool = True) -> nn.TransformerEncoder:
  torch.manual_seed(0)
  layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (torch's note on enable_nested_tensor)
    return nn.TransformerEncoder(layer, 1, enable_nested_tensor=nested).eval()


MASK = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
X = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
NESTED = r"the `jax` device cannot hold nested tensors.*enable_nested_tensor=False"


def test_the_nested_fast_path_is_refused_with_the_fix_not_torchs_internal_error():
  with pytest.raises(bridge.BridgeTypeError, match=NESTED):
    bridge.compile(_encoder())(X, src_key_padding_mask=MASK)
  on_jax = _encoder().to("jax")
  with torch.no_grad(), pytest.raises(bridge.BridgeTypeError, match=NESTED):
    on_jax(X.to("jax"), src_key_padding_mask=MASK.to("jax"))


def test_the_fix_it_names_gives_eagers_values_at_the_unpadded_positions():
  eager = _encoder()
  plain = _encoder(nested=False)
  plain.load_state_dict(eager.state_dict())
  want = eager(X, src_key_padding_mask=MASK)
  got = bridge.compile(plain)(X, src_key_padding_mask=MASK)
  torch.testing.assert_close(got[~MASK], want[~MASK], rtol=1e-5, atol=1e-5)


def test_a_value_torch_code_needs_names_torchs_line_too():
  with pytest.raises(bridge.TracedValueError) as info:
    bridge.compile(nn.BatchNorm1d(3, momentum=None))(torch.randn(4, 3))
  message = str(info.value)
  assert "in torch's code at" in message and "batchnorm.py" in message
  assert "float(self.num_batches_tracked)" in message


def _pruned():
  from torch.nn.utils import prune

  torch.manual_seed(0)
  m = nn.Linear(4, 4)
  prune.l1_unstructured(m, "weight", amount=0.5)
  return m


def _old_weight_norm():
  torch.manual_seed(0)
  return nn.utils.weight_norm(nn.Linear(4, 4))


def _old_spectral_norm():
  torch.manual_seed(0)
  return nn.utils.spectral_norm(nn.Linear(4, 4))


@pytest.mark.parametrize("make", [_pruned, _old_weight_norm, _old_spectral_norm])
def test_reparametrizations_that_set_an_attribute_in_a_pre_hook_compile(make):
  # (prune, the old weight_norm and spectral_norm set `weight` from the parameters before
  # each forward: a traced call raised LeakedTracerError for it)
  compiled_module, eager = make(), make()
  compiled = bridge.compile(compiled_module)
  x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
  for _ in range(2):  # (spectral_norm's power iteration updates its `weight_u` buffer)
    got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got.sum().backward()
    want.sum().backward()
    for (name, p), q in zip(compiled_module.named_parameters(), eager.parameters()):
      torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
  assert type(compiled_module.weight) is torch.Tensor  # (not a traced tensor left behind)


def test_a_pruned_modules_parameters_changed_between_calls_are_seen():
  m = _pruned()
  compiled = bridge.compile(m)
  x = torch.randn(3, 4)
  compiled(x)
  with torch.no_grad():
    m.weight_orig.mul_(2)
  torch.testing.assert_close(compiled(x), m(x))


def test_a_function_closing_over_parameters_says_they_get_no_gradient():
  lin = nn.Linear(2, 2)
  f = bridge.compile(lambda x: lin(x))
  with pytest.warns(UserWarning, match=r"closes over 2 tensor\(s\) that require grad"):
    y = f(torch.ones(1, 2))
  assert not y.requires_grad  # (as documented: constants)
  with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("error")
    bridge.compile(lambda x: lin(x))(torch.ones(1, 2))  # (nothing to say without grad)
