"""FlexAttention's mask tools: and_masks, or_masks, noop_mask and create_mask against numpy; a
BlockMask indexed by example and head, cut to a shorter length, converted to and from per-row
lists of key blocks, and drawn; and, where torch is installed, torch's own functions."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import attention_jax as aj
from attention_jax import blocks

pytestmark = pytest.mark.quick

T = 48
DOCUMENTS = np.repeat([0, 1, 2], [10, 22, 16])
causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
same_document = lambda b, h, q_idx, kv_idx: jnp.asarray(DOCUMENTS)[q_idx] == jnp.asarray(  # noqa: E731
    DOCUMENTS)[kv_idx]
per_head_window = lambda b, h, q_idx, kv_idx: q_idx - kv_idx < 4 + 8 * h + 3 * b  # noqa: E731


def _dense(fn, batch=1, heads=1, q_len=T, kv_len=T):
  """fn evaluated by numpy broadcasting, [B, N, T, S]."""
  b, h, q, kv = np.ogrid[:batch, :heads, :q_len, :kv_len]
  return np.broadcast_to(fn(b, h, q, kv), (batch, heads, q_len, kv_len))


def test_and_or_and_noop_combine_as_numpy_does():
  q, kv = np.arange(T)[:, None], np.arange(T)
  both = _dense(lambda b, h, q, kv: (q >= kv) & (DOCUMENTS[q] == DOCUMENTS[kv]))
  either = _dense(lambda b, h, q, kv: (q >= kv) | (DOCUMENTS[q] == DOCUMENTS[kv]))
  np.testing.assert_array_equal(aj.create_mask(aj.and_masks(causal, same_document), 1, 1, T, T),
                                both)
  np.testing.assert_array_equal(aj.create_mask(aj.or_masks(causal, same_document), 1, 1, T, T),
                                either)
  assert bool(jnp.all(aj.create_mask(aj.noop_mask, 2, 3, 5, 7)))
  assert aj.create_mask(aj.noop_mask, 2, 3, 5, 7).shape == (2, 3, 5, 7)
  assert bool(jnp.all(aj.create_mask(aj.and_masks(), None, None, 4, 4)))  # torch: every pair
  assert not bool(jnp.any(aj.create_mask(aj.or_masks(), None, None, 4, 4)))  # torch: no pair
  del q, kv
  with pytest.raises(ValueError, match="and_masks takes mask_mods"):
    aj.and_masks(causal, 3)


def test_create_mask_reads_a_score_mod_as_its_finite_scores_and_refuses_other_arities():
  def score_mod(score, b, h, q_idx, kv_idx):
    return jnp.where(q_idx - kv_idx < 2 + h, score, -jnp.inf)
  np.testing.assert_array_equal(aj.create_mask(score_mod, None, 3, 9, 9),
                                _dense(lambda b, h, q, kv: q - kv < 2 + h, 1, 3, 9, 9))
  with pytest.raises(ValueError, match="got a function of 3 positional arguments"):
    aj.create_mask(lambda q_idx, kv_idx, h: True, None, None, 4, 4)


def test_a_block_mask_and_the_attention_it_gives_agree_with_the_combined_mask():
  q, k, v = (jax.random.normal(key, (2, T, 2, 8)) for key in jax.random.split(
      jax.random.key(0), 3))
  mask_mod = aj.and_masks(causal, same_document)
  block_mask = aj.make_block_mask(mask_mod, None, None, T, T, block_size=16)
  dense = aj.create_mask(mask_mod, None, None, T, T)  # [1, 1, T, T]
  out = aj.dot_product_attention(q, k, v, block_mask=block_mask, implementation="chunked")
  expected = aj.dot_product_attention(q, k, v, mask=dense, implementation="reference")
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def _kinds_of(dense, block):
  """The kinds of a dense mask [B, N, T, S], block by block, by numpy."""
  b, n, t, s = dense.shape
  tiles = dense.reshape(b, n, t // block, block, s // block, block)
  some, every = tiles.any(axis=(3, 5)), tiles.all(axis=(3, 5))
  return np.where(every, blocks.FULL, np.where(some, blocks.PARTIAL, blocks.EMPTY))


def test_indexing_by_example_and_head_selects_their_blocks_and_rebases_the_mask_mod():
  mask = aj.make_block_mask(per_head_window, 2, 3, T, T, block_size=8)
  full = _kinds_of(_dense(per_head_window, 2, 3), 8)
  np.testing.assert_array_equal(mask.kinds, full)
  for index, b, h in [((1, 2), [1], [2]), ((0,), [0], [0, 1, 2]), ((slice(None), 1), [0, 1], [1]),
                      ((-1, slice(0, 3, 2)), [1], [0, 2])]:
    picked = mask[index]
    np.testing.assert_array_equal(picked.kinds, full[np.ix_(b, h)])
    # The re-based mask_mod answers for the chosen example and head: its block mask is the same.
    remade = aj.make_block_mask(picked.mask_mod, len(b), len(h), T, T, block_size=8)
    np.testing.assert_array_equal(remade.kinds, picked.kinds)
  assert mask[0, 1].shape == (1, 1, T, T)
  with pytest.raises(ValueError, match="out of range for the block mask's heads of 3"):
    mask[0, 3]
  with pytest.raises(ValueError, match="indexed by example and head"):
    mask[0, 0, 1]


def test_adjust_cuts_to_a_shorter_length_without_calling_the_mod_and_stays_correct():
  calls = []

  def counted(b, h, q_idx, kv_idx):
    calls.append(1)
    return causal(b, h, q_idx, kv_idx)
  mask = aj.make_block_mask(counted, None, None, 64, 64, block_size=16)
  before = len(calls)
  short = mask.adjust(40, 36)
  assert len(calls) == before and (short.q_len, short.kv_len) == (40, 36)
  fresh = aj.make_block_mask(causal, None, None, 40, 36, block_size=16)
  assert short.kinds.shape == fresh.kinds.shape == (1, 1, 3, 3)
  # Equal where the fresh mask says so, or partial (evaluated: right, only slower).
  assert bool(jnp.all((short.kinds == fresh.kinds) | (short.kinds == blocks.PARTIAL)))
  with pytest.raises(ValueError, match="make a new one with make_block_mask"):
    mask.adjust(80, 64)


def test_per_row_lists_of_key_blocks_round_trip_and_follow_torch_layout():
  mask = aj.make_block_mask(aj.and_masks(causal, same_document), None, 2, T, T, block_size=8)
  num, indices, full_num, full_indices = mask.as_kv_blocks()
  kinds = np.asarray(mask.kinds)
  np.testing.assert_array_equal(num, (kinds == blocks.PARTIAL).sum(-1))
  np.testing.assert_array_equal(full_num, (kinds == blocks.FULL).sum(-1))
  for row, count, listed in [(kinds[0, 1, 4], int(num[0, 1, 4]), indices[0, 1, 4])]:
    np.testing.assert_array_equal(listed[:count], np.flatnonzero(row == blocks.PARTIAL))
  back = aj.BlockMask.from_kv_blocks(num, indices, full_num, full_indices, block_size=8,
                                     mask_mod=mask.mask_mod, seq_lengths=(T, T))
  np.testing.assert_array_equal(back.kinds, mask.kinds)
  # Without full lists every listed block is partial; without a mask_mod, noop_mask.
  partial_only = aj.BlockMask.from_kv_blocks(num + full_num, jnp.argsort(
      mask.kinds == blocks.EMPTY, axis=-1, stable=True), block_size=8)
  np.testing.assert_array_equal(partial_only.kinds != blocks.EMPTY, mask.kinds != blocks.EMPTY)
  assert partial_only.mask_mod is aj.noop_mask and partial_only.shape == (1, 2, T, T)
  with pytest.raises(ValueError, match="from_kv_blocks takes kv_num_blocks"):
    aj.BlockMask.from_kv_blocks(num[0], indices)


def test_print_draws_the_block_grid():
  mask = aj.make_block_mask(causal, None, None, 32, 32, block_size=8)
  assert repr(mask) == ("BlockMask(shape=(1, 1, 32, 32), block_size=(8, 8), sparsity=37.50%,\n"
                        "every batch and head\n|░   |\n|█░  |\n|██░ |\n|███░|\n)")
  big = aj.make_block_mask(causal, 1, 6, 1024, 1024, block_size=8)  # 128 x 128 blocks
  drawn = big.to_string(grid_size=(4, 8), limit=2)
  # each character: 32 x 16 blocks, partial where they mix
  assert drawn.splitlines()[:5] == ["batch 0, head 0", "|░░      |", "|██░░    |",
                                    "|████░░  |", "|██████░░|"]
  assert drawn.endswith("... 4 more")
  seen = []  # inside jit the blocks are tracers: the repr says so instead of failing
  jax.jit(lambda m: seen.append(repr(m)) or m.kinds)(mask)
  assert "the blocks are traced" in seen[0] and "sparsity" not in seen[0]


def test_torch_gives_the_same_masks_and_block_lists():
  torch = pytest.importorskip("torch")
  flex = pytest.importorskip("torch.nn.attention.flex_attention")
  documents = torch.tensor(DOCUMENTS)
  t_causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
  t_document = lambda b, h, q_idx, kv_idx: documents[q_idx] == documents[kv_idx]  # noqa: E731
  for ours, theirs in [(aj.and_masks(causal, same_document), flex.and_masks(t_causal, t_document)),
                       (aj.or_masks(causal, same_document), flex.or_masks(t_causal, t_document)),
                       (aj.noop_mask, flex.noop_mask)]:
    np.testing.assert_array_equal(aj.create_mask(ours, 2, 2, T, T),
                                  flex.create_mask(theirs, 2, 2, T, T, device="cpu").numpy())
    block_mask = flex.create_block_mask(theirs, None, None, T, T, device="cpu", BLOCK_SIZE=16)
    num, indices, full_num, full_indices = aj.make_block_mask(
        ours, None, None, T, T, block_size=16).as_kv_blocks()
    np.testing.assert_array_equal(num, block_mask.kv_num_blocks.numpy())
    np.testing.assert_array_equal(full_num, block_mask.full_kv_num_blocks.numpy())
    for mine, torchs, counts in [(indices, block_mask.kv_indices, num),
                                 (full_indices, block_mask.full_kv_indices, full_num)]:
      listed = np.arange(mine.shape[-1]) < np.asarray(counts)[..., None]
      np.testing.assert_array_equal(np.where(listed, mine, -1),
                                    np.where(listed, torchs.numpy(), -1))
