"""Overlapping heads (MOHSA, :ref:`Zhang et al. 2024 <ref-zhang2024>`), as its models/vit.py
computes them: head n reads features n*H - o .. (n+1)*H + o of Q, K and V (zeros beyond the
ends), so W_O grows to [N, H + 2o, D_out]; the scale stays 1/sqrt(H) of the unwidened heads; the
overlap o of each layer follows a schedule of the layer index ("index", the one its code leaves
uncommented, by default).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from attention_jax.variants import base

# MOHSA's overlap per layer (layer index i of L), the eight paradigms its models/vit.py lists.
SCHEDULES = {
    "index": lambda i, L: i,
    "index_plus_one": lambda i, L: i + 1,
    "half_index": lambda i, L: i // 2,
    "half_index_plus_one": lambda i, L: i // 2 + 1,
    "reverse": lambda i, L: L - i - 1,
    "reverse_plus_one": lambda i, L: L - i,
    "half_reverse": lambda i, L: (L - i - 1) // 2,
    "half_reverse_plus_one": lambda i, L: (L - i - 1) // 2 + 1,
}


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


@base.register
@dataclasses.dataclass(frozen=True)
class Overlap(base.Variant):
  """Overlapping heads with ``overlap`` o features taken from each neighbour (0: plain MHA).

  >>> Overlap.for_layer(layer=3, num_layers=4, schedule="half_index").overlap
  1
  """
  name = "overlap"
  overlap: int = 0

  def __post_init__(self):
    if self.overlap < 0:
      raise ValueError(f"overlap must be >= 0, got {self.overlap}.")

  @classmethod
  def for_layer(cls, *, layer, num_layers, schedule="index", **options):
    """The overlap of layer ``layer`` from a per-layer ``schedule`` (the only option)."""
    if options:
      raise ValueError(f"head variant 'overlap' takes the option 'schedule' (one of "
                       f"{sorted(SCHEDULES)}), got {sorted(options)}.")
    if schedule not in SCHEDULES:
      raise ValueError(f"unknown overlap schedule {schedule!r}; use one of "
                       f"{sorted(SCHEDULES)}.")
    return cls(overlap=SCHEDULES[schedule](layer, num_layers))

  def value_dim(self, head_dim):
    return head_dim + 2 * self.overlap

  def identity(self, params):  # overlap 0: the heads as they were, W_O back to [N, H, D]
    o = self.overlap
    kernel = params["out"]["kernel"]  # [N, H + 2o, D]
    out = {**params["out"], "kernel": kernel[:, o:kernel.shape[1] - o]}
    return Overlap(0), {**params, "out": out}

  def layout(self, query, key, value):
    if self.overlap == 0:
      return query, key, value
    if key.shape[-2] != query.shape[-2]:
      raise ValueError(
          f"overlapping heads slice Q, K and V alike, so they need as many key/value heads as "
          f"query heads, got {key.shape[-2]} and {query.shape[-2]}; set num_kv_heads = num_heads.")
    return tuple(overlapping_heads(x, self.overlap) for x in (query, key, value))
