"""dot_product_attention, every implementation, against the float64 NumPy reference."""

import dataclasses
import functools
from unittest import mock
import zlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
import numpy_reference
from attention_cases import (CASES, IMPLEMENTATIONS, assert_case_matches, attention, random_case,
                             run_case)
from conftest import assert_close


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_values_and_gradients_match_float64_reference(case, implementation):
  fn = functools.partial(attention, implementation=implementation)
  assert_case_matches(run_case(CASES[case], fn, seed=zlib.crc32(case.encode()) % 1000), 1e-5)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_fully_masked_rows_give_zeros_and_finite_gradients(implementation):
  query, key, value, _, _ = random_case(0, (2,), 4, 5, 2, 2, 8)
  mask = np.ones((2, 2, 4, 5), bool)
  mask[0, 1, 2] = False  # one row of one head
  mask[1] = False  # a whole batch element
  fn = lambda q, k, v: attention(q, k, v, mask=mask, implementation=implementation)
  output = fn(query, key, value)
  np.testing.assert_array_equal(output[0, 2, 1], 0.0)
  np.testing.assert_array_equal(output[1], 0.0)
  grads = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2))(query, key, value)
  for grad in grads:
    assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grads[0][1], 0.0)  # no gradient reaches a row with no keys


@pytest.mark.parametrize("case", ["basic", "gqa", "causal", "bias_per_head", "padding_mask",
                                  "two_batch_dims"])
def test_default_equals_jax_nn_where_both_apply(case):
  batch, q_len, kv_len, heads, kv_heads, head_dim, options = CASES[case]
  options = dict(options)
  is_causal = options.pop("is_causal", False)
  query, key, value, mask, bias = random_case(3, batch, q_len, kv_len, heads, kv_heads,
                                               head_dim, **options)
  if mask is not None:  # jax.nn averages the values of fully masked rows; keep one key
    mask = mask.copy()
    mask[..., 0] = True
  ours = aj.dot_product_attention(query, key, value, bias, mask, is_causal=is_causal)
  flat = lambda x: None if x is None else x.reshape((-1,) + x.shape[-3:])
  theirs = jax.nn.dot_product_attention(
      flat(query), flat(key), flat(value),
      bias=None if bias is None else bias[None], mask=flat(mask) if mask is not None and
      mask.ndim > 3 else mask, is_causal=is_causal)
  assert_close(ours, theirs.reshape(ours.shape), 1e-6)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_value_dim_may_differ_only_where_supported(implementation):
  query, key, value, _, _ = random_case(1, (2,), 4, 6, 2, 2, 8, value_dim=12)
  if implementation == "xla":
    with pytest.raises(ValueError, match="value.shape == key.shape"):
      aj.dot_product_attention(query, key, value, implementation=implementation)
    return
  output = attention(query, key, value, implementation=implementation)
  assert_close(output, numpy_reference.attention(query, key, value)[0])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bfloat16_softmax_in_float32_and_output_dtype(implementation):
  query, key, value, _, _ = random_case(2, (2,), 8, 8, 2, 2, 16)
  query, key, value = (jnp.asarray(x, jnp.bfloat16) for x in (query, key, value))
  output = attention(query, key, value, implementation=implementation)
  assert output.dtype == jnp.bfloat16
  expected = numpy_reference.attention(*(np.asarray(x, np.float32)
                                         for x in (query, key, value)))[0]
  assert_close(output, expected, 2e-2)


def test_return_weights_are_the_softmax_and_match_reference():
  query, key, value, mask, _ = random_case(4, (2,), 6, 6, 4, 2, 8, mask="random")
  output, weights = aj.dot_product_attention(query, key, value, mask=mask, return_weights=True,
                                            empty_rows="zero")
  expected_output, expected_weights, _ = numpy_reference.attention(query, key, value, mask=mask)
  assert weights.shape == (2, 4, 6, 6) and weights.dtype == jnp.float32
  assert_close(weights, expected_weights)
  assert_close(output, expected_output)


