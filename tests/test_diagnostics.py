"""Per-head attention statistics against direct NumPy computations, and head switching-off."""

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from attention_jax import diagnostics
from experiments import probes


def _random_attention(seed=0, shape=(2, 3, 5, 5)):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=shape).astype(np.float32) * 2
  valid = np.ones(shape[:1] + (1,) + shape[2:], bool)
  valid[1, :, :, 3:] = False  # example 1: keys 3, 4 are padding ...
  valid[1, :, 3:, :] = False  # ... and so are queries 3, 4
  masked = np.where(valid, logits, -np.inf)
  with np.errstate(invalid="ignore"):  # fully padded rows: 0 / 0, set to 0 below
    weights = np.exp(masked - masked.max(-1, keepdims=True))
    weights = np.nan_to_num(weights / weights.sum(-1, keepdims=True))
  return logits, weights, valid


def test_head_statistics_equal_a_direct_numpy_computation():
  logits, weights, valid = _random_attention()
  stats = diagnostics.head_statistics(jnp.asarray(logits), jnp.asarray(weights), valid)
  heads = logits.shape[1]
  for head in range(heads):
    rows = [(b, t) for b in range(2) for t in range(5) if valid[b, 0, t].any()]
    w = [weights[b, head, t][valid[b, 0, t]] for b, t in rows]
    entropy = np.mean([-np.sum(p * np.log(p)) for p in w])
    distance = np.mean([np.sum(weights[b, head, t] * np.abs(t - np.arange(5))) for b, t in rows])
    diagonal = np.mean([np.argmax(np.where(valid[b, 0, t], logits[b, head, t], -np.inf)) == t
                        for b, t in rows])
    np.testing.assert_allclose(stats["entropy"][head], entropy, rtol=1e-5)
    np.testing.assert_allclose(stats["max_weight"][head], np.mean([p.max() for p in w]), rtol=1e-6)
    np.testing.assert_allclose(stats["distance"][head], distance, rtol=1e-5)
    np.testing.assert_allclose(stats["diagonal_max"][head], diagonal, rtol=1e-6)
    np.testing.assert_allclose(stats["first_token_weight"][head],
                               np.mean([weights[b, head, t, 0] for b, t in rows]), rtol=1e-6)
    pairs = logits[:, head][np.broadcast_to(valid[:, 0], logits[:, head].shape)]
    np.testing.assert_allclose(stats["logit_variance"][head], np.var(pairs), rtol=1e-5)


def test_entropy_of_one_hot_is_zero_and_of_uniform_is_log_n():
  one_hot = jnp.eye(6)[None]
  np.testing.assert_allclose(diagnostics.entropy(one_hot), 0.0, atol=1e-7)
  np.testing.assert_allclose(diagnostics.entropy(jnp.full((1, 2, 6), 1 / 6)), np.log(6),
                             rtol=1e-6)


def test_switching_off_a_head_removes_exactly_its_share_of_the_output():
  config = aj.EncoderConfig(vocab_size=12, d_model=16, num_heads=4, num_layers=1,
                            num_classes=3, max_length=8)
  model = aj.SequenceClassifier(config)
  tokens = jnp.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 2]])
  params = model.init(jax.random.key(0), tokens)["params"]
  head = 2
  switched = probes.without_head(params, layer=0, head=head)
  kernel = switched["encoder"]["block_0"]["attention"]["out"]["kernel"]
  assert np.all(kernel[head] == 0) and np.any(kernel[head - 1] != 0)
  changed = jax.tree.map(lambda a, b: bool(np.any(a != b)), params, switched)
  assert sum(jax.tree.leaves(changed)) == 1
  # The attention output of the block equals the full one minus head 2's term.
  attention = params["encoder"]["block_0"]["attention"]
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  _, weights = aj.multi_head_attention(attention, x, return_weights=True)  # [B, N, T, T]
  value = jnp.einsum("btd,dnh->btnh", x, attention["value"]["kernel"]) + attention["value"]["bias"]
  head_term = jnp.einsum("bts,bsh,hd->btd", weights[:, head], value[:, :, head],
                         attention["out"]["kernel"][head])
  full = aj.multi_head_attention(attention, x)
  without = aj.multi_head_attention(switched["encoder"]["block_0"]["attention"], x)
  np.testing.assert_allclose(without, full - head_term, atol=1e-5)
