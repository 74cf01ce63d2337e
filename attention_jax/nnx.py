"""Flax NNX shells over the pure functions that the Linen modules call, with the parameter trees
of their Linen twins, so weights move both ways (``load_linen_params``, ``linen_params``).

Dropout: ``deterministic`` is set in the constructor, by ``model.train()`` / ``model.eval()`` or
``nnx.view``, or at the call; the keys come from the constructor's ``rngs``. Inside
``nnx.capture(..., nnx.Intermediate)`` each MultiHeadAttention sows what the Linen module sows
in "intermediates", and inside ``nnx.capture(..., Losses)`` what it sows in "losses".

Shape letters: B batch, T tokens, S keys, D d_model, N heads, H head dim, C classes.
"""

from __future__ import annotations

from collections.abc import Mapping
import math
from types import MappingProxyType
from typing import Any, Callable

from flax import nnx
from flax.nnx.nn import dtypes as nnx_dtypes
import jax
import jax.numpy as jnp

from attention_jax import _checks
from attention_jax import encoder as encoder_lib
from attention_jax import kv_cache
from attention_jax import masks as masks_lib
from attention_jax import multihead
from attention_jax import positional
from attention_jax import variants
from attention_jax.products import dense_dot_general


_FLAX_PROMOTE_DTYPE = nnx_dtypes.promote_dtype  # the *_promote_dtype arguments' default


class Losses(nnx.Variable):
  """The auxiliary losses a layer records (MoH's load balancing): NNX's counterpart of Linen's
  "losses" collection. ``nnx.capture(model, Losses)`` returns them; the training loss adds
  ``variants.auxiliary_loss({"losses": captured})``."""


#: The variable type that records each collection of ``multihead.Step.records``.
RECORDED_AS = {"intermediates": nnx.Intermediate, variants.LOSSES: Losses}


def _capturing(module: nnx.Module, variable_type=nnx.Intermediate) -> bool:
  """True inside ``nnx.capture(..., variable_type)`` (which marks modules with ``__captures__``):
  NNX's counterpart of a mutable Linen collection."""
  return any(type(v) is variable_type for v in getattr(module, "__captures__", ()))


class _Dropping(nnx.Module):
  """A module with dropout inside, whose call passes ``deterministic`` down explicitly."""

  def set_view(self, deterministic: bool | None = None):
    """Called by ``nnx.view``, as on ``nnx.Dropout``."""
    if deterministic is not None:
      self.deterministic = deterministic

  def _deterministic(self, deterministic: bool | None) -> bool:
    return self.deterministic if deterministic is None else deterministic


class _Params(nnx.Module):
  """Parameters declared by specs {name: (shape, initializer)}, drawn from ``rngs.params()`` in
  flax's order with ``metadata[name]``; called, it returns {name: array}."""

  def __init__(self, specs: dict, param_dtype, rngs: nnx.Rngs,
               metadata: Mapping = MappingProxyType({})):
    self.names = tuple(specs)
    for name, (shape, init) in specs.items():
      setattr(self, name, nnx.Param(init(rngs.params(), shape, param_dtype),
                                    **metadata.get(name, {})))

  def __call__(self):
    return {name: getattr(self, name)[...] for name in self.names}


