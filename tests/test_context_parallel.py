"""Context-parallel attention on 8 simulated CPU devices: both strategies, causal or not, balanced
(zigzag) or not, grouped-query heads, sequence lengths, segment ids, a window, a bias and mask
(all_gather), a score_mod with a learnable table and a mask_mod, inside a caller's shard_map and
under vmap: values and gradients against the
unsharded float64 numpy reference. Malformed calls are one-line ValueErrors."""

import os
import subprocess
import sys

import numpy as np
import pytest

import attention_jax as aj
from training_helpers import EIGHT_CPU_DEVICES, on_eight_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One worker runs the module, so that its one 8-device subprocess (the fixture) runs once.
pytestmark = pytest.mark.xdist_group("context_parallel")

PROGRAM = r"""
import functools, json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, "tests")
import numpy_reference
import attention_jax as aj

assert jax.device_count() == 8
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "seq"))  # the batch over "data"
rng = np.random.default_rng(0)
B, T, N, K, H = 2, 64, 4, 2, 8
query, key, value = (rng.standard_normal((B, T, n, H)).astype(np.float32) for n in (N, K, K))
d_out = rng.standard_normal(query.shape).astype(np.float32)
lengths = np.array([45, 64], np.int32)
ids = np.sort(rng.integers(0, 3, size=(B, T)), axis=-1).astype(np.int32)
bias = rng.standard_normal((B, 1, T, T)).astype(np.float32)
mask = rng.random((B, N, T, T)) > 0.2

def reference(is_causal, **structure):
  allowed = numpy_reference.structure_mask(T, T, (B,), **structure)
  if "extra_mask" in extra:
    allowed = allowed & extra["extra_mask"]
  out, _, cache = numpy_reference.attention(query, key, value, extra.get("bias"), allowed,
                                            is_causal=is_causal)
  return out, numpy_reference.attention_vjp(cache, d_out)[:3]

def error(got, want):
  return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))

@functools.partial(jax.jit, static_argnums=0)
def value_and_grads(fn, q, k, v):  # one compilation for the output and its gradients
  out, pullback = jax.vjp(fn, q, k, v)
  return out, pullback(jnp.asarray(d_out))

def check(fn, want, want_grads):
  out, grads = value_and_grads(fn, query, key, value)
  return max([error(out, want)] + [error(g, w) for g, w in zip(grads, want_grads)])

results = {}
for strategy in ("ring", "all_gather"):
  for is_causal, balanced in ((False, False), (True, False), (True, True)):
    extra = {}
    want, want_grads = reference(is_causal, q_lengths=lengths, kv_lengths=lengths)
    fn = functools.partial(aj.context_parallel_attention, mesh=mesh, axis_name="seq",
                           strategy=strategy, is_causal=is_causal, load_balance=balanced,
                           query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                           block_q=8, block_k=8)
    results[f"{strategy} causal={is_causal} balanced={balanced}"] = check(fn, want, want_grads)

  extra = {}
  want, want_grads = reference(True, q_segments=ids, kv_segments=ids, window=(6, 0))
  fn = functools.partial(aj.context_parallel_attention, mesh=mesh, axis_name="seq",
                         strategy=strategy, is_causal=True, query_segment_ids=ids,
                         key_segment_ids=ids, local_window_size=(6, 0), block_q=8, block_k=8)
  results[f"{strategy} segments and window, balanced"] = check(fn, want, want_grads)

extra = {"bias": bias, "extra_mask": mask}
want, want_grads = reference(True, kv_lengths=lengths)
fn = functools.partial(aj.context_parallel_attention, bias=bias, mask=mask, mesh=mesh,
                       axis_name="seq", strategy="all_gather", is_causal=True,
                       key_value_seq_lengths=lengths, block_q=8, block_k=8,
                       empty_rows="zero")  # causal row 0 may be masked: zeros, as the reference
results["all_gather bias and mask, balanced"] = check(fn, want, want_grads)

# Inside a caller's shard_map on an automatic mesh, activations kept in zigzag order throughout.
extra = {}
want, want_grads = reference(True)
auto = Mesh(np.array(jax.devices()), ("seq",))
shard = functools.partial(aj.context_parallel_attention_shard, axis_name="seq", strategy="ring",
                          layout="zigzag", is_causal=True, block_q=8, block_k=8)
spec = P(None, "seq")
mapped = jax.shard_map(shard, mesh=auto, in_specs=(spec,) * 3, out_specs=spec)
fn = lambda q, k, v: aj.from_zigzag(mapped(*(aj.to_zigzag(x, 8) for x in (q, k, v))), 8)
results["ring per-shard in a caller's shard_map, zigzag"] = check(fn, want, want_grads)

# vmapped over a leading replica axis (as the trainer does), the replicas being the batch.
vmapped = jax.vmap(lambda q, k, v: aj.context_parallel_attention(
    q, k, v, mesh=auto, axis_name="seq", is_causal=True, block_q=8, block_k=8))
as_replicas = lambda q, k, v: vmapped(q[:, None], k[:, None], v[:, None])[:, 0]
results["ring under vmap"] = check(as_replicas, want, want_grads)

# FlexAttention's functions: a learnable relative bias (a T5-style table, whose gradient is
# summed over the devices) and a document mask, both on positions in the whole sequence, against
# the unsharded reference implementation.
table = jnp.asarray(rng.standard_normal(2 * T - 1).astype(np.float32))
docs = jnp.asarray(np.repeat(np.arange(4), T // 4))
score_mod = lambda t: lambda s, b, h, q_idx, kv_idx: s + t[q_idx - kv_idx + T - 1] * (h + 1) / N
same_doc = lambda b, h, q_idx, kv_idx: docs[q_idx] == docs[kv_idx]

@functools.partial(jax.jit, static_argnums=0)
def mod_grads(fn, q, k, v, t):
  out, pullback = jax.vjp(fn, q, k, v, t)
  return out, pullback(jnp.asarray(d_out))

for is_causal in (False, True):
  want = mod_grads(lambda q, k, v, t: aj.dot_product_attention(
      q, k, v, is_causal=is_causal, score_mod=score_mod(t), mask_mod=same_doc,
      implementation="reference"), query, key, value, table)
  want = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(want)]
  for strategy in ("ring", "all_gather"):
    got = mod_grads(lambda q, k, v, t: aj.context_parallel_attention(
        q, k, v, mesh=mesh, axis_name="seq", strategy=strategy, is_causal=is_causal,
        score_mod=score_mod(t), mask_mod=same_doc, block_q=8, block_k=8),
        query, key, value, table)
    results[f"{strategy} score_mod and mask_mod, causal={is_causal}"] = max(
        error(g, w) for g, w in zip(jax.tree_util.tree_leaves(got), want))

errors = {}
for name, call in {
    "ring with a bias": lambda: aj.context_parallel_attention(
        query, key, value, bias, mesh=mesh, axis_name="seq"),
    "cross-attention": lambda: aj.context_parallel_attention(
        query, key[:, :32], value[:, :32], mesh=mesh, axis_name="seq"),
    "unknown axis": lambda: aj.context_parallel_attention(
        query, key, value, mesh=mesh, axis_name="sequence"),
    "unknown strategy": lambda: aj.context_parallel_attention(
        query, key, value, mesh=mesh, axis_name="seq", strategy="ulysses"),
    "residual requested": lambda: aj.ContextParallel(mesh, "seq")(
        query, key, value, return_residual=True),
    "sinks requested": lambda: aj.ContextParallel(mesh, "seq")(
        query, key, value, sinks=jnp.zeros(N)),
}.items():
  try:
    call()
    errors[name] = None
  except ValueError as error:
    errors[name] = str(error)
print(json.dumps({"results": results, "errors": errors}))
"""


