"""The Transformer encoder and its classifiers in Flax NNX, built on attention_jax (its NNX
attention and positional encodings): the twins of the Linen modules in attention_jax.encoder
(the same parameter trees, so weights move both ways with attention_jax.nnx.linen_params and
load_linen_params, and the same outputs), over the same pure functions. An example of an NNX
model on the library, to read and copy; needs only `pip install .` (jax, flax, chex, numpy).

  python examples/nnx_encoder.py

Dropout: ``deterministic`` is set in the constructor, by ``model.train()`` / ``model.eval()`` or
``nnx.view``, or at the call; the keys come from the constructor's ``rngs``.

Shape letters: B batch, T tokens, D d_model, N heads, H head dim, C classes.
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp

from attention_jax import encoder as encoder_lib
from attention_jax import masks as masks_lib
from attention_jax.nnx import POSITIONAL_ENCODINGS
from attention_jax.nnx import MultiHeadAttention
from attention_jax.nnx import Stochastic
from attention_jax.nnx import linen_params
from attention_jax.nnx import positional_encoding
from attention_jax.products import dense_dot_general


def _check_attention_module(config: encoder_lib.EncoderConfig):
  if config.attention_module is not None:
    raise ValueError(
        f"EncoderConfig.attention_module={config.attention_module!r} is a Linen choice; the NNX "
        f"encoder uses attention_jax.nnx.MultiHeadAttention, so leave attention_module=None.")


class FeedForward(Stochastic):
  """Position-wise FFN(x) = max(0, x W_1 + b_1) W_2 + b_2: [..., D] -> [..., D].

  >>> x = jnp.ones((2, 10, 32))  # [B, T, D]
  >>> FeedForward(32, 64, dropout_rate=0.1, rngs=nnx.Rngs(0))(x).shape
  (2, 10, 32)
  """

  def __init__(self, d_model: int, mlp_dim: int, *, dropout_rate: float,
               deterministic: bool = True, rngs: nnx.Rngs):
    self.deterministic = deterministic
    self.hidden = nnx.Linear(d_model, mlp_dim, dot_general=dense_dot_general, rngs=rngs)
    self.output = nnx.Linear(mlp_dim, d_model, dot_general=dense_dot_general, rngs=rngs)
    self.dropout = nnx.Dropout(dropout_rate, deterministic=deterministic, rngs=rngs)

  def __call__(self, x, *, deterministic: bool | None = None):
    deterministic = self._deterministic(deterministic)
    y = nnx.relu(self.hidden(x))  # [..., mlp_dim]
    return self.output(self.dropout(y, deterministic=deterministic))  # [..., D]


class EncoderBlock(Stochastic):
  """The twin of ``attention_jax.EncoderBlock``: [B, T, D] -> same; RoPE comes from the config,
  the other encodings act outside the block.

  >>> from attention_jax import EncoderConfig, lengths_to_valid, padding_mask
  >>> block = EncoderBlock(EncoderConfig(vocab_size=32, d_model=64), rngs=nnx.Rngs(0))
  >>> x = jnp.ones((2, 10, 64))  # [B, T, D]
  >>> valid = lengths_to_valid(jnp.array([10, 7]), 10)  # [B, T]
  >>> block(x, padding_mask(valid)).shape
  (2, 10, 64)
  """

  def __init__(self, config: encoder_lib.EncoderConfig, *, layer: int = 0,
               deterministic: bool = True, rngs: nnx.Rngs):
    _check_attention_module(config)
    cfg = self.config = config
    self.deterministic, self.layer = deterministic, layer
    query_kernel_init = None  # lecun normal (the default) with its standard deviation x the scale
    if cfg.query_init_scale != 1.0:
      query_kernel_init = nnx.initializers.variance_scaling(cfg.query_init_scale ** 2, "fan_in",
                                                            "truncated_normal")
    self.attention = MultiHeadAttention(
        cfg.num_heads, cfg.d_model, cfg.num_heads * cfg.head_dim,
        scale=cfg.attention_scale, dropout_rate=cfg.attention_dropout_rate,
        implementation=cfg.attention_impl, normalize_qk=cfg.normalize_qk,
        attention_fn=cfg.attention_fn,
        qk_transform=POSITIONAL_ENCODINGS[cfg.positional_encoding].rotate,
        head_variant=cfg.head_variant_of(layer), query_kernel_init=query_kernel_init,
        deterministic=deterministic, rngs=rngs)
    self.feed_forward = FeedForward(cfg.d_model, cfg.mlp_dim, dropout_rate=cfg.dropout_rate,
                                    deterministic=deterministic, rngs=rngs)
    self.norm_0 = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.norm_1 = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=deterministic, rngs=rngs)

  def __call__(self, x, mask=None, attention_bias=None, *, deterministic: bool | None = None):
    deterministic = self._deterministic(deterministic)
    dropout = lambda y: self.dropout(y, deterministic=deterministic)
    attention = lambda y: self.attention(y, mask=mask, bias=attention_bias,
                                         is_causal=self.config.causal,
                                         deterministic=deterministic, sow_weights=None)
    feed_forward = lambda y: self.feed_forward(y, deterministic=deterministic)
    return encoder_lib.hooked_block(x, (attention, feed_forward), (self.norm_0, self.norm_1),
                                    dropout, layer=self.layer,
                                    pre_layer_norm=self.config.pre_layer_norm)


class TransformerEncoder(Stochastic):
  """The twin of ``attention_jax.TransformerEncoder``: token ids [B, T] -> [B, T', D].

  >>> from attention_jax import EncoderConfig
  >>> config = EncoderConfig(vocab_size=32, d_model=64, num_heads=4, num_layers=2)
  >>> encoder = TransformerEncoder(config, rngs=nnx.Rngs(0))
  >>> tokens = jnp.array([[5, 7, 9, 0], [3, 4, 0, 0]])  # [B, T], 0 = padding
  >>> encoder(tokens).shape  # [B, T, D]
  (2, 4, 64)
  """

  def __init__(self, config: encoder_lib.EncoderConfig, *, cls_token: bool = False,
               deterministic: bool = True, rngs: nnx.Rngs):
    _check_attention_module(config)
    cfg = self.config = config
    self.cls_token, self.deterministic = cls_token, deterministic
    self.embed = (nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs) if cfg.input_features is None
                  else nnx.Linear(cfg.input_features, cfg.d_model,
                                  dot_general=dense_dot_general, rngs=rngs))
    if cls_token:
      self.cls = nnx.Param(jax.nn.initializers.normal(1.0)(rngs.params(), (cfg.d_model,)))
    self.positional = positional_encoding(
        cfg.positional_encoding, max_length=cfg.max_length + cls_token, d_model=cfg.d_model,
        num_heads=cfg.num_heads, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=deterministic, rngs=rngs)
    for layer in range(cfg.num_layers):
      setattr(self, f"block_{layer}", EncoderBlock(cfg, layer=layer, deterministic=deterministic,
                                                   rngs=rngs))
    if cfg.pre_layer_norm:
      self.final_norm = nnx.LayerNorm(cfg.d_model, rngs=rngs)

  def embed_inputs(self, tokens, valid=None, *, deterministic: bool | None = None):
    """What the first block sees (to run the blocks another way, e.g. nnx.scan): x [B, T', D],
    mask [B, 1, 1, T'] and attention_bias [N, T', T'] or None."""
    deterministic = self._deterministic(deterministic)
    cfg = self.config
    valid = encoder_lib.inputs_to_valid(tokens, cfg) if valid is None else valid
    x = self.embed(tokens)  # [B, T, D]
    x = x * math.sqrt(cfg.d_model) if cfg.input_features is None else x
    if self.cls_token:
      x, valid = encoder_lib.prepend_cls(x, valid, self.cls[...])  # [B, T + 1, D], [B, T + 1]
    x = self.dropout(self.positional.embed(x, deterministic), deterministic=deterministic)
    length = x.shape[-2]
    return x, masks_lib.padding_mask(valid), self.positional.attention_bias(length, length)

  def __call__(self, tokens, valid=None, *, deterministic: bool | None = None):
    deterministic = self._deterministic(deterministic)
    x, mask, attention_bias = self.embed_inputs(tokens, valid, deterministic=deterministic)
    for layer in range(self.config.num_layers):
      x = getattr(self, f"block_{layer}")(x, mask, attention_bias, deterministic=deterministic)
    return self.final_norm(x) if self.config.pre_layer_norm else x


class _Classifier(Stochastic):
  """An encoder and a linear read-out, of the pooled vector or (``per_token``) of every one."""
  per_token = False

  def __init__(self, config: encoder_lib.EncoderConfig, *, deterministic: bool = True,
               rngs: nnx.Rngs):
    self.config, self.deterministic = config, deterministic
    cls_token = not self.per_token and config.pooling == "cls"
    self.encoder = TransformerEncoder(config, cls_token=cls_token, deterministic=deterministic,
                                      rngs=rngs)
    self.logits = nnx.Linear(config.d_model, config.num_classes, dot_general=dense_dot_general,
                             rngs=rngs)

  def __call__(self, tokens, valid=None, *, deterministic: bool | None = None):
    valid = encoder_lib.inputs_to_valid(tokens, self.config) if valid is None else valid
    x = self.encoder(tokens, valid, deterministic=self._deterministic(deterministic))
    if not self.per_token:  # [B, T(+1), D] -> [B, D]
      x = encoder_lib.pool(x, valid, self.config.pooling)
    return self.logits(x)  # [B, C] or [B, T, C]


class SequenceClassifier(_Classifier):
  """Token ids [B, T] -> class logits [B, C], pooling the encoder by CLS token, masked mean or
  last real token; the twin of ``attention_jax.SequenceClassifier`` (encoder, logits).

  >>> from attention_jax import EncoderConfig
  >>> model = SequenceClassifier(EncoderConfig(vocab_size=32, num_classes=10, pooling="mean"),
  ...                            rngs=nnx.Rngs(0))
  >>> tokens = jnp.array([[5, 7, 9, 0], [3, 4, 0, 0]])  # [B, T], 0 = padding
  >>> model(tokens).shape  # [B, C]
  (2, 10)
  """


class TokenClassifier(_Classifier):
  """Token ids [B, T] -> logits [B, T, C] at every position (no CLS token); the twin of
  ``attention_jax.TokenClassifier`` (encoder, logits).

  >>> from attention_jax import EncoderConfig
  >>> model = TokenClassifier(EncoderConfig(vocab_size=32, num_classes=16), rngs=nnx.Rngs(0))
  >>> tokens = jnp.array([[5, 7, 9, 0], [3, 4, 0, 0]])  # [B, T], 0 = padding
  >>> model(tokens).shape  # [B, T, C]
  (2, 4, 16)
  """
  per_token = True


if __name__ == "__main__":
  import attention_jax as aj

  config = aj.EncoderConfig(vocab_size=100, d_model=32, num_heads=4, num_classes=3,
                            positional_encoding="rope")
  model = SequenceClassifier(config, rngs=nnx.Rngs(0))
  tokens = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])  # [B, T], 0 = padding
  logits = nnx.jit(lambda model, tokens: model(tokens))(model, tokens)
  print("NNX sequence classifier under nnx.jit:", logits.shape)
  linen_logits = aj.SequenceClassifier(config).apply({"params": linen_params(model)}, tokens)
  print("equals its Linen twin with the moved weights:",
        bool(jnp.allclose(linen_logits, logits, atol=1e-6)))
