"""Tasks by name: built-in synthetic TFDS builders and catalog datasets from the TFDS catalog.

``load_task(name, options, data_dir)`` returns the train and test splits as padded NumPy arrays
with what the model needs to know (vocabulary size, classes, length, pad id). A token-level task
(``mqar``) has labels [N, L]: a class at each position with a target, IGNORE (-1) elsewhere.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds

from experiments.tasks import formal_languages, listops, mqar, order, synthetic

BUILT_IN = {
    "order": (order.Order, order.OrderConfig),
    "mqar": (mqar.MQAR, mqar.MQARConfig),
    "listops": (listops.ListOps, listops.ListOpsConfig),
    "even_pairs": (formal_languages.EvenPairs, formal_languages.LengthConfig),
    "cycle_navigation": (formal_languages.CycleNavigation, formal_languages.LengthConfig),
}
CATALOG = ("imdb_reviews",)  # byte-level text classification, the LRA "Text" setting
TASKS = tuple(BUILT_IN) + CATALOG
BYTE_VOCAB = 256 + 1  # byte b -> token b + 1, 0 = pad


@dataclasses.dataclass(frozen=True)
class Split:
  tokens: np.ndarray  # [num_examples, max_length] int32, 0 = pad
  labels: np.ndarray  # [num_examples] int32, or [num_examples, max_length] (IGNORE = no target)


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  train: Split
  test: Split
  vocab_size: int
  num_classes: int
  max_length: int
  token_names: tuple[str, ...]  # printable name of each token id
  pad_id: int = synthetic.PAD_ID

  @property
  def token_level(self) -> bool:
    """Whether the task has a target per position (logits [B, T, C]) rather than per sequence."""
    return self.train.labels.ndim == 2


def task_options(name: str) -> dict:
  """The options a task accepts, with their defaults."""
  if name in CATALOG:
    return {"max_length": 1024}
  if name not in BUILT_IN:
    raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}.")
  inherited = {field.name for field in dataclasses.fields(tfds.core.BuilderConfig)}
  return {field.name: field.default for field in dataclasses.fields(BUILT_IN[name][1])
          if field.name not in inherited}


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


def load_task(name: str, options: dict | None = None, data_dir: str | None = None) -> Task:
  """Generates (once, cached under data_dir) and loads a task by name.

  >>> import tempfile
  >>> task = load_task("order", {"max_length": 32, "num_train": 100, "num_test": 20},
  ...                  data_dir=tempfile.mkdtemp())
  Downloading and preparing dataset ...
  Dataset order downloaded and prepared to ...
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
  builder = builder_class(config=config_class(name=synthetic.config_name(options), **options),
                          data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  sources = builder.as_data_source()
  featurize = lambda r: (r["tokens"], r["targets" if builder.TOKEN_LEVEL else "label"])
  max_length = builder.max_length()
  return Task(name, _to_split(sources["train"], featurize, max_length),
              _to_split(sources["test"], featurize, max_length),
              builder.vocab_size(), builder.num_classes(), max_length,
              tuple(builder.token_names()))
