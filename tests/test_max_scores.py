"""return_max_scores: each row's largest score (torch's max_scores) from the reference, the
blockwise kernel and the fused kernel, against numpy in float64, with masks, mods, sinks and
empty rows; from the other kernels by a second pass when they are named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import pallas_gpu

pytestmark = pytest.mark.quick

B, T, N, H = 2, 24, 3, 8


def _inputs():
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32) for _ in range(3)]


def _expected(q, k, scale, allowed, bias=0.0, sinks=None):
  """max over allowed keys of scale q.k + bias (and the sink), [B, T, N], -inf on empty rows."""
  logits = np.einsum("btnh,bsnh->bnts", np.float64(q), np.float64(k)) * scale + bias
  logits = np.where(allowed, logits, -np.inf)
  best = logits.max(axis=-1)
  if sinks is not None:
    best = np.maximum(best, np.float64(sinks)[None, :, None])
  return np.swapaxes(best, 1, 2)


def _attend(implementation, q, k, v, **kwargs):
  """dot_product_attention, the blockwise kernel in blocks of 8 (several per row), or the fused
  kernel in Pallas' interpreter (in blocks of 16, its smallest)."""
  if implementation == "pallas_gpu":
    return pallas_gpu.pallas_gpu_attention(q, k, v, scale=H ** -0.5, interpret=True,
                                           return_max_scores=True, **kwargs)
  if implementation == "chunked_blocks":
    return aj.chunked_attention(q, k, v, scale=H ** -0.5, block_q=8, block_k=8,
                                return_max_scores=True, **kwargs)
  return aj.dot_product_attention(q, k, v, implementation=implementation,
                                  return_max_scores=True, **kwargs)


@pytest.mark.parametrize("implementation", ["reference", "chunked", "chunked_blocks",
                                            "pallas_gpu"])
def test_the_largest_score_of_each_row_matches_numpy(implementation):
  q, k, v = _inputs()
  scale = H ** -0.5
  slopes = jnp.asarray([0.5, 0.25, 0.125])
  alibi = lambda s, b, h, q_idx, kv_idx: s - slopes[h] * jnp.abs(q_idx - kv_idx)
  late = lambda b, h, q_idx, kv_idx: (kv_idx < q_idx - 3) | (h > 0)  # rows 0-3 of head 0 empty
  t, s = np.arange(T)[:, None], np.arange(T)[None, :]
  bias = -np.asarray(slopes)[:, None, None] * np.abs(t - s)  # [N, T, S]
  allowed = (s < t - 3) | (np.arange(N)[:, None, None] > 0)
  out, best = _attend(implementation, q, k, v, score_mod=alibi, mask_mod=late)
  np.testing.assert_allclose(best, _expected(q, k, scale, allowed, bias), rtol=1e-5, atol=1e-5)
  assert out.shape == q.shape
  assert np.all(np.isneginf(np.asarray(best)[:, :4, 0]))  # the empty rows
  # after the residual, with sinks (a sink is a logit of the row's softmax)
  if implementation == "pallas_gpu":  # sinks are not the fused kernel's: causal alone
    _, lse, best = _attend(implementation, q, k, v, is_causal=True, return_residual=True)
    causal = np.broadcast_to(s <= t, (N, T, T))
    np.testing.assert_allclose(best, _expected(q, k, H ** -0.5, causal), rtol=1e-5, atol=1e-5)
    return
  sinks = jnp.asarray([0.3, 5.0, -2.0])
  _, lse, best = _attend(implementation, q, k, v, is_causal=True, sinks=sinks,
                         return_residual=True)
  causal = np.broadcast_to(s <= t, (N, T, T))
  np.testing.assert_allclose(best, _expected(q, k, scale, causal, sinks=sinks), rtol=1e-5,
                             atol=1e-5)
  assert np.all(np.asarray(lse) >= np.asarray(best) - 1e-5)  # log-sum-exp >= max
  # no gradient flows through it
  grad = jax.grad(lambda q: jnp.sum(_attend(implementation, q, k, v)[1]))(q)
  assert not np.any(np.asarray(grad))


@pytest.mark.parametrize("implementation", ["xla", "cudnn", "pallas_tpu"])
def test_named_kernels_without_row_maxima_give_them_by_a_second_pass(implementation,
                                                                     monkeypatch):
  """xla, cuDNN and the Pallas TPU kernel keep no row maxima: when named they give them from a
  second pass through the blockwise kernel (cuDNN's inputs through jax.nn's XLA path and the TPU
  kernel in interpret mode, off their backends); the automatic choice takes a kernel that keeps
  them."""
  import dataclasses
  from jax.experimental.pallas import tpu as pltpu
  from attention_jax import cudnn
  monkeypatch.setattr(cudnn, "KERNEL", "xla")
  monkeypatch.setitem(aj.attention.KERNELS, implementation, dataclasses.replace(
      aj.attention.KERNELS[implementation], backend=jax.default_backend()))
  rng = np.random.default_rng(1)
  dtype = jnp.bfloat16 if implementation == "cudnn" else jnp.float32  # cuDNN's 16-bit inputs
  q, k, v = (jnp.asarray(rng.standard_normal((B, 128, N, 16)), dtype) for _ in range(3))
  residual = implementation != "pallas_tpu"  # the TPU kernel keeps no log-sum-exp
  with pltpu.force_tpu_interpret_mode():
    out, *extras = aj.dot_product_attention(q, k, v, implementation=implementation,
                                            is_causal=True, return_residual=residual,
                                            return_max_scores=True)
  t, s = np.arange(128)[:, None], np.arange(128)[None, :]
  causal = np.broadcast_to(s <= t, (N, 128, 128))
  f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  np.testing.assert_allclose(extras[-1], _expected(f32(q), f32(k), 16 ** -0.5, causal),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(f32(out), f32(aj.dot_product_attention(
      q, k, v, is_causal=True, implementation="reference")), rtol=2e-2, atol=2e-2)
  if residual:
    lse, best = np.asarray(extras[0]), np.asarray(extras[1])  # lse >= max (bfloat16's lse
    assert np.all(lse >= best - 1e-2 * np.abs(best) - 1e-5)  # is rounded to 8 bits)


def test_where_no_kernel_gives_it_the_call_is_refused_and_the_automatic_choice_finds_one():
  q, k, v = _inputs()
  with pytest.raises(ValueError, match="sigmoid attention has no log-sum-exp"):
    aj.dot_product_attention(q, k, v, normalizer="sigmoid", return_max_scores=True)
  x = jax.ShapeDtypeStruct((1, 4096, 4, 64), jnp.bfloat16)
  select = lambda kind: aj.select_implementation(  # noqa: E731
      x, x, x, return_max_scores=True, backend="gpu", device_kind=kind)
  assert select("NVIDIA H200") == "pallas_gpu"  # keeps them, and was timed there
  assert select("NVIDIA A100") == "chunked"
