"""The Transformer encoder of Vaswani et al. (2017) and a sequence classifier on top.

  x = Embed(tokens) * sqrt(d_model) + PE    (token ids [B, T])
  x = inputs W_E + b_E + PE                 (vectors [B, T, F], with input_features = F)
  per block (post-LN, the paper):  x = LN(x + Dropout(MHA(x)));  x = LN(x + Dropout(FFN(x)))
  per block (pre-LN option):       x = x + Dropout(MHA(LN(x)));  x = x + Dropout(FFN(LN(x)))

Shape letters: B batch, T tokens, F input features, D d_model, N heads, C classes (or real outputs).

Heads: the sequence classifier reads one vector (the CLS token or the mean); the token classifier
reads every position, for tasks with a target at each token (multi-query associative recall).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from attention_jax import attention
from attention_jax import hooks
from attention_jax import masks as masks_lib
from attention_jax import multihead
from attention_jax import positional
from attention_jax import variants
from attention_jax.products import dense_dot_general

POOLINGS = ("cls", "mean", "last")

#: The old EncoderConfig fields (and run-config keys) of MoH's and overlapping heads' options,
#: deprecated for one release, each with the key of head_variant_options it became.
DEPRECATED_OPTIONS = {"moh_shared_heads": "shared_heads", "moh_routed_heads": "routed_heads",
                      "overlap_schedule": "schedule"}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyperparameters of the encoder; invalid combinations raise ValueError when constructed.

  >>> config = EncoderConfig(vocab_size=32, d_model=128, num_heads=4, positional_encoding="rope")
  >>> config.mlp_dim, config.pooling
  (512, 'cls')
  >>> EncoderConfig(vocab_size=32, d_model=100, num_heads=3)
  Traceback (most recent call last):
  ...
  ValueError: ...
  """
  vocab_size: int                       # token ids; unused (may be 0) with input_features
  d_model: int = 128
  num_heads: int = 4
  num_layers: int = 2
  mlp_dim: int = 512
  max_length: int = 512                 # positions of a learned table
  input_features: int | None = None     # F: inputs are vectors [B, T, F], embedded linearly
  positional_encoding: str = "sinusoidal"  # a name in positional.POSITIONAL_ENCODINGS
  attention_scale: float | str = "inv_sqrt"  # a number or a name in multihead.SCALES
  head_dim: int = 0                     # d_k of every head; 0: d_model / num_heads (the paper),
                                        # resolved when the config is built
  normalize_qk: bool = False            # LayerNorm on each head's queries and keys (QK-norm)
  query_init_scale: float = 1.0         # W_Q's initial values x this (e.g. d_k^-1/2 unscaled)
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  pre_layer_norm: bool = False          # False: post-LN as in the paper
  causal: bool = False                  # True: position t attends to positions <= t only
                                        # (is_causal in every layer, so blockwise kernels skip
                                        # blocks; a module of your own gets it in the mask)
  attention_impl: str | None = None     # see attention.select_implementation
  pad_id: int = 0                       # token id of padding
  num_classes: int = 2                  # classifier only
  pooling: str = "cls"                  # classifier only: "cls" token, masked "mean" or the
                                        # "last" real token (the causal read-out)
  # A head variant (attention_jax/variants/): a registered name or "package.module:Class", and
  # its options as one mapping, e.g. {"shared_heads": 2} for MoH or {"schedule": "half_index"}
  # for overlapping heads (held as sorted (name, value) pairs, so the config stays hashable).
  head_variant: str = "mha"
  head_variant_options: Any = ()
  # Deprecated for one release: MoH's and overlapping heads' options before head_variant_options.
  moh_shared_heads: dataclasses.InitVar[int | None] = None
  moh_routed_heads: dataclasses.InitVar[int | None] = None
  overlap_schedule: dataclasses.InitVar[str | None] = None
  # The self-attention module class; None = MultiHeadAttention. Another class must take the same
  # constructor fields (num_heads, scale, dropout_rate, implementation, qk_transform) and call
  # signature (x, mask=, bias=, deterministic=), e.g. a wrapper of flax's attention; it also gets
  # qkv_features= (N * head_dim) when that is not d_model, normalize_qk=True when set,
  # query_kernel_init when query_init_scale is not 1, and head_variant= when it is not plain MHA.
  attention_module: Any = None
  # Replaces dot_product_attention in every layer (same signature), e.g.
  # context_parallel.ContextParallel(mesh, "sequence") for a sequence sharded over devices.
  attention_fn: Any = None

  def __post_init__(self, moh_shared_heads, moh_routed_heads, overlap_schedule):
    if self.head_dim < 0:
      raise ValueError(f"head_dim must be positive (or 0 for d_model / num_heads), got "
                       f"{self.head_dim}.")
    if not self.head_dim or isinstance(self.head_dim, _Derived):  # derived again by replace()
      object.__setattr__(self, "head_dim", _Derived(multihead.head_dim_of(
          self.d_model, self.num_heads, name="d_model", fix="or set head_dim")))
    elif self.num_heads <= 0:
      raise ValueError(f"num_heads must be positive, got {self.num_heads}.")
    object.__setattr__(self, "head_variant_options", _variant_options(
        self.head_variant_options, moh_shared_heads=moh_shared_heads,
        moh_routed_heads=moh_routed_heads, overlap_schedule=overlap_schedule))
    _named("attention_scale", multihead.resolve_scale, self.attention_scale, self.head_dim)
    if not self.query_init_scale > 0:
      raise ValueError(f"query_init_scale must be positive, got {self.query_init_scale}.")
    if self.positional_encoding == "rope" and self.head_dim % 2:
      raise ValueError(f"positional_encoding='rope' rotates pairs of dimensions, so d_k must be "
                       f"even, got d_k={self.head_dim}; use fewer heads, an even head_dim, or "
                       "another encoding.")
    _named("positional_encoding", positional.positional_encoding, self.positional_encoding,
           max_length=1, num_heads=1)
    if self.attention_impl not in (None,) + attention.IMPLEMENTATIONS:
      raise ValueError(f"attention_impl must be None (automatic) or one of "
                       f"{list(attention.IMPLEMENTATIONS)}, got {self.attention_impl!r}.")
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}.")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}.")
    sizes = ("d_model", "num_layers", "mlp_dim", "max_length", "num_classes")
    sizes += ("vocab_size",) if self.input_features is None else ("input_features",)
    for name in sizes:
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
    # an unknown name or option fails here, as do head counts or widths a variant cannot use
    variant = _named(f"head_variant={self.head_variant!r} with head_variant_options="
                     f"{dict(self.head_variant_options)}", self.head_variant_of, 0)
    _named(f"head_variant={self.head_variant!r}", variant.check, num_heads=self.num_heads,
           head_dim=self.head_dim)
    if variant.forms_maps and self.attention_impl not in (None, "reference"):
      raise ValueError(f"head_variant={self.head_variant!r} forms every head's logits at each "
                       f"(query, key) pair, which attention_impl={self.attention_impl!r} never "
                       "forms; use the automatic choice (attention_impl None, '' in a run "
                       "config) or 'reference'.")

  def head_variant_of(self, layer: int) -> variants.base.Variant:
    """The ``variants.Variant`` of block ``layer`` (``Variant()``: plain multi-head attention)."""
    return variants.layer_variant(self.head_variant, layer=layer, num_layers=self.num_layers,
                                  **dict(self.head_variant_options))

  @property
  def key_dim(self) -> int:
    """``head_dim`` under its old name, deprecated (``head_dim`` is d_k, given or derived)."""
    warnings.warn("EncoderConfig.key_dim is deprecated; use head_dim (d_k, resolved when the "
                  "config is built).", DeprecationWarning, stacklevel=2)
    return self.head_dim


