"""Claims of the self-attention explainers, as executable checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import reference


@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_variance_of_q_dot_k_is_d_k_and_one_after_scaling(head_dim):
  """For q, k with independent unit-variance entries, Var(q . k) = d_k (Vaswani et al., fn. 4)."""
  q_key, k_key = jax.random.split(jax.random.key(head_dim))
  query = jax.random.normal(q_key, (64, 64, 1, head_dim))  # [B, T, N, H]: 262k pairs
  key = jax.random.normal(k_key, (64, 64, 1, head_dim))
  unscaled = reference.attention_logits(query, key, scale=1.0)
  scaled = reference.attention_logits(query, key, scale=1.0 / np.sqrt(head_dim))
  # Relative std of the estimate is about sqrt((2 + 6 / d_k) / 262144) < 0.5%.
  assert float(jnp.var(unscaled)) == pytest.approx(head_dim, rel=0.05)
  assert float(jnp.var(scaled)) == pytest.approx(1.0, rel=0.05)


def test_without_scaling_softmax_saturates_as_d_k_grows():
  """Large logits push softmax to one-hot rows (small gradients); 1/sqrt(d_k) prevents it."""
  def mean_max_weight(head_dim, scale):
    q_key, k_key = jax.random.split(jax.random.key(0))
    query = jax.random.normal(q_key, (8, 32, 1, head_dim))
    key = jax.random.normal(k_key, (8, 32, 1, head_dim))
    weights = reference.attention_weights(query, key, scale=scale)
    return float(jnp.mean(jnp.max(weights, axis=-1)))

  unscaled = [mean_max_weight(d, 1.0) for d in (4, 64, 1024)]
  scaled = [mean_max_weight(d, d ** -0.5) for d in (4, 64, 1024)]
  assert unscaled[0] < unscaled[1] < unscaled[2] and unscaled[2] > 0.9
  assert max(scaled) - min(scaled) < 0.1 and max(scaled) < 0.5