@pytest.fixture(scope="module")
def outcome():
  return on_eight_devices(PROGRAM)


def test_both_strategies_equal_the_float64_reference_on_eight_devices(outcome):
  results = outcome["results"]
  assert len(results) == 15
  for case, relative_error in results.items():
    assert relative_error <= 2e-6, (case, relative_error)


def test_malformed_calls_name_the_cause_in_one_line(outcome):
  errors = outcome["errors"]
  assert "strategy='all_gather'" in errors["ring with a bias"]
  assert "must have one length" in errors["cross-attention"]
  assert "'sequence' is not an axis" in errors["unknown axis"]
  assert "strategy must be one of" in errors["unknown strategy"]
  assert "nor the log-sum-exp" in errors["residual requested"]
  assert "does not serve sinks" in errors["sinks requested"]
  assert all("\n" not in message for message in errors.values())


def test_zigzag_gives_every_device_equal_causal_work():
  order = aj.zigzag_order(32, 4).reshape(4, -1)  # [device, positions it holds]
  work = [(positions + 1).sum() for positions in order]  # keys each device's queries see
  assert len(set(work)) == 1
  assert sorted(order.ravel().tolist()) == list(range(32))
  contiguous = np.arange(32).reshape(4, -1)
  assert len({(positions + 1).sum() for positions in contiguous}) == 4
  x = np.arange(2 * 32 * 3).reshape(2, 32, 3, 1).astype(np.float32)
  np.testing.assert_array_equal(aj.from_zigzag(aj.to_zigzag(x, 4), 4), x)
  with pytest.raises(ValueError, match="multiple of 8"):
    aj.zigzag_order(30, 4)


