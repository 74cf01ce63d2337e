"""The idealised reference of multi-retrieval (experiments/retrieval_reference.py): zero from
h = D, one at h = 0, never rising with h, and a case worked by hand."""

import numpy as np
import pytest

from experiments import retrieval_reference
from experiments.tasks import multi_retrieval

W = multi_retrieval.directions(0, 4, 8)


def test_enough_heads_leave_nothing_and_none_leave_everything():
  assert retrieval_reference.reference_nmse(W, 8, heads=4, samples=2000) == 0.0
  assert retrieval_reference.reference_nmse(W, 8, heads=6, samples=2000) == 0.0
  assert retrieval_reference.reference_nmse(W, 8, heads=0, samples=2000) == pytest.approx(1.0)


def test_each_head_more_lowers_it_or_keeps_it():
  values = [retrieval_reference.reference_nmse(W, 16, heads=h, samples=4000) for h in range(5)]
  assert all(a >= b for a, b in zip(values, values[1:])), values
  assert values[1] < 1.0  # the maxima are correlated a little: one tells something of another


def test_min_and_max_of_two_uniforms_by_hand():
  # w = +1 and -1 in one dimension: y_1 = max(x_1, x_2), y_2 = -min(x_1, x_2). For two
  # uniforms corr(min, max) = 1/2 and E[min | max = m] = m / 2 (linear), so knowing the
  # maximum leaves 1 - 1/4 of the minimum's variance: NMSE = (0 + 3/4) / 2 = 3/8.
  value = retrieval_reference.reference_nmse(np.array([[1.0], [-1.0]]), 2, heads=1,
                                             samples=100000)
  assert value == pytest.approx(3 / 8, abs=0.01)


def test_negative_heads_are_refused():
  with pytest.raises(ValueError, match="heads must be"):
    retrieval_reference.reference_nmse(W, 8, heads=-1)
