"""Custom attention as functions: score_mod, mask_mod, block masks, sinks and sigmoid attention.

Every implementation that serves them is held to the dense reference (itself checked against
float64 NumPy formulas written out here), the built-in arguments re-expressed as mods give the
built-in numbers, and PyTorch's FlexAttention gives the same numbers for the same mods.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import attention as attention_lib
from conftest import assert_close

B, T, N, K, H = 2, 24, 4, 2, 8  # [B, T, N, H] queries, K key/value heads (GQA)
SCALE = H ** -0.5
SEGMENTS = np.repeat(np.array([[0, 1, 2], [0, 0, 1]]), 8, axis=1)  # [B, T]
LENGTHS = np.array([24, 17])


def _case(seed=0, kv_len=T):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((B, kv_len, K, H)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((B, kv_len, K, H)), jnp.float32)
  return q, k, v


def _attend(implementation, q, k, v, **kwargs):
  """dot_product_attention, or the chunked kernel with blocks of 8 so that blocks are skipped
  and rescaled ("chunked_blocks")."""
  if implementation == "chunked_blocks":
    return aj.chunked_attention(q, k, v, scale=SCALE, block_q=8, block_k=8, **kwargs)
  return aj.dot_product_attention(q, k, v, implementation=implementation,
                                  **{"empty_rows": "zero", **kwargs})


def _value_and_grads(f, *args):
  """f's output and the gradients of sum(sin(output)) with respect to every argument."""
  loss = lambda *a: jnp.sum(jnp.sin(f(*a)))
  grads = jax.grad(loss, argnums=tuple(range(len(args))))
  return jax.jit(lambda *a: (f(*a),) + grads(*a))(*args)  # one compilation, not one per op


def _assert_all_close(actual, expected, rtol=2e-5):
  for index, (a, e) in enumerate(zip(actual, expected)):
    assert_close(a, e, rtol=rtol, name=f"output {index}")


# ----------------------------------------------------------------------------------------------
# The built-in arguments, re-expressed as mods, give the built-in numbers.

def _alibi(s, b, h, q_idx, kv_idx):
  return s - aj.positional.alibi_slopes(N)[h] * jnp.abs(q_idx - kv_idx)


BUILT_INS = {  # name: (built-in arguments, the same as score_mod / mask_mod)
    "alibi": (dict(bias=aj.alibi_bias(N, T)), dict(score_mod=_alibi)),
    "soft_cap": (dict(logits_soft_cap=2.0),
                 dict(score_mod=lambda s, b, h, q_idx, kv_idx: 2.0 * jnp.tanh(s / 2.0))),
    "window": (dict(local_window_size=(5, 2)),
               dict(mask_mod=lambda b, h, q_idx, kv_idx: (kv_idx >= q_idx - 5)
                    & (kv_idx <= q_idx + 2))),
    "causal": (dict(is_causal=True), dict(mask_mod=lambda b, h, q_idx, kv_idx: q_idx >= kv_idx)),
    "segments": (dict(query_segment_ids=SEGMENTS, key_segment_ids=SEGMENTS),
                 dict(mask_mod=lambda b, h, q_idx, kv_idx: jnp.asarray(SEGMENTS)[b, q_idx]
                      == jnp.asarray(SEGMENTS)[b, kv_idx])),
    "lengths": (dict(key_value_seq_lengths=LENGTHS),
                dict(mask_mod=lambda b, h, q_idx, kv_idx: kv_idx < jnp.asarray(LENGTHS)[b])),
}


@pytest.mark.parametrize("implementation", ["reference", "chunked_blocks"])
@pytest.mark.parametrize("name", sorted(BUILT_INS))
def test_built_in_arguments_written_as_mods_give_the_same_numbers(name, implementation):
  built_in, as_mods = BUILT_INS[name]
  q, k, v = _case()
  expected = _value_and_grads(lambda *a: _attend(implementation, *a, **built_in), q, k, v)
  actual = _value_and_grads(lambda *a: _attend(implementation, *a, **as_mods), q, k, v)
  _assert_all_close(actual, expected)


def test_a_mask_mod_with_a_block_mask_equals_the_built_in_and_the_mask_mod_alone():
  q, k, v = _case()
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  block_mask = aj.make_block_mask(causal, None, None, T, T, block_size=8)
  expected = _value_and_grads(lambda *a: _attend("chunked", *a, is_causal=True), q, k, v)
  for kwargs in (dict(block_mask=block_mask), dict(mask_mod=causal, block_mask=block_mask),
                 dict(mask_mod=causal)):
    _assert_all_close(_value_and_grads(lambda *a: _attend("chunked", *a, **kwargs), q, k, v),
                      expected)


