"""The idealised reference of multi-retrieval with too few heads: a model that retrieves h of
the D maxima exactly and regresses the others on them as well as least squares can.

Multi-retrieval (experiments/tasks/multi_retrieval.py) asks for the D maxima y_i = max_s <w_i,
x_s> of T vectors x_s ~ U[0, 1]^F. One head can retrieve one maximum (Yu et al. 2025, arXiv
2510.06662), so h < D heads leave D - h maxima that the model can only guess from what it has.
The reference gives it the h maxima that help most, exactly, and predicts each missing one by
the least-squares polynomial (degree ``DEGREE``) of the retrieved ones, an estimate of the
conditional mean E[y_missing | y_retrieved] fitted on a Monte Carlo draw of the task's own
generator with a fixed seed. Its NMSE (squared error summed over the outputs / their variance
summed, as experiments/steps.py's normalised_mse, each output standardised as the task does) is

  NMSE(h, T) = min over subsets S of size h of sum_{i not in S} E[(y_i - f_i(y_S))^2] / D.

It is 1 at h = 0 (each target's mean), 0 at h >= D, and never rises with h (a larger subset
holds a smaller one, and its polynomials those of the smaller one; the fit is in-sample).
A trained model of h heads may beat it (a head need not retrieve one maximum exactly: it can
mix tokens), or fall short of it (it may not find the maxima at all).

>>> round(reference_nmse(np.array([[1.0], [-1.0]]), length=1, heads=1), 6)  # y_2 = -y_1
0.0
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from experiments import tasks
from experiments.tasks import multi_retrieval as multi_retrieval_task

DEGREE = 3         # the degree of the polynomial of the retrieved maxima
SAMPLES = 20000    # sequences of the Monte Carlo draw
SEED = 7           # its seed, apart from the task's data seeds
CHUNK = 2000       # sequences drawn at once (memory: CHUNK x T x F)


def maxima_sample(w: np.ndarray, length: int, samples: int = SAMPLES,
                  seed: int = SEED) -> np.ndarray:
  """The D maxima of ``samples`` sequences of ``length`` vectors x_s ~ U[0, 1]^F, each
  standardised (mean 0, variance 1 over the draw): w [D, F] -> [samples, D].

  >>> maxima_sample(np.eye(2), length=4, samples=1000).shape
  (1000, 2)
  """
  rng = np.random.default_rng(seed)
  y = np.concatenate([
      multi_retrieval_task.maxima(rng.random((min(CHUNK, samples - start), length, w.shape[1])), w)
      for start in range(0, samples, CHUNK)])
  spread = y.std(axis=0)
  return (y - y.mean(axis=0)) / np.where(spread > 0, spread, 1.0)


def polynomial_features(y: np.ndarray, degree: int = DEGREE) -> np.ndarray:
  """Every monomial of the columns of y up to ``degree``, the constant included: [N, k] -> [N, m].

  >>> polynomial_features(np.array([[2.0, 3.0]]), degree=2)
  array([[1., 2., 3., 4., 6., 9.]])
  """
  columns = [np.ones(len(y))]
  for d in range(1, degree + 1):
    for combination in itertools.combinations_with_replacement(range(y.shape[1]), d):
      columns.append(np.prod(y[:, list(combination)], axis=1))
  return np.stack(columns, axis=1)


def unexplained(y: np.ndarray, retrieved: tuple, degree: int = DEGREE) -> float:
  """The squared error, summed over the outputs and averaged over the draw, of retrieving the
  columns ``retrieved`` of y [N, D] exactly and fitting the others by least squares on their
  polynomial features."""
  missing = [i for i in range(y.shape[1]) if i not in retrieved]
  if not missing:
    return 0.0
  features = polynomial_features(y[:, list(retrieved)], degree)
  coefficients, *_ = np.linalg.lstsq(features, y[:, missing], rcond=None)
  return float(np.mean(np.sum((y[:, missing] - features @ coefficients) ** 2, axis=1)))


def reference_nmse(w: np.ndarray, length: int, heads: int, *, samples: int = SAMPLES,
                   seed: int = SEED, degree: int = DEGREE) -> float:
  """NMSE of the idealised model with ``heads`` exact retrievals of the maxima of directions
  w [D, F] over ``length`` vectors, the best subset of maxima retrieved (module docstring).

  >>> w = multi_retrieval_task.directions(0, 4, 8)
  >>> reference_nmse(w, 8, heads=4), reference_nmse(w, 8, heads=0)
  (0.0, 1.0)
  """
  if heads < 0:
    raise ValueError(f"heads must be >= 0, got {heads}.")
  count = len(w)
  if heads >= count:
    return 0.0
  y = maxima_sample(w, length, samples, seed)
  best = min(unexplained(y, subset, degree)
             for subset in itertools.combinations(range(count), heads))
  return round(best / float(np.sum(y.var(axis=0))), 10)


@functools.lru_cache(maxsize=64)
def task_reference(heads: int, length: int, num_retrievals: int | None = None,
                   features: int | None = None, directions_seed: int | None = None) -> float:
  """``reference_nmse`` on multi_retrieval's own directions (its defaults where not given).

  >>> task_reference(4, 16)
  0.0
  """
  options = tasks.task_options("multi_retrieval")
  w = multi_retrieval_task.directions(
      options["directions_seed"] if directions_seed is None else directions_seed,
      options["num_retrievals"] if num_retrievals is None else num_retrievals,
      options["features"] if features is None else features)
  return reference_nmse(w, length, heads)
