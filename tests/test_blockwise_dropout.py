"""Dropout inside the blockwise kernel: the same mask from any block shape, forward and backward,
equal to dense attention with that mask (values and gradients, float64); the keep rate and the
1 / (1 - rate) scaling tested statistically; memory linear in T; the automatic choice keeps
flax's masks where the dense weights are small."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import attention_jax as aj

pytestmark = pytest.mark.quick

B, T, N, H = 2, 40, 3, 8
RATE = 0.3


def _inputs(dtype=jnp.float32, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(key, (B, T, N, H), dtype) for key in keys)


def _mix(x):
  x = x ^ (x >> np.uint32(16))
  x = x * np.uint32(0x85EBCA6B)
  x = x ^ (x >> np.uint32(13))
  x = x * np.uint32(0xC2B2AE35)
  return x ^ (x >> np.uint32(16))


def _keep(rng, b, h, q_len, kv_len, rate=RATE, broadcast=False):
  """The kernel's keep mask [T, S] of example b and head h, written out in numpy's uint32
  arithmetic: MurmurHash3's finaliser of the query index and of the key index under the key
  folded with (b, h), their exclusive or times an odd constant."""
  key = rng if broadcast else jax.random.fold_in(jax.random.fold_in(rng, b), h)
  k0, k1 = np.asarray(jax.random.key_data(key), np.uint32)
  with np.errstate(over="ignore"):
    row = _mix(np.arange(q_len, dtype=np.uint32)[:, None] * np.uint32(0x9E3779B1) + k0)
    column = _mix(np.arange(kv_len, dtype=np.uint32)[None, :] * np.uint32(0x85EBCA77) + k1)
    bits = (row ^ column) * np.uint32(0x2C1B3C6D)
  return bits >= np.uint32(round(rate * 2 ** 32))


def _dense_with(keep, q, k, v, causal=False):
  """softmax(Q K^T / sqrt(H)) * keep / (1 - rate) V in float64, keep [B, N, T, S]."""
  logits = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
  if causal:
    logits = jnp.where(np.tril(np.ones((T, T), bool)), logits, -jnp.inf)
  weights = jax.nn.softmax(logits, axis=-1) * keep / (1 - RATE)
  return jnp.einsum("bnts,bsnh->btnh", weights, v)


@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_the_mask_is_the_same_from_any_blocks_and_gives_dense_attention_with_it(broadcast,
                                                                                 causal):
  q, k, v = _inputs()
  rng = jax.random.key(7)
  keep = np.stack([np.stack([_keep(rng, b, h, T, T, broadcast=broadcast) for h in range(N)])
                   for b in range(B)])

  def blockwise(q, k, v, block_q, block_k):
    return aj.chunked_attention(q, k, v, scale=H ** -0.5, is_causal=causal, dropout_rate=RATE,
                                dropout_rng=rng, broadcast_dropout=broadcast, block_q=block_q,
                                block_k=block_k)
  loss = lambda f: lambda *x: jnp.sum(jnp.sin(f(*x)))
  with jax.enable_x64():
    q64, k64, v64 = (x.astype(jnp.float64) for x in (q, k, v))
    expected = _dense_with(keep, q64, k64, v64, causal)
    expected_grads = jax.grad(loss(lambda *x: _dense_with(keep, *x, causal)),
                              argnums=(0, 1, 2))(q64, k64, v64)
  for block_q, block_k in [(8, 8), (16, 40), (40, 8)]:
    run = lambda q, k, v, bq=block_q, bk=block_k: blockwise(q, k, v, bq, bk)
    np.testing.assert_allclose(run(q, k, v), expected, rtol=1e-5, atol=2e-6)
    grads = jax.grad(loss(run), argnums=(0, 1, 2))(q, k, v)
    for name, got, want in zip("qkv", grads, expected_grads):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-6, err_msg=f"d{name}")
  if broadcast:  # one mask for every example and head
    assert all((keep[b, h] == keep[0, 0]).all() for b in range(B) for h in range(N))


def test_the_keep_rate_and_the_scaling_hold_statistically():
  """With value = ones every output entry is sum_s w_ts keep_ts / (1 - rate): its mean over
  many rows is 1, and the kept share of the weights is 1 - rate (two-sided tests, 1% level)."""
  length, heads = 512, 4
  q = jnp.zeros((1, length, heads, H))  # uniform weights 1 / S per row
  ones = jnp.ones((1, length, heads, H))
  out = aj.chunked_attention(q, q, ones, scale=1.0, dropout_rate=RATE,
                             dropout_rng=jax.random.key(11), broadcast_dropout=False,
                             block_q=128, block_k=128)[0, :, :, 0]  # [T, N]
  kept = np.asarray(out) * (1 - RATE) * length  # kept keys per row
  total = int(round(kept.sum()))
  assert stats.binomtest(total, length * length * heads, 1 - RATE).pvalue > 0.01
  assert stats.ttest_1samp(np.asarray(out).ravel(), 1.0).pvalue > 0.01
  # rows and heads differ: the mask is not one row or one head repeated
  assert len(set(np.round(kept[:, 0]))) > 10 and not np.allclose(kept[:, 0], kept[:, 1])


def test_neighbouring_entries_of_the_mask_are_independent():
  """Kept or not at (t, s) against (t, s + 1), (t + 1, s) and the same entry of the next head:
  2 x 2 contingency tables, chi-square tests at the 1% level (the mask is the kernel's: the
  dense comparison above checks that)."""
  rng = jax.random.key(5)
  keep = _keep(rng, 0, 0, 512, 512)
  other_head = _keep(rng, 0, 1, 512, 512)
  for a, b in [(keep[:, :-1], keep[:, 1:]), (keep[:-1], keep[1:]), (keep, other_head)]:
    table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
    assert stats.chi2_contingency(table).pvalue > 0.01, table


def test_the_corners_of_a_rectangle_are_independent():
  """The mask hashes rows and columns apart and combines them: four corners (t, s), (t, s'),
  (t', s), (t', s') of random rectangles are kept or dropped independently at rate 1/2 (the parity
  of the four is even half the time; an exclusive or of the two hashes alone makes it always
  even). Binomial test at the 1% level."""
  keep = _keep(jax.random.key(8), 0, 0, 1024, 1024, rate=0.5)
  t, t2, s, s2 = np.random.default_rng(0).integers(0, 1024, (4, 20000))
  corners = (t != t2) & (s != s2)
  odd = (keep[t, s] ^ keep[t, s2] ^ keep[t2, s] ^ keep[t2, s2])[corners]
  assert stats.binomtest(int(odd.sum()), odd.size, 0.5).pvalue > 0.01


def test_dropout_through_dot_product_attention_and_the_automatic_choice():
  q, k, v = _inputs()
  rng = jax.random.key(3)
  blockwise = aj.dot_product_attention(q, k, v, dropout_rate=RATE, dropout_rng=rng,
                                       implementation="chunked", broadcast_dropout=False)
  keep = np.stack([np.stack([_keep(rng, b, h, T, T) for h in range(N)]) for b in range(B)])
  np.testing.assert_allclose(blockwise, _dense_with(keep, q, k, v), rtol=1e-5, atol=2e-6)
  # short sequences: the reference and flax's masks; long ones: the blockwise kernel
  shape = lambda length: jax.ShapeDtypeStruct((2, length, 4, 64), jnp.float32)
  for backend, length, expected in [("cpu", 128, "reference"), ("cpu", 4096, "chunked"),
                                    ("gpu", 512, "reference"), ("gpu", 65536, "chunked"),
                                    ("tpu", 512, "reference")]:
    x = shape(length)
    assert aj.select_implementation(x, x, x, dropout_rate=0.1, backend=backend,
                                    device_kind="NVIDIA A100" if backend == "gpu" else None
                                    ) == expected, (backend, length)
  deterministic = aj.dot_product_attention(q, k, v, dropout_rate=RATE, dropout_rng=rng,
                                           deterministic=True, implementation="chunked")
  np.testing.assert_allclose(deterministic, aj.dot_product_attention(q, k, v), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("broadcast", [False, True])
def test_the_fused_kernel_drops_the_same_entries_as_the_blockwise_kernel(broadcast):
  """The fused Pallas kernel (in Pallas' interpreter) regenerates the blockwise kernel's masks:
  the same outputs and gradients, from blocks of another size."""
  from attention_jax import pallas_gpu
  q, k, v = _inputs()
  rng = jax.random.key(9)
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
  common = dict(scale=H ** -0.5, mask_mod=causal, dropout_rate=RATE, dropout_rng=rng,
                broadcast_dropout=broadcast)
  fused = lambda q, k, v: pallas_gpu.flex_attention(q, k, v, interpret=True, **common)[0]  # noqa: E731
  blockwise = lambda q, k, v: aj.chunked_attention(q, k, v, block_q=8, block_k=8, **common)  # noqa: E731
  np.testing.assert_allclose(fused(q, k, v), blockwise(q, k, v), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="needs a dropout_rng"):
    pallas_gpu.flex_attention(q, k, v, scale=1.0, dropout_rate=0.1, interpret=True)
  loss = lambda f: lambda *x: jnp.sum(jnp.sin(f(*x)))  # noqa: E731
  for name, a, b in zip("qkv", jax.grad(loss(fused), argnums=(0, 1, 2))(q, k, v),
                        jax.grad(loss(blockwise), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=f"d{name}")


def _temp_bytes(dropout_rate, length):
  q = jax.ShapeDtypeStruct((1, length, 4, 64), jnp.float32)

  def loss(q, k, v):
    return jnp.sum(aj.chunked_attention(q, k, v, scale=0.125, dropout_rate=dropout_rate,
                                        dropout_rng=jax.random.key(0) if dropout_rate else None,
                                        block_q=512, block_k=512))
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, q, q).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_forward_and_backward_with_dropout_at_16k_tokens_needs_at_most_1_5x_the_memory():
  """Compiled, not run: XLA's buffer assignment for fwd+bwd at T = 16384. Dense dropout would
  hold a [N, T, T] mask (4 GiB of float32 weights)."""
  without, with_dropout = _temp_bytes(0.0, 16384), _temp_bytes(0.1, 16384)
  assert with_dropout <= 1.5 * without, (with_dropout, without)
  dense_weights = 4 * 4 * 16384 * 16384  # the [N, T, S] float32 weights dense dropout masks
  assert with_dropout < dense_weights / 40