class MultiHeadAttention(_Dropping):
  """Multi-head attention as a Flax NNX module: a drop-in for ``flax.nnx.MultiHeadAttention``
(same arguments, state, parameters for the same ``rngs``, dropout masks, decode cache, sown
weights and partitioning metadata), computed by ``multihead.multi_head_attention_step``.

inputs_q [..., T, D_in], inputs_k [..., S, D_kv] (None: inputs_q), inputs_v (None: inputs_k)
-> [..., T, D_out]. The arguments mean what the Linen twin's attributes mean
(``attention_jax.MultiHeadDotProductAttention``; ours from ``scale`` on), plus flax NNX's own:
in_features (D_in), in_kv_features (D_kv, default D_in), ``rngs`` (parameter keys, and the
"dropout" stream, forked and kept when ``keep_rngs``), ``*_metadata`` (e.g. ``sharding_names``)
and ``*_promote_dtype`` (only flax's default is served). ``decode`` uses the cache that
``init_cache`` makes. A head variant's records and losses are sown inside ``nnx.capture(...,
nnx.Intermediate)`` and ``nnx.capture(..., Losses)``, whatever ``sow_weights`` says.

  >>> layer = MultiHeadAttention(8, 128, 256, rngs=nnx.Rngs(0))  # 8 heads of d_k = 32
  >>> x = jnp.ones((2, 10, 128))  # [B, T, D_in]
  >>> layer(x).shape
  (2, 10, 128)
  >>> y, maps = nnx.capture(layer, nnx.Intermediate)(x, sow_weights=True)
  >>> maps["attention_weights"][0].shape  # [B, N, T, T], as Linen sows them
  (2, 8, 10, 10)
  """

  def __init__(self, num_heads: int, in_features: int, qkv_features: int | None = None,
               out_features: int | None = None, num_kv_heads: int | None = None,
               in_kv_features: int | None = None, *, dtype: Any = None,
               param_dtype: Any = jnp.float32, broadcast_dropout: bool = True,
               dropout_rate: float = 0.0, deterministic: bool | None = None,
               precision: Any = None,
               kernel_init: Callable = nnx.initializers.lecun_normal(),
               out_kernel_init: Callable | None = None,
               bias_init: Callable = nnx.initializers.zeros_init(),
               out_bias_init: Callable | None = None, use_bias: bool = True,
               attention_fn: Callable | None = None, decode: bool | None = None,
               normalize_qk: bool = False, qkv_promote_dtype=None, out_promote_dtype=None,
               ln_promote_dtype=None, qkv_dot_general=None, out_dot_general=None,
               qkv_dot_general_cls=None, out_dot_general_cls=None, rngs: nnx.Rngs,
               keep_rngs: bool = True, kernel_metadata: Mapping = MappingProxyType({}),
               out_kernel_metadata: Mapping = MappingProxyType({}),
               bias_metadata: Mapping = MappingProxyType({}),
               out_bias_metadata: Mapping = MappingProxyType({}),
               query_ln_scale_metadata: Mapping = MappingProxyType({}),
               key_ln_scale_metadata: Mapping = MappingProxyType({}),
               scale: float | str = "inv_sqrt", implementation: str | None = None,
               fused_qkv: bool = False, qk_transform: Callable | None = None,
               head_variant=None, empty_rows: str = "mean",
               query_kernel_init: Callable | None = None):
    _checks.refuse_unserved(qkv_dot_general=qkv_dot_general, out_dot_general=out_dot_general,
                            qkv_dot_general_cls=qkv_dot_general_cls,
                            out_dot_general_cls=out_dot_general_cls,
                            **{name: None if fn in (None, _FLAX_PROMOTE_DTYPE) else fn
                               for name, fn in (("qkv_promote_dtype", qkv_promote_dtype),
                                                ("out_promote_dtype", out_promote_dtype),
                                                ("ln_promote_dtype", ln_promote_dtype))})
    qkv_features = in_features if qkv_features is None else qkv_features
    in_kv_features = in_features if in_kv_features is None else in_kv_features
    head_dim = multihead.head_dim_of(qkv_features, num_heads)
    multihead.resolve_scale(scale, head_dim)  # an unknown name fails before any parameter
    num_kv_heads = multihead.check_heads(num_heads, num_kv_heads, fused_qkv)
    self.num_heads, self.in_features, self.scale = num_heads, in_features, scale
    self.dropout_rate, self.broadcast_dropout = dropout_rate, broadcast_dropout
    self.implementation, self.fused_qkv, self.qk_transform = implementation, fused_qkv, qk_transform
    self.normalize_qk, self.deterministic, self.empty_rows = normalize_qk, deterministic, empty_rows
    self.attention_fn, self.dtype, self.precision, self.decode = (attention_fn, dtype, precision,
                                                                  decode)
    self.num_kv_heads, self.head_variant = num_kv_heads, head_variant
    d_out = in_features if out_features is None else out_features
    specs = multihead.parameter_specs(
        in_features, in_kv_features, in_kv_features, d_out, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, fused_qkv=fused_qkv,
        normalize_qk=normalize_qk, use_bias=use_bias, kernel_init=kernel_init,
        bias_init=bias_init, out_kernel_init=out_kernel_init, out_bias_init=out_bias_init,
        query_kernel_init=query_kernel_init, head_variant=head_variant)
    projection = {"kernel": kernel_metadata, "bias": bias_metadata}
    metadata = dict.fromkeys(("qkv", "query", "key", "value"), projection)
    metadata.update(out={"kernel": out_kernel_metadata or kernel_metadata,
                         "bias": out_bias_metadata or bias_metadata},
                    query_ln={"scale": query_ln_scale_metadata},
                    key_ln={"scale": key_ln_scale_metadata})
    for name, group in specs.items():  # flax's order, so that the same rngs give its parameters
      setattr(self, name, _Params(group, param_dtype, rngs, metadata.get(name, {})))
    self.groups = tuple(specs)
    self.rngs = rngs["dropout"].fork() if keep_rngs and dropout_rate > 0.0 else None
    if scale == "learned":
      self.temperature = nnx.Param(
          jnp.full((num_heads,), multihead.resolve_scale("learned", head_dim), param_dtype))
    self.cached_key = self.cached_value = self.cache_index = nnx.data(None)

  def init_cache(self, input_shape, dtype=jnp.float32):
    """An empty key/value cache for inputs of ``input_shape`` [..., L, D_in] (L: the longest
    sequence), as ``flax.nnx.MultiHeadAttention.init_cache``."""
    cache = multihead.empty_cache(self.params(), jax.ShapeDtypeStruct(input_shape, dtype),
                                  dtype=dtype, head_variant=self.head_variant)
    self.cached_key, self.cached_value, self.cache_index = (nnx.Cache(array) for array in cache)

  def params(self) -> dict:
    """The parameters as the dict that ``multihead.multi_head_attention`` takes."""
    params = {name: getattr(self, name)() for name in self.groups}
    if self.scale == "learned":
      params["temperature"] = self.temperature[...]
    return params

  def _cache(self, decode: bool | None):
    decode = self.decode if decode is None else decode
    if not decode:
      return None
    if self.cached_key is None:
      raise ValueError("decode=True needs a key/value cache: call init_cache(input_shape) first.")
    return kv_cache.KVCache(self.cached_key[...], self.cached_value[...], self.cache_index[...])

  def _dropout_rng(self, deterministic, rngs, dropout_rng):
    """The dropout key of this call, None without dropout (flax's rules: ``deterministic`` from
    the call, else the module, else an error; keys from the call's rngs, else the module's)."""
    if self.dropout_rate <= 0.0:
      return None
    deterministic = self.deterministic if deterministic is None else deterministic
    if deterministic is None:
      raise ValueError("dropout_rate > 0 needs deterministic: set it in the constructor, by "
                       "model.train() / model.eval(), or at the call.")
    if deterministic:
      return None
    if dropout_rng is not None:
      return dropout_rng
    stream = rngs["dropout"] if isinstance(rngs, nnx.Rngs) else (rngs or self.rngs)
    if stream is None:
      raise ValueError("dropout needs keys: pass rngs= at the call (the module was built with "
                       "keep_rngs=False).")
    return stream()

  def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, mask=None,
               deterministic: bool | None = None, rngs=None, sow_weights: bool | None = False,
               decode: bool | None = None, is_causal: bool = False, out_sharding=None,
               qkv_sharding=None, bias=None, dropout_rng=None, **attention_args):
    """flax's call; ``rngs`` (an ``nnx.Rngs`` or stream) or ``dropout_rng`` override the
    module's dropout keys; ``sow_weights=None``: sow inside ``nnx.capture``; ``out_sharding``
    and ``qkv_sharding``: only None is served; ``attention_args``: those of
    ``multihead.multi_head_attention``."""
    if inputs_q.shape[-1] != self.in_features:
      raise ValueError(f"inputs_q has width {inputs_q.shape[-1]}, and this module was built for "
                       f"in_features={self.in_features}.")
    _checks.refuse_unserved(out_sharding=out_sharding, qkv_sharding=qkv_sharding)
    dropout_rng = self._dropout_rng(deterministic, rngs, dropout_rng)
    sow = _capturing(self) if sow_weights is None else sow_weights
    step = multihead.shell_step(
        self, self.params(), inputs_q, inputs_k, inputs_v, mask=mask, bias=bias,
        is_causal=is_causal, dropout_rate=self.dropout_rate if dropout_rng is not None else 0.0,
        dropout_rng=dropout_rng, cache=self._cache(decode), return_maps=sow, **attention_args)
    if step.cache is not None:
      self.cached_key[...], self.cached_value[...], self.cache_index[...] = step.cache
    for collection, records in step.records.items():  # as Linen sows into mutable collections
      kind = RECORDED_AS[collection]  # (sow_weights=True sows outside nnx.capture too, as flax)
      if records and (_capturing(self, kind) or (sow and kind is nnx.Intermediate)):
        for name, value in records.items():
          self.sow(kind, name, value)
    return step.output



