"""Positional encodings: the paper's formula, the linear-shift property, RoPE and ALiBi."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import positional

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick


def test_sinusoidal_matches_the_paper_formula_elementwise():
  length, dim = 37, 16
  table = np.asarray(aj.sinusoidal_encoding(length, dim))
  for pos in (0, 1, 17, 36):
    for i in range(dim // 2):
      angle = pos / 10000 ** (2 * i / dim)
      assert table[pos, 2 * i] == pytest.approx(np.sin(angle), abs=1e-6)
      assert table[pos, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-6)


@pytest.mark.parametrize("offset", [1, 5, 40])
def test_shifted_sinusoid_is_a_fixed_linear_map_of_the_original(offset):
  """PE(pos + k) = M_k PE(pos) for one matrix M_k, whatever pos (Vaswani et al. 2017, 3.5)."""
  dim, length = 32, 200
  table = np.asarray(aj.sinusoidal_encoding(length + offset, dim), np.float64)
  source, target = table[:length], table[offset:offset + length]  # PE(pos), PE(pos + k)
  # One matrix fitted by least squares maps all 200 positions (200 equations per output
  # coordinate, 32 unknowns) with float32 round-off as the only residual.
  fitted, *_ = np.linalg.lstsq(source, target, rcond=None)
  np.testing.assert_allclose(source @ fitted, target, atol=2e-6)
  # The same fit fails for a map that is not linear in PE(pos): PE(2 * pos).
  doubled = np.asarray(aj.sinusoidal_encoding(2 * length, dim), np.float64)[::2]
  fitted_doubled, *_ = np.linalg.lstsq(source, doubled, rcond=None)
  assert np.max(np.abs(source @ fitted_doubled - doubled)) > 1e-2
  # The closed form: a block-diagonal rotation by offset * frequency_i.
  frequency = 10000.0 ** (-np.arange(0, dim, 2) / dim)
  rotation = np.zeros((dim, dim))
  for i, angle in enumerate(offset * frequency):
    c, s = np.cos(angle), np.sin(angle)
    rotation[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
  np.testing.assert_allclose(source @ rotation, target, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, 1, 8)), jnp.float32)  # one token, one head
  k = jnp.asarray(rng.standard_normal((1, 1, 8)), jnp.float32)
  def score(t, s):
    rq = aj.apply_rope(q, jnp.array([t]))
    rk = aj.apply_rope(k, jnp.array([s]))
    return float(jnp.sum(rq * rk))
  assert score(3, 1) == pytest.approx(score(10, 8), rel=1e-5)
  assert score(0, 0) == pytest.approx(float(jnp.sum(q * k)), rel=1e-5)
  assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)
  # A rotation preserves norms.
  np.testing.assert_allclose(jnp.linalg.norm(aj.apply_rope(q, jnp.array([7]))),
                             jnp.linalg.norm(q), rtol=1e-6)


def test_alibi_slopes_and_bias():
  np.testing.assert_allclose(positional.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
  six = positional.alibi_slopes(6)  # not a power of two: 4 geometric + 2 interleaved from 8
  np.testing.assert_allclose(six[:4], [2.0 ** (-2 * (i + 1)) for i in range(4)])
  np.testing.assert_allclose(six[4:], [2.0 ** -1, 2.0 ** -3])
  bias = aj.alibi_bias(2, 3, 4)
  assert bias.shape == (2, 3, 4)
  np.testing.assert_allclose(bias[0], -(2.0 ** -4) * np.abs(np.arange(3)[:, None] -
                                                            np.arange(4)[None, :]))


@pytest.mark.parametrize("name", sorted(aj.POSITIONAL_ENCODINGS))
def test_every_registered_encoding_has_the_common_interface(name):
  module = aj.positional_encoding(name, max_length=8, num_heads=2)
  x = jnp.ones((1, 6, 4))
  variables = module.init(jax.random.key(0), x)
  embedded = module.apply(variables, x, method="embed")
  assert embedded.shape == x.shape
  q = jnp.ones((1, 6, 2, 4))
  rotated = module.apply(variables, q, q, method="rotate")
  assert rotated[0].shape == q.shape
  bias = module.apply(variables, 6, 6, method="attention_bias")
  assert bias is None or bias.shape == (2, 6, 6)
  changes = [not np.allclose(embedded, x), not np.allclose(rotated[0], q), bias is not None]
  assert sum(changes) == (0 if name == "none" else 1)


@pytest.mark.parametrize("offset", [1, 7, 100])
def test_the_offset_matrix_written_in_the_docs_maps_every_position(offset):
  """docs/guides/theory.md: PE(p + k) = M_k PE(p), M_k block-diagonal with the rotations
  [[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]] on the (sin, cos) pairs, w_i = 10000^(-2i/D)."""
  dim, length = 16, 200
  table = np.asarray(aj.sinusoidal_encoding(length + offset, dim), np.float64)
  omega = 10000.0 ** (-np.arange(0, dim, 2) / dim)
  rotation = np.zeros((dim, dim))
  for i, angle in enumerate(offset * omega):
    rotation[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[np.cos(angle), np.sin(angle)],
                                                  [-np.sin(angle), np.cos(angle)]]
  np.testing.assert_allclose(table[:length] @ rotation.T, table[offset:], atol=1e-5)
  np.testing.assert_allclose(rotation @ rotation.T, np.eye(dim), atol=1e-12)


def test_randomized_positions_are_distinct_sorted_and_in_range():
  for seed in range(20):
    positions = np.asarray(aj.randomized_positions(jax.random.key(seed), 12, 40))
    assert positions.shape == (12,) and positions.min() >= 0 and positions.max() < 40
    assert np.all(np.diff(positions) > 0)
  with pytest.raises(ValueError, match="raise max_length"):
    aj.randomized_positions(jax.random.key(0), 41, 40)


def test_randomized_encoding_over_its_whole_range_is_the_sinusoidal_one():
  """With max_length = T every position is drawn, so the sorted draw is 0..T-1."""
  x = jax.random.normal(jax.random.key(1), (2, 10, 8))
  randomized = aj.positional_encoding("randomized", max_length=10, num_heads=2)
  sinusoidal = aj.positional_encoding("sinusoidal", max_length=10, num_heads=2)
  for deterministic in (True, False):
    got = randomized.apply({}, x, deterministic, method="embed",
                           rngs={"dropout": jax.random.key(2)})
    np.testing.assert_array_equal(got, sinusoidal.apply({}, x, method="embed"))


def test_randomized_encoding_draws_anew_when_training_and_is_fixed_when_evaluating():
  x = jnp.zeros((1, 6, 8))
  module = aj.positional_encoding("randomized", max_length=64, num_heads=2)
  embed = lambda deterministic, seed: module.apply(
      {}, x, deterministic, method="embed", rngs={"dropout": jax.random.key(seed)})
  table = np.asarray(aj.sinusoidal_encoding(64, 8))
  rows = lambda y: [int(np.argmin(np.abs(table - row).sum(-1))) for row in np.asarray(y)[0]]
  assert rows(embed(True, 0)) == rows(embed(True, 1))  # evaluation: one fixed draw
  assert rows(embed(False, 0)) != rows(embed(False, 1))  # training: a draw per key
  assert rows(embed(False, 0)) == sorted(set(rows(embed(False, 0))))


@pytest.mark.parametrize("name", sorted(aj.POSITIONAL_ENCODINGS))
def test_each_nnx_encoding_equals_its_linen_twin_on_the_same_parameters(name):
  """attention_jax.nnx holds an NNX shell of every encoding: on the Linen one's parameters (a
  learned table) it embeds, rotates and biases as the Linen one does, training draws included."""
  from flax import nnx
  from attention_jax import nnx as ajnnx
  x = jax.random.normal(jax.random.key(0), (2, 10, 16))  # [B, T, D]
  query = key = jax.random.normal(jax.random.key(1), (2, 10, 4, 8))  # [B, T, N, H]
  linen = aj.positional_encoding(name, max_length=32, num_heads=4)
  variables = linen.init(jax.random.key(2), x, method="embed")
  twin = ajnnx.positional_encoding(name, max_length=32, d_model=16, num_heads=4,
                                   rngs=nnx.Rngs(params=3, dropout=4))
  if name == "learned":
    assert twin.table.shape == variables["params"]["table"].shape
    twin.table[...] = variables["params"]["table"]
  assert_close = np.testing.assert_allclose
  assert_close(twin.embed(x), linen.apply(variables, x, method="embed"), rtol=1e-6)
  if name == "randomized":  # training: the shared draw at the key of each one's own stream
    twin.rngs = lambda: jax.random.key(5)
    assert_close(twin.embed(x, deterministic=False),
                 positional.add_randomized_sinusoidal(x, jax.random.key(5), 32), rtol=1e-6)
  else:
    assert_close(twin.embed(x, deterministic=False),
                 linen.apply(variables, x, False, method="embed"), rtol=1e-6)
  for got, want in zip(twin.rotate(query, key), linen.apply(variables, query, key,
                                                           method="rotate")):
    assert_close(got, want, rtol=1e-6)
  bias, want = twin.attention_bias(10, 12), linen.apply(variables, 10, 12,
                                                        method="attention_bias")
  assert (bias is None) == (want is None) and (bias is None or np.allclose(bias, want))


def test_a_name_that_moved_out_of_the_nnx_module_says_where_in_one_line():
  from attention_jax import nnx as ajnnx
  assert ajnnx.SinusoidalEncoding is ajnnx.POSITIONAL_ENCODINGS["sinusoidal"]  # back in place
  with pytest.raises(AttributeError, match="TransformerEncoder moved to examples/nnx_encoder.py"
                     ) as error:
    ajnnx.TransformerEncoder  # noqa: B018
  assert "\n" not in str(error.value)
  with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
    ajnnx.Nothing  # noqa: B018