class _Derived(int):
  """A head_dim derived from d_model / num_heads (an int like any other), so that
  ``dataclasses.replace(config, num_heads=...)`` derives it again instead of keeping the old."""


def _named(field: str, check, *args, **kwargs):
  """``check(*args, **kwargs)``, its ValueError's message prefixed with ``field``."""
  try:
    return check(*args, **kwargs)
  except ValueError as error:
    raise ValueError(f"{field}: {error}") from None


def _variant_options(options, **deprecated) -> tuple[tuple[str, Any], ...]:
  """``head_variant_options`` (a mapping, or (name, value) pairs) as sorted pairs, with the
  deprecated MoH / overlap fields merged in (each warns once, naming its new place)."""
  options = dict(options.items() if hasattr(options, "items") else options)
  for old, value in deprecated.items():
    if value is not None:
      name = DEPRECATED_OPTIONS[old]
      warnings.warn(f"EncoderConfig({old}=...) is deprecated; use "
                    f"head_variant_options={{{name!r}: {value!r}}}.", DeprecationWarning,
                    stacklevel=4)
      options.setdefault(name, value)
  return tuple(sorted(options.items()))


def inputs_to_valid(inputs, config: EncoderConfig):
  """Which positions are real, [B, T] bool: token ids [B, T] other than config.pad_id, or every
  position of vectors [B, T, F] (config.input_features set).

  >>> config = EncoderConfig(vocab_size=0, input_features=3)
  >>> inputs_to_valid(jnp.ones((2, 4, 3)), config).shape
  (2, 4)
  """
  if config.input_features is None:
    return masks_lib.tokens_to_valid(inputs, config.pad_id)
  return jnp.ones(inputs.shape[:-1], bool)