# Positional encodings: the Linen ones' methods over the same functions; ``rotate`` is static, so
# that a block can take it from the config alone.

class NoPositionalEncoding(nnx.Module):
  """No position information: embed, rotate and attention_bias leave everything as it is.

  >>> encoding = positional_encoding("none", max_length=64, d_model=32, num_heads=4,
  ...                                rngs=nnx.Rngs(0))
  """

  def __init__(self, *, max_length: int, d_model: int, num_heads: int, rngs: nnx.Rngs):
    del max_length, d_model, rngs
    self.num_heads = num_heads

  def embed(self, x, deterministic: bool | None = None):  # [B, T, D] -> [B, T, D]
    del deterministic
    return x

  @staticmethod
  def rotate(query, key, positions=None):  # [B, T, N, H], [B, S, N, H] -> same
    return query, key

  def attention_bias(self, q_len: int, kv_len: int):  # None, or a logit bias [N, T, S]
    return None


class SinusoidalEncoding(NoPositionalEncoding):
  """Adds the fixed sinusoidal table to the embeddings; any length.

  >>> encoding = positional_encoding("sinusoidal", max_length=64, d_model=32, num_heads=4,
  ...                                rngs=nnx.Rngs(0))
  >>> encoding.embed(jnp.zeros((2, 10, 32))).shape  # [B, T, D]
  (2, 10, 32)
  """

  def embed(self, x, deterministic: bool | None = None):
    del deterministic
    return x + positional.sinusoidal_encoding(x.shape[-2], x.shape[-1]).astype(x.dtype)


