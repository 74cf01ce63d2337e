"""The jax.nn superset of dot_product_attention -- sequence lengths, local windows, logits
soft-capping, segment ids and the log-sum-exp residual -- on every implementation, against the
float64 NumPy reference (values, gradients including the bias's, and the residual), and equal to
jax.nn where both apply."""

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
import numpy_reference
from attention_cases import IMPLEMENTATIONS, attention, random_case
from conftest import assert_close

CASES = {
    # name: (batch, T, S, N, K, H, options)
    "window_int": ((2,), 9, 9, 2, 2, 8, {"local_window_size": 2}),
    "window_left_causal_gqa": ((2,), 10, 10, 4, 2, 8, {"local_window_size": (3, 0),
                                                       "is_causal": True}),
    "window_cross_lengths": ((2,), 5, 9, 2, 1, 8, {"local_window_size": (1, 4)}),
    "soft_cap_bias": ((2,), 7, 7, 2, 2, 8, {"logits_soft_cap": 1.5, "bias": "heads"}),
    "soft_cap_causal_gqa": ((2,), 8, 8, 4, 1, 8, {"logits_soft_cap": 0.7, "is_causal": True}),
    "query_lengths": ((3,), 7, 7, 2, 2, 8, {"query_seq_lengths": True}),
    "key_value_lengths_bias": ((3,), 6, 8, 2, 2, 8, {"key_value_seq_lengths": True,
                                                     "bias": "full"}),
    "segments_packed": ((2,), 12, 12, 2, 2, 8, {"segments": "packed"}),
    "segments_scattered_gqa": ((2,), 9, 9, 4, 2, 8, {"segments": "scattered"}),
    "two_batch_dims_lengths_segments": ((2, 2), 6, 6, 2, 2, 8, {
        "query_seq_lengths": True, "key_value_seq_lengths": True, "segments": "packed"}),
    "everything": ((2,), 11, 11, 4, 2, 8, {
        "local_window_size": (4, 2), "is_causal": True, "logits_soft_cap": 2.0,
        "query_seq_lengths": True, "key_value_seq_lengths": True, "segments": "packed",
        "bias": "full", "mask": "random"}),
}


def _structure(rng, batch, q_len, kv_len, options):
  """The jax.nn-style arguments a case asks for, drawn at random (lengths include 0)."""
  args = {}
  for name, length in (("query_seq_lengths", q_len), ("key_value_seq_lengths", kv_len)):
    if options.pop(name, False):
      lengths = rng.integers(1, length + 1, size=batch).astype(np.int32)
      lengths.reshape(-1)[-1] = 0 if name == "key_value_seq_lengths" else length // 2
      args[name] = lengths
  kind = options.pop("segments", None)
  if kind == "packed":  # contiguous runs, as packed examples
    ids = np.sort(rng.integers(0, 3, size=batch + (q_len,)), axis=-1).astype(np.int32)
  elif kind == "scattered":
    ids = rng.integers(0, 3, size=batch + (q_len,)).astype(np.int32)
  if kind:
    args["query_segment_ids"] = args["key_segment_ids"] = ids
  for name in ("local_window_size", "logits_soft_cap"):
    if name in options:
      args[name] = options.pop(name)
  return args


def run_case(case, implementation, seed):
  """(output, residual, grads) of ours and of the float64 reference for one case."""
  batch, q_len, kv_len, heads, kv_heads, head_dim, options = case
  options = dict(options)
  is_causal = options.pop("is_causal", False)
  rng = np.random.default_rng(seed)
  args = _structure(rng, batch, q_len, kv_len, options)
  query, key, value, mask, bias = random_case(seed, batch, q_len, kv_len, heads, kv_heads,
                                               head_dim, **options)
  window = args.get("local_window_size")
  window = (window, window) if isinstance(window, int) else window
  allowed = numpy_reference.structure_mask(
      q_len, kv_len, batch, window=window, q_lengths=args.get("query_seq_lengths"),
      kv_lengths=args.get("key_value_seq_lengths"), q_segments=args.get("query_segment_ids"),
      kv_segments=args.get("key_segment_ids"))
  expected, _, cache = numpy_reference.attention(
      query, key, value, bias, allowed if mask is None else allowed & mask, is_causal=is_causal,
      logits_soft_cap=args.get("logits_soft_cap"))
  d_output = np.random.default_rng(7).standard_normal(query.shape).astype(np.float32)

  def loss(q, k, v, b):
    out, residual = attention(q, k, v, b, mask, is_causal=is_causal, return_residual=True,
                              implementation=implementation, **args)
    return jnp.sum(out * d_output), (out, residual)

  grad_args = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  grads, (output, residual) = jax.jit(jax.grad(loss, argnums=grad_args, has_aux=True))(
      query, key, value, bias)
  expected_grads = numpy_reference.attention_vjp(cache, d_output)
  return (output, residual, grads), (expected, numpy_reference.log_sum_exp(cache),
                                     expected_grads)


