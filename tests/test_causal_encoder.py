"""The causal encoder (``EncoderConfig(causal=True)``): position t never reads inputs after t."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import attention, multihead
from attention_jax.encoder import EncoderConfig, TransformerEncoder


def _encode(config, tokens):
  encoder = TransformerEncoder(config)
  variables = encoder.init(jax.random.key(0), tokens)
  return encoder.apply(variables, tokens)  # [B, T, D]


def test_causal_output_at_t_ignores_later_tokens():
  config = EncoderConfig(vocab_size=16, d_model=32, num_heads=2, mlp_dim=64, num_layers=2,
                         positional_encoding="none", causal=True, dropout_rate=0.0)
  tokens = jnp.array([[3, 5, 7, 9, 11, 13]])  # [B, T]
  changed = tokens.at[:, 4:].set(jnp.array([2, 4]))  # other tokens after t = 3
  before, after = _encode(config, tokens), _encode(config, changed)
  np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-5)
  assert not np.allclose(before[:, 4:], after[:, 4:], atol=1e-3)


def test_bidirectional_output_at_t_reads_later_tokens():
  config = EncoderConfig(vocab_size=16, d_model=32, num_heads=2, mlp_dim=64, num_layers=1,
                         positional_encoding="none", dropout_rate=0.0)
  tokens = jnp.array([[3, 5, 7, 9]])
  changed = tokens.at[:, 3].set(2)
  assert not np.allclose(_encode(config, tokens)[:, 0], _encode(config, changed)[:, 0], atol=1e-3)


def test_config_check_passes_causal_to_the_encoder():
  from configs import default
  from experiments import config_check
  config = default.get_config()
  assert not config_check.encoder_config(config).causal
  config.model.causal = True
  with pytest.raises(config_check.ConfigError, match="CLS token .* sees only itself"):
    config_check.validate(config)  # the default read-out, the CLS token, is position 0
  config.model.pooling = "mean"
  config_check.validate(config)
  assert config_check.encoder_config(config).causal


class _DenseMaskAttention(multihead.MultiHeadAttention):
  """Multi-head attention as a module of the user's own: the encoder hands it causality in the
  mask ([B, 1, T, T]), since such a module may take no is_causal."""


@pytest.mark.parametrize("implementation", ["reference", "chunked"])
def test_is_causal_with_the_padding_mask_gives_the_dense_causal_mask_outputs(implementation):
  config = EncoderConfig(vocab_size=16, d_model=32, num_heads=2, mlp_dim=64, num_layers=2,
                         positional_encoding="alibi", causal=True, dropout_rate=0.0,
                         attention_impl=implementation)
  tokens = jnp.array([[3, 5, 7, 9, 11, 13], [4, 6, 8, 0, 0, 0]])  # [B, T], 0 = padding
  encoder = TransformerEncoder(config)
  variables = encoder.init(jax.random.key(0), tokens)
  dense = TransformerEncoder(dataclasses.replace(config, attention_module=_DenseMaskAttention))
  valid = np.asarray(tokens != 0)[..., None]  # padded rows differ by the empty-row convention
  np.testing.assert_allclose(np.where(valid, encoder.apply(variables, tokens), 0),
                             np.where(valid, dense.apply(variables, tokens), 0), atol=1e-5)


def test_every_layer_asks_for_is_causal_with_a_key_padding_mask():
  calls = []

  def spy(query, key, value, bias=None, mask=None, **arguments):
    calls.append((arguments.get("is_causal"), None if mask is None else mask.shape))
    return attention.dot_product_attention(query, key, value, bias, mask, **arguments)

  config = EncoderConfig(vocab_size=16, d_model=32, num_heads=2, mlp_dim=64, num_layers=2,
                         positional_encoding="none", causal=True, dropout_rate=0.0,
                         attention_fn=spy)
  tokens = jnp.array([[3, 5, 7, 0]])  # [B, T]
  encoder = TransformerEncoder(config)
  encoder.apply(encoder.init(jax.random.key(0), tokens), tokens)
  assert set(calls) == {(True, (1, 1, 1, 4))}  # [B, N, T, S] broadcast: keys only, no [T, S]


def test_nnx_example_is_causal_and_reads_the_last_token_as_linen_does():
  from flax import nnx
  from attention_jax import SequenceClassifier
  from attention_jax import nnx as ajnnx
  from examples import nnx_encoder
  config = EncoderConfig(vocab_size=16, d_model=16, num_heads=2, mlp_dim=32, num_layers=2,
                         positional_encoding="alibi", causal=True, pooling="last",
                         dropout_rate=0.0)
  tokens = jnp.array([[3, 9, 4, 7, 1, 12], [2, 6, 11, 0, 0, 0]])  # [B, T], 0 = padding
  model = nnx_encoder.SequenceClassifier(config, rngs=nnx.Rngs(0))
  params = ajnnx.linen_params(model)
  logits = SequenceClassifier(config).apply({"params": params}, tokens)  # [B, C]
  np.testing.assert_allclose(model(tokens), logits, atol=1e-5)
  # the last real token reads the whole sequence: a change at position 0 moves the logits
  assert not np.allclose(model(tokens.at[:, 0].set(5)), logits, atol=1e-4)
  # trailing padding is not read: the sequence [2, 6, 11] alone gives the same logits
  np.testing.assert_allclose(model(tokens[1:, :3]), logits[1:], atol=1e-5)