class LearnedEncoding(NoPositionalEncoding):
  """Adds a learned table [max_length, D] ("table", as the Linen one).

  >>> encoding = positional_encoding("learned", max_length=64, d_model=32, num_heads=4,
  ...                                rngs=nnx.Rngs(0))
  >>> encoding.table.shape
  (64, 32)
  """

  def __init__(self, *, max_length: int, d_model: int, num_heads: int, rngs: nnx.Rngs):
    super().__init__(max_length=max_length, d_model=d_model, num_heads=num_heads, rngs=rngs)
    self.table = nnx.Param(positional.learned_table_init(rngs.params(), (max_length, d_model)))

  def embed(self, x, deterministic: bool | None = None):
    del deterministic
    return positional.add_learned_table(x, self.table[...])


class RandomizedEncoding(NoPositionalEncoding):
  """Adds the sinusoidal table at sorted random positions from 0..max_length-1 (Ruoss et al.
  2023): a new draw from the "dropout" stream when training, a fixed one when deterministic.

  >>> encoding = positional_encoding("randomized", max_length=64, d_model=32, num_heads=4,
  ...                                rngs=nnx.Rngs(0))
  >>> encoding.embed(jnp.zeros((2, 10, 32)), deterministic=False).shape  # [B, T, D]
  (2, 10, 32)
  """

  def __init__(self, *, max_length: int, d_model: int, num_heads: int, rngs: nnx.Rngs,
               deterministic: bool = True):
    super().__init__(max_length=max_length, d_model=d_model, num_heads=num_heads, rngs=rngs)
    self.max_length, self.deterministic = max_length, deterministic
    self.rngs = rngs["dropout"].fork()

  def embed(self, x, deterministic: bool | None = None):
    deterministic = self.deterministic if deterministic is None else deterministic
    key = None if deterministic else self.rngs()
    return positional.add_randomized_sinusoidal(x, key, self.max_length)