def _serves(implementation, case):
  return not (implementation == "xla" and "logits_soft_cap" in case[-1])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_values_gradients_and_residual_match_float64_reference(case, implementation):
  if not _serves(implementation, CASES[case]):
    with pytest.raises(ValueError, match="no logits soft cap"):
      run_case(CASES[case], implementation, seed=0)
    return
  (output, residual, grads), (expected, expected_residual, expected_grads) = run_case(
      CASES[case], implementation, seed=zlib.crc32(case.encode()) % 1000)
  assert_close(output, expected, 1e-5, "output")
  for name, grad, expected_grad in zip(("query", "key", "value", "bias"), grads,
                                       expected_grads):
    assert_close(grad, expected_grad, 1e-5, f"d_{name}")
  assert residual.dtype == jnp.float32 and residual.shape == expected_residual.shape
  empty = np.isneginf(expected_residual)
  np.testing.assert_array_equal(np.isneginf(residual), empty)  # the log of an empty sum
  assert_close(np.where(empty, 0.0, residual), np.where(empty, 0.0, expected_residual), 1e-5,
               "residual")


def test_every_case_has_an_empty_row_or_a_skipped_block():
  """The cases reach the paths that matter: rows with nothing to attend to, and key blocks the
  chunked kernel skips entirely (its smallest test blocks are 4 x 3)."""
  assert any("key_value_seq_lengths" in case[-1] for case in CASES.values())
  assert any(case[-1].get("segments") == "packed" and case[1] > 8 for case in CASES.values())


def _jax_nn_ignores_window_without_mask() -> bool:
  """Whether this jax's jax.nn.dot_product_attention has the bug its own regression test
  (testDotProductAttention_localWindowSizeWithoutMask) guards against."""
  x = jnp.eye(4)[None, :, None, :]  # [1, T, 1, H]: query t matches key t alone
  windowed = jax.nn.dot_product_attention(x, x, 10.0 * x, local_window_size=(0, 0), scale=1.0)
  plain = jax.nn.dot_product_attention(x, x, 10.0 * x, scale=1.0)
  return bool(jnp.allclose(windowed, plain))


@pytest.mark.parametrize("options", [
    dict(key_value_seq_lengths=np.array([5, 9], np.int32)),
    dict(query_seq_lengths=np.array([3, 9], np.int32)),
    dict(local_window_size=(2, 1)),
    dict(local_window_size=3, is_causal=True),
    dict(local_window_size=(3, 2), key_value_seq_lengths=np.array([7, 9], np.int32)),
])
@pytest.mark.parametrize("implementation", [None, "reference", "xla", "chunked"])
def test_equal_to_jax_nn_where_both_apply(options, implementation):
  """jax.nn's own arguments give jax.nn's answers, output and residual (on the rows that have a
  key: jax.nn averages an empty row's values where the contract asks for zeros)."""
  if set(options) == {"local_window_size"} and _jax_nn_ignores_window_without_mask():
    pytest.skip("jax.nn before 0.8.2 ignores local_window_size without a mask or is_causal "
                "(jax commit 099f0a1708), so it is no reference for it")
  query, key, value, _, _ = random_case(5, (2,), 9, 9, 4, 2, 8)
  ours, residual = aj.dot_product_attention(query, key, value, return_residual=True,
                                            implementation=implementation, **options)
  theirs, their_residual = jax.nn.dot_product_attention(query, key, value, return_residual=True,
                                                        **options)
  assert_close(ours, theirs, 1e-6)
  rows = np.arange(9)[None, :, None] < options.get("query_seq_lengths", np.array([9, 9]))[:, None,
                                                                                          None]
  assert_close(np.where(rows, residual, 0.0), np.where(rows, their_residual, 0.0), 1e-6)


@pytest.mark.parametrize("implementation", ["reference", "chunked_small_blocks"])
def test_modules_and_multi_head_function_pass_the_arguments_through(implementation):
  """MultiHeadAttention with a window and segment ids equals multi_head_attention with them, and
  its sown weights respect them (zero outside the window and across segments)."""
  x = jax.random.normal(jax.random.key(0), (2, 10, 16))
  ids = jnp.array([[0] * 6 + [1] * 4, [0] * 10])
  args = dict(local_window_size=(2, 1), query_segment_ids=ids, key_segment_ids=ids,
              logits_soft_cap=3.0)
  layer = aj.MultiHeadAttention(num_heads=2, implementation=None if implementation ==
                                "reference" else "chunked")
  variables = layer.init(jax.random.key(1), x)
  output, state = layer.apply(variables, x, sow_weights=True, mutable="intermediates", **args)
  direct = aj.multi_head_attention(variables["params"], x, implementation="reference", **args)
  assert_close(output, direct, 1e-5)
  weights = state["intermediates"]["attention_weights"][0]  # [B, N, T, S]
  offset = np.arange(10)[None, :] - np.arange(10)[:, None]
  outside = (offset < -2) | (offset > 1) | (np.asarray(ids)[:, None, :, None] !=
                                             np.asarray(ids)[:, None, None, :])
  assert np.all(np.asarray(weights)[np.broadcast_to(outside, weights.shape)] == 0.0)
  assert_close(weights, aj.multi_head_attention_weights(variables["params"], x, **args), 1e-6)
  out, residual = aj.multi_head_attention(variables["params"], x, return_residual=True, **args)
  assert out.shape == x.shape and residual.shape == (2, 10, 2)