def test_dropout_is_inverted_dropout_and_reproducible():
  query, key, value, _, _ = random_case(5, (2,), 16, 16, 2, 2, 8)
  rng = jax.random.key(0)
  run = jax.jit(lambda r: aj.dot_product_attention(query, key, value, dropout_rate=0.5,
                                                   dropout_rng=r))
  np.testing.assert_array_equal(run(rng), run(rng))
  assert not np.allclose(run(rng), run(jax.random.key(1)))
  # The mean over many dropout draws approaches the output without dropout.
  mean = jnp.mean(jax.vmap(run)(jax.random.split(rng, 2000)), axis=0)
  assert_close(mean, aj.dot_product_attention(query, key, value), 0.1)


def test_select_implementation_names_the_choice():
  query, key, value, _, _ = random_case(6, (1,), 4, 4, 2, 2, 8)
  assert aj.select_implementation(query, key, value, backend="cpu") == "reference"
  assert aj.select_implementation(query, key, value, implementation="xla") == "xla"
  assert aj.select_implementation(query, key, value, return_weights=True) == "reference"
  assert aj.select_implementation(query, key, value, dropout_rate=0.1) == "reference"
  assert aj.select_implementation(query, key, value, implementation="reference") == "reference"
  assert aj.select_implementation(query, key, value, implementation="chunked") == "chunked"
  long_query = jnp.zeros((1, aj.attention.CHUNKED_MIN_LENGTH_CPU, 2, 8))
  assert aj.select_implementation(long_query, key, value, backend="cpu") == "chunked"
  assert aj.select_implementation(long_query, key, value, return_weights=True,
                                  backend="cpu") == "reference"


def test_select_implementation_asks_the_call_itself():
  """select_implementation runs the call's own validation: a malformed call raises what the call
  raises, and what it names is what the call runs (the kernel seen running)."""
  query, key, value, _, _ = random_case(6, (1,), 4, 4, 2, 2, 8)
  with pytest.raises(ValueError, match="empty_rows must be one of"):
    aj.select_implementation(query, key, value, empty_rows="none")
  with pytest.raises(ValueError, match="empty_rows must be one of"):
    aj.dot_product_attention(query, key, value, empty_rows="none")
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (query, key, value))
  lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
  assert aj.select_implementation(*shapes, key_value_seq_lengths=lengths, backend="cpu",
                                  sinks=jnp.zeros(2)) == "reference"
  ran = []
  spies = {name: dataclasses.replace(kernel, run=lambda *a, kernel=kernel: ran.append(
      kernel.name) or kernel.run(*a)) for name, kernel in aj.attention.KERNELS.items()}
  with mock.patch.dict(aj.attention.KERNELS, spies):
    for length in (4, aj.attention.CHUNKED_MIN_LENGTH_CPU):
      long_query = jnp.zeros((1, length, 2, 8))
      chosen = aj.select_implementation(long_query, key, value, is_causal=True)
      aj.dot_product_attention(long_query, key, value, is_causal=True)
      assert ran == [chosen], (length, ran, chosen)
      ran.clear()
  assert chosen == "chunked"


def test_jit_vmap_grad_compose_and_jit_traces_once():
  query, key, value, _, _ = random_case(8, (3, 2), 6, 6, 2, 2, 8)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def loss(q, k, v):
    per_example = jax.vmap(lambda a, b, c: aj.dot_product_attention(a, b, c, is_causal=True))
    return jnp.sum(per_example(q, k, v) ** 2)

  grad_fn = jax.jit(jax.grad(loss))
  for _ in range(3):
    loss(query, key, value)
    loss(query + 1.0, key, value)
  grads = grad_fn(query, key, value)
  expected, _, cache = numpy_reference.attention(query, key, value, is_causal=True)
  assert_close(grads, numpy_reference.attention_vjp(cache, 2 * expected)[0], 1e-5)


@pytest.mark.parametrize("q_len, kv_len, block_q, block_k", [
    (16, 16, 4, 3), (16, 16, 3, 8), (16, 16, 8, 2),  # blocks below, across and above the diagonal
    (12, 20, 4, 4), (20, 12, 8, 4), (13, 13, 16, 16)])  # fewer or more keys; a single block