class RotaryEncoding(NoPositionalEncoding):
  """Rotates queries and keys by their positions (RoPE).

  >>> query = key = jnp.ones((2, 10, 4, 8))  # [B, T, N, H]
  >>> query, key = RotaryEncoding.rotate(query, key)
  >>> query.shape
  (2, 10, 4, 8)
  """

  @staticmethod
  def rotate(query, key, positions=None):
    return positional.rope_transform(query, key, positions)


class ALiBiEncoding(NoPositionalEncoding):
  """Adds ``-slope_n * |t - s|`` to the logits of head n (ALiBi).

  >>> positional_encoding("alibi", max_length=64, d_model=32, num_heads=4,
  ...                     rngs=nnx.Rngs(0)).attention_bias(10, 10).shape
  (4, 10, 10)
  """

  def attention_bias(self, q_len: int, kv_len: int):
    return positional.alibi_bias(self.num_heads, q_len, kv_len)


#: The positional encodings by name, as NNX modules.
POSITIONAL_ENCODINGS = {
    "none": NoPositionalEncoding,
    "sinusoidal": SinusoidalEncoding,
    "learned": LearnedEncoding,
    "randomized": RandomizedEncoding,
    "rope": RotaryEncoding,
    "alibi": ALiBiEncoding,
}


def positional_encoding(name: str, /, *, max_length: int, d_model: int, num_heads: int,
                        rngs: nnx.Rngs):
  """The NNX positional encoding registered under ``name`` (the names of the Linen registry).

  >>> encoding = positional_encoding("rope", max_length=512, d_model=128, num_heads=8,
  ...                                rngs=nnx.Rngs(0))
  """
  if name not in POSITIONAL_ENCODINGS:
    raise ValueError(
        f"unknown positional encoding {name!r}; known: {sorted(POSITIONAL_ENCODINGS)}.")
  return POSITIONAL_ENCODINGS[name](max_length=max_length, d_model=d_model, num_heads=num_heads,
                                    rngs=rngs)


def _check_attention_module(config: encoder_lib.EncoderConfig):
  if config.attention_module is not None:
    raise ValueError(
        f"EncoderConfig.attention_module={config.attention_module!r} is a Linen choice; the NNX "
        f"encoder uses attention_jax.nnx.MultiHeadAttention, so leave attention_module=None.")


class FeedForward(_Dropping):
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


class EncoderBlock(_Dropping):
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
    self.deterministic = deterministic
    self.attention = MultiHeadAttention(
        cfg.num_heads, cfg.d_model, cfg.num_heads * cfg.key_dim,
        scale=cfg.attention_scale, dropout_rate=cfg.attention_dropout_rate,
        implementation=cfg.attention_impl, normalize_qk=cfg.normalize_qk,
        attention_fn=cfg.attention_fn,
        qk_transform=POSITIONAL_ENCODINGS[cfg.positional_encoding].rotate,
        head_variant=cfg.head_variant_of(layer), deterministic=deterministic, rngs=rngs)
    self.feed_forward = FeedForward(cfg.d_model, cfg.mlp_dim, dropout_rate=cfg.dropout_rate,
                                    deterministic=deterministic, rngs=rngs)
    self.norm_0 = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.norm_1 = nnx.LayerNorm(cfg.d_model, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=deterministic, rngs=rngs)

  def __call__(self, x, mask=None, attention_bias=None, *, deterministic: bool | None = None):
    deterministic = self._deterministic(deterministic)
    dropout = lambda y: self.dropout(y, deterministic=deterministic)
    attention = lambda y: self.attention(y, mask=mask, bias=attention_bias,
                                         deterministic=deterministic, sow_weights=None)
    feed_forward = lambda y: self.feed_forward(y, deterministic=deterministic)
    for sublayer, norm in ((attention, self.norm_0), (feed_forward, self.norm_1)):
      x = encoder_lib.residual_sublayer(x, sublayer, norm, dropout,
                                        pre_layer_norm=self.config.pre_layer_norm)
    return x