@pytest.mark.parametrize("arguments, match", [
    (dict(query_seq_lengths=np.array([1.0, 2.0])), "query_seq_lengths must be an integer"),
    (dict(key_value_seq_lengths=np.array([1, 2, 3])), r"must have shape \(2,\)"),
    (dict(query_segment_ids=np.zeros((2, 6), np.int32)), "come together"),
    (dict(query_segment_ids=np.zeros((2, 5), np.int32),
          key_segment_ids=np.zeros((2, 6), np.int32)), r"query_segment_ids must have shape"),
    (dict(local_window_size=(1, 2, 3)), "local_window_size must be"),
    (dict(local_window_size=-1), "local_window_size must be"),
    (dict(logits_soft_cap=0.0), "logits_soft_cap must be a positive"),
])
def test_malformed_superset_arguments_name_themselves(arguments, match):
  query = jnp.zeros((2, 6, 2, 8))
  with pytest.raises(ValueError, match=match):
    aj.dot_product_attention(query, query, query, **arguments)


@pytest.mark.parametrize("implementation", ["reference", "xla", "chunked"])
def test_forward_mode_agrees_with_the_float64_vjp(implementation):
  """jvp through the implementations that support forward mode: <w, J t> = <J^T w, t> with
  J^T w from the hand-written float64 backward."""
  query, key, value, _, bias = random_case(9, (2,), 6, 6, 4, 2, 8, bias="heads")
  tangents = [np.random.default_rng(i).standard_normal(x.shape).astype(np.float32)
              for i, x in enumerate((query, key, value, bias))]
  fn = functools.partial(aj.dot_product_attention, is_causal=True, implementation=implementation)
  _, jvp = jax.jvp(fn, (query, key, value, bias), tuple(tangents))
  w = np.random.default_rng(5).standard_normal(query.shape)
  _, _, cache = numpy_reference.attention(query, key, value, bias, is_causal=True)
  cotangents = numpy_reference.attention_vjp(cache, w)
  expected = sum(np.sum(c * t) for c, t in zip(cotangents, tangents))
  assert abs(float(np.sum(np.asarray(jvp, np.float64) * w)) - expected) <= 1e-4 * abs(expected)
  hessian_vector = jax.jvp(jax.grad(lambda q: jnp.sum(fn(q, key, value, bias) ** 2)),
                           (query,), (tangents[0],))[1]
  assert np.all(np.isfinite(hessian_vector))


@pytest.mark.parametrize("implementation", [None, "chunked"])
def test_every_transform_of_jax_nn_s_default_works_on_the_default_and_blockwise_paths(
    implementation):
  """One list of transforms, run on jax.nn.dot_product_attention and on ours at a length where
  the automatic choice is the blockwise kernel (forward mode included: its tangent kernel)."""
  query, key, value = (jax.random.normal(jax.random.key(i), (2, 256, 2, 8)) for i in range(3))
  tangent = jax.random.normal(jax.random.key(3), query.shape)
  ours = lambda q, k, v: aj.dot_product_attention(q, k, v, is_causal=True,
                                                  implementation=implementation)
  theirs = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)
  # 3 parameters -> 32 outputs (the last 4 queries): jacrev's batch is the outputs'
  scaled = lambda f: (lambda s: f(query * s[0], key * s[1], value * s[2])[:, -4:, :, :2])
  loss = lambda f: (lambda s: jnp.sum(scaled(f)(s) ** 2))
  s = jnp.ones(3)
  transforms = {
      "jvp": lambda f: jax.jvp(f, (query, key, value), (tangent, tangent, tangent))[1],
      "linearize": lambda f: jax.linearize(f, query, key, value)[1](tangent, tangent, tangent),
      "jacfwd": lambda f: jax.jacfwd(scaled(f))(s),
      "jacrev": lambda f: jax.jacrev(scaled(f))(s),
      "grad": lambda f: jax.grad(loss(f))(s),
      "hessian": lambda f: jax.hessian(loss(f))(s),
      "vmap": lambda f: jax.vmap(f, in_axes=(2, 2, 2), out_axes=2)(query, key, value),
  }
  for name, transform in transforms.items():
    assert_close(transform(ours), transform(theirs), 2e-5 if name == "hessian" else 1e-5, name)