def test_chunked_causal_block_skipping_at_every_block_shape(q_len, kv_len, block_q, block_k):
  """Causal chunked attention skips the blocks above the diagonal; no split loses a key."""
  case = ((2,), q_len, kv_len, 2, 2, 8, {"is_causal": True})
  fn = functools.partial(attention, implementation="chunked_small_blocks", block_q=block_q,
                         block_k=block_k)
  assert_case_matches(run_case(case, fn, seed=11), 1e-5)


@pytest.mark.parametrize("block_k", [3, 16])  # several key blocks; one (the plain softmax)
@pytest.mark.parametrize("case", ["gqa", "causal_masked_gqa", "structure_mask", "padding_mask",
                                  "bias_full_and_mask"])
def test_chunked_heads_side_by_side_equal_the_reference(case, block_k, monkeypatch):
  """Three (example, head) pairs per loop step: whole steps, and a remainder where B * N is not
  a multiple of three; grouped-query heads, masks, biases and causal skipping with them."""
  _, q_len, kv_len, *_ = CASES[case]
  geometry = aj.blocks.Geometry.create(q_len, kv_len, 4, block_k)
  monkeypatch.setattr(aj.blocks, "PAIR_BLOCK_BYTES", 3 * 4 * geometry.block_q * geometry.block_k)
  assert geometry.pairs_per_step == 3
  assert (geometry.num_k == 1) == (block_k == 16)
  fn = functools.partial(attention, implementation="chunked_small_blocks", block_k=block_k)
  assert_case_matches(run_case(CASES[case], fn, seed=3), 1e-5)


@pytest.mark.parametrize("length, pairs", [(33, 1310), (256, 32), (1024, 2), (2048, None)])
def test_chunked_pairs_per_step_keep_the_logits_within_the_budget(length, pairs):
  geometry = aj.blocks.Geometry.create(length, length)
  assert geometry.pairs_per_step == pairs
  assert dataclasses.replace(geometry, side_by_side=False).pairs_per_step is None


@pytest.mark.parametrize("length, requested, block, count", [
    (1100, None, 552, 2),   # equal blocks: 1104 padded, not 2048
    (1024, None, 1024, 1),
    (3000, None, 1000, 3),
    (33, None, 40, 1),      # a multiple of 8
    (1100, 256, 256, 5),    # a requested block is kept
    (100, 256, 104, 1),     # but never beyond the padded length
])
def test_chunked_block_sizes(length, requested, block, count):
  geometry = aj.blocks.Geometry.create(length, length, requested, requested, narrow_keys=True)
  assert (geometry.block_q, geometry.num_q) == (block, count)
  assert (geometry.block_k, geometry.num_k) == (block, count)


@pytest.mark.parametrize("length, block, count", [(3000, 3000, 1), (4096, 4096, 1),
                                                  (5000, 2504, 2), (8200, 2736, 3)])
def test_chunked_key_blocks_are_longer_without_a_causal_mask(length, block, count):
  geometry = aj.blocks.Geometry.create(length, length)
  assert (geometry.block_k, geometry.num_k) == (block, count)
  assert geometry.block_q <= aj.blocks.DEFAULT_BLOCK_Q


@pytest.mark.parametrize("is_causal", [True, False])
def test_long_sequences_default_to_chunked_with_several_blocks_and_stay_exact(is_causal):
  q_len = 1064  # default blocks: 2 x 536 queries; keys 2 x 536 when causal, else one block
  query, key, value, _, _ = random_case(9, (1,), q_len, q_len, 2, 1, 16)
  mask = np.ones((1, 1, 1, q_len), bool)
  mask[..., -100:] = False  # padded keys at the end
  d_output = np.random.default_rng(1).standard_normal(query.shape).astype(np.float32)
  implementation = aj.select_implementation(query, key, value, backend="cpu")
  assert implementation == "chunked"  # on the CPU; named, so that every backend tests it
  attention = functools.partial(aj.dot_product_attention, mask=mask, is_causal=is_causal,
                                implementation=implementation)
  loss = lambda q, k, v: jnp.sum(attention(q, k, v) * d_output)
  output = attention(query, key, value)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(query, key, value)
  expected, _, cache = numpy_reference.attention(query, key, value, mask=mask, is_causal=is_causal)
  assert np.abs(expected).max() > 0.1
  assert_close(output, expected, 1e-5)
  for grad, expected_grad in zip(grads, numpy_reference.attention_vjp(cache, d_output)):
    assert_close(grad, expected_grad, 1e-5)


