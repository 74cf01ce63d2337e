"""The attention maps at the hook points ``attn.hook_attn_scores`` and ``attn.hook_pattern``:
patched on the path that forms them, or captured for chosen query rows from the log-sum-exp a
kernel returns (the blockwise kernels never form [T, S]; only the R rows asked for are formed).

Shape letters: T queries, S keys, R query rows, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax.numpy as jnp

from attention_jax import attention as attention_lib
from attention_jax import hooks as hooks_lib
from attention_jax import reference

SCORES, PATTERN = hooks_lib.MAPS
#: The arguments that shape a map beyond mask, bias and is_causal: recomputed rows refuse them.
_STRUCTURE = ("query_seq_lengths", "key_value_seq_lengths", "local_window_size",
              "query_segment_ids", "key_segment_ids", "score_mod", "mask_mod", "block_mask",
              "sinks")


def maps_patched() -> bool:
  """Whether the running ``hooks.patch`` replaces this layer's logits or weights."""
  return any(hooks_lib.patched(name) for name in hooks_lib.MAPS)


def maps_asked() -> bool:
  """Whether the running ``hooks.capture`` or ``hooks.patch`` reads this layer's maps."""
  return any(hooks_lib.asks(name) for name in hooks_lib.MAPS)


def patched_attention(query, key, value, *, bias, mask, scale, is_causal, variant_hooks,
                      **arguments):
  """``dot_product_attention`` on the "reference" path (the one that forms every map) with the
  hook points on its logits (after the bias, before the mask) and weights (before dropout):
  query [..., T, N, H], key and value [..., S, K, H] -> [..., T, N, H] (and the extras asked)."""
  if variant_hooks is not None:
    raise ValueError("this head variant forms its own maps, which hook_attn_scores and "
                     "hook_pattern cannot replace; patch hook_q, hook_k, hook_v or hook_z.")
  if arguments.get("score_mod") is not None and hooks_lib.patched(SCORES):
    raise ValueError("hook_attn_scores is the logits before score_mod; patch it without a "
                     "score_mod, or fold the score_mod into the patch.")
  folded = lambda logits: logits if bias is None else logits + bias
  hooks = reference.Hooks(logits=lambda logits: hooks_lib.point(SCORES, folded(logits)),
                          weights=lambda weights: hooks_lib.point(PATTERN, weights))
  arguments["implementation"] = "reference"
  return attention_lib.dot_product_attention(query, key, value, None, mask, scale=scale,
                                             is_causal=is_causal, hooks=hooks, **arguments)


def rows_from_residual(query, key, residual, rows, *, scale, bias=None, mask=None,
                       is_causal: bool = False, logits_soft_cap=None, **structure):
  """The logits (after the bias, before the mask) and the weights of query ``rows`` [R], each
  [..., N, R, S], exactly from the kernel's log-sum-exp ``residual`` [..., T, N]: weights =
  exp(masked logits - lse). query [..., T, N, H], key [..., S, K, H].

  >>> q, k = jnp.ones((1, 6, 2, 4)), jnp.ones((1, 6, 2, 4))  # [B, T, N, H], [B, S, K, H]
  >>> _, lse = attention_lib.dot_product_attention(q, k, k, is_causal=True, return_residual=True)
  >>> logits, weights = rows_from_residual(q, k, lse, jnp.array([2]), scale=0.5, is_causal=True)
  >>> weights[0, 0, 0].round(3)  # row 2 attends to keys 0, 1, 2 equally
  Array([0.333, 0.333, 0.333, 0.   , 0.   , 0.   ], dtype=float32)
  """
  used = sorted(name for name in _STRUCTURE if structure.get(name) is not None)
  if used:
    raise ValueError(f"query_rows maps read mask, bias and is_causal, and this call sets "
                     f"{used[0]}; capture the maps without query_rows (every row, densely).")
  rows = jnp.atleast_1d(jnp.asarray(rows))
  take_rows = lambda x: x if x is None or jnp.ndim(x) < 2 or jnp.shape(x)[-2] == 1 else (
      jnp.take(x, rows, axis=-2))
  logits = reference.attention_logits(jnp.take(query, rows, axis=-3), key, scale=scale,
                                      logits_soft_cap=logits_soft_cap)  # [..., N, R, S]
  bias, mask = take_rows(bias), take_rows(mask)
  logits = logits if bias is None else logits + bias
  if is_causal:  # top-left aligned: row t sees keys s <= t
    causal = rows[:, None] >= jnp.arange(key.shape[-3])[None, :]  # [R, S]
    mask = causal if mask is None else causal & (jnp.asarray(mask) != 0)
  masked = reference.mask_logits(logits, None if mask is None else jnp.asarray(mask) != 0)
  lse = jnp.swapaxes(jnp.take(residual, rows, axis=-2), -1, -2)[..., None]  # [..., N, R, 1]
  return logits, jnp.exp(masked - reference.lse_of(lse.astype(masked.dtype)))
