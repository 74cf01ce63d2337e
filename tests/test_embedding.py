"""attention_jax.embedding: the one-hot gradient of the token table is the scatter-add's, and the
Linen and NNX modules are flax's Embed with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
import flax.linen as nn

import attention_jax as aj
from attention_jax import embedding
from attention_jax import nnx as ajnnx


@pytest.fixture
def one_hot_everywhere(monkeypatch):
  monkeypatch.setattr(embedding, "DETERMINISTIC_GRADIENT", True)


@pytest.mark.parametrize("vocab", [1, 19, embedding.VOCAB_BLOCK, 2 * embedding.VOCAB_BLOCK + 37])
def test_one_hot_gradient_is_the_scatter_add(vocab, one_hot_everywhere):
  """Repeated tokens, several blocks of rows, an uneven last block. In bfloat16 the one-hot
  product sums in float32 and rounds once, so it is the float32 scatter-add rounded."""
  rng = np.random.default_rng(vocab)
  tokens = rng.integers(0, vocab, (3, 50))
  tokens[0, :10] = vocab - 1  # one row gathers many cotangents
  for dtype in (jnp.float32, jnp.bfloat16):
    table = jnp.asarray(rng.standard_normal((vocab, 6)), dtype)
    cotangent = jnp.asarray(rng.standard_normal((3, 50, 6)), dtype)
    loss = lambda lookup: lambda t: jnp.sum((lookup(t) * cotangent).astype(jnp.float32))
    exact = jax.grad(lambda t: jnp.sum(jnp.take(t, tokens, axis=0) * cotangent.astype(
        jnp.float32)))(table.astype(jnp.float32))
    got = jax.jit(jax.grad(loss(lambda t: embedding.lookup(t, tokens))))(table)
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), exact,
                               rtol=1e-6 if dtype == jnp.float32 else 2 ** -8, atol=1e-6)
    np.testing.assert_array_equal(embedding.lookup(table, tokens),
                                  jnp.take(table, tokens, axis=0))


def test_the_switch_follows_the_backend(monkeypatch):
  monkeypatch.setattr(embedding, "DETERMINISTIC_GRADIENT", None)
  assert embedding.uses_one_hot_gradient() == (jax.default_backend() == "gpu")


def test_linen_and_nnx_modules_are_flax_embed(one_hot_everywhere):
  tokens = jnp.array([[3, 1, 4, 1], [5, 9, 2, 6]])
  linen, flax_linen = embedding.Embed(10, 8), nn.Embed(10, 8)
  params = flax_linen.init(jax.random.key(0), tokens)
  assert jax.tree.structure(linen.init(jax.random.key(0), tokens)) == jax.tree.structure(params)
  np.testing.assert_array_equal(linen.apply(params, tokens), flax_linen.apply(params, tokens))
  grads = [jax.grad(lambda p, m=m: jnp.sum(m.apply(p, tokens) ** 2))(params)
           for m in (linen, flax_linen)]
  np.testing.assert_allclose(grads[0]["params"]["embedding"],
                             grads[1]["params"]["embedding"], rtol=1e-6)
  ours, theirs = ajnnx.Embed(10, 8, rngs=nnx.Rngs(0)), nnx.Embed(10, 8, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(ours(tokens), theirs(tokens))
  with pytest.raises(ValueError, match="integers"):
    linen.apply(params, tokens.astype(jnp.float32))


def test_the_encoders_use_it():
  config = aj.EncoderConfig(vocab_size=10, d_model=16, num_heads=2, num_layers=1, mlp_dim=32,
                            max_length=8)
  tokens = jnp.array([[3, 1, 4, 1]])
  params = aj.TransformerEncoder(config).init(jax.random.key(0), tokens)
  assert "embedding" in params["params"]["embed"]
  assert isinstance(ajnnx.TransformerEncoder(config, rngs=nnx.Rngs(0)).embed, ajnnx.Embed)
