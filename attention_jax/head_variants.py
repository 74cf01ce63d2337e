"""Four improvements of multi-head attention, as hooks of ``multihead.multi_head_attention``.

The hooks::

  head layout   overlapping heads (MOHSA, Zhang, Luo & Wang 2024): head n reads features
                n*H - o .. (n+1)*H + o of Q, K and V (zeros beyond the ends); W_O grows to
                [N, H + 2o, D_out].
  logits mix    talking heads (Shazeer et al. 2020) and DCMHA (Xiao et al. 2024): the logits of
  weights mix   all heads at one (query, key) pair are mixed before the softmax, the weights
                after it.
  head gate     MoH (Jin et al. 2024): a router scales each head's output per token before W_O;
                shared heads always on, the top-k of the others routed.

The papers: overlapping heads :ref:`Zhang et al. 2024 <ref-zhang2024>`, talking heads
:ref:`Shazeer et al. 2020 <ref-shazeer2020>`, DCMHA :ref:`Xiao et al. 2024 <ref-xiao2024>`, MoH
:ref:`Jin et al. 2024 <ref-jin2024>`.

Plain multi-head attention is every hook at its identity: overlap 0, identity mixes, gates 1.
Each variant follows its authors' code where it differs from the paper or from another port::

  talking heads  mesh-tensorflow's TalkingHeadsSelfAttention: mixes drawn at random (truncated
                 normal, variance 1/N), no bias in them; bias and mask added after the logits mix,
                 dropout after the weights mix. Its 1/sqrt(d_k) sits in W_Q's initialisation;
                 here it is the usual scale (the same function).
  DCMHA          DCFormer's JAX code (jax/MaxText/layers/dc_attentions.py), one head group: each
                 composition is the identity plus a static part drawn small (0.1 x Xavier) plus
                 dynamic parts drawn tiny, so a layer starts near, not exactly at, plain MHA; the
                 mask is applied again after the weights composition. Its PyTorch port
                 (pytorch/dcformer) drops the static part by default and draws the gates 10x
                 larger; the JAX training code is followed.
  MoH            MoH-ViT/attention.py: gates scaled by the head counts (shared, k, 2), which the
                 paper's formula lacks, so that a zero router gives gate 1; its load-balancing
                 loss, 0.01 x its mean over layers (MoH-ViT/engine.py).
  overlapping    MOHSA's models/vit.py: zero padding at the ends, the scale 1/sqrt(H) of the
                 unwidened heads, overlap = layer index ("index" schedule).

Shape letters: B batch dims (``...``), T queries, S keys, L either, N heads, H head dim,
D input width, I the rank of DCMHA's dynamic mixes, K the hidden width of its network.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from attention_jax import _checks
from attention_jax import attention as attention_lib
from attention_jax import reference

VARIANTS = ("mha", "talking_heads", "dcmha", "moh", "overlap")
# The variants that mix heads at every (query, key) pair: they need each head's logits there, which
# only the "reference" implementation forms (a blockwise kernel keeps one head's block at a time).
MIXING = ("talking_heads", "dcmha")
MIXING_IMPLEMENTATIONS = ("reference",)

# DCFormer's choices (jax/MaxText/layers/dc_attentions.py, AttentionOp.setup): rank I = 2 of each
# dynamic mix, hidden width K = 2 * I * N of the network that computes them.
DCMHA_RANK = 2
DCMHA_PARTS = ("pre_query", "pre_key", "post_query", "post_key")  # the code's order of the 4 splits
RMS_NORM_EPSILON = 1e-6  # flax.linen.RMSNorm's default, as DCFormer's dw1_norm uses it

# MoH's engine adds 0.01 x the layers' mean load-balancing loss to the task loss
# (MoH-ViT/engine.py); the trainer reads the sown terms from this collection.
LOAD_BALANCING_WEIGHT = 0.01
LOSSES = "losses"
SOWN = ("intermediates", LOSSES)  # the collections a layer may record in (see ``sown``)

# MOHSA's overlap per layer (layer index i of L), the eight paradigms its models/vit.py lists;
# "index" is the one it leaves uncommented.
OVERLAP_SCHEDULES = {
    "index": lambda i, L: i,
    "index_plus_one": lambda i, L: i + 1,
    "half_index": lambda i, L: i // 2,
    "half_index_plus_one": lambda i, L: i // 2 + 1,
    "reverse": lambda i, L: L - i - 1,
    "reverse_plus_one": lambda i, L: L - i,
    "half_reverse": lambda i, L: (L - i - 1) // 2,
    "half_reverse_plus_one": lambda i, L: (L - i - 1) // 2 + 1,
}


@dataclasses.dataclass(frozen=True)
class HeadVariant:
  """Which variant a multi-head attention layer runs, with its settings (hashable, static).

  Attributes:
    name: one of VARIANTS.
    shared_heads: MoH's always-on heads, the first ones; -1: N // 2 (MoH-LLaMA3's choice).
    routed_heads: MoH's k, how many of the other heads each token routes to; -1: N // 4, so that
      75% of the heads are active (MoH-LLaMA3).
    overlap: the features o that each head takes from each neighbour (overlapping heads).
    load_balancing_weight: MoH: the weight of the load-balancing loss sown for the trainer.

  >>> HeadVariant("moh").moh_heads(16)  # (shared, routed k, routed heads E)
  (8, 4, 8)
  """
  name: str = "mha"
  shared_heads: int = -1
  routed_heads: int = -1
  overlap: int = 0
  load_balancing_weight: float = LOAD_BALANCING_WEIGHT

  def __post_init__(self):
    if self.name not in VARIANTS:
      raise ValueError(f"unknown head variant {self.name!r}; use one of {list(VARIANTS)}.")
    if self.overlap < 0 or (self.overlap and self.name != "overlap"):
      raise ValueError(f"overlap={self.overlap} needs the 'overlap' variant and must be >= 0.")

  def moh_heads(self, num_heads: int) -> tuple[int, int, int]:
    """(shared heads, routed k, routed heads E = N - shared), defaults resolved and checked."""
    shared = num_heads // 2 if self.shared_heads < 0 else self.shared_heads
    routed = num_heads // 4 if self.routed_heads < 0 else self.routed_heads
    if not (0 <= shared < num_heads and 1 <= routed <= num_heads - shared):
      raise ValueError(
          f"MoH needs 0 <= shared_heads < num_heads and 1 <= routed_heads <= num_heads - "
          f"shared_heads, got shared={shared}, routed={routed} of num_heads={num_heads}; use "
          f"num_heads >= 4 for the defaults (N // 2 shared, N // 4 routed) or set both.")
    return shared, routed, num_heads - shared


def layer_variant(name: str, *, layer: int, num_layers: int, overlap_schedule: str = "index",
                  shared_heads: int = -1, routed_heads: int = -1) -> HeadVariant | None:
  """The variant of encoder layer ``layer`` (of ``num_layers``); None for plain MHA.

  >>> layer_variant("overlap", layer=1, num_layers=2).overlap  # MOHSA's schedule: o = index
  1
  """
  if name not in VARIANTS:
    raise ValueError(f"unknown head variant {name!r}; use one of {list(VARIANTS)}.")
  if overlap_schedule not in OVERLAP_SCHEDULES:
    raise ValueError(f"unknown overlap schedule {overlap_schedule!r}; use one of "
                     f"{sorted(OVERLAP_SCHEDULES)}.")
  if name == "mha":
    return None
  overlap = OVERLAP_SCHEDULES[overlap_schedule](layer, num_layers) if name == "overlap" else 0
  return HeadVariant(name, shared_heads=shared_heads, routed_heads=routed_heads, overlap=overlap)


def _name(variant: HeadVariant | None) -> str:
  return "mha" if variant is None else variant.name


def mixes(variant: HeadVariant | None) -> bool:
  """Whether the variant mixes heads at each (query, key) pair (needs every head's logits)."""
  return _name(variant) in MIXING


# ------------------------------------------------------------------------------------------------
# Parameters: one spec for the Linen and the NNX shells, so their trees are the same.

def _truncated_normal_fan_in(key, shape, dtype=jnp.float32):
  """mesh-tensorflow's default VarianceScalingInitializer: truncated normal, variance 1/fan_in."""
  return jax.nn.initializers.lecun_normal()(key, shape, dtype)


def _torch_linear_init(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default kernel: uniform in +-1/sqrt(fan_in) (MoH's routers)."""
  return jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")(key, shape, dtype)


def parameter_specs(variant: HeadVariant | None, *, in_features: int,
                    num_heads: int) -> dict[str, dict[str, tuple[tuple[int, ...], object]]]:
  """{group: {name: (shape, initializer)}}: the parameters a variant adds to multi-head attention,
  held under params[group]. Initialisers as in each variant's code.

  >>> sorted(parameter_specs(HeadVariant("talking_heads"), in_features=8, num_heads=4)
  ...        ["talking_heads"])
  ['logits_mix', 'weights_mix']
  """
  name, n, d = _name(variant), num_heads, in_features
  if name == "talking_heads":  # mesh-tensorflow: mtf.layers.dense's default, no bias
    return {name: {"logits_mix": ((n, n), _truncated_normal_fan_in),
                   "weights_mix": ((n, n), _truncated_normal_fan_in)}}
  if name == "dcmha":  # DCFormer's DynamicWeightProjection and CrossHeadProjection, one group
    rank, hidden = DCMHA_RANK, 2 * DCMHA_RANK * n
    normal = jax.nn.initializers.normal
    static = ((n, n), normal(math.sqrt(2.0 / (n + n)) * 0.1))
    return {name: {
        "dw1": ((d, len(DCMHA_PARTS), hidden), normal(math.sqrt(2.0 / (d + hidden)))),
        "qkw": ((len(DCMHA_PARTS), hidden, 2 * rank, n),
                normal(math.sqrt(1.0 / hidden) * 2.0 / (n + rank) * 0.01)),
        "dd": ((d, len(DCMHA_PARTS), n), normal(math.sqrt(2.0 / (d + n)) * 0.005)),
        "pre_static": static, "post_static": static}}
  if name == "moh":  # MoH-ViT/attention.py: wg, wg_1 (more than one shared head), wg_0
    shared, _, routed = variant.moh_heads(n)
    group = {"router": ((d, routed), _torch_linear_init)}
    if shared > 1:
      group["shared_router"] = ((d, shared), _torch_linear_init)
    if shared > 0:
      group["mix_router"] = ((d, 2), _torch_linear_init)
    return {name: group}
  return {}


def head_width(variant: HeadVariant | None, head_dim: int) -> int:
  """The width of each head after the layout hook: H + 2o for overlapping heads, else H."""
  return head_dim + 2 * variant.overlap if _name(variant) == "overlap" else head_dim


# ------------------------------------------------------------------------------------------------
# Head layout: overlapping heads.

def overlapping_heads(x, overlap: int):
  """Each head widened by ``overlap`` features of each neighbour, zeros beyond the ends (MOHSA's
  ``overlapping_heads``): [..., L, N, H] -> [..., L, N, H + 2o].

  >>> x = jnp.arange(1.0, 7.0).reshape(1, 3, 2)  # one position, 3 heads of 2 features
  >>> overlapping_heads(x, 1)[0]
  Array([[0., 1., 2., 3.],
         [2., 3., 4., 5.],
         [4., 5., 6., 0.]], dtype=float32)
  """
  num_heads, head_dim = x.shape[-2:]
  flat = jnp.reshape(x, x.shape[:-2] + (num_heads * head_dim,))  # [..., L, N * H]
  padded = jnp.pad(flat, [(0, 0)] * (flat.ndim - 1) + [(overlap, overlap)])  # [..., L, NH + 2o]
  index = head_dim * jnp.arange(num_heads)[:, None] + jnp.arange(head_dim + 2 * overlap)
  return padded[..., index]  # [..., L, N, H + 2o]


def head_layout(variant: HeadVariant | None, query, key, value):
  """The layout hook on the projected query [..., T, N, H], key and value [..., S, K, H]."""
  if _name(variant) != "overlap" or variant.overlap == 0:
    return query, key, value
  if key.shape[-2] != query.shape[-2]:
    raise ValueError(
        f"overlapping heads slice Q, K and V alike, so they need as many key/value heads as query "
        f"heads, got {key.shape[-2]} and {query.shape[-2]}; set num_kv_heads = num_heads.")
  return tuple(overlapping_heads(x, variant.overlap) for x in (query, key, value))


# ------------------------------------------------------------------------------------------------
# Logits and weights mixes: talking heads, DCMHA.

def mix_heads(maps, matrix):
  """out_m = sum_n maps_n P[n, m] at every (query, key) pair: [..., N, T, S], P [N, M] ->
  [..., M, T, S] (mesh-tensorflow's talking-heads projection, reducing the input heads).

  >>> maps = jnp.arange(2.0).reshape(2, 1, 1)  # head 0: 0, head 1: 1
  >>> mix_heads(maps, jnp.array([[1.0, 0.0], [2.0, 3.0]]))[:, 0, 0]  # [0 + 2, 0 + 3]
  Array([2., 3.], dtype=float32)
  """
  return jnp.einsum("...nts,nm->...mts", maps, matrix.astype(maps.dtype))


def _rms_normalize(x, epsilon: float = RMS_NORM_EPSILON):
  """RMSNorm without scale over the last axis."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + epsilon)


def dcmha_dynamic_weights(params, x):
  """DCFormer's DynamicWeightProjection: from the attention input x [..., L, D], for each of
  DCMHA_PARTS (pre/post composition, query-/key-wise), low-rank mixes w1, w2 [..., L, I, N]
  (w1 RMS-normalised over heads) and gates dd [..., L, N] (tanh).

  Returns {part: (w1, w2, dd)}.

  >>> specs = parameter_specs(HeadVariant("dcmha"), in_features=8, num_heads=4)["dcmha"]
  >>> params = {k: init(jax.random.key(0), shape) for k, (shape, init) in specs.items()}
  >>> w1, w2, dd = dcmha_dynamic_weights(params, jnp.ones((5, 8)))["pre_query"]
  >>> w1.shape, w2.shape, dd.shape  # [L, I, N], [L, I, N], [L, N]
  ((5, 2, 4), (5, 2, 4), (5, 4))
  """
  dtype = reference.compute_dtype(x.dtype)
  x = x.astype(dtype)
  hidden = jax.nn.gelu(jnp.einsum("...ld,dck->...lck", x, params["dw1"].astype(dtype)))
  w = jnp.einsum("...lck,ckim->...lcim", hidden, params["qkw"].astype(dtype))  # [..., L, 4, 2I, N]
  w1, w2 = _rms_normalize(w[..., :DCMHA_RANK, :]), w[..., DCMHA_RANK:, :]
  dd = jnp.tanh(jnp.einsum("...ld,dcm->...lcm", x, params["dd"].astype(dtype)))  # [..., L, 4, N]
  return {part: (w1[..., c, :, :], w2[..., c, :, :], dd[..., c, :])
          for c, part in enumerate(DCMHA_PARTS)}


def dcmha_compose(maps, static, query_wise, key_wise):
  """One composition of DCMHA (DCFormer's CrossHeadProjection) at every (query, key) pair:

    out_m = maps_m + sum_n maps_n (static[n, m] + sum_i qw1[t,i,n] qw2[t,i,m]
                                   + sum_i kw1[s,i,n] kw2[s,i,m]) + maps_m (qdd[t,m] + kdd[s,m])

  maps [..., N, T, S], static [N, N], query_wise (qw1, qw2 [..., T, I, N], qdd [..., T, N]),
  key_wise the same over S -> [..., N, T, S]. All zeros but the identity leaves the maps as they
  are (plain MHA).

  >>> maps = jnp.ones((2, 3, 3))  # [N, T, S]
  >>> zeros = (jnp.zeros((3, 2, 2)), jnp.zeros((3, 2, 2)), jnp.zeros((3, 2)))
  >>> bool(jnp.all(dcmha_compose(maps, jnp.zeros((2, 2)), zeros, zeros) == maps))
  True
  """
  out = maps + mix_heads(maps, static)
  (qw1, qw2, qdd), (kw1, kw2, kdd) = query_wise, key_wise
  cast = lambda a: a.astype(maps.dtype)
  hidden = jnp.einsum("...nts,...tin->...its", maps, cast(qw1))  # [..., I, T, S]
  out = out + jnp.einsum("...its,...tim->...mts", hidden, cast(qw2))
  hidden = jnp.einsum("...nts,...sin->...its", maps, cast(kw1))
  out = out + jnp.einsum("...its,...sim->...mts", hidden, cast(kw2))
  out = out + maps * jnp.swapaxes(cast(qdd), -1, -2)[..., :, :, None]  # [..., N, T, 1]
  return out + maps * jnp.swapaxes(cast(kdd), -1, -2)[..., :, None, :]  # [..., N, 1, S]


def head_mixes(params, inputs_q, inputs_kv, variant: HeadVariant | None):
  """(logits mix, weights mix): functions [..., N, T, S] -> [..., N, T, S] for a mixing variant.

  Talking heads: static [N, N] matrices, no bias (mesh-tensorflow). DCMHA: identity + static +
  dynamic parts computed from the attention input; self-attention only (DCFormer computes the
  key-wise parts of cross-attention with a second network, not built here).
  """
  name = _name(variant)
  if name == "talking_heads":
    group = params["talking_heads"]
    return (functools.partial(mix_heads, matrix=group["logits_mix"]),
            functools.partial(mix_heads, matrix=group["weights_mix"]))
  if inputs_kv is not None and inputs_kv is not inputs_q:
    raise ValueError("DCMHA composes heads from the one input of self-attention; call it with "
                     "inputs_kv=None (DCFormer's cross-attention variant is not built here).")
  group = params["dcmha"]
  dynamic = dcmha_dynamic_weights(group, inputs_q)  # queries and keys are the same positions
  return tuple(functools.partial(dcmha_compose, static=group[f"{stage}_static"],
                                 query_wise=dynamic[f"{stage}_query"],
                                 key_wise=dynamic[f"{stage}_key"]) for stage in ("pre", "post"))


def _apply_weights(weights, value):
  """sum_s w[n, t, s] v[s, n // G] per head: [..., N, T, S], [..., S, K, H] -> [..., T, N, H]."""
  num_kv_heads = value.shape[-2]
  grouped = jnp.reshape(weights, weights.shape[:-3] + (num_kv_heads, -1) + weights.shape[-2:])
  out = jnp.einsum("...kgts,...ksh->...kgth", grouped,
                   reference.heads_first(value).astype(weights.dtype))  # [..., K, G, T, H]
  return reference.heads_first(jnp.reshape(out, out.shape[:-4] + (-1,) + out.shape[-2:]))


def mixed_maps(query, key, bias=None, mask=None, *, logits_mix, weights_mix, scale: float,
               is_causal: bool = False, logits_soft_cap: float | None = None, **structure):
  """(logits, weights) [..., N, T, S] that a mixing variant applies: the logits the softmax sees
  (mixed, then bias added, as mesh-tensorflow and DCFormer add bias and mask after the mix;
  unmasked) and the mixed weights, zero where the mask rules a pair out (DCFormer masks again
  after the mix). The weights can be negative and need not sum to one.
  """
  logits = logits_mix(reference.attention_logits(query, key, scale=scale,
                                                 logits_soft_cap=logits_soft_cap))
  logits = logits if bias is None else logits + bias
  mask = attention_lib.structure_mask(mask, *logits.shape[-2:], **structure)
  weights = weights_mix(reference.logits_to_weights(logits, mask, is_causal=is_causal))
  allowed = reference.mask_logits(jnp.zeros(logits.shape[-2:]), mask, is_causal=is_causal) == 0
  return logits, jnp.where(allowed, weights, 0.0)


def mixed_attention(query, key, value, bias=None, mask=None, *, logits_mix, weights_mix,
                    scale: float | None = None, is_causal: bool = False,
                    dropout_rate: float = 0.0, dropout_rng=None, return_weights: bool = False,
                    return_residual: bool = False, implementation: str | None = None,
                    logits_soft_cap: float | None = None, **structure):
  """Attention whose heads talk: ``dot_product_attention``'s signature and contract, with the
  logits mixed across heads before the softmax and the weights after it (``mixed_maps``).

  query [..., T, N, H], key [..., S, K, H], value [..., S, K, H_v] -> [..., T, N, H_v] (and the
  mixed weights [..., N, T, S] with ``return_weights``). Dropout acts on the mixed weights
  (mesh-tensorflow). Only ``implementation`` None or "reference" can serve it.

  >>> q = k = v = jnp.ones((6, 2, 4))  # [T, N, H]
  >>> swap = jnp.array([[0.0, 1.0], [1.0, 0.0]])
  >>> mix = functools.partial(mix_heads, matrix=swap)
  >>> mixed_attention(q, k, v, logits_mix=mix, weights_mix=mix, is_causal=True).shape
  (6, 2, 4)
  """
  if implementation not in (None,) + MIXING_IMPLEMENTATIONS:
    raise ValueError(
        f"implementation={implementation!r} cannot serve talking heads or DCMHA: they mix every "
        f"head's logits at each (query, key) pair, which only {list(MIXING_IMPLEMENTATIONS)} "
        f"forms; use implementation=None or 'reference'.")
  if return_residual:
    raise ValueError("return_residual: the mixed weights are no softmax, so there is no "
                     "log-sum-exp to return; call without it.")
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  _checks.check_qkv(query, key, value)
  target = query.shape[:-3] + (query.shape[-2], query.shape[-3], key.shape[-3])  # [..., N, T, S]
  _checks.check_mask_and_bias(mask, bias, target)
  if dropout_rate > 0.0 and dropout_rng is None:
    raise ValueError(f"dropout_rate={dropout_rate} needs a dropout_rng (a jax.random key).")
  scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
  _, weights = mixed_maps(query, key, bias, mask, logits_mix=logits_mix, weights_mix=weights_mix,
                          scale=scale, is_causal=is_causal, logits_soft_cap=logits_soft_cap,
                          **structure)
  attended = weights
  if dropout_rate > 0.0:
    attended = reference.dropout_weights(weights, dropout_rate, dropout_rng)
  output = _apply_weights(attended, value).astype(query.dtype)  # [..., T, N, H_v]
  return (output, weights) if return_weights else output


def attention_fn(params, inputs_q, inputs_kv, variant: HeadVariant | None, attention_fn=None):
  """The attention function a layer runs: ``attention_fn`` (None: dot_product_attention) for the
  variants that do not mix heads; ``mixed_attention`` with the variant's mixes for those that do
  (which refuse another attention_fn, e.g. context-parallel attention, in one line)."""
  if not mixes(variant):
    return attention_fn or attention_lib.dot_product_attention
  if attention_fn is not None:
    raise ValueError(f"head variant {variant.name!r} mixes heads at each (query, key) pair and "
                     f"runs its own attention; leave attention_fn=None (got {attention_fn!r}).")
  logits_mix, weights_mix = head_mixes(params, inputs_q, inputs_kv, variant)
  return functools.partial(mixed_attention, logits_mix=logits_mix, weights_mix=weights_mix)


# ------------------------------------------------------------------------------------------------
# Head gate: MoH.

def moh_router(params, x, variant: HeadVariant, num_heads: int):
  """MoH's gates (MoH-ViT/attention.py): x [..., T, D] -> gates [..., T, N], the routed heads'
  router probabilities and which of them each token chose, [..., T, E] each (E = N - shared).

  Shared heads (the first ones) get softmax(x W_s) * shared, routed heads the top-k of
  softmax(x W_r) renormalised to sum to one, times k; with shared heads, the two groups are
  weighted by softmax(x W_h) * 2. The code's scaling by the counts (not in the paper's formula)
  makes a zero router give every active head gate 1: plain MHA when k = E.

  >>> variant = HeadVariant("moh", shared_heads=2, routed_heads=2)
  >>> specs = parameter_specs(variant, in_features=8, num_heads=6)["moh"]
  >>> params = {k: jnp.zeros(shape) for k, (shape, _) in specs.items()}  # a zero router
  >>> gates, probs, chosen = moh_router(params, jnp.ones((3, 8)), variant, num_heads=6)
  >>> gates[0]  # 2 shared + 2 of the 4 routed heads, each at gate 1
  Array([1., 1., 1., 1., 0., 0.], dtype=float32)
  """
  dtype = reference.compute_dtype(x.dtype)
  x = x.astype(dtype)
  shared, k, routed = variant.moh_heads(num_heads)
  probs = jax.nn.softmax(x @ params["router"].astype(dtype), axis=-1)  # [..., T, E]
  _, chosen_index = jax.lax.top_k(probs, k)  # [..., T, k]
  chosen = jnp.sum(jax.nn.one_hot(chosen_index, routed, dtype=dtype), axis=-2)  # [..., T, E]
  routed_gates = probs * chosen
  routed_gates = routed_gates / jnp.maximum(jnp.sum(routed_gates, axis=-1, keepdims=True),
                                            jnp.finfo(dtype).eps) * k
  if shared == 0:
    return routed_gates, probs, chosen > 0
  if shared > 1:
    shared_gates = jax.nn.softmax(x @ params["shared_router"].astype(dtype), axis=-1) * shared
  else:
    shared_gates = jnp.ones(x.shape[:-1] + (1,), dtype)
  groups = jax.nn.softmax(x @ params["mix_router"].astype(dtype), axis=-1) * 2  # [..., T, 2]
  gates = jnp.concatenate([shared_gates * groups[..., :1], routed_gates * groups[..., 1:]], -1)
  return gates, probs, chosen > 0


def load_balancing_loss(probs, chosen):
  """MoH's load-balancing loss E * sum_e mean_t(p_e) * mean_t(chosen_e) over every token of
  probs, chosen [..., T, E] (MoH-ViT/attention.py: mean(me * ce) * E * E). At a uniform router
  it is k, whatever the choice.

  >>> probs = jnp.full((4, 3), 1 / 3)  # uniform over 3 routed heads
  >>> chosen = jnp.array([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 0]], bool)  # k = 2
  >>> float(load_balancing_loss(probs, chosen))
  2.0
  """
  routed = probs.shape[-1]
  flat = lambda a: jnp.reshape(a.astype(jnp.float32), (-1, routed))
  return routed * jnp.sum(jnp.mean(flat(probs), axis=0) * jnp.mean(flat(chosen), axis=0))


def head_gates(params, inputs_q, variant: HeadVariant | None, num_heads: int):
  """MoH's gates [..., T, N] of the heads at each query, or None for the other variants."""
  if _name(variant) != "moh":
    return None
  return moh_router(params["moh"], inputs_q, variant, num_heads)[0]


def gate_heads(params, inputs_q, heads, variant: HeadVariant | None):
  """The head-gate hook: each head's output [..., T, N, H] times its gate (MoH), before W_O."""
  gates = head_gates(params, inputs_q, variant, heads.shape[-2])
  return heads if gates is None else heads * gates[..., None].astype(heads.dtype)


def sown(params, inputs_q, variant: HeadVariant | None, num_heads: int, *, collections):
  """What a layer records beside its output, as (collection, name, value) for the collections
  in ``collections`` (a subset of SOWN): MoH's gates [..., T, N] as "head_gates" (which heads
  each token used) and its weighted load-balancing loss as "load_balancing"."""
  if _name(variant) != "moh" or not collections:
    return []
  gates, probs, chosen = moh_router(params["moh"], inputs_q, variant, num_heads)
  loss = variant.load_balancing_weight * load_balancing_loss(probs, chosen)
  return [(collection, name, value) for collection, name, value in (
      ("intermediates", "head_gates", gates), (LOSSES, "load_balancing", loss))
          if collection in collections]


def auxiliary_loss(collections) -> jax.Array:
  """The mean over layers of the terms sown in the LOSSES collection (0 when none are), as MoH's
  engine averages its layers' load-balancing losses.

  >>> auxiliary_loss({"losses": {"block_0": {"load_balancing": (jnp.array(2.0),)}}})
  Array(2., dtype=float32)
  """
  terms = jax.tree.leaves(collections.get(LOSSES, {}))
  return jnp.mean(jnp.stack(terms)) if terms else jnp.zeros((), jnp.float32)
