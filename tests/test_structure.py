"""The structure's translation into pair predicates and block kinds: the kinds each structure
gives are make_block_mask's of its own mask_mod (exact, or sound where ids mix within blocks),
and their combination is empty where one is, full where all are."""

import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import structure

B, T, S, N = 2, 40, 36, 4  # T, S not multiples of the blocks


def late_start(b, h, q_idx, kv_idx):  # rows 0-5 of head 0 attend to nothing
  return (q_idx > 5) | (h > 0)


@pytest.mark.parametrize("is_causal, window", [
    (True, None), (False, (5, 3)), (True, (20, 40)), (False, (0, 9)), (False, (12, 0)),
    (True, (3, 7))])
def test_causal_and_windows_skip_the_blocks_they_empty(is_causal, window):
  """The band's kinds of blocks (its block predicate at each block's index range) are
  make_block_mask's of its pair predicate, at square and oblong blocks."""
  for blocks in [(16, 16), (16, 8)]:
    mask_mod, block_mask = structure.translate((1,), T, S, blocks, is_causal=is_causal,
                                               window=window)
    want = aj.make_block_mask(block_mask.mask_mod, None, None, T, S, block_size=blocks).kinds
    np.testing.assert_array_equal(block_mask.kinds, want, err_msg=str(blocks))
    assert mask_mod is None


def test_the_band_is_the_reach_of_the_causal_mask_and_the_window():
  """The band's predicate at single positions keeps exactly the keys within (before, after) of
  the query, the causal mask capping after at 0."""
  query, key = np.arange(30)[:, None], np.arange(30)[None, :]
  for is_causal, window in [(True, None), (False, (4, 2)), (True, (4, 2)), (False, (3, 0))]:
    before, after = structure.reach(is_causal, window)
    want = ((key - query <= (np.inf if after is None else after))
            & (query - key <= (np.inf if before is None else before)))
    got = aj.masks.combine_masks(*structure.band_meets(query, query, key, key, (before, after)))
    np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want)


def test_the_structure_arrays_skip_the_blocks_they_empty():
  """Lengths, segment ids and a mask give kinds of blocks (at blocks of 16 here) that are
  make_block_mask's of their mask_mods: equal for lengths, a mask, and segment ids constant over
  blocks or sorted (packed); for ids mixed within blocks never wrongly empty or full. Combined:
  empty where one is empty, full where all are full, never full beside a mask_mod whose kinds
  are unknown."""
  rng = np.random.default_rng(7)
  ids = lambda low, high, length: rng.integers(low, high, (B, length))
  packed = np.sort(ids(0, 4, T), axis=1), np.sort(ids(0, 4, S), axis=1)
  permuted = (np.repeat([[3, 1, 2], [0, 2, 1]], 16, axis=1)[:, :T],  # constant over blocks
              np.repeat([[2, 3, 1], [1, 0, 2]], 16, axis=1)[:, :S])
  mixed = ids(0, 3, T), ids(0, 3, S)
  lengths = dict(lengths=(jnp.array([40, 17]), jnp.array([30, 5])))
  cases = [dict(lengths=(None, jnp.array([30, 5]))), dict(lengths=(jnp.array([40, 17]), None)),
           dict(mask=jnp.asarray(rng.random((B, N, T, S)) < 0.97)),
           dict(mask=jnp.arange(S) < 20), dict(segment_ids=tuple(map(jnp.asarray, packed))),
           dict(segment_ids=tuple(map(jnp.asarray, permuted))),
           dict(segment_ids=tuple(map(jnp.asarray, mixed)))]
  for case in cases:
    mask_mod, block_mask = structure.translate((B,), T, S, (16, 16), **case)
    want = np.asarray(aj.make_block_mask(block_mask.mask_mod, B, N, T, S, block_size=16).kinds)
    got = np.broadcast_to(np.asarray(block_mask.kinds), want.shape)
    assert mask_mod is None and block_mask.kinds.shape[2:] == want.shape[2:]
    if case is cases[-1]:  # ids mixed within blocks: sound
      assert np.all((got == 0) <= (want == 0)) and np.all((got == 2) <= (want == 2))
    else:
      np.testing.assert_array_equal(got, want, err_msg=str(sorted(case)))
  _, block_mask = structure.translate((B,), T, S, (16, 16), is_causal=True, **lengths)
  want = aj.make_block_mask(block_mask.mask_mod, B, None, T, S, block_size=16).kinds
  np.testing.assert_array_equal(block_mask.kinds, want)
  assert np.min(want) == 0 and np.max(want) == 2
  mask_mod, block_mask = structure.translate((B,), T, S, (16, 16), mask_mod=late_start,
                                             **lengths)
  assert mask_mod is None and np.max(block_mask.kinds) == 1 and np.min(block_mask.kinds) == 0
  assert structure.translate((B,), T, S, (16, 16), mask_mod=late_start) == (late_start, None)