def residual_sublayer(x, sublayer, norm, dropout, *, pre_layer_norm: bool):
  """One sublayer with its residual connection and LayerNorm, [B, T, D] -> [B, T, D]:
  post-LN (the paper) LN(x + Dropout(F(x))), pre-LN x + Dropout(F(LN(x))).

  ``sublayer``, ``norm`` and ``dropout`` are callables [B, T, D] -> [B, T, D], so the Linen and
  NNX blocks share this arrangement.

  >>> x = jnp.ones((2, 8, 16))  # [B, T, D]
  >>> residual_sublayer(x, lambda y: 2 * y, lambda y: y - 1, lambda y: y,
  ...                   pre_layer_norm=True)[0, 0, 0]  # x + 2 (x - 1)
  Array(1., dtype=float32)
  """
  if pre_layer_norm:
    return x + dropout(sublayer(norm(x)))
  return norm(x + dropout(sublayer(x)))


#: The residual-stream hook points of a block, its input and the stream after each sublayer
#: (``attention_jax.hooks`` lists every name).
STREAM_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")
#: The hook points of each sublayer's own output, the attention's then the feed-forward's.
SUBLAYER_HOOKS = ("hook_attn_out", "hook_mlp_out")


def hooked_block(x, sublayers, norms, dropout, *, layer: int, pre_layer_norm: bool):
  """An encoder block, ``residual_sublayer`` for the attention then the feed-forward sublayer,
  with its hook points named ``blocks.{layer}.*`` (the Linen and NNX blocks share it): [B, T, D]
  -> [B, T, D].

  >>> x = jnp.ones((2, 8, 16))  # [B, T, D]
  >>> hooked_block(x, [lambda y: y, lambda y: y], [lambda y: y] * 2, lambda y: y, layer=0,
  ...              pre_layer_norm=True)[0, 0, 0]  # x + x, then + 2 x
  Array(4., dtype=float32)
  """
  with hooks.scope(f"blocks.{layer}"):
    x = hooks.point(STREAM_HOOKS[0], x)
    for sublayer, norm, stream, own in zip(sublayers, norms, STREAM_HOOKS[1:], SUBLAYER_HOOKS):
      hooked = lambda y, sublayer=sublayer, own=own: hooks.point(own, sublayer(y))
      x = hooks.point(stream, residual_sublayer(x, hooked, norm, dropout,
                                                pre_layer_norm=pre_layer_norm))
  return x


def prepend_cls(x, valid, cls):
  """Puts the CLS vector before the tokens, always valid:
  x [B, T, D], valid [B, T], cls [D] -> x [B, T + 1, D], valid [B, T + 1].

  >>> x, valid = prepend_cls(jnp.ones((2, 8, 64)), jnp.ones((2, 8), bool), jnp.zeros(64))
  >>> x.shape, valid.shape
  ((2, 9, 64), (2, 9))
  """
  x = jnp.concatenate([jnp.broadcast_to(cls, x.shape[:-2] + (1, x.shape[-1])), x], axis=-2)
  valid = jnp.concatenate([jnp.ones(valid.shape[:-1] + (1,), bool), valid], axis=-1)
  return x, valid


class FeedForward(nn.Module):
  """Position-wise FFN(x) = max(0, x W_1 + b_1) W_2 + b_2: [..., D] -> [..., D]."""
  mlp_dim: int
  dropout_rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    y = nn.relu(nn.Dense(self.mlp_dim, dot_general=dense_dot_general, name="hidden")(x))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)  # [..., mlp_dim]
    return nn.Dense(x.shape[-1], dot_general=dense_dot_general, name="output")(y)