def test_the_guide_example_runs_on_eight_devices_at_a_shorter_length():
  import re
  guide = open(os.path.join(ROOT, "docs", "guides", "context_parallel.md")).read()
  block = re.search(r"```python context-parallel\n(.*?)```", guide, re.S).group(1)
  assert "T = 65536" in block
  code = block.replace("T = 65536", "T = 1024") + "\nassert out.shape == (1, T, 8, 64)\n" + \
      "assert d_q.shape == q.shape and bool(jnp.all(jnp.isfinite(d_q.astype(jnp.float32))))\n"
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **EIGHT_CPU_DEVICES})
  assert result.returncode == 0, result.stderr[-3000:]


def test_the_drop_in_serves_the_chunked_kernel_by_name_and_refuses_the_rest_in_one_line():
  import jax
  import jax.numpy as jnp
  attention_fn = aj.ContextParallel(jax.make_mesh((1,), ("seq",)), "seq")
  q = k = v = jax.random.normal(jax.random.key(0), (2, 16, 4, 8))
  want = aj.dot_product_attention(q, k, v, is_causal=True)
  for implementation in (None, "chunked"):
    np.testing.assert_allclose(attention_fn(q, k, v, is_causal=True,
                                            implementation=implementation), want, atol=1e-6)
  for options, words in (({"implementation": "pallas_gpu"}, "implementation='pallas_gpu' is not"),
                         ({"implementation": "xla"}, "implementation='xla' is not served"),
                         ({"return_max_scores": True}, "return_max_scores asked"),
                         ({"return_logits": True}, "return_logits asked"),
                         ({"dropout_rate": 0.1}, "has no attention dropout")):
    with pytest.raises(ValueError, match=words) as error:
      attention_fn(q, k, v, **options)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("setting, words", [
    ({"model.attention_impl": "xla"}, "implementation='xla' is not served"),
    ({"model.attention_dropout_rate": 0.1}, "has no attention dropout"),
    ({"model.positional_encoding": "alibi"}, "strategy='ring' takes no bias"),
    ({"model.head_variant": "talking_heads"}, "does not serve hooks"),
    ({"mesh.strategy": "ulysses"}, "mesh.strategy must be one of"),
])
def test_a_run_config_is_refused_by_the_librarys_own_check(setting, words):
  from configs import default
  from experiments import config_check
  config = default.get_config()
  config.mesh.sequence = 2
  for name, value in setting.items():
    section, field = name.split(".")
    config[section][field] = value
  with pytest.raises(config_check.ConfigError, match=words) as error:
    config_check.validate(config)
  assert "\n" not in str(error.value)


PADDED_ON_EXPLICIT_AXES = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType
import attention_jax as aj

x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 30, 2, 8)), jnp.float32)
lengths = jnp.array([30, 0])  # example 1: no key for any row, jax.nn's mean of the values
errors = {}
for types in (AxisType.Explicit,):  # automatic axes served it before
  mesh = jax.make_mesh((8,), ("seq",), axis_types=(types,))
  for causal in (True, False):  # padded to 32: 16 zigzag chunks, or 8 contiguous ones
    f = lambda x: aj.context_parallel_attention(x, x, x, mesh=mesh, axis_name="seq",
                                                is_causal=causal, key_value_seq_lengths=lengths)
    ref = lambda x: jax.nn.dot_product_attention(x, x, x, is_causal=causal,
                                                 key_value_seq_lengths=lengths)
    with jax.set_mesh(mesh):
      out, grad = jax.jit(lambda x: (f(x), jax.grad(lambda x: jnp.sum(f(x) ** 2))(x)))(x)
    for name, got, want in (("out", out, ref(x)),
                            ("grad", grad, jax.grad(lambda x: jnp.sum(ref(x) ** 2))(x))):
      errors[f"{types} causal={causal} {name}"] = float(jnp.max(jnp.abs(got - want))
                                                        / jnp.max(jnp.abs(want)))
print(json.dumps(errors))
"""


def test_a_length_padded_to_whole_shards_on_a_mesh_with_explicit_axes():
  """T = 30 on 8 devices (padded inside to 32) on jax.make_mesh's explicit axes, causal (zigzag)
  or not: values and gradients equal jax.nn's (it failed on the padded output's sharding before;
  automatic axes served it), rows with no key included (the mean of the values, jax.nn's answer
  and the library's one empty_rows default; zeros before)."""
  errors = on_eight_devices(PADDED_ON_EXPLICIT_AXES)
  assert len(errors) == 4
  for case, relative_error in errors.items():
    assert relative_error <= 1e-5, (case, relative_error)