# ----------------------------------------------------------------------------------------------
# Mods on every implementation that serves them, against the dense reference.

def _relative_bias_mods(table, documents):
  """A T5-style learnable bias table [N, 2T - 1] by relative position, and a causal document
  mask, as mods."""
  def score_mod(score, b, h, q_idx, kv_idx):
    return score + table[h, q_idx - kv_idx + T - 1]

  def mask_mod(b, h, q_idx, kv_idx):
    return (documents[q_idx] == documents[kv_idx]) & (q_idx >= kv_idx)
  return score_mod, mask_mod


DOCUMENTS = np.repeat([0, 1, 2], [5, 11, 8])


@pytest.mark.parametrize("implementation", ["chunked", "chunked_blocks"])
@pytest.mark.parametrize("with_bias", [True, False])  # without: heads side by side backward
def test_mods_match_the_reference_and_a_closed_over_table_gets_its_gradient(implementation,
                                                                            with_bias):
  q, k, v = _case(1)
  table = jnp.asarray(np.random.default_rng(2).standard_normal((N, 2 * T - 1)), jnp.float32)
  sinks = jnp.asarray([0.5, -1.0, 0.0, 2.0], jnp.float32)
  bias = jnp.asarray(np.random.default_rng(3).standard_normal((N, T, T)), jnp.float32)

  def run(implementation, table, sinks, bias, q, k, v):
    score_mod, mask_mod = _relative_bias_mods(table, jnp.asarray(DOCUMENTS))
    return _attend(implementation, q, k, v, bias=bias if with_bias else None,
                   score_mod=score_mod, mask_mod=mask_mod, sinks=sinks)

  args = (table, sinks, bias, q, k, v)
  expected = _value_and_grads(functools.partial(run, "reference"), *args)
  actual = _value_and_grads(functools.partial(run, implementation), *args)
  _assert_all_close(actual, expected)
  assert float(jnp.max(jnp.abs(actual[1]))) > 0.0  # the table trains
  assert float(jnp.max(jnp.abs(actual[2]))) > 0.0  # so do the sinks


def _equations(jaxpr):
  """Every equation of ``jaxpr`` and of the jaxprs inside its equations."""
  for equation in jaxpr.eqns:
    yield equation
    for param in equation.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


def test_a_constant_indexed_by_the_head_is_differentiated_once_per_block_not_per_entry():
  # slopes[h] at every entry of a block would transpose into one scatter of all its entries
  # onto one address, which a GPU serialises.
  slopes = jnp.asarray([0.5, 0.25, 0.125], jnp.float32)
  mod = aj.mods.trace_score_mod(lambda s, b, h, q_idx, kv_idx: s - slopes[h] * (q_idx - kv_idx))
  q_idx, kv_idx = jnp.arange(8)[:, None], jnp.arange(16)[None, :]
  loss = lambda consts, logits: jnp.sum(aj.mods.pointwise(
      mod.fn, consts, logits, jnp.int32(0), jnp.int32(2), q_idx, kv_idx))
  d_consts = jax.grad(loss)(mod.consts, jnp.zeros((8, 16)))
  np.testing.assert_allclose(d_consts[0], [0.0, 0.0, -float(jnp.sum(q_idx - kv_idx))])
  jaxpr = jax.make_jaxpr(jax.grad(loss))(mod.consts, jnp.zeros((8, 16))).jaxpr
  per_entry = [(e.primitive.name, e.invars[1].aval.shape) for e in _equations(jaxpr)
               if e.primitive.name in ("gather", "scatter", "scatter-add")
               and e.invars[1].aval.size > 1]
  assert not per_entry, per_entry  # was a gather and a scatter-add of 128 indices


