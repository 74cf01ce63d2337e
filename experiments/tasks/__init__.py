"""Tasks by name: built-in synthetic TFDS builders and catalog datasets from the TFDS catalog.

``load_task(name, options, data_dir)`` returns the train and test splits as padded NumPy arrays
with what the model needs to know (vocabulary size, classes, length, pad id). A token-level task
(``mqar``) has labels [N, L]: a class at each position with a target, IGNORE (-1) elsewhere.
A regression task (experiments/tasks/vectors.py: ``multi_retrieval``, ``farthest_point``,
``sparse_average``) has vectors [N, L, F] float32 as inputs and real targets [N, C] or [N, L, C].
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import time

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from experiments.tasks import farthest_point, formal_languages, listops, mqar, multi_retrieval
from experiments.tasks import order, sparse_average, synthetic, vectors

BUILT_IN = {
    "order": (order.Order, order.OrderConfig),
    "mqar": (mqar.MQAR, mqar.MQARConfig),
    "listops": (listops.ListOps, listops.ListOpsConfig),
    "even_pairs": (formal_languages.EvenPairs, formal_languages.LengthConfig),
    "cycle_navigation": (formal_languages.CycleNavigation, formal_languages.LengthConfig),
    "multi_retrieval": (multi_retrieval.MultiRetrieval, multi_retrieval.MultiRetrievalConfig),
    "farthest_point": (farthest_point.FarthestPoint, farthest_point.FarthestPointConfig),
    "sparse_average": (sparse_average.SparseAverage, sparse_average.SparseAverageConfig),
}
CATALOG = ("imdb_reviews",)  # byte-level text classification, the LRA "Text" setting
TASKS = tuple(BUILT_IN) + CATALOG
BYTE_VOCAB = 256 + 1  # byte b -> token b + 1, 0 = pad


@dataclasses.dataclass(frozen=True)
class Split:
  tokens: np.ndarray  # [num_examples, max_length] int32, 0 = pad; or vectors [.., F] float32
  labels: np.ndarray  # [num_examples] int32, or [num_examples, max_length] (IGNORE = no target);
                      # real targets: [num_examples(, max_length), C] float32


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  train: Split
  test: Split
  vocab_size: int
  num_classes: int              # classes, or real values per target (regression)
  max_length: int
  token_names: tuple[str, ...]  # printable name of each token id
  pad_id: int = synthetic.PAD_ID
  input_features: int | None = None  # F of vector inputs; None: token ids

  @property
  def regression(self) -> bool:
    """Whether the targets are real values (mean squared error) rather than classes."""
    return self.train.labels.dtype.kind == "f"

  @property
  def token_level(self) -> bool:
    """Whether the task has a target per position (outputs [B, T, C]) rather than per sequence."""
    return self.train.labels.ndim == 2 + self.regression


def task_options(name: str) -> dict:
  """The options a task accepts, with their defaults."""
  if name in CATALOG:
    return {"max_length": 1024}
  if name not in BUILT_IN:
    raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}.")
  inherited = {field.name for field in dataclasses.fields(tfds.core.BuilderConfig)}
  return {field.name: field.default for field in dataclasses.fields(BUILT_IN[name][1])
          if field.name not in inherited}


def is_regression(name: str) -> bool:
  """Whether a task gives vectors as inputs and real values as targets (tasks/vectors.py)."""
  return name in BUILT_IN and issubclass(BUILT_IN[name][0], vectors.VectorTask)


def byte_tokens(text) -> np.ndarray:
  """UTF-8 bytes as tokens 1..256 (0 is padding), as in the LRA byte-level Text task."""
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  return np.frombuffer(data, np.uint8).astype(np.int32) + 1


def _pad(sequences, max_length: int, fill: int = synthetic.PAD_ID) -> np.ndarray:
  tokens = np.full((len(sequences), max_length), fill, np.int32)
  for row, sequence in enumerate(sequences):
    sequence = sequence[:max_length]
    tokens[row, :len(sequence)] = sequence
  return tokens


def _to_split(source, featurize, max_length: int) -> Split:
  records = [featurize(source[i]) for i in range(len(source))]
  labels = [label for _, label in records]
  return Split(_pad([tokens for tokens, _ in records], max_length),
               _pad(labels, max_length, synthetic.IGNORE) if np.ndim(labels[0])
               else np.array(labels, np.int32))


def _stacked(source, featurize, max_length: int) -> Split:
  """A split of fixed-length vector examples, stacked as they come (nothing to pad); read in one
  batch, ~10x faster than one by one for the large training splits of these tasks."""
  del max_length  # every example has it
  records = [featurize(record) for record in source.__getitems__(range(len(source)))]
  return Split(np.stack([inputs for inputs, _ in records]),
               np.stack([targets for _, targets in records]))


def _shown(path: str) -> str:
  """``path`` as a message shows it: under the home folder as ``~/...``, so that a page built from
  a run's output does not print the build machine's home.

  >>> _shown(os.path.join(os.path.expanduser("~"), "tensorflow_datasets", "order"))
  '~/tensorflow_datasets/order'
  """
  home = os.path.expanduser("~")
  inside = os.path.commonpath([home, os.path.abspath(path)]) == home
  return os.path.join("~", os.path.relpath(path, home)) if inside else path


@contextlib.contextmanager
def _quietly():
  """TFDS's own warnings and progress bars off while a built-in task is generated: they speak of
  downloads and custom configurations where nothing is downloaded (its progress bars are on
  again afterwards)."""
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  tfds.display_progress_bar(False)
  try:
    yield
  finally:
    tfds.display_progress_bar(True)
    absl_logging.set_verbosity(verbosity)


def load_task(name: str, options: dict | None = None, data_dir: str | None = None) -> Task:
  """Generates (once, cached under data_dir) and loads a task by name.

  >>> import tempfile
  >>> task = load_task("order", {"max_length": 32, "num_train": 100, "num_test": 20},
  ...                  data_dir=tempfile.mkdtemp())  # says on stderr that it generates it
  >>> task.train.tokens.shape, task.test.tokens.shape
  ((100, 32), (20, 32))
  """
  options = {**task_options(name), **(options or {})}
  data_dir = os.path.expanduser(data_dir or "~/tensorflow_datasets")
  if name in CATALOG:
    max_length = options["max_length"]
    sources = tfds.data_source(name, data_dir=data_dir, split=["train", "test"])
    featurize = lambda r: (byte_tokens(r["text"]), r["label"])
    train, test = (_to_split(s, featurize, max_length) for s in sources)
    names = ("<pad>",) + tuple(chr(b) if 32 < b < 127 else f"x{b:02x}" for b in range(256))
    return Task(name, train, test, BYTE_VOCAB, 2, max_length, names)

  builder_class, config_class = BUILT_IN[name]
  with _quietly():
    builder = builder_class(config=config_class(name=synthetic.config_name(options), **options),
                            data_dir=data_dir, file_format="array_record")
    if not builder.is_prepared():
      print(f"generating the task {name!r} on this machine ({options['num_train']} training and "
            f"{options['num_test']} test examples) under {_shown(builder.data_dir)}",
            file=sys.stderr)
      started = time.perf_counter()
      with contextlib.redirect_stdout(io.StringIO()):  # TFDS's "Downloading and preparing"
        builder.download_and_prepare()
      print(f"generated in {time.perf_counter() - started:.0f} s; later runs reuse it",
            file=sys.stderr)
  sources = builder.as_data_source()
  featurize = lambda r: (r["tokens"], r[builder.label_name()])
  max_length = builder.max_length()
  to_split = _to_split if builder.input_features() is None else _stacked
  return Task(name, to_split(sources["train"], featurize, max_length),
              to_split(sources["test"], featurize, max_length),
              builder.vocab_size(), builder.num_classes(), max_length,
              tuple(builder.token_names()), input_features=builder.input_features())
