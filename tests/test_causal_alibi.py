"""ALiBi in a causal model is Press et al.'s: the encoder's bias, -slope * |t - s|, under the causal
mask gives the weights of their one-sided -slope * (t - s) and of their code's slope * s."""
import numpy as np
import pytest

from attention_jax import dot_product_attention
from attention_jax.positional import alibi_bias


def _press_slopes(num_heads: int) -> np.ndarray:
  """Press et al. (2022), section 3: for n heads (a power of two) the slopes 2^(-8 i / n)."""
  return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)


def _causal_attention(query, key, value, bias):
  """softmax(q k / sqrt(H) + bias) v over keys s <= t, float64: [T, N, H] -> [T, N, H]."""
  length, _, head_dim = query.shape
  logits = np.einsum("tnh,snh->nts", query, key) / np.sqrt(head_dim) + bias  # [N, T, S]
  logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("nts,snh->tnh", weights, value)


@pytest.mark.parametrize("implementation", ["reference", "chunked"])
def test_causal_alibi_is_press_et_al_one_sided_bias(implementation):
  num_heads, length, head_dim = 4, 12, 8
  rng = np.random.default_rng(0)
  query, key, value = (rng.normal(size=(length, num_heads, head_dim)) for _ in range(3))
  t, s = np.arange(length)[:, None], np.arange(length)[None, :]
  slopes = _press_slopes(num_heads)[:, None, None]  # [N, 1, 1]
  one_sided = _causal_attention(query, key, value, -slopes * (t - s))  # the paper's figure 3
  code_form = _causal_attention(query, key, value, slopes * s + 0.0 * t)  # their code's
  np.testing.assert_allclose(one_sided, code_form, atol=1e-12)
  ours = dot_product_attention(*(x.astype(np.float32) for x in (query, key, value)),
                               bias=alibi_bias(num_heads, length), is_causal=True,
                               implementation=implementation)
  np.testing.assert_allclose(np.asarray(ours), one_sided, atol=2e-5)


def test_symmetric_alibi_differs_from_one_sided_without_the_causal_mask():
  """The check above is not vacuous: attending both ways, the symmetric bias is not one-sided."""
  bias = np.asarray(alibi_bias(4, 6))
  t, s = np.arange(6)[:, None], np.arange(6)[None, :]
  one_sided = -_press_slopes(4)[:, None, None] * (t - s)
  lower = np.tril(np.ones((6, 6), bool))
  np.testing.assert_allclose(bias[:, lower], one_sided[:, lower], rtol=1e-6)
  assert not np.allclose(bias[:, ~lower], one_sided[:, ~lower])
