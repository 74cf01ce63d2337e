"""Flax NNX shells over the pure functions that the Linen modules call, with the parameter trees
of their Linen twins, so weights move both ways (``load_linen_params``, ``linen_params``).

Dropout: ``deterministic`` is set in the constructor, by ``model.train()`` / ``model.eval()`` or
``nnx.view``, or at the call; the keys come from the constructor's ``rngs``. Inside
``nnx.capture(..., nnx.Intermediate)`` each MultiHeadAttention sows what the Linen module sows
in "intermediates", and inside ``nnx.capture(..., Losses)`` what it sows in "losses".

The positional encodings (``positional_encoding(name, ...)``) are the twins of
``attention_jax.positional``'s. The NNX twins of the encoder and its classifiers are an example
built on these: ``examples/nnx_encoder.py``.

Shape letters: B batch, T tokens, S keys, D d_model, N heads, H head dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable

import flax
from flax import nnx
from flax import traverse_util
from flax.nnx.nn import dtypes as nnx_dtypes
import jax
import jax.numpy as jnp

from attention_jax import _checks
from attention_jax import kv_cache
from attention_jax import multihead
from attention_jax import positional
from attention_jax import variants


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


class _Params(nnx.Module):
  """One group of ``multihead.parameter_specs`` {name: (shape, initializer)}, drawn from
  ``rngs.params()`` in flax's order with ``metadata[name]``; called, it returns {name: array}."""

  def __init__(self, specs: dict, param_dtype, rngs: nnx.Rngs,
               metadata: Mapping = MappingProxyType({})):
    self.names = tuple(specs)
    for name, (shape, init) in specs.items():
      setattr(self, name, nnx.Param(init(rngs.params(), shape, param_dtype),
                                    **metadata.get(name, {})))

  def __call__(self):
    return {name: getattr(self, name)[...] for name in self.names}


class Stochastic(nnx.Module):
  """A module with dropout (or other draws) inside: its ``deterministic`` is set in the
  constructor, by ``model.train()`` / ``model.eval()`` or ``nnx.view`` (``set_view``, as on
  ``nnx.Dropout``), and a call's own ``deterministic`` overrides it (``_deterministic``)."""

  def set_view(self, deterministic: bool | None = None):
    """Called by ``nnx.view``, as on ``nnx.Dropout``."""
    if deterministic is not None:
      self.deterministic = deterministic

  def _deterministic(self, deterministic: bool | None) -> bool | None:
    """The call's ``deterministic``, else the module's."""
    return self.deterministic if deterministic is None else deterministic


