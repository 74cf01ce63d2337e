"""Another JAX project using attention_jax: needs only `pip install .` (jax, flax, chex, numpy).

  python examples/use_in_your_project.py

0. an NNX model of your own with attention_jax.nnx's MultiHeadAttention and a positional encoding
   chosen by name (attention_jax.nnx's), its attention maps captured, and an NNX
   classifier's weights moved to the Linen twin;
1. dot_product_attention inside your own jit and vmap (and grad);
2. MultiHeadAttention dropped into your own Flax Linen model, the positional encoding by name;
3. the attention weights of that model, captured without changing its output.
"""

from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp

import attention_jax as aj
from attention_jax import nnx as ajnnx
import nnx_encoder  # examples/nnx_encoder.py: the NNX encoder and classifiers


# 0. Flax NNX: your own module holding attention_jax's NNX attention.
class NnxTagger(nnx.Module):
  """Token ids [B, T] -> per-token logits [B, T, C]."""

  def __init__(self, *, vocab_size=100, d_model=64, num_heads=4, num_classes=5, max_length=32,
               encoding="rope", rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab_size, d_model, rngs=rngs)
    self.position = ajnnx.positional_encoding(
        encoding, max_length=max_length, d_model=d_model, num_heads=num_heads, rngs=rngs)
    self.attention = ajnnx.MultiHeadAttention(num_heads, d_model,
                                              qk_transform=self.position.rotate, rngs=rngs)
    self.norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.logits = nnx.Linear(d_model, num_classes, rngs=rngs)

  def __call__(self, tokens):
    x = self.position.embed(self.embed(tokens))  # [B, T, D]
    length = tokens.shape[-1]
    x = x + self.attention(x, mask=aj.padding_mask(tokens != 0), sow_weights=None,  # captured
                           bias=self.position.attention_bias(length, length))
    return self.logits(self.norm(x))


tokens = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
tagger = NnxTagger(rngs=nnx.Rngs(0))
print("0. NNX tagger under nnx.jit:", nnx.jit(lambda model, t: model(t))(tagger, tokens).shape)
_, maps = nnx.capture(tagger, nnx.Intermediate)(tokens)
print("   captured attention weights [B, N, T, S]:", maps["attention"]["attention_weights"][0].shape)
classifier = nnx_encoder.SequenceClassifier(
    aj.EncoderConfig(vocab_size=100, d_model=32, num_heads=4, num_classes=3), rngs=nnx.Rngs(1))
linen_twin = aj.SequenceClassifier(classifier.config)  # the same model in Linen, same weights
same = jnp.allclose(linen_twin.apply({"params": ajnnx.linen_params(classifier)}, tokens),
                    classifier(tokens), atol=1e-6)
print("   NNX classifier equals its Linen twin with the moved weights:", bool(same))


# 1. A function of your own that calls the attention kernel; jit, vmap and grad compose with it.
def pooled_attention(query, key, value, lengths):
  """query [T, N, H], key/value [S, N, H], lengths [] -> [N, H]: attend, then average over T."""
  valid = jnp.arange(key.shape[0]) < lengths  # [S]: the first `lengths` keys are real
  mask = aj.padding_mask(valid)  # [1, 1, S], broadcasts to [N, T, S]
  attended = aj.dot_product_attention(query, key, value, mask=mask)  # [T, N, H]
  return attended.mean(axis=0)


batched = jax.jit(jax.vmap(pooled_attention))  # over a batch axis you add yourself
q, k, v = jax.random.normal(jax.random.key(0), (3, 4, 16, 8, 32))  # [B=4, T=16, N=8, H=32] each
lengths = jnp.array([16, 9, 3, 12])
print("1. vmapped attention:", batched(q, k, v, lengths).shape)  # (4, 8, 32)
grad_q = jax.grad(lambda q: batched(q, k, v, lengths).sum())(q)
print("   gradient w.r.t. the queries:", grad_q.shape)


# 2. Your own model with attention_jax's multi-head attention and a positional encoding by name.
class TinyTagger(nn.Module):
  """Token ids [B, T] -> per-token logits [B, T, C]."""
  vocab_size: int = 100
  d_model: int = 64
  num_heads: int = 4
  num_classes: int = 5
  encoding: str = "rope"  # any name in aj.POSITIONAL_ENCODINGS

  @nn.compact
  def __call__(self, tokens):
    position = aj.positional_encoding(self.encoding, max_length=tokens.shape[-1],
                                      num_heads=self.num_heads)
    x = position.embed(nn.Embed(self.vocab_size, self.d_model)(tokens))  # [B, T, D]
    length = tokens.shape[-1]
    attention = aj.MultiHeadAttention(num_heads=self.num_heads, qk_transform=position.rotate)
    x = x + attention(x, mask=aj.padding_mask(tokens != 0), sow_weights=None,  # when captured
                      bias=position.attention_bias(length, length))
    return nn.Dense(self.num_classes)(nn.LayerNorm()(x))


tokens = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
for encoding in ("sinusoidal", "rope", "alibi"):
  model = TinyTagger(encoding=encoding)
  variables = model.init(jax.random.key(1), tokens)
  print(f"2. TinyTagger with {encoding}:", jax.jit(model.apply)(variables, tokens).shape)

# 3. The weights every head applied, sown into "intermediates"; the output is unchanged.
logits, state = model.apply(variables, tokens, mutable="intermediates")
(weights,) = state["intermediates"]["MultiHeadAttention_0"]["attention_weights"]
print("3. attention weights [B, N, T, S]:", weights.shape)
