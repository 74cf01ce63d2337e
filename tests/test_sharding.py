"""Every implementation that runs on the CPU inside jax.shard_map (over the batch and over the
heads, with check_vma on, as by default) and under jit with NamedSharding inputs, on 8 simulated
devices: values and gradients equal to the unsharded float64 reference."""

from training_helpers import on_eight_devices

PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, "tests")
import numpy_reference
import attention_jax as aj

assert jax.device_count() == 8
mesh = Mesh(np.array(jax.devices()), ("devices",))
rng = np.random.default_rng(0)
B, T, N, K, H = 8, 24, 8, 8, 8
query, key, value = (rng.standard_normal((B, T, n, H)).astype(np.float32) for n in (N, K, K))
d_out = rng.standard_normal(query.shape).astype(np.float32)
lengths = rng.integers(1, T + 1, size=B).astype(np.int32)
ids = np.sort(rng.integers(0, 3, size=(B, T)), axis=-1).astype(np.int32)
expected, _, cache = numpy_reference.attention(query, key, value, is_causal=True)
expected_grads = numpy_reference.attention_vjp(cache, d_out)
allowed = numpy_reference.structure_mask(T, T, (B,), window=(5, 0), kv_lengths=lengths,
                                         q_segments=ids, kv_segments=ids)
structured, _, s_cache = numpy_reference.attention(query, key, value, mask=allowed,
                                                    is_causal=True)
structured_grads = numpy_reference.attention_vjp(s_cache, d_out)

def error(got, want):
  return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))

def check(fn, *extra, want=expected, want_grads=expected_grads):
  loss = lambda q, k, v, *e: jnp.sum(fn(q, k, v, *e) * d_out)
  out = jax.jit(fn)(query, key, value, *extra)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(query, key, value, *extra)
  return max([error(out, want)] + [error(g, w) for g, w in zip(grads, want_grads[:3])])

results = {}
for name in ("reference", "xla", "chunked", "chunked_blocks"):
  implementation = "chunked" if name == "chunked_blocks" else name
  def attend(q, k, v, *e, name=name, implementation=implementation):
    if name == "chunked_blocks":  # several blocks, so the block loops run sharded
      return aj.chunked_attention(q, k, v, scale=H ** -0.5, is_causal=True, block_q=8,
                                  block_k=8)
    return aj.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
  for axis, spec in (("batch", P("devices")), ("heads", P(None, None, "devices"))):
    sharded = jax.shard_map(attend, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    results[f"{name} shard_map over {axis}"] = check(sharded)
  placed = [jax.device_put(x, NamedSharding(mesh, P("devices"))) for x in (query, key, value)]
  out = jax.jit(attend)(*placed)
  results[f"{name} jit with NamedSharding"] = error(out, expected)

def structured_attend(q, k, v, lengths, ids):
  return aj.dot_product_attention(q, k, v, is_causal=True, local_window_size=(5, 0),
                                  key_value_seq_lengths=lengths, query_segment_ids=ids,
                                  key_segment_ids=ids, implementation="chunked", empty_rows="zero")
sharded = jax.shard_map(structured_attend, mesh=mesh, in_specs=(P("devices"),) * 5,
                        out_specs=P("devices"))
results["chunked with window, lengths, segments, shard_map over batch"] = check(
    sharded, lengths, ids, want=structured, want_grads=structured_grads)
print(json.dumps(results))
"""


def test_every_cpu_implementation_runs_sharded_on_eight_devices():
  errors = on_eight_devices(PROGRAM)
  assert len(errors) == 13
  for case, relative_error in errors.items():
    assert relative_error <= 1e-5, (case, relative_error)
