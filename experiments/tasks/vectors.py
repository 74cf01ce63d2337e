"""Base of the regression tasks: vector inputs and real-valued targets, generated like the others.

An example is ``tokens`` [T, F] float32 (T vectors of F features; the name is the token tasks')
and ``targets``: [C] float32, one vector per sequence (read from a CLS token), or with TOKEN_LEVEL
[T, C], one per position. The model embeds the vectors linearly (EncoderConfig.input_features), is
trained on the mean squared error and evaluated by the normalised MSE (experiments/steps.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from experiments.tasks import synthetic


@dataclasses.dataclass
class VectorConfig(synthetic.TaskConfig):
  """Real-valued data costs little to draw, and a fresh example per step keeps a small model from
  memorising its training set, hence the larger default."""
  num_train: int = 100000


class VectorTask(synthetic.SyntheticTask):
  """A task whose ``sample`` returns vectors [T, F] and targets [C] (or [T, C], TOKEN_LEVEL)."""

  def input_features(self) -> int:
    """F, the features of each input vector."""
    raise NotImplementedError

  def num_outputs(self) -> int:
    """C, the real values predicted per sequence (or per token)."""
    raise NotImplementedError

  def num_classes(self):
    return self.num_outputs()  # the width of the read-out

  def vocab_size(self):
    return 0  # no token table

  def token_names(self):
    return [f"x{position}" for position in range(self.max_length())]

  def label_name(self):
    return "targets"

  def features(self):
    length, outputs = self.max_length(), self.num_outputs()
    shape = (length, outputs) if self.TOKEN_LEVEL else (outputs,)
    return {"tokens": tfds.features.Tensor(shape=(length, self.input_features()),
                                           dtype=np.float32),
            "targets": tfds.features.Tensor(shape=shape, dtype=np.float32)}

  def example(self, tokens, label):
    return {"tokens": np.asarray(tokens, np.float32), "targets": np.asarray(label, np.float32)}