class EncoderBlock(nn.Module):
  """Self-attention and feed-forward sublayers with residuals and LayerNorm: [B, T, D] -> same.

  ``mask`` broadcasts to [B, N, T, T]; ``attention_bias`` to [N, T, T] (or None).

  >>> from attention_jax import positional_encoding
  >>> config = EncoderConfig(vocab_size=32, d_model=64, num_heads=4)
  >>> block = EncoderBlock(config, positional_encoding("none", max_length=64, num_heads=4))
  >>> x, mask = jnp.ones((2, 10, 64)), jnp.ones((2, 1, 10, 10), bool)  # [B, T, D], [B, 1, T, S]
  >>> variables = block.init(jax.random.key(0), x, mask, None, True)
  >>> block.apply(variables, x, mask, None, True).shape
  (2, 10, 64)
  """
  config: EncoderConfig
  encoding: positional.NoPositionalEncoding
  layer: int = 0  # the block's index, for head variants whose settings follow the layer

  @nn.compact
  def __call__(self, x, mask, attention_bias, deterministic: bool):
    cfg = self.config
    attention_module = cfg.attention_module or multihead.MultiHeadAttention
    variant = cfg.head_variant_of(self.layer)
    qkv_features = cfg.num_heads * cfg.head_dim
    options = {**({"qkv_features": qkv_features} if qkv_features != cfg.d_model else {}),
               **({"normalize_qk": True} if cfg.normalize_qk else {}),
               # lecun normal (the default kernel_init) with its standard deviation x the scale
               **({"query_kernel_init": nn.initializers.variance_scaling(
                   cfg.query_init_scale ** 2, "fan_in", "truncated_normal")}
                  if cfg.query_init_scale != 1.0 else {}),
               **({"attention_fn": cfg.attention_fn} if cfg.attention_fn else {}),
               # every variant, plain MHA included; a module of your own only gets one that
               # is not plain MHA (flax's take none)
               **({"head_variant": variant} if cfg.attention_module is None
                  or variant != variants.Variant() else {})}
    attention = attention_module(
        num_heads=cfg.num_heads, scale=cfg.attention_scale,
        dropout_rate=cfg.attention_dropout_rate, implementation=cfg.attention_impl,
        qk_transform=self.encoding.rotate, name="attention", **options)
    feed_forward = FeedForward(cfg.mlp_dim, cfg.dropout_rate, name="feed_forward")
    dropout = nn.Dropout(cfg.dropout_rate)
    sublayers = (
        lambda y: attention(y, mask=mask, bias=attention_bias, deterministic=deterministic,
                            **({} if cfg.attention_module else {"sow_weights": None,
                                                                "is_causal": cfg.causal})),
        lambda y: feed_forward(y, deterministic=deterministic))
    norms = [nn.LayerNorm(name=f"norm_{index}") for index in range(2)]
    return hooked_block(x, sublayers, norms, lambda y: dropout(y, deterministic=deterministic),
                        layer=self.layer, pre_layer_norm=cfg.pre_layer_norm)


class TransformerEncoder(nn.Module):
  """Token ids [B, T] (or vectors [B, T, F] with ``input_features``) -> contextual vectors
  [B, T', D] (T' = T + 1 with ``cls_token``).

  ``valid`` [B, T] marks real tokens (default: inputs_to_valid); padded keys get no attention.
  Vectors are embedded by a linear layer ("embed": kernel [F, D], bias [D]), not scaled.

  >>> config = EncoderConfig(vocab_size=32, d_model=64, num_heads=4, num_layers=2)
  >>> tokens = jnp.array([[5, 7, 9, 0], [3, 4, 0, 0]])  # [B, T], 0 = padding
  >>> encoder = TransformerEncoder(config)
  >>> encoder.apply(encoder.init(jax.random.key(0), tokens), tokens).shape
  (2, 4, 64)
  >>> vectors = jnp.ones((2, 4, 3))  # [B, T, F]
  >>> encoder = TransformerEncoder(dataclasses.replace(config, input_features=3))
  >>> encoder.apply(encoder.init(jax.random.key(0), vectors), vectors).shape
  (2, 4, 64)
  """
  config: EncoderConfig
  cls_token: bool = False

  @nn.compact
  def __call__(self, tokens, valid=None, *, deterministic: bool = True):
    cfg = self.config
    valid = inputs_to_valid(tokens, cfg) if valid is None else valid
    if cfg.input_features is None:
      x = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed")(tokens)  # [B, T, D]
      x = x * math.sqrt(cfg.d_model)
    else:
      x = nn.Dense(cfg.d_model, dot_general=dense_dot_general, name="embed")(tokens)  # [B, T, D]
    if self.cls_token:
      cls = self.param("cls", nn.initializers.normal(1.0), (cfg.d_model,))
      x, valid = prepend_cls(x, valid, cls)  # [B, T + 1, D], [B, T + 1]
    length = x.shape[-2]
    encoding = positional.positional_encoding(
        cfg.positional_encoding, max_length=cfg.max_length + self.cls_token,
        num_heads=cfg.num_heads, name="positional")
    x = encoding.embed(x, deterministic)
    x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
    mask = masks_lib.padding_mask(valid)  # [B, 1, 1, T]; causality is is_causal (EncoderBlock)
    if cfg.causal and cfg.attention_module:  # a module of your own may take no is_causal
      mask = masks_lib.combine_masks(mask, masks_lib.causal_mask(length))  # [B, 1, T, T]
    attention_bias = encoding.attention_bias(length, length)  # [N, T, T] or None
    for layer in range(cfg.num_layers):
      x = EncoderBlock(cfg, encoding, layer, name=f"block_{layer}")(x, mask, attention_bias,
                                                                     deterministic)
    if cfg.pre_layer_norm:
      x = nn.LayerNorm(name="final_norm")(x)
    return x