class MultiHeadAttention(Stochastic):
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
    arguments = locals()
    _checks.refuse_unserved(  # flax's default *_promote_dtype counts as unset
        **{name: arguments[name] for name in ("qkv_dot_general", "out_dot_general",
                                              "qkv_dot_general_cls", "out_dot_general_cls")},
        **{name: None if arguments[name] is nnx_dtypes.promote_dtype else arguments[name]
           for name in ("qkv_promote_dtype", "out_promote_dtype", "ln_promote_dtype")})
    for name in multihead.SETTINGS + ("in_features", "deterministic", "decode"):
      setattr(self, name, arguments[name])  # the settings, as the Linen module's attributes
    in_kv_features = in_features if in_kv_features is None else in_kv_features
    specs = multihead.parameter_specs(self, in_features, in_kv_features, in_kv_features)
    projection = {"kernel": kernel_metadata, "bias": bias_metadata}
    metadata = dict.fromkeys(("qkv", "query", "key", "value"), projection)
    metadata.update(out={"kernel": out_kernel_metadata or kernel_metadata,
                         "bias": out_bias_metadata or bias_metadata},
                    query_ln={"scale": query_ln_scale_metadata},
                    key_ln={"scale": key_ln_scale_metadata})
    for name, spec in specs.items():  # flax's order, so that the same rngs give its parameters
      if isinstance(spec, dict):
        setattr(self, name, _Params(spec, param_dtype, rngs, metadata.get(name, {})))
      else:  # "temperature", a constant: drawn from no key
        setattr(self, name, nnx.Param(spec[1](None, spec[0], param_dtype)))
    self.groups = tuple(specs)
    self.rngs = rngs["dropout"].fork() if keep_rngs and dropout_rate > 0.0 else None
    self.cached_key = self.cached_value = self.cache_index = nnx.data(None)

  def init_cache(self, input_shape, dtype=jnp.float32):
    """An empty key/value cache for inputs of ``input_shape`` [..., L, D_in] (L: the longest
    sequence), as ``flax.nnx.MultiHeadAttention.init_cache``."""
    cache = multihead.empty_cache(self.params(), jax.ShapeDtypeStruct(input_shape, dtype),
                                  dtype=dtype, head_variant=self.head_variant)
    self.cached_key, self.cached_value, self.cache_index = (nnx.Cache(array) for array in cache)

  def params(self) -> dict:
    """The parameters as the dict that ``multihead.multi_head_attention`` takes."""
    held = {name: getattr(self, name) for name in self.groups}
    return {name: group() if isinstance(group, _Params) else group[...]
            for name, group in held.items()}

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
    deterministic = self._deterministic(deterministic)
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
        is_causal=is_causal, dropout_rng=dropout_rng, cache=self._cache(decode), return_maps=sow,
        **attention_args)
    if step.cache is not None:
      self.cached_key[...], self.cached_value[...], self.cache_index[...] = step.cache
    for collection, records in step.records.items():  # as Linen sows into mutable collections
      kind = RECORDED_AS[collection]  # (sow_weights=True sows outside nnx.capture too, as flax)
      if records and (_capturing(self, kind) or (sow and kind is nnx.Intermediate)):
        for name, value in records.items():
          self.sow(kind, name, value)
    return step.output


def linen_params(module: nnx.Module) -> dict:
  """The parameters of ``module`` as the Linen twin's ``variables["params"]``.

  >>> import attention_jax
  >>> layer = MultiHeadAttention(4, 32, rngs=nnx.Rngs(0))
  >>> x = jnp.ones((2, 5, 32))  # [B, T, D_in]
  >>> variables = {"params": linen_params(layer)}
  >>> linen_y = attention_jax.MultiHeadAttention(num_heads=4).apply(variables, x)
  >>> bool(jnp.allclose(linen_y, layer(x), atol=1e-6))
  True
  """
  return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def load_linen_params(module: nnx.Module, params) -> nnx.Module:
  """Sets the parameters of ``module`` in place to the Linen twin's ``variables["params"]`` (or
  its variables); returns the module. A different tree raises ValueError.

  >>> import attention_jax
  >>> x = jnp.ones((2, 5, 32))  # [B, T, D_in]
  >>> linen_layer = attention_jax.MultiHeadAttention(num_heads=4)
  >>> variables = linen_layer.init(jax.random.key(0), x)
  >>> layer = load_linen_params(MultiHeadAttention(4, 32, rngs=nnx.Rngs(1)), variables)
  >>> bool(jnp.allclose(layer(x), linen_layer.apply(variables, x), atol=1e-6))
  True
  """
  params = jax.tree.map(jnp.asarray, flax.core.unfreeze(params))  # nested dicts of jax arrays
  if set(params) == {"params"}:
    params = params["params"]
  state = nnx.state(module, nnx.Param)
  # {"a/b/kernel": shape} of each tree (map(str, ...): nnx.List's keys are ints)
  want, got = ({"/".join(map(str, path)): jnp.shape(leaf)
                for path, leaf in traverse_util.flatten_dict(tree).items()}
               for tree in (nnx.to_pure_dict(state), params))
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


# Positional encodings: the twins of attention_jax.positional's Linen modules (described there),
# the same three methods over the same pure tables and rotations, the same parameter ("table");
# ``rotate`` is static, so that a block can take it from the config alone.

