"""The causal encoder (``EncoderConfig(causal=True)``): position t never reads inputs after t."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