def test_the_kernels_and_dot_product_attention_share_one_empty_rows_default():
  """One default ("mean", jax.nn's), applied by masks.fill_empty_rows on every path: the blockwise
  kernels called directly give the mean too, zeros with empty_rows="zero", as does every
  implementation named."""
  from attention_jax import pallas_gpu
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (2, 16, 2, 8)) for key in keys)
  mask = jnp.ones((2, 1, 16, 16), bool).at[1, :, 3].set(False)  # example 1, row 3: no key
  chunked = aj.chunked_attention(q, k, v, None, mask, scale=0.5, empty_rows="zero")
  fused = pallas_gpu.pallas_gpu_attention(q, k, v, mask, scale=0.5, interpret=True,
                                          empty_rows="zero")
  assert_close(fused, chunked, rtol=1e-5)
  assert float(jnp.max(jnp.abs(chunked[1, 3]))) == 0.0
  mean = jnp.mean(v[1], axis=0)  # [K, H]: the row's uniform weights
  for default in (aj.chunked_attention(q, k, v, None, mask, scale=0.5),
                  pallas_gpu.pallas_gpu_attention(q, k, v, mask, scale=0.5, interpret=True)):
    assert_close(default[1, 3], mean, rtol=1e-5)
    assert_close(default[0], chunked[0], rtol=1e-5)
  for implementation in ("reference", "xla", "chunked"):
    out = aj.dot_product_attention(q, k, v, mask=mask, scale=0.5, implementation=implementation)
    assert_close(out[1, 3], mean, rtol=1e-5)
    assert_close(out[0], chunked[0], rtol=1e-5)
    zeros = aj.dot_product_attention(q, k, v, mask=mask, scale=0.5, implementation=implementation,
                                     empty_rows="zero", return_residual=True)
    assert_close(zeros[0], chunked, rtol=1e-5)
    assert not np.isfinite(zeros[1][1, 3]).any()  # the residual says the row is empty


def test_a_mod_interpreter_failure_passes_the_automatic_choice_to_chunked_and_says_why():
  """On a GPU (forced here) an error of the fused kernel's mod interpreter other than Unservable
  is a reason, not an exception: the automatic choice takes chunked and select_implementation
  says why; named, the kernel is refused in one line."""
  from attention_jax import pallas_gpu

  def failing(*args, **kwargs):
    raise KeyError("an equation the interpreter misreads")

  q = k = v = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  distance = lambda s, b, h, q_idx, kv_idx: s - 0.1 * jnp.abs(q_idx - kv_idx)  # noqa: E731
  on_hopper = dict(backend="gpu", device_kind="NVIDIA H200", score_mod=distance)
  name, why = aj.select_implementation(q, k, v, explain=True, **on_hopper)
  assert name == "pallas_gpu" and "cudnn" in why  # cuDNN serves no score_mod
  with mock.patch.object(pallas_gpu, "evaluate", failing):
    name, why = aj.select_implementation(q, k, v, explain=True, **on_hopper)
    assert name == "chunked" and "misreads" in why["pallas_gpu"], why
    assert "\n" not in why["pallas_gpu"]
    assert aj.select_implementation(q, k, v, **on_hopper) == "chunked"
    with pytest.raises(ValueError, match="'pallas_gpu' cannot serve this call: .*misreads"
                       ) as error:
      aj.select_implementation(q, k, v, implementation="pallas_gpu", **on_hopper)
    assert "\n" not in str(error.value)


def test_the_mod_record_annotations_resolve_in_the_pinned_jax():
  import typing
  from attention_jax import mods
  assert "jaxpr" in typing.get_type_hints(mods.Mod)