def masked_mean(x, valid):
  """Mean over real tokens: x [B, T, D], valid [B, T] -> [B, D]; zeros for an empty sequence."""
  weights = valid.astype(x.dtype)[..., None]  # [B, T, 1]
  return jnp.sum(x * weights, axis=-2) / jnp.maximum(jnp.sum(weights, axis=-2), 1.0)


def pool(x, valid, pooling: str):
  """x [B, T, D] -> [B, D] by ``pooling`` (one of POOLINGS): position 0 (the CLS token), the
  ``masked_mean`` of the real tokens, or the last real token's (position 0 for an empty sequence),
  which under a causal mask is the one position that reads the whole sequence.

  >>> x, valid = jnp.arange(8.0).reshape(1, 4, 2), jnp.array([[True, True, True, False]])
  >>> pool(x, valid, "last"), pool(x, valid, "mean")
  (Array([[4., 5.]], dtype=float32), Array([[2., 3.]], dtype=float32))
  """
  if pooling == "cls":
    return x[..., 0, :]
  if pooling == "mean":
    return masked_mean(x, valid)
  last = jnp.max(jnp.where(valid, jnp.arange(valid.shape[-1]), 0), axis=-1)  # [B]
  return jnp.take_along_axis(x, last[..., None, None], axis=-2)[..., 0, :]


class _Classifier(nn.Module):
  """An encoder and a linear read-out, of the pooled vector or (``per_token``) of every one."""
  config: EncoderConfig
  per_token = False

  @nn.compact
  def __call__(self, tokens, valid=None, *, deterministic: bool = True):
    cfg = self.config
    valid = inputs_to_valid(tokens, cfg) if valid is None else valid
    use_cls = not self.per_token and cfg.pooling == "cls"
    x = TransformerEncoder(cfg, cls_token=use_cls, name="encoder")(
        tokens, valid, deterministic=deterministic)  # [B, T(+1), D]
    if not self.per_token:
      x = pool(x, valid, cfg.pooling)  # [B, D]
    return nn.Dense(cfg.num_classes, dot_general=dense_dot_general, name="logits")(x)


class SequenceClassifier(_Classifier):
  """Token ids [B, T] -> class logits [B, C] (or C real values), pooling the encoder by CLS
  token, masked mean or last real token.

  >>> model = SequenceClassifier(EncoderConfig(vocab_size=32, num_classes=10, pooling="mean"))
  >>> tokens = jnp.array([[5, 7, 9, 0], [3, 4, 0, 0]])  # [B, T], 0 = padding
  >>> model.apply(model.init(jax.random.key(0), tokens), tokens).shape
  (2, 10)
  """


class TokenClassifier(_Classifier):
  """Token ids [B, T] -> logits [B, T, C] at every position (no CLS token), for a target per
  token; the caller's loss masks padding and untargeted positions.

  >>> model = TokenClassifier(EncoderConfig(vocab_size=32, num_classes=16))
  >>> tokens = jnp.array([[5, 7, 9, 0], [3, 4, 0, 0]])  # [B, T], 0 = padding
  >>> model.apply(model.init(jax.random.key(0), tokens), tokens).shape
  (2, 4, 16)
  """
  per_token = True
