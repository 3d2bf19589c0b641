"""`bridge.export` / `bridge.load`: torch models as portable JAX artifacts, checked against
the torch module (outputs, gradients, dynamic dimensions, files, a process without torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge

Dim = torch.export.Dim


def _mlp() -> torch.nn.Module:
  torch.manual_seed(0)
  return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def test_a_module_with_a_dynamic_batch_runs_from_torch_and_from_jax():
  model = _mlp()
  exported = bridge.export(model, torch.randn(4, 6), dynamic_shapes=({0: Dim("batch")},))
  assert isinstance(exported, bridge.Exported)
  assert exported.manifest["inputs"] == [
    {"name": "input", "dtype": "float32", "shape": ["batch", 6]}
  ]
  for batch in (1, 7, 33):
    x = torch.randn(batch, 6)
    out = exported(x)  # torch in, torch out
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, model(x))
    got = exported(jnp.asarray(x.numpy()))  # JAX in, JAX out
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(np.asarray(got), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_weights_are_inputs_not_constants_of_the_program():
  model = _mlp()
  exported = bridge.export(model, torch.randn(2, 6))
  names = [w["name"] for w in exported.manifest["weights"]]
  assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]
  assert len(exported.program.in_avals) == 4 + 1
  # other weights, same program: the result follows them
  zeros = {n: jnp.zeros_like(a) for n, a in exported.weights.items()}
  out = exported.apply(zeros, np.ones((2, 6), np.float32))
  np.testing.assert_array_equal(np.asarray(out), np.zeros((2, 3), np.float32))


def test_a_plain_function_with_keyword_inputs_and_structured_outputs():
  def f(x, *, scale):
    return {"sum": (x * scale).sum(-1), "parts": (x.relu(), x.int())}

  x, scale = torch.randn(3, 4), torch.rand(4)
  exported = bridge.export(f, x, scale=scale)
  assert exported.manifest["output_names"] == ["sum", "parts.0", "parts.1"]
  out = exported(x, scale=scale)
  ref = f(x, scale=scale)
  torch.testing.assert_close(out["sum"], ref["sum"])
  torch.testing.assert_close(out["parts"][0], ref["parts"][0])
  assert out["parts"][1].dtype == torch.int32
  torch.testing.assert_close(out["parts"][1], ref["parts"][1])


def test_save_and_load_round_trip(tmp_path):
  model = _mlp()
  exported = bridge.export(model, torch.randn(2, 6), dynamic_shapes=({0: Dim("batch", max=100)},))
  exported.save(tmp_path / "mlp")
  assert sorted(os.listdir(tmp_path / "mlp")) == [
    "manifest.json",
    "program.jaxexport",
    "weights.safetensors",
  ]
  manifest = json.loads((tmp_path / "mlp" / "manifest.json").read_text())
  assert manifest["format"] == 1
  assert manifest["symbols"] == {"batch": {"min": 1, "max": 100}}
  assert set(manifest["versions"]) == {"bridge", "torch", "jax", "jaxlib"}
  loaded = bridge.load(tmp_path / "mlp")
  x = torch.randn(5, 6)
  torch.testing.assert_close(loaded(x), model(x))
  y = jax.jit(loaded.apply)(loaded.weights, jnp.asarray(x.numpy()))
  np.testing.assert_allclose(np.asarray(y), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_broken_constraint_names_the_dimension():
  exported = bridge.export(
    _mlp(), torch.randn(2, 6), dynamic_shapes=({0: Dim("batch", min=2, max=8)},)
  )
  with pytest.raises(
    bridge.BridgeTypeError, match=r"dimension 0 \('batch'\) is 9, outside .*2\.\.8"
  ):
    exported(torch.randn(9, 6))
  with pytest.raises(
    bridge.BridgeTypeError, match=r"dimension 1 is 5; it was exported as static 6"
  ):
    exported(torch.randn(4, 5))


def test_two_inputs_sharing_a_dimension_must_agree():
  def f(a, b):
    return a + b

  batch = Dim("batch")
  exported = bridge.export(
    f, torch.randn(3, 2), torch.randn(3, 2), dynamic_shapes=({0: batch}, {0: batch})
  )
  torch.testing.assert_close(exported(torch.ones(5, 2), torch.ones(5, 2)), torch.full((5, 2), 2.0))
  with pytest.raises(bridge.BridgeTypeError, match=r"'batch'\) is 4, but input 'a' dimension 0"):
    exported(torch.ones(5, 2), torch.ones(4, 2))


def test_fine_tuning_in_jax_matches_torch_autograd_and_loads_back(tmp_path):
  optax = pytest.importorskip("optax")
  model = _mlp()
  x, y = torch.randn(8, 6), torch.randn(8, 3)
  bridge.export(model, x, vjp_order=1).save(tmp_path / "m")
  loaded = bridge.load(tmp_path / "m")

  def loss(weights, x, y):
    return jnp.mean((loaded.apply(weights, x) - y) ** 2)

  xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
  grads = jax.grad(loss)(loaded.weights, xj, yj)
  torch.nn.functional.mse_loss(model(x), y).backward()
  for name, p in model.named_parameters():
    np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-4, atol=1e-6)

  opt = optax.adam(1e-2)
  weights, state = dict(loaded.weights), opt.init(dict(loaded.weights))
  step = jax.jit(lambda w, s: _adam_step(opt, loss, w, s, xj, yj))
  first = float(loss(weights, xj, yj))
  for _ in range(30):
    weights, state = step(weights, state)
  assert float(loss(weights, xj, yj)) < first * 0.8
  model.load_state_dict(loaded.state_dict(weights))
  np.testing.assert_allclose(
    model(x).detach().numpy(), np.asarray(loaded.apply(weights, xj)), rtol=1e-5, atol=1e-6
  )


def _adam_step(opt, loss, w, s, x, y):
  import optax

  g = jax.grad(loss)(w, x, y)
  updates, s = opt.update(g, s, w)
  return optax.apply_updates(w, updates), s


def test_second_order_derivatives_with_vjp_order_2(tmp_path):
  def f(x):
    return (x**3).sum()

  bridge.export(f, torch.randn(3), vjp_order=2).save(tmp_path / "f")
  loaded = bridge.load(tmp_path / "f")
  x = jnp.asarray([1.0, 2.0, -1.0], jnp.float32)
  hess_diag = jax.grad(lambda v: jax.grad(lambda u: loaded.apply({}, u))(v).sum())(x)
  np.testing.assert_allclose(np.asarray(hess_diag), 6 * np.asarray(x))


def test_runs_in_a_process_where_torch_cannot_be_imported(tmp_path):
  model = _mlp()
  x = torch.randn(3, 6)
  bridge.export(model, x, dynamic_shapes=({0: Dim("batch")},)).save(tmp_path / "m")
  np.save(tmp_path / "x.npy", x.numpy())
  # the documentation's snippet (docs/export.md), verbatim after the path
  snippet = _docs_snippet()
  for line in ("path = exported_path", "inputs = [np.ones((3, 8), np.float32)]"):
    assert line in snippet, line
  snippet = snippet.replace("path = exported_path", f"path = {str(tmp_path / 'm')!r}")
  snippet = snippet.replace(
    "inputs = [np.ones((3, 8), np.float32)]", f"inputs = [np.load({str(tmp_path / 'x.npy')!r})]"
  )
  script = (
    "import sys\n"
    "sys.modules['torch'] = None  # `import torch` raises ImportError\n"
    "import jax\n"
    + snippet
    + textwrap.dedent(
      f"""
      assert not [m for m in sys.modules if m.startswith("torch") and sys.modules[m] is not None]
      np.save({str(tmp_path / "out.npy")!r}, np.asarray(outputs[0]))
      """
    )
  )
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  np.testing.assert_allclose(
    np.load(tmp_path / "out.npy"), model(x).detach().numpy(), rtol=1e-5, atol=1e-6
  )


def _docs_snippet() -> str:
  page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "export.md")).read()
  start = page.index("<!-- export-without-torch -->")
  block = page[start:].split("```python\n", 1)[1].split("```", 1)[0]
  return block


# --- models ---------------------------------------------------------------------------------


def _transformers():
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  transformers = pytest.importorskip("transformers")
  transformers.logging.set_verbosity_error()
  return transformers


def test_gpt2_with_dynamic_batch_and_sequence(tmp_path):
  transformers = _transformers()
  config = transformers.GPT2Config(
    n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
    attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, use_cache=False,
  )  # fmt: skip
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(config).eval()
  ids = torch.randint(0, 100, (2, 8))
  exported = bridge.export(
    model, ids, dynamic_shapes={"input_ids": {0: Dim("batch", max=16), 1: Dim("seq", max=32)}}
  )
  assert exported.manifest["output_names"] == ["logits"]
  assert exported.manifest["aliases"] == {"lm_head.weight": "transformer.wte.weight"}
  exported.save(tmp_path / "gpt2")
  loaded = bridge.load(tmp_path / "gpt2")
  for batch, seq in ((1, 5), (7, 32), (3, 1)):
    x = torch.randint(0, 100, (batch, seq))
    out = loaded(x)
    assert set(out) == {"logits"}
    torch.testing.assert_close(out["logits"], model(x).logits, rtol=1e-4, atol=1e-5)
  with pytest.raises(bridge.BridgeTypeError, match=r"\('seq'\) is 33"):
    loaded(torch.randint(0, 100, (1, 33)))
  # the tied embedding is one weight: its gradient sums both uses, as torch's does
  x = torch.randint(0, 100, (2, 6))
  with jax.enable_x64(True):
    g = jax.grad(lambda w: exported.apply(w, x.numpy())["logits"].sum())(exported.weights)
  model(x).logits.sum().backward()
  np.testing.assert_allclose(
    np.asarray(g["transformer.wte.weight"]),
    model.transformer.wte.weight.grad.numpy(),
    rtol=1e-4,
    atol=1e-4,
  )


def test_bert_with_an_attention_mask():
  transformers = _transformers()
  config = transformers.BertConfig(
    vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64, max_position_embeddings=64,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
  )  # fmt: skip
  torch.manual_seed(0)
  model = transformers.BertModel(config, add_pooling_layer=False).eval()
  ids = torch.randint(0, 100, (2, 8))
  mask = torch.ones(2, 8, dtype=torch.long)
  batch, seq = Dim("batch", max=8), Dim("seq", max=64)
  exported = bridge.export(
    model,
    input_ids=ids,
    attention_mask=mask,
    dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
  )
  x = torch.randint(0, 100, (3, 11))
  m = torch.ones(3, 11, dtype=torch.long)
  m[1, 6:] = 0
  out = exported(input_ids=x, attention_mask=m)
  ref = model(input_ids=x, attention_mask=m).last_hidden_state
  torch.testing.assert_close(out["last_hidden_state"], ref, rtol=1e-4, atol=1e-5)


def test_cnn_with_batchnorm_in_eval_mode():
  torch.manual_seed(0)
  model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1),
    torch.nn.BatchNorm2d(8),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Flatten(),
    torch.nn.Linear(8 * 4 * 4, 5),
  )
  model.train()
  model(torch.randn(16, 3, 8, 8))  # running statistics away from their defaults
  model.eval()
  exported = bridge.export(model, torch.randn(2, 3, 8, 8), dynamic_shapes=({0: Dim("batch")},))
  kinds = {w["name"]: w["kind"] for w in exported.manifest["weights"]}
  assert kinds["1.running_mean"] == "buffer" and kinds["1.num_batches_tracked"] == "buffer"
  assert exported.weights["1.num_batches_tracked"].dtype == jnp.int64
  x = torch.randn(5, 3, 8, 8)
  torch.testing.assert_close(exported(x), model(x), rtol=1e-4, atol=1e-5)
  sd = exported.state_dict()
  assert set(sd) == set(model.state_dict())


def test_batchnorm_in_training_mode_is_refused():
  model = torch.nn.BatchNorm1d(4).train()
  with pytest.raises(bridge.BridgeError, match="eval mode"):
    bridge.export(model, torch.randn(3, 4))


def test_lstm():
  torch.manual_seed(0)
  model = torch.nn.LSTM(5, 7, num_layers=2, batch_first=True).eval()
  x = torch.randn(3, 4, 5)
  exported = bridge.export(model, x)
  out, (h, c) = exported(x)
  ref, (rh, rc) = model(x)
  torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
  torch.testing.assert_close(h, rh, rtol=1e-4, atol=1e-5)
  torch.testing.assert_close(c, rc, rtol=1e-4, atol=1e-5)


# --- bad input ------------------------------------------------------------------------------


def test_data_dependent_control_flow_names_the_users_line():
  def f(x):
    if x.sum() > 0:  # the line named
      return x * 2
    return x

  with pytest.raises(bridge.TracedValueError, match=r"test_export.py, line \d+"):
    bridge.export(f, torch.randn(3))


def test_torch_cond_and_while_loop_export_as_jax_control_flow(tmp_path):
  """Value-dependent control flow written with torch's operators is one program: `lax.cond`
  (both branches kept, the value picks one) and `lax.while_loop` (any trip count)."""
  from torch._higher_order_ops import while_loop

  class Gate(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.a, self.b = torch.nn.Linear(6, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
      h = self.a(x)
      return torch.cond(h.sum() > 0, lambda t: self.b(t).relu(), lambda t: t * -1.0, (h,))

  torch.manual_seed(0)
  model = Gate().eval()
  bridge.export(model, torch.randn(3, 6), dynamic_shapes=({0: Dim("batch")},)).save(
    tmp_path / "gate"
  )
  loaded = bridge.load(tmp_path / "gate")
  picked = set()
  for i in range(8):
    x = torch.randn(1 + i, 6) * (1.0 if i % 2 else -1.0)
    picked.add(bool(model.a(x).sum() > 0))
    torch.testing.assert_close(loaded(x), model(x))
  assert picked == {True, False}

  class Doubling(torch.nn.Module):
    def forward(self, x, n):
      start = torch.zeros((), dtype=torch.int64)
      return while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 2 + 1), (start, x))

  exported = bridge.export(Doubling(), torch.randn(3), torch.tensor(4))
  for n in (0, 3, 5):
    steps, y = exported(torch.ones(3), torch.tensor(n))
    assert steps.dtype == torch.int64 and int(steps) == n
    torch.testing.assert_close(y, torch.full((3,), 2.0 ** (n + 1) - 1))


def test_an_op_without_a_lowering_is_named():
  lib = torch.library.Library("bridge_export_test", "DEF")
  lib.define("twice(Tensor x) -> Tensor")
  lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
  lib.impl("twice", lambda x: torch.empty_like(x), "Meta")

  def f(x):
    return torch.ops.bridge_export_test.twice(x) + 1

  with pytest.raises(
    bridge.OperatorNotFound, match="bridge_export_test.twice.default has no JAX lowering"
  ):
    bridge.export(f, torch.randn(3))


def test_non_tensor_inputs_are_refused_with_the_argument_named():
  with pytest.raises(bridge.BridgeTypeError, match=r"example_args\[1\] is a float"):
    bridge.export(lambda x, s: x * s, torch.randn(2), 2.0)


def test_a_manifest_of_another_format_names_both_versions(tmp_path):
  bridge.export(_mlp(), torch.randn(2, 6)).save(tmp_path / "m")
  path = tmp_path / "m" / "manifest.json"
  manifest = json.loads(path.read_text())
  manifest["format"] = 99
  path.write_text(json.dumps(manifest))
  with pytest.raises(bridge.BridgeError, match="format 99; this bridge .* reads format 1"):
    bridge.load(tmp_path / "m")


@pytest.mark.parametrize("name", ["program.jaxexport", "weights.safetensors"])
def test_a_truncated_or_edited_file_is_refused(tmp_path, name):
  bridge.export(_mlp(), torch.randn(2, 6)).save(tmp_path / "m")
  path = tmp_path / "m" / name
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(bridge.BridgeError, match="truncated or was changed"):
    bridge.load(tmp_path / "m")


def test_several_platforms_in_one_artifact(tmp_path):
  model = _mlp()
  exported = bridge.export(model, torch.randn(2, 6), platforms=("cpu", "cuda", "tpu"))
  assert exported.program.platforms == ("cpu", "cuda", "tpu")
  exported.save(tmp_path / "m")
  x = torch.randn(2, 6)
  torch.testing.assert_close(bridge.load(tmp_path / "m")(x), model(x))
  with pytest.raises(bridge.BridgeTypeError, match="unknown platform"):
    bridge.export(model, x, platforms=("gpu",))


def test_a_program_this_jax_cannot_read_names_both_versions(tmp_path, monkeypatch):
  bridge.export(_mlp(), torch.randn(2, 6)).save(tmp_path / "m")
  path = tmp_path / "m" / "manifest.json"
  manifest = json.loads(path.read_text())
  manifest["versions"]["jax"] = "0.99.0"
  path.write_text(json.dumps(manifest))

  def refuse(data):
    raise ValueError("unsupported serialization version 99")

  monkeypatch.setattr(jax.export, "deserialize", refuse)
  with pytest.raises(
    bridge.BridgeError, match=rf"JAX {jax.__version__} cannot read .* JAX 0\.99\.0"
  ):
    bridge.load(tmp_path / "m")


def test_a_named_tuple_output_becomes_a_dict_of_its_fields():
  import collections

  Out = collections.namedtuple("Out", "logits hidden")

  class Model(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
      h = self.linear(x)
      return Out(h.softmax(-1), h)

  model = Model().eval()
  x = torch.randn(3, 4)
  out = bridge.export(model, x)(x)
  assert set(out) == {"logits", "hidden"}
  torch.testing.assert_close(out["logits"], model(x).logits)
  torch.testing.assert_close(out["hidden"], model(x).hidden)


@pytest.mark.parametrize(
  "fn, dim",
  [
    (lambda x: x[:, None] * 2, Dim("batch")),  # torch's end: the int64 maximum
    (lambda x: x[:2] * 2, Dim("batch", max=100)),  # min(2, batch) rows
    (lambda x: x[-1:] * 2, Dim("batch")),
    (lambda x: x[1:] * 2, Dim("batch", min=3)),  # (torch.export's own bound for it)
  ],
)
def test_slices_of_a_dynamic_dimension(fn, dim):
  exported = bridge.export(fn, torch.randn(4, 3), dynamic_shapes=({0: dim},))
  for batch in (3, 6) if dim.min == 3 else (1, 2, 3, 6):
    x = torch.randn(batch, 3)
    torch.testing.assert_close(exported(x), fn(x))


def test_a_derived_dimension():
  def f(x, y):
    return torch.cat([x, x], 0) + y

  b = Dim("b", max=50)
  exported = bridge.export(
    f, torch.randn(3, 2), torch.randn(6, 2), dynamic_shapes=({0: b}, {0: 2 * b})
  )
  assert [i["shape"] for i in exported.manifest["inputs"]] == [["b", 2], ["2*b", 2]]
  x, y = torch.randn(5, 2), torch.randn(10, 2)
  torch.testing.assert_close(exported(x, y), f(x, y))


def test_input_dtypes_are_torchs_exactly_and_jaxs_32_bit_types_stand_for_64_bit_ones():
  model = torch.nn.Linear(4, 2).eval()
  exported = bridge.export(model, torch.randn(3, 4))
  with pytest.raises(RuntimeError, match="same dtype") as eager:
    model(torch.randn(3, 4).half())
  del eager
  with pytest.raises(
    bridge.BridgeTypeError, match=r"dtype torch\.float16; the program takes torch\.float32"
  ):
    exported(torch.randn(3, 4).half())  # widened to float32 and answered in float32, before
  with pytest.raises(bridge.BridgeTypeError, match="dtype bfloat16; the program takes float32"):
    exported(jnp.ones((3, 4), jnp.bfloat16))
  double = bridge.export(lambda x: x * 2, torch.randn(3, dtype=torch.float64))
  out = double(jnp.ones(3, jnp.float32))  # JAX without 64-bit types holds float64 as float32
  assert out.dtype == jnp.float64
  with pytest.raises(
    bridge.BridgeTypeError, match=r"torch\.float32; the program takes torch\.float64"
  ):
    double(torch.ones(3))


def test_a_failed_load_leaves_jax_64_bit_types_as_they_were(tmp_path):
  bridge.export(_mlp(), torch.randn(2, 6)).save(tmp_path / "m")
  path = tmp_path / "m" / "manifest.json"
  manifest = json.loads(path.read_text())
  manifest["weights"][0]["shape"] = [9, 9]
  path.write_text(json.dumps(manifest))
  assert not jax.config.jax_enable_x64
  with pytest.raises(bridge.BridgeError, match="does not match the manifest"):
    bridge.load(tmp_path / "m")
  assert not jax.config.jax_enable_x64 and jnp.arange(3).dtype == jnp.int32


def test_derivatives_of_an_artifact_saved_without_them_say_how_to_save_them(tmp_path):
  bridge.export(_mlp(), torch.randn(2, 6)).save(tmp_path / "m")
  loaded = bridge.load(tmp_path / "m")
  x = np.ones((2, 6), np.float32)
  np.testing.assert_allclose(  # calls without derivatives are unchanged
    np.asarray(jax.jit(loaded.apply)(loaded.weights, x)), np.asarray(loaded(x)), rtol=1e-6
  )
  with pytest.raises(bridge.BridgeError, match=r"vjp_order=0.*vjp_order=1"):
    jax.grad(lambda w: loaded.apply(w, x).sum())(loaded.weights)
  with pytest.raises(bridge.BridgeError, match=r"vjp_order=1"):
    jax.jvp(lambda v: loaded.apply(loaded.weights, v), (x,), (x,))