class NoPositionalEncoding(nnx.Module):
  """``positional.NoPositionalEncoding`` in NNX: embed, rotate and attention_bias leave
  everything as it is.

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
  """``positional.SinusoidalEncoding`` in NNX.

  >>> encoding = positional_encoding("sinusoidal", max_length=64, d_model=32, num_heads=4,
  ...                                rngs=nnx.Rngs(0))
  >>> encoding.embed(jnp.zeros((2, 10, 32))).shape  # [B, T, D]
  (2, 10, 32)
  """

  def embed(self, x, deterministic: bool | None = None):
    del deterministic
    return x + positional.sinusoidal_encoding(x.shape[-2], x.shape[-1]).astype(x.dtype)


class LearnedEncoding(NoPositionalEncoding):
  """``positional.LearnedEncoding`` in NNX: its "table" [max_length, D].

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


class RandomizedEncoding(NoPositionalEncoding, Stochastic):
  """``positional.RandomizedEncoding`` in NNX: its draws from the "dropout" stream of ``rngs``.

  >>> encoding = positional_encoding("randomized", max_length=64, d_model=32, num_heads=4,
  ...                                rngs=nnx.Rngs(0))
  >>> encoding.embed(jnp.zeros((2, 10, 32)), deterministic=False).shape  # [B, T, D]
  (2, 10, 32)
  >>> nnx.view(encoding, deterministic=False).deterministic  # as nnx.Dropout's
  False
  """

  def __init__(self, *, max_length: int, d_model: int, num_heads: int, rngs: nnx.Rngs,
               deterministic: bool = True):
    super().__init__(max_length=max_length, d_model=d_model, num_heads=num_heads, rngs=rngs)
    self.max_length, self.deterministic = max_length, deterministic
    self.rngs = rngs["dropout"].fork()

  def embed(self, x, deterministic: bool | None = None):
    key = None if self._deterministic(deterministic) else self.rngs()
    return positional.add_randomized_sinusoidal(x, key, self.max_length)


class RotaryEncoding(NoPositionalEncoding):
  """``positional.RotaryEncoding`` in NNX.

  >>> query = key = jnp.ones((2, 10, 4, 8))  # [B, T, N, H]
  >>> query, key = RotaryEncoding.rotate(query, key)
  >>> query.shape
  (2, 10, 4, 8)
  """

  @staticmethod
  def rotate(query, key, positions=None):
    return positional.rope_transform(query, key, positions)


class ALiBiEncoding(NoPositionalEncoding):
  """``positional.ALiBiEncoding`` in NNX.

  >>> positional_encoding("alibi", max_length=64, d_model=32, num_heads=4,
  ...                     rngs=nnx.Rngs(0)).attention_bias(10, 10).shape
  (4, 10, 10)
  """

  def attention_bias(self, q_len: int, kv_len: int):
    return positional.alibi_bias(self.num_heads, q_len, kv_len)


#: The positional encodings by name, as NNX modules (the Linen registry's names, each with the
#: NNX twin of its Linen class).
POSITIONAL_ENCODINGS = {name: globals()[linen.__name__]
                        for name, linen in positional.POSITIONAL_ENCODINGS.items()}


def positional_encoding(name: str, /, *, max_length: int, d_model: int, num_heads: int,
                        rngs: nnx.Rngs):
  """The NNX positional encoding registered under ``name`` (the names of the Linen registry).

  >>> encoding = positional_encoding("rope", max_length=512, d_model=128, num_heads=8,
  ...                                rngs=nnx.Rngs(0))
  """
  return positional.registered(POSITIONAL_ENCODINGS, name)(
      max_length=max_length, d_model=d_model, num_heads=num_heads, rngs=rngs)


#: Names that moved out of this module -> where they live now.
MOVED = dict.fromkeys(("FeedForward", "EncoderBlock", "TransformerEncoder", "SequenceClassifier",
                       "TokenClassifier"), "examples/nnx_encoder.py")


def __getattr__(name):
  """A name that moved raises AttributeError in one line naming its new home."""
  if name in MOVED:
    raise AttributeError(f"attention_jax.nnx.{name} moved to {MOVED[name]} (an example on the "
                         f"library: copy it, or import it from there).")
  raise AttributeError(f"module 'attention_jax.nnx' has no attribute {name!r}")
