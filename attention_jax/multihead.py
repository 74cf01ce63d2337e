"""Multi-head attention: per-head projections W_Q, W_K, W_V, attention per head, concat, W_O.

  head_n = Attention(X_q W_Q^n, X_kv W_K^n, X_kv W_V^n),   MultiHead = Concat(head_1..head_N) W_O

Shape letters: B batch dims, T query length, S key/value length, D_in input width, N heads,
H = d_model / N head dim (d_k), D_out output width.

Parameters (the layout of ``flax.linen.MultiHeadDotProductAttention``, so weights transfer):
  query/key/value: {"kernel": [D_in, N, H], "bias": [N, H]}  -- kernel[:, n, :] is W_Q^n
  out:             {"kernel": [N, H, D_out], "bias": [D_out]}
  qkv (fused):     {"kernel": [D_in, 3, N, H], "bias": [3, N, H]} replaces query/key/value
  temperature:     [N], only with scale="learned"
  query_ln/key_ln: {"scale": [H]}, only with normalize_qk (as flax's ``normalize_qk``)
  talking_heads / dcmha / moh: a head variant's own, head_variants.parameter_specs (overlapping
                   heads widen out's H and query_ln/key_ln's to H + 2o instead)
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_jax import attention as attention_lib
from attention_jax import head_variants
from attention_jax import reference
from attention_jax.products import dense_product

QK_NORM_EPSILON = 1e-6  # flax.linen.LayerNorm's default, so normalize_qk matches flax's

SCALES = {
    "inv_sqrt": lambda head_dim: 1.0 / math.sqrt(head_dim),  # the paper
    "none": lambda head_dim: 1.0,
    "inv": lambda head_dim: 1.0 / head_dim,
    "learned": lambda head_dim: 1.0 / math.sqrt(head_dim),  # initial value of the temperature
}


def resolve_scale(scale: float | str, head_dim: int) -> float:
  """The number a scale name stands for at ``head_dim`` ("learned": its initial value).

  >>> resolve_scale("inv_sqrt", 64), resolve_scale("inv", 64), resolve_scale(0.5, 64)
  (0.125, 0.015625, 0.5)
  """
  if isinstance(scale, str):
    if scale not in SCALES:
      raise ValueError(
          f"unknown attention scale {scale!r}; use a number or one of {sorted(SCALES)}.")
    return SCALES[scale](head_dim)
  if isinstance(scale, bool) or not isinstance(scale, (int, float)):
    raise ValueError(f"attention scale must be a number or a name in {sorted(SCALES)}, "
                     f"got {scale!r}.")
  return float(scale)


def head_dim_of(d_model: int, num_heads: int) -> int:
  """d_k = d_model / h, with a clear error when h does not divide d_model."""
  if num_heads <= 0 or d_model % num_heads:
    raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads} "
                     f"(d_k = d_model / num_heads); choose num_heads among the divisors of "
                     f"{d_model}.")
  return d_model // num_heads


def _project(x, params):
  """x [..., L, D_in] with kernel [D_in, *F] -> [..., L, *F]."""
  y = dense_product(x, params["kernel"].astype(x.dtype))
  return y + params["bias"].astype(x.dtype) if "bias" in params else y


def project_qkv(params, inputs_q, inputs_kv):
  """Per-head projections: [..., T, D_in], [..., S, D_in] -> query [..., T, N, H], key and value
  [..., S, N, H]. The fused kernel needs self-attention (inputs_kv is inputs_q)."""
  if "qkv" in params:
    if inputs_kv is not inputs_q:
      raise ValueError("fused qkv projections need self-attention (inputs_kv=None).")
    qkv = _project(inputs_q, params["qkv"])  # [..., T, 3, N, H]
    return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
  return (_project(inputs_q, params["query"]), _project(inputs_kv, params["key"]),
          _project(inputs_kv, params["value"]))


def project_out(params, heads):
  """Concat(head_1..head_N) W_O: [..., T, N, H] -> [..., T, D_out]."""
  kernel = params["out"]["kernel"].astype(heads.dtype)  # [N, H, D_out]
  output = dense_product(jnp.reshape(heads, heads.shape[:-2] + (-1,)),  # [..., T, N * H]
                         jnp.reshape(kernel, (-1, kernel.shape[-1])))
  return output + params["out"]["bias"].astype(heads.dtype) if "bias" in params["out"] else output


def qk_layer_norm(x, scale, epsilon: float = QK_NORM_EPSILON):
  """LayerNorm over the head dimension without bias (QK-norm, Dehghani et al. 2023): each head's
  query (or key) vector normalised to zero mean and unit variance, times a learned ``scale`` [H].
  Statistics in float32 whatever the input dtype: [..., N, H] -> [..., N, H].

  >>> qk_layer_norm(query, params["query_ln"]["scale"])  # query [B, T, N, H] -> [B, T, N, H]
  """
  y = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  y = y - jnp.mean(y, axis=-1, keepdims=True)
  y = y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + epsilon)
  return (y * scale).astype(x.dtype)


def attention_inputs(params, inputs_q, inputs_kv=None, *, scale: float | str = "inv_sqrt",
                     qk_transform: Callable | None = None, head_variant=None):
  """Projected, normalised (with query_ln/key_ln), transformed query/key/value and the scale left
  to apply to Q K^T.

  [..., T, D_in], [..., S, D_in] -> query [..., T, N, H], key, value [..., S, N, H], scale.
  ``head_variant`` (head_variants.HeadVariant): overlapping heads widen H to H + 2o here.
  """
  inputs_kv = inputs_q if inputs_kv is None else inputs_kv
  query, key, value = project_qkv(params, inputs_q, inputs_kv)  # [..., T|S, N, H]
  head_dim = query.shape[-1]  # the scale's d_k, before a head variant widens the heads (MOHSA)
  query, key, value = head_variants.head_layout(head_variant, query, key, value)
  if "query_ln" in params:
    query = qk_layer_norm(query, params["query_ln"]["scale"])
    key = qk_layer_norm(key, params["key_ln"]["scale"])
  if qk_transform is not None:
    query, key = qk_transform(query, key)
  if scale == "learned":  # a per-head temperature, folded into the query
    return query * params["temperature"][:, None].astype(query.dtype), key, value, 1.0
  return query, key, value, resolve_scale(scale, head_dim)


def multi_head_attention(params, inputs_q, inputs_kv=None, *, mask=None, bias=None,
                         scale: float | str = "inv_sqrt", is_causal: bool = False,
                         qk_transform: Callable | None = None, dropout_rate: float = 0.0,
                         dropout_rng=None, implementation: str | None = None,
                         return_weights: bool = False, attention_fn: Callable | None = None,
                         head_variant=None, **attention_args):
  """Multi-head attention as a pure function of its parameters (layout in the module docstring).

  Args:
    params: the parameter dict of ``MultiHeadAttention`` (``variables["params"]``).
    inputs_q: [..., T, D_in].
    inputs_kv: [..., S, D_in]; None for self-attention.
    mask, bias, is_causal: as in ``dot_product_attention``, broadcastable to [..., N, T, S].
    scale: a number or "inv_sqrt" (1/sqrt(H)), "none" (1), "inv" (1/H), "learned".
    qk_transform: optional (query, key) -> (query, key) on [..., T|S, N, H], e.g. RoPE.
    dropout_rate, dropout_rng, implementation, return_weights: as in ``dot_product_attention``.
    attention_fn: what computes attention from the projected heads, with the signature of
      ``dot_product_attention`` (the default), e.g. ``ContextParallel(mesh, axis_name)``.
    head_variant: a ``head_variants.HeadVariant`` (talking heads, DCMHA, MoH, overlapping heads)
      or None (plain multi-head attention); its parameters are in ``params``.
    **attention_args: the other keyword arguments of ``dot_product_attention``
      (query_seq_lengths, key_value_seq_lengths, local_window_size, logits_soft_cap,
      query_segment_ids, key_segment_ids, return_residual).

  Returns:
    [..., T, D_out]; followed by the weights [..., N, T, S] with ``return_weights`` and the
    log-sum-exp [..., T, N] with ``return_residual`` (a tuple then).

  >>> variables = MultiHeadAttention(num_heads=8, d_model=256).init(rng, x)  # x: [B, T, 128]
  >>> multi_head_attention(variables["params"], x).shape  # [B, T, 128]
  """
  # The named scopes label the three parts in profiles (scripts/profile_train.py).
  with jax.named_scope("qkv_projection"):
    query, key, value, scale = attention_inputs(params, inputs_q, inputs_kv, scale=scale,
                                                qk_transform=qk_transform,
                                                head_variant=head_variant)
  # head variants: talking heads and DCMHA mix heads inside attention, MoH gates heads after it
  attention_fn = head_variants.attention_fn(params, inputs_q, inputs_kv, head_variant,
                                            attention_fn)
  with jax.named_scope("dot_product_attention"):
    result = attention_fn(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal,
        dropout_rate=dropout_rate, dropout_rng=dropout_rng, return_weights=return_weights,
        implementation=implementation, **attention_args)
  heads, *extras = result if isinstance(result, tuple) else (result,)  # heads [..., T, N, H]
  heads = head_variants.gate_heads(params, inputs_q, heads, head_variant)
  with jax.named_scope("out_projection"):
    output = project_out(params, heads)  # [..., T, D_out]
  return (output, *extras) if extras else output


def multi_head_attention_logits(params, inputs_q, inputs_kv=None, *, bias=None,
                                scale: float | str = "inv_sqrt",
                                qk_transform: Callable | None = None,
                                logits_soft_cap: float | None = None, head_variant=None):
  """The logits Q K^T * scale + bias [..., N, T, S] that the softmax of each head sees (a mixing
  head variant's are in ``attention_maps``).

  >>> multi_head_attention_logits(params, x).shape  # x [B, T, D_in], 8 heads -> (B, 8, T, T)
  """
  query, key, _, scale = attention_inputs(params, inputs_q, inputs_kv, scale=scale,
                                          qk_transform=qk_transform, head_variant=head_variant)
  logits = reference.attention_logits(query, key, scale=scale,
                                      logits_soft_cap=logits_soft_cap)  # [..., N, T, S]
  return logits if bias is None else logits + bias


def attention_maps(params, inputs_q, inputs_kv=None, *, mask=None, bias=None,
                   scale: float | str = "inv_sqrt", is_causal: bool = False,
                   qk_transform: Callable | None = None, logits_soft_cap: float | None = None,
                   return_residual: bool = False, head_variant=None, **structure):
  """(logits, weights), each [..., N, T, S]: what ``multi_head_attention`` with the same
  arguments computes inside (the weights before dropout). ``structure``: the sequence lengths,
  local window and segment ids, as there. The modules sow these when asked. With talking heads
  or DCMHA: the mixed logits and the mixed (possibly negative) weights that it applies.

  >>> logits, weights = attention_maps(params, x, local_window_size=2)  # x [B, T, D_in]
  """
  del return_residual  # the maps are the same either way
  if head_variants.mixes(head_variant):  # head variants: the maps the mixes give
    query, key, _, scale = attention_inputs(params, inputs_q, inputs_kv, scale=scale,
                                            qk_transform=qk_transform, head_variant=head_variant)
    logits_mix, weights_mix = head_variants.head_mixes(params, inputs_q, inputs_kv, head_variant)
    return head_variants.mixed_maps(query, key, bias, mask, logits_mix=logits_mix,
                                    weights_mix=weights_mix, scale=scale, is_causal=is_causal,
                                    logits_soft_cap=logits_soft_cap, **structure)
  logits = multi_head_attention_logits(params, inputs_q, inputs_kv, bias=bias, scale=scale,
                                       qk_transform=qk_transform,
                                       logits_soft_cap=logits_soft_cap, head_variant=head_variant)
  mask = attention_lib.structure_mask(mask, *logits.shape[-2:], **structure)
  return logits, reference.logits_to_weights(logits, mask, is_causal=is_causal)


def multi_head_attention_weights(params, inputs_q, inputs_kv=None, **options):
  """The softmax weights [..., N, T, S] that ``multi_head_attention`` applies (before dropout);
  ``options`` as ``attention_maps``.

  >>> multi_head_attention_weights(params, x).shape  # x [B, T, D_in], 8 heads -> (B, 8, T, T)
  """
  return attention_maps(params, inputs_q, inputs_kv, **options)[1]


class _Weights(nn.Module):
  """Holds one projection's kernel (and bias) and hands them back as a dict.

  The kernel is drawn as the matrix [prod(input dims), prod(output dims)] and reshaped, as
  ``flax.linen.DenseGeneral`` does, so fan-in and fan-out (and the initial scale of q . k) do not
  depend on how the output is split into heads.
  """
  kernel_shape: tuple[int, ...]
  input_dims: int  # how many leading kernel dims are contracted with the input
  bias_shape: tuple[int, ...]
  use_bias: bool
  kernel_init: Callable
  bias_init: Callable
  param_dtype: Any

  def _init_kernel(self, rng, shape, dtype):
    matrix = (math.prod(shape[:self.input_dims]), math.prod(shape[self.input_dims:]))
    return jnp.reshape(self.kernel_init(rng, matrix, dtype), shape)

  @nn.compact
  def __call__(self):
    weights = {"kernel": self.param("kernel", self._init_kernel, self.kernel_shape,
                                    self.param_dtype)}
    if self.use_bias:
      weights["bias"] = self.param("bias", self.bias_init, self.bias_shape, self.param_dtype)
    return weights


class _NormScale(nn.Module):
  """Holds the learned scale [H] of a QK LayerNorm (flax's LayerNorm(use_bias=False) layout)."""
  features: int
  param_dtype: Any

  @nn.compact
  def __call__(self):
    return {"scale": self.param("scale", nn.initializers.ones_init(), (self.features,),
                                self.param_dtype)}


class _VariantParams(nn.Module):
  """Holds the parameters a head variant adds, {name: array}, from head_variants.parameter_specs."""
  specs: Any  # ((name, shape, initializer), ...)
  param_dtype: Any

  @nn.compact
  def __call__(self):
    return {name: self.param(name, init, shape, self.param_dtype)
            for name, shape, init in self.specs}


class MultiHeadAttention(nn.Module):
  """Multi-head attention (Vaswani et al. 2017, section 3.2.2) as a Flax Linen module.

  Attributes:
    num_heads: N.
    d_model: total width of the projected queries/keys/values, N * H; default: input width.
    out_features: D_out; default: the width of inputs_q.
    scale: a number or "inv_sqrt" | "none" | "inv" | "learned" (per-head temperature, starting at
      1/sqrt(H)).
    dropout_rate: attention dropout; draws from the "dropout" rng when not deterministic.
    implementation: passed to ``dot_product_attention``.
    fused_qkv: one [D_in, 3, N, H] kernel for W_Q, W_K, W_V (self-attention only).
    qk_transform: optional (query, key) -> (query, key) hook, e.g. rotary encodings.
    normalize_qk: LayerNorm (no bias, learned scale [H]) on each head's queries and keys before
      the dot product, as flax's ``normalize_qk`` (Dehghani et al. 2023; Wortsman et al. 2023).
    attention_fn: replaces ``dot_product_attention`` (same signature), e.g.
      ``ContextParallel(mesh, axis_name)`` for a sequence sharded over a mesh axis.
    head_variant: a ``head_variants.HeadVariant`` (talking heads, DCMHA, MoH, overlapping
      heads); None: plain multi-head attention. Its parameters sit under params[variant name].

  When the "intermediates" collection is mutable, the logits and the weights [..., N, T, S] are
  sown there as "attention_logits" and "attention_weights", computed beside the output so the
  output does not change (with MoH also its "head_gates" [..., T, N], zero for the heads a token
  did not use). MoH sows its weighted load-balancing loss in the "losses" collection when that
  is mutable (the trainer adds it to the task loss).

  >>> layer = MultiHeadAttention(num_heads=8, d_model=256)  # embed 128 -> 8 heads of d_k = 32
  >>> variables = layer.init(jax.random.key(0), x)  # x: [B, T, 128]
  >>> y, state = layer.apply(variables, x, mutable="intermediates")  # y: [B, T, 128]
  """
  num_heads: int
  d_model: int | None = None
  out_features: int | None = None
  scale: float | str = "inv_sqrt"
  dropout_rate: float = 0.0
  implementation: str | None = None
  fused_qkv: bool = False
  use_bias: bool = True
  qk_transform: Callable | None = None
  normalize_qk: bool = False
  attention_fn: Callable | None = None
  head_variant: Any = None
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros_init()
  param_dtype: Any = jnp.float32

  def _weights(self, name, kernel_shape, bias_shape, input_dims=1):
    return _Weights(kernel_shape, input_dims, bias_shape, self.use_bias, self.kernel_init,
                    self.bias_init, self.param_dtype, name=name)()

  def _parameters(self, d_in: int, head_dim: int):
    heads = (self.num_heads, head_dim)
    d_out = self.out_features or d_in
    if self.fused_qkv:
      params = {"qkv": self._weights("qkv", (d_in, 3) + heads, (3,) + heads)}
    else:
      params = {name: self._weights(name, (d_in,) + heads, heads)
                for name in ("query", "key", "value")}
    width = head_variants.head_width(self.head_variant, head_dim)  # H, or H + 2o (MOHSA)
    params["out"] = self._weights("out", (self.num_heads, width, d_out), (d_out,), input_dims=2)
    if self.normalize_qk:
      for name in ("query_ln", "key_ln"):
        params[name] = _NormScale(width, self.param_dtype, name=name)()
    for group, specs in head_variants.parameter_specs(
        self.head_variant, in_features=d_in, num_heads=self.num_heads).items():
      params[group] = _VariantParams(tuple((name, shape, init) for name, (shape, init)
                                           in specs.items()), self.param_dtype, name=group)()
    if self.scale == "learned":
      params["temperature"] = self.param(
          "temperature", nn.initializers.constant(resolve_scale("learned", head_dim)),
          (self.num_heads,), self.param_dtype)
    return params

  @nn.compact
  def __call__(self, inputs_q, inputs_kv=None, *, mask=None, bias=None, is_causal=False,
               deterministic: bool = True, **attention_args):
    """inputs_q [..., T, D_in], inputs_kv [..., S, D_in] or None -> [..., T, D_out].

    ``attention_args``: further keyword arguments of ``multi_head_attention`` (sequence lengths,
    local window, soft cap, segment ids, return_residual)."""
    head_dim = head_dim_of(self.d_model or inputs_q.shape[-1], self.num_heads)
    resolve_scale(self.scale, head_dim)  # an unknown name fails before any parameter is made
    params = self._parameters(inputs_q.shape[-1], head_dim)
    dropout_rate = 0.0 if deterministic else self.dropout_rate
    dropout_rng = self.make_rng("dropout") if dropout_rate > 0.0 else None
    output = multi_head_attention(
        params, inputs_q, inputs_kv, mask=mask, bias=bias, scale=self.scale,
        is_causal=is_causal, qk_transform=self.qk_transform, dropout_rate=dropout_rate,
        dropout_rng=dropout_rng, implementation=self.implementation,
        attention_fn=self.attention_fn, head_variant=self.head_variant, **attention_args)
    if self.is_mutable_collection("intermediates"):
      logits, weights = attention_maps(params, inputs_q, inputs_kv, mask=mask, bias=bias,
                                       scale=self.scale, is_causal=is_causal,
                                       qk_transform=self.qk_transform,
                                       head_variant=self.head_variant, **attention_args)
      self.sow("intermediates", "attention_logits", logits)
      self.sow("intermediates", "attention_weights", weights)
    for collection, name, value in head_variants.sown(
        params, inputs_q, self.head_variant, self.num_heads,
        collections=[c for c in head_variants.SOWN if self.is_mutable_collection(c)]):
      self.sow(collection, name, value)
    return output