def test_mods_compose_with_dropout_and_the_residual():
  """Dropout (the reference serves it) draws the same masks as with the built-in bias, and the
  chunked kernel's log-sum-exp includes the score_mod and the mask_mod."""
  q, k, v = _case(18)
  key = jax.random.key(0)
  dropout = dict(dropout_rate=0.25, dropout_rng=key)
  assert_close(_attend(None, q, k, v, score_mod=_alibi, **dropout),
               _attend(None, q, k, v, bias=aj.alibi_bias(N, T), **dropout), rtol=2e-5)
  score_mod, mask_mod = _relative_bias_mods(jnp.ones((N, 2 * T - 1)), jnp.asarray(DOCUMENTS))
  lse = {name: _attend(name, q, k, v, score_mod=score_mod, mask_mod=mask_mod,
                       return_residual=True)[1] for name in ("reference", "chunked_blocks")}
  assert_close(lse["chunked_blocks"], lse["reference"], rtol=1e-5)


def test_xla_serves_a_mask_mod_as_a_dense_mask():
  q, k, v = _case(17)
  _, mask_mod = _relative_bias_mods(None, jnp.asarray(DOCUMENTS))
  expected = _value_and_grads(lambda *a: _attend("reference", *a, mask_mod=mask_mod), q, k, v)
  _assert_all_close(_value_and_grads(lambda *a: _attend("xla", *a, mask_mod=mask_mod), q, k, v),
                    expected)