class TransformerEncoder(_Dropping):
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


class _Classifier(_Dropping):
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
      x = x[..., 0, :] if self.encoder.cls_token else encoder_lib.masked_mean(x, valid)
    return self.logits(x)  # [B, C] or [B, T, C]


class SequenceClassifier(_Classifier):
  """Token ids [B, T] -> class logits [B, C], pooling the encoder by CLS token or masked mean;
  the twin of ``attention_jax.SequenceClassifier`` (encoder, logits).

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


def linen_params(module: nnx.Module) -> dict:
  """The parameters of ``module`` as the Linen twin's ``variables["params"]``.

  >>> import attention_jax
  >>> config = attention_jax.EncoderConfig(vocab_size=32, d_model=32, num_heads=4)
  >>> nnx_model = SequenceClassifier(config, rngs=nnx.Rngs(0))
  >>> tokens = jnp.array([[5, 7, 9, 0]])
  >>> variables = {"params": linen_params(nnx_model)}
  >>> linen_logits = attention_jax.SequenceClassifier(config).apply(variables, tokens)
  >>> bool(jnp.allclose(linen_logits, nnx_model(tokens), atol=1e-6))
  True
  """
  return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def _plain(tree):
  """Nested mappings (dicts, FrozenDicts) of arrays -> nested dicts of jax arrays."""
  if isinstance(tree, Mapping):
    return {key: _plain(value) for key, value in tree.items()}
  return jnp.asarray(tree)


def _shapes(tree, prefix=()):
  """{"a/b/kernel": shape} for the leaves of nested dicts."""
  if not isinstance(tree, dict):
    return {"/".join(map(str, prefix)): jnp.shape(tree)}
  return {path: shape for key, value in tree.items()
          for path, shape in _shapes(value, prefix + (key,)).items()}


def load_linen_params(module: nnx.Module, params) -> nnx.Module:
  """Sets the parameters of ``module`` in place to the Linen twin's ``variables["params"]`` (or
  its variables); returns the module. A different tree raises ValueError.

  >>> import attention_jax
  >>> config = attention_jax.EncoderConfig(vocab_size=32, d_model=32, num_heads=4)
  >>> tokens = jnp.array([[5, 7, 9, 0]])
  >>> linen_model = attention_jax.SequenceClassifier(config)
  >>> variables = linen_model.init(jax.random.key(0), tokens)
  >>> model = load_linen_params(SequenceClassifier(config, rngs=nnx.Rngs(1)), variables)
  >>> bool(jnp.allclose(model(tokens), linen_model.apply(variables, tokens), atol=1e-6))
  True
  """
  params = _plain(params)
  if set(params) == {"params"}:
    params = params["params"]
  state = nnx.state(module, nnx.Param)
  want, got = _shapes(nnx.to_pure_dict(state)), _shapes(params)
  if want != got:
    reshaped = [f"{path} {want[path]} != {got[path]}" for path in sorted(want.keys() & got.keys())
                if want[path] != got[path]]
    raise ValueError(
        f"these parameters do not fit {type(module).__name__}: missing "
        f"{sorted(want.keys() - got.keys())[:5]}, unexpected {sorted(got.keys() - want.keys())[:5]}"
        f", shapes (module's != given) {reshaped[:5]}; build the module from the Linen model's "
        f"config.")
  nnx.replace_by_pure_dict(state, params)
  nnx.update(module, state)
  return module
