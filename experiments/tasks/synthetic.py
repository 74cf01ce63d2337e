"""Base of the built-in tasks: TFDS builders that generate their examples locally.

Each task draws (tokens, label) pairs from a seeded NumPy generator, so the same options give the
same dataset on every machine, with no download and no TensorFlow. The data is written once as
array_record files under the data dir and read back with ``tfds.data_source``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

PAD_ID = 0
IGNORE = -1  # the target of a position that carries no loss (token-level tasks)


@dataclasses.dataclass
class TaskConfig(tfds.core.BuilderConfig):
  """Sizes and seed shared by every synthetic task; subclasses add the task's options."""
  num_train: int = 20000
  num_test: int = 2000
  seed: int = 0


class SyntheticTask(tfds.core.GeneratorBasedBuilder):
  """A sequence-classification task: features ``tokens`` [L] int32 (0 = pad) and ``label``; or,
  with TOKEN_LEVEL, ``targets`` [L] int32: a class at every position that carries a loss and
  IGNORE elsewhere."""
  TOKEN_LEVEL = False
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}

  @property
  def options(self) -> TaskConfig:
    return self.builder_config

  def vocab_size(self) -> int:
    raise NotImplementedError

  def num_classes(self) -> int:
    raise NotImplementedError

  def max_length(self) -> int:
    raise NotImplementedError

  def input_features(self) -> int | None:
    """None: the inputs are token ids (vector tasks, experiments/tasks/vectors.py, give F)."""
    return None

  def token_names(self) -> list[str]:
    """A printable name per token id, for attention maps."""
    return ["<pad>"] + [str(i) for i in range(1, self.vocab_size())]

  def check_options(self) -> None:
    """Raises ValueError for options that cannot generate examples; called once per split."""

  def sample(self, rng: np.random.Generator) -> tuple[np.ndarray, int | np.ndarray]:
    """One example: tokens [length <= max_length] int32 without padding, and its label (or, with
    TOKEN_LEVEL, its targets [length])."""
    raise NotImplementedError

  def features(self) -> dict:
    """The TFDS features of an example: ``tokens`` and the label (or targets)."""
    return {"tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            self.label_name(): (tfds.features.Tensor(shape=(None,), dtype=np.int32)
                                 if self.TOKEN_LEVEL else
                                 tfds.features.ClassLabel(num_classes=self.num_classes()))}

  def example(self, tokens, label) -> dict:
    """What ``sample`` drew, as the features hold it."""
    label = np.asarray(label, np.int32) if self.TOKEN_LEVEL else int(label)
    return {"tokens": np.asarray(tokens, np.int32), self.label_name(): label}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict(self.features()),
        supervised_keys=("tokens", self.label_name()),
        metadata=tfds.core.MetadataDict(vocab_size=self.vocab_size(),
                                        max_length=self.max_length(), pad_id=PAD_ID),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    return {"train": self._generate_examples(0, self.options.num_train),
            "test": self._generate_examples(1, self.options.num_test)}

  def _generate_examples(self, split_index: int, num_examples: int):
    self.check_options()
    rng = np.random.default_rng([self.options.seed, split_index])
    for index in range(num_examples):
      yield index, self.example(*self.sample(rng))

  def label_name(self) -> str:
    return "targets" if self.TOKEN_LEVEL else "label"


def config_name(options: dict) -> str:
  """A readable, unique name for a set of options: {'length': 32, 'seed': 0} -> 'length32_seed0'."""
  return "_".join(f"{key}{value}" for key, value in sorted(options.items())) or "default"