def test_the_reference_applies_mods_as_their_definitions_say():
  """Against float64 NumPy: score = mod(scale q.k + bias), masked where mask_mod is False."""
  q, k, v = _case(4)
  table = np.random.default_rng(5).standard_normal((N, 2 * T - 1))
  documents = DOCUMENTS
  score_mod, mask_mod = _relative_bias_mods(jnp.asarray(table, jnp.float32),
                                            jnp.asarray(documents))
  out = _attend("reference", q, k, v, score_mod=score_mod, mask_mod=mask_mod)
  qn, kn, vn = (np.repeat(np.asarray(x, np.float64), N // x.shape[2], axis=2) for x in (q, k, v))
  t, s = np.arange(T)[:, None], np.arange(T)[None, :]
  logits = SCALE * np.einsum("btnh,bsnh->bnts", qn, kn) + table[:, t - s + T - 1]
  allowed = (documents[t] == documents[s]) & (t >= s)
  logits = np.where(allowed, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  assert_close(out, np.einsum("bnts,bsnh->btnh", weights, vn), rtol=1e-5)


def test_mods_see_batch_and_head_indices_and_broadcast_over_leading_batch_dims():
  """batch is the flattened index over the leading dims, head the query head (as torch)."""
  q, k, v = _case(6)
  q, k, v = (x.reshape((1, 2) + x.shape[1:]) for x in (q, k, v))  # two leading batch dims
  per_example = jnp.asarray([[0.0, 1.0, 2.0, 3.0], [-1.0, 0.5, 0.0, 1.5]])  # [B, N]
  score_mod = lambda s, b, h, q_idx, kv_idx: s * 0.5 + per_example[b, h] * (kv_idx % 3)
  # the same as half the scale and a dense bias [1, 2, N, 1, S]
  expected = _attend("reference", q, k, v, scale=0.5 * SCALE,
                     bias=(per_example[:, :, None, None] * (jnp.arange(T) % 3))[None])
  for implementation in ("reference", "chunked", "chunked_blocks"):
    assert_close(_attend(implementation, q, k, v, score_mod=score_mod), expected,
                 rtol=2e-5, name=implementation)


# ----------------------------------------------------------------------------------------------
# Block masks.

def test_block_mask_kinds_match_the_dense_mask_and_skipping_changes_nothing():
  documents = np.repeat([0, 1, 2, 3], [3, 9, 10, 2])
  mask_mod = lambda b, h, q_idx, kv_idx: jnp.asarray(documents)[q_idx] == jnp.asarray(
      documents)[kv_idx]
  block_mask = aj.make_block_mask(mask_mod, None, None, T, T, block_size=8)
  dense = documents[:, None] == documents[None, :]
  blocks = dense.reshape(3, 8, 3, 8).transpose(0, 2, 1, 3)
  expected = np.where(blocks.all((2, 3)), 2, np.where(blocks.any((2, 3)), 1, 0))
  np.testing.assert_array_equal(block_mask.kinds[0, 0], expected)
  assert block_mask.kinds.dtype == jnp.int8
  q, k, v = _case(7)
  expected = _value_and_grads(lambda *a: _attend("reference", *a, mask_mod=mask_mod), q, k, v)
  actual = _value_and_grads(lambda *a: _attend("chunked", *a, block_mask=block_mask), q, k, v)
  _assert_all_close(actual, expected)


def test_full_blocks_do_not_evaluate_the_mask_mod_and_empty_ones_are_skipped():
  """A block mask that calls every block full makes a mask_mod that masks everything do
  nothing; one that calls them all empty leaves every row empty (zeros)."""
  q, k, v = _case(8)
  nothing = lambda b, h, q_idx, kv_idx: q_idx < 0
  made = aj.make_block_mask(nothing, None, None, T, T, block_size=8)
  assert np.all(np.asarray(made.kinds) == 0)
  full = aj.BlockMask(jnp.full(made.kinds.shape, 2, jnp.int8), T, T, 8, 8, nothing)
  assert_close(_attend("chunked", q, k, v, block_mask=full), _attend("reference", q, k, v))
  assert np.all(np.asarray(_attend("chunked", q, k, v, block_mask=made)) == 0.0)


def test_per_example_and_per_head_block_masks_and_padding_lengths():
  """B and N given; lengths that are not a multiple of the block (padding keys never count)."""
  q, k, v = _case(9, kv_len=21)
  limits = jnp.asarray([[3, 20, 9, 14], [21, 1, 8, 16]])  # [B, N]
  mask_mod = lambda b, h, q_idx, kv_idx: kv_idx <= limits[b, h] + q_idx // 4
  block_mask = aj.make_block_mask(mask_mod, B, N, T, 21, block_size=(8, 16))
  assert block_mask.kinds.shape == (B, N, 3, 2)
  # the kinds over the real pairs only: the last key block holds 5 real keys of 16
  b, h, q_idx, kv_idx = np.ogrid[:B, :N, :T, :21]
  dense = kv_idx <= np.asarray(limits)[b, h] + q_idx // 4  # [B, N, T, 21]
  for j, keys in enumerate((slice(0, 16), slice(16, 21))):
    block = dense[..., keys].reshape(B, N, 3, 8, -1)
    expected = np.where(block.all((3, 4)), 2, np.where(block.any((3, 4)), 1, 0))
    np.testing.assert_array_equal(block_mask.kinds[..., j], expected)
  expected = _value_and_grads(lambda *a: _attend("reference", *a, mask_mod=mask_mod), q, k, v)
  actual = _value_and_grads(lambda *a: _attend("chunked", *a, block_mask=block_mask), q, k, v)
  _assert_all_close(actual, expected)


def test_a_block_mask_is_a_pytree_reused_under_jit_vmap_scan_and_remat():
  q, k, v = _case(10)
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  block_mask = aj.make_block_mask(causal, None, None, T, T, block_size=8)
  leaves, tree = jax.tree_util.tree_flatten(block_mask)
  assert len(leaves) == 1 and jax.tree_util.tree_unflatten(tree, leaves) == block_mask
  attend = lambda q, k, v, m: _attend("chunked", q, k, v, block_mask=m)
  causal_reference = lambda q: _attend("reference", q, k, v, is_causal=True)
  vmapped = jax.jit(jax.vmap(attend, in_axes=(0, 0, 0, None)))
  assert_close(vmapped(q[:, None], k[:, None], v[:, None], block_mask)[:, 0],
               causal_reference(q), rtol=2e-5)

  def layers(x, m):  # the same block mask in every layer, rematerialised
    return jax.lax.scan(lambda x, _: (jax.checkpoint(attend)(x, k, v, m), None), x, None,
                        length=2)[0]
  _assert_all_close(_value_and_grads(lambda q: layers(q, block_mask), q),
                    _value_and_grads(lambda q: causal_reference(causal_reference(q)), q))


def test_mods_under_shard_map():
  """Inside shard_map (one device per batch shard) the mods see the shard's own indices."""
  q, k, v = _case(11)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
  table = jnp.linspace(-1, 1, N * (2 * T - 1)).reshape(N, 2 * T - 1)

  def run(implementation, table, q, k, v):
    score_mod, mask_mod = _relative_bias_mods(table, jnp.asarray(DOCUMENTS))
    return _attend(implementation, q, k, v, score_mod=score_mod, mask_mod=mask_mod)

  spec = jax.sharding.PartitionSpec("batch")
  sharded = jax.jit(jax.shard_map(functools.partial(run, "chunked_blocks"), mesh=mesh,
                                  in_specs=(jax.sharding.PartitionSpec(),) + (spec,) * 3,
                                  out_specs=spec))
  _assert_all_close(_value_and_grads(sharded, table, q, k, v),
                    _value_and_grads(functools.partial(run, "reference"), table, q, k, v))


def test_memory_stays_linear_at_64k_tokens_with_a_document_mask():
  """Compiled (not run) at T = 65536, forward and backward: XLA's temporary memory is a few
  times the query's, linear in T, where one T x S float32 matrix would take 16 GiB."""
  length = 65536
  documents = jnp.repeat(jnp.arange(8), length // 8)
  same_document = lambda b, h, q_idx, kv_idx: documents[q_idx] == documents[kv_idx]
  block_mask = jax.eval_shape(
      lambda: aj.make_block_mask(same_document, None, None, length, length, block_size=1024))
  shape = jax.ShapeDtypeStruct((1, length, 1, 64), jnp.float32)
  attend = lambda q, k, v, m: aj.dot_product_attention(q, k, v, block_mask=m,
                                                       implementation="chunked")
  gradients = jax.grad(lambda q, k, v, m: jnp.sum(attend(q, k, v, m)), argnums=(0, 1, 2))
  for fn in (attend, gradients):
    compiled = jax.jit(fn).lower(shape, shape, shape, block_mask).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < 8 * length * 64 * 4, temp  # 8 arrays the size of q; a T x S one is 16 GiB


# ----------------------------------------------------------------------------------------------
# Sinks and sigmoid attention.

def _numpy_weights(q, k, *, sinks=None, sigmoid_bias=None, causal=False):
  """float64 weights [B, N, T, S]: softmax with exp(sink) in the denominator, or sigmoid."""
  qn, kn = (np.repeat(np.asarray(x, np.float64), N // x.shape[2], axis=2) for x in (q, k))
  logits = SCALE * np.einsum("btnh,bsnh->bnts", qn, kn)
  allowed = np.tril(np.ones(logits.shape[-2:], bool)) if causal else True
  if sigmoid_bias is not None:
    return np.where(allowed, 1.0 / (1.0 + np.exp(-(logits + sigmoid_bias))), 0.0)
  exp = np.where(allowed, np.exp(logits), 0.0)
  return exp / (exp.sum(-1, keepdims=True) + np.exp(np.asarray(sinks))[:, None, None])


@pytest.mark.parametrize("implementation", ["reference", "chunked", "chunked_blocks"])
def test_sinks_take_their_share_of_each_row_and_enter_the_log_sum_exp(implementation):
  q, k, v = _case(12)
  sinks = jnp.asarray([0.0, 1.0, -2.0, 3.0], jnp.float32)
  weights = _numpy_weights(q, k, sinks=sinks, causal=True)
  vn = np.repeat(np.asarray(v, np.float64), N // K, axis=2)
  out, lse = _attend(implementation, q, k, v, sinks=sinks, is_causal=True, return_residual=True)
  assert_close(out, np.einsum("bnts,bsnh->btnh", weights, vn), rtol=1e-5)
  qn, kn = (np.repeat(np.asarray(x, np.float64), N // x.shape[2], axis=2) for x in (q, k))
  logits = SCALE * np.einsum("btnh,bsnh->bnts", qn, kn)
  logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
  expected_lse = np.logaddexp(np.logaddexp.reduce(logits, -1), np.asarray(sinks)[:, None])
  assert_close(lse, np.swapaxes(expected_lse, 1, 2), rtol=1e-5)
  expected = _value_and_grads(
      lambda s, q, k, v: _attend("reference", q, k, v, sinks=s, is_causal=True), sinks, q, k, v)
  actual = _value_and_grads(
      lambda s, q, k, v: _attend(implementation, q, k, v, sinks=s, is_causal=True), sinks, q, k,
      v)
  _assert_all_close(actual, expected)


def test_zero_sinks_are_softmax_off_by_one_and_an_empty_row_gives_zeros():
  q, k, v = _case(13)
  out = _attend("chunked", q, k, v, sinks=jnp.zeros(N), mask_mod=lambda b, h, q_idx, kv_idx:
                q_idx >= 3 + kv_idx * 0)  # rows 0..2 have no key
  weights = _numpy_weights(q, k, sinks=np.zeros(N))  # exp / (1 + sum exp)
  vn = np.repeat(np.asarray(v, np.float64), N // K, axis=2)
  expected = np.einsum("bnts,bsnh->btnh", weights, vn)
  expected[:, :3] = 0.0
  assert_close(out, expected, rtol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", "chunked", "chunked_blocks"])
def test_sigmoid_attention_against_its_formula_with_gradients(implementation):
  q, k, v = _case(14)
  vn = np.repeat(np.asarray(v, np.float64), N // K, axis=2)
  for sigmoid_bias, expected_bias in ((None, -np.log(T)), (0.5, 0.5)):
    weights = _numpy_weights(q, k, sigmoid_bias=expected_bias, causal=True)
    out = _attend(implementation, q, k, v, normalizer="sigmoid", sigmoid_bias=sigmoid_bias,
                  is_causal=True)
    assert_close(out, np.einsum("bnts,bsnh->btnh", weights, vn), rtol=1e-5)
  table = jnp.linspace(-1.0, 1.0, N * (2 * T - 1)).reshape(N, 2 * T - 1)

  def run(implementation, table, q, k, v):
    score_mod, _ = _relative_bias_mods(table, None)
    return _attend(implementation, q, k, v, normalizer="sigmoid", score_mod=score_mod,
                   is_causal=True)
  _assert_all_close(_value_and_grads(functools.partial(run, implementation), table, q, k, v),
                    _value_and_grads(functools.partial(run, "reference"), table, q, k, v))


# ----------------------------------------------------------------------------------------------
# Refusals and errors, in one line each.

@pytest.mark.parametrize("name", ["cudnn", "pallas_tpu"])
@pytest.mark.parametrize("custom", ["score_mod", "mask_mod", "sinks"])
def test_accelerator_kernels_refuse_mods_and_the_automatic_choice_avoids_them(name, custom):
  q = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  backend = {"cudnn": "gpu", "pallas_tpu": "tpu"}[name]
  value = {"score_mod": lambda s, b, h, q_idx, kv_idx: s,
           "mask_mod": lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, "sinks": jnp.zeros(8)}
  request = attention_lib.Request(backend=backend, **{custom: value[custom]})
  reason = attention_lib.unsupported_reason(name, q, q, q, request)
  if custom == "mask_mod":  # served as a dense mask when named, never chosen automatically
    assert reason is None and custom in attention_lib.KERNELS[name].named_only, reason
  else:
    assert custom in reason, reason
  for device in (dict(backend="gpu", device_kind="NVIDIA H100"),
                 dict(backend="tpu", device_kind="TPU v5 lite")):
    chosen = aj.select_implementation(q, q, q, **device, **{custom: value[custom]})
    # on Hopper the fused kernel serves mods; on a TPU xla materialises a mask_mod; what neither
    # serves goes to the blockwise kernel (O(T) memory)
    fused = device["backend"] == "gpu" and custom != "sinks"
    assert chosen == ("pallas_gpu" if fused else "xla" if custom == "mask_mod" else "chunked"), (
        device)


def test_bad_mods_and_block_masks_raise_one_line_errors():
  q, k, v = _case()
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  cases = [
      (dict(score_mod=lambda s, b, h, q_idx, kv_idx: jnp.stack([s, s])), "score_mod must return"),
      (dict(score_mod=lambda s, b, h: s), "score_mod must take 5 arguments"),
      (dict(mask_mod=lambda b, h, q_idx, kv_idx: q_idx - kv_idx), "mask_mod must return"),
      (dict(mask_mod=lambda b, h, q_idx, kv_idx: True if q_idx >= kv_idx else False),
       "mask_mod uses a traced index as a Python value (TracerBoolConversionError): a mod is "
       "traced once, on abstract indices; write conditions with jnp.where"),
      (dict(score_mod=lambda s, b, h, q_idx, kv_idx: s + np.arange(T)[q_idx]),
       "score_mod uses a traced index as a Python value"),
      (dict(block_mask=aj.make_block_mask(causal, None, None, T, 16, block_size=8)),
       "block_mask was made for q_len=24, kv_len=16"),
      (dict(block_mask=aj.make_block_mask(causal, 3, None, T, T, block_size=8)),
       "block_mask was made for batch=3"),
      (dict(mask_mod=lambda b, h, q_idx, kv_idx: q_idx > kv_idx,
            block_mask=aj.make_block_mask(causal, None, None, T, T)), "mask_mod differs"),
      (dict(sinks=jnp.zeros(3)), "sinks must be a floating array of shape [N] = (4,)"),
      (dict(sinks=jnp.zeros(N), normalizer="sigmoid"), "sigmoid attention has none"),
      (dict(normalizer="sigmoid", return_residual=True), "no log-sum-exp"),
      (dict(normalizer="relu"), "normalizer must be one of"),
      (dict(mask_mod=causal, implementation="cudnn"), "cannot serve this call"),
  ]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=r"^[^\n]*" + _escape(message)):
      aj.dot_product_attention(q, k, v, **kwargs)


def test_the_context_parallel_drop_in_serves_mods_and_refuses_the_rest_in_one_line():
  q, k, v = _case()
  attention_fn = aj.ContextParallel(jax.make_mesh((1,), ("seq",)), "seq")
  decay = lambda s, b, h, q_idx, kv_idx: s - 0.1 * jnp.abs(q_idx - kv_idx)
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  np.testing.assert_allclose(attention_fn(q, k, v, score_mod=decay, mask_mod=causal),
                             aj.dot_product_attention(q, k, v, score_mod=decay, mask_mod=causal),
                             rtol=1e-5, atol=1e-6)  # eight devices: tests/test_context_parallel.py
  with pytest.raises(ValueError, match="does not serve sinks, normalizer"):
    attention_fn(q, k, v, sinks=jnp.zeros(N), normalizer="sigmoid")
  with pytest.raises(ValueError, match="^context-parallel attention does not serve block_mask"):
    attention_fn(q, k, v, block_mask=aj.make_block_mask(causal, None, None, T, T, block_size=8))


def _escape(text):
  import re
  return re.escape(text)


# ----------------------------------------------------------------------------------------------
# PyTorch FlexAttention gives the same numbers for the same mods.

@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_torch_flex_attention_gives_the_same_outputs_and_gradients():
  """Forward: torch's flex_attention (eager, CPU). Gradients: torch's own eager FlexAttention
  math (``math_attention``, the dense computation flex_attention runs in eager mode), through
  torch's autograd, since torch's CPU flex_attention has no backward. B, N, T, H as torch lays
  them out: [B, N, T, H]."""
  torch = pytest.importorskip("torch")
  flex = pytest.importorskip("torch.nn.attention.flex_attention")
  import importlib
  math_attention = importlib.import_module("torch._higher_order_ops.flex_attention").math_attention
  q, k, v = _case(15)
  table = np.random.default_rng(16).standard_normal((N, 2 * T - 1)).astype(np.float32)
  documents = np.repeat([0, 1, 2], [5, 11, 8])

  def torch_mods(table_t, documents_t):
    def score_mod(score, b, h, q_idx, kv_idx):
      return score + table_t[h, q_idx - kv_idx + T - 1]

    def mask_mod(b, h, q_idx, kv_idx):
      return (documents_t[q_idx] == documents_t[kv_idx]) & (q_idx >= kv_idx)
    return score_mod, mask_mod

  to_torch = lambda x: torch.tensor(np.swapaxes(np.asarray(x), 1, 2), requires_grad=True)
  tq, tk, tv = (to_torch(x) for x in (q, k, v))
  ttable = torch.tensor(table, requires_grad=True)
  score_mod, mask_mod = torch_mods(ttable, torch.tensor(documents))
  block_mask = flex.create_block_mask(mask_mod, None, None, T, T, device="cpu")
  with torch.no_grad():
    forward = flex.flex_attention(tq.detach(), tk.detach(), tv.detach(), score_mod=score_mod,
                                  block_mask=block_mask, scale=SCALE, enable_gqa=True)
  out, _, _ = math_attention(tq, tk, tv, score_mod, block_mask.as_tuple(), SCALE, {})
  torch.sin(out).sum().backward()
  to_ours = lambda x: np.swapaxes(x.detach().numpy(), 1, 2)

  def ours(table, q, k, v):
    score_mod, mask_mod = _relative_bias_mods(table, jnp.asarray(documents))
    return _attend("chunked_blocks", q, k, v, score_mod=score_mod, mask_mod=mask_mod)
  actual = _value_and_grads(ours, jnp.asarray(table), q, k, v)
  assert_close(actual[0], to_ours(forward), rtol=2e-5, name="output vs flex_attention")
  assert_close(actual[0], to_ours(out), rtol=2e-5, name="output vs math_attention")
  assert_close(actual[1], ttable.grad.numpy(), rtol=5e-5, name="table gradient")
  for name, ours_grad, theirs in zip("qkv", actual[2:], (tq, tk, tv)):
    assert_close(ours_grad, to_ours(theirs.grad), rtol=5e-5, name=f"d{name}")
