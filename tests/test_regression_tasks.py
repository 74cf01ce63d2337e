"""The regression tasks: shapes, targets against independent NumPy computations, determinism."""

import itertools

import numpy as np
import pytest

from experiments import tasks

SMALL = {"num_train": 200, "num_test": 50}


def test_multi_retrieval_targets_are_standardised_maxima_of_fixed_projections(data_dir):
  task = tasks.load_task("multi_retrieval", {**SMALL, "num_retrievals": 3}, data_dir)
  assert task.regression and not task.token_level
  assert task.train.tokens.shape == (200, 16, 8) and task.train.labels.shape == (200, 3)
  assert task.input_features == 8 and task.num_classes == 3
  x = task.train.tokens.astype(np.float64)
  assert 0.0 <= x.min() and x.max() <= 1.0
  # The directions are those of another data seed too (a fixed function of the inputs)...
  other = tasks.load_task("multi_retrieval", {**SMALL, "num_retrievals": 3, "seed": 1}, data_dir)
  inputs = np.concatenate([x, other.train.tokens])
  targets = np.concatenate([task.train.labels, other.train.labels])
  # ... so y_i = a_i max_s <w_i, x_s> + b_i for one unit w_i: find w_i as the direction whose
  # maxima fit the targets (least squares on a, b), checking every row by a loop over tokens.
  for i in range(3):
    y = targets[:, i]
    assert abs(y.mean()) < 0.3 and 0.6 < y.std() < 1.4  # standardised (on a reference draw)
    best = min((np.linalg.lstsq(np.stack([_maxima(inputs, w), np.ones(len(y))], 1), y,
                                rcond=None)[1].sum(), tuple(w)) for w in _candidates(inputs, y))
    assert best[0] < 1e-6 * len(y)


def _maxima(x, w):
  return np.array([max(float(np.dot(w, token)) for token in row) for row in x])


def _candidates(x, y):
  """Unit directions w fitted to y by regressing on the argmax tokens, refined a few times."""
  w = np.ones(x.shape[-1]) / np.sqrt(x.shape[-1])
  for _ in range(20):
    chosen = x[np.arange(len(x)), np.argmax(x @ w, axis=1)]  # [N, F] the maximising tokens
    coef = np.linalg.lstsq(np.concatenate([chosen, np.ones((len(x), 1))], 1), y, rcond=None)[0]
    w = coef[:-1] / np.linalg.norm(coef[:-1])
    yield w


def test_farthest_point_targets_are_each_points_farthest_other_point(data_dir):
  task = tasks.load_task("farthest_point", SMALL, data_dir)
  assert task.regression and task.token_level and task.input_features == 16
  x, y = task.train.tokens.astype(np.float64), task.train.labels
  assert x.shape == y.shape == (200, 16, 16)
  np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, rtol=1e-6)  # on the unit sphere
  for points, targets in zip(x[:20], y[:20]):
    for s, point in enumerate(points):
      distances = {t: np.linalg.norm(point - other) for t, other in enumerate(points) if t != s}
      np.testing.assert_array_equal(targets[s], points[max(distances, key=distances.get)])
  assert abs(np.mean(x)) < 0.02  # uniform on the sphere: no preferred direction


def test_sparse_average_targets_average_the_vectors_at_the_named_positions(data_dir):
  options = {**SMALL, "length": 6, "num_selected": 3, "value_dim": 4}
  task = tasks.load_task("sparse_average", options, data_dir)
  assert task.regression and task.token_level and task.input_features == 4 + 12
  x, y = task.train.tokens, task.train.labels
  assert x.shape == (200, 6, 16) and y.shape == (200, 6, 4)
  for row, targets in zip(x[:20], y[:20]):
    z, selected, position = row[:, :4], row[:, 4:10], row[:, 10:]
    np.testing.assert_array_equal(position, np.eye(6))
    for s in range(6):
      named = [t for t in range(6) if selected[s, t] == 1.0]
      assert len(named) == 3 and set(np.unique(selected[s])) == {0.0, 1.0}
      np.testing.assert_allclose(targets[s], sum(z[t] for t in named) / 3, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="1 <= num_selected <= length"):
    tasks.load_task("sparse_average", {**options, "num_selected": 7}, data_dir)


@pytest.mark.parametrize("name", ["multi_retrieval", "farthest_point", "sparse_average"])
def test_generation_is_deterministic_by_seed(name, data_dir, tmp_path):
  first = tasks.load_task(name, SMALL, data_dir)
  again = tasks.load_task(name, SMALL, str(tmp_path))  # regenerated elsewhere
  other = tasks.load_task(name, {**SMALL, "seed": 1}, data_dir)
  for split in ("train", "test"):
    for field in ("tokens", "labels"):
      np.testing.assert_array_equal(getattr(getattr(first, split), field),
                                    getattr(getattr(again, split), field))
  assert not np.array_equal(first.train.tokens, other.train.tokens)
  assert not np.array_equal(first.train.tokens[:10], first.test.tokens[:10])
  assert first.train.tokens.dtype == first.train.labels.dtype == np.float32
  assert len(first.token_names) == first.max_length and first.vocab_size == 0
