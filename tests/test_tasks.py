"""The built-in TFDS tasks: deterministic, correct labels, and the properties they are built for."""

import collections

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import tasks
from experiments.tasks import listops, order, recall

SMALL = {"num_train": 200, "num_test": 50}



def test_order_labels_follow_marker_order_and_bags_do_not_tell(data_dir):
  task = tasks.load_task("order", {**SMALL, "max_length": 16}, data_dir)
  for tokens, label in zip(task.train.tokens, task.train.labels):
    a, b = int(np.flatnonzero(tokens == order.MARKER_A)[0]), int(
        np.flatnonzero(tokens == order.MARKER_B)[0])
    assert label == int(a < b)
    assert np.sum(tokens == order.MARKER_A) == np.sum(tokens == order.MARKER_B) == 1
  # Swapping A and B flips the label and keeps the multiset: the generator draws the same
  # filler bags for both labels, so a bag-of-tokens model is at chance by construction.
  assert 0.4 < task.train.labels.mean() < 0.6


def test_recall_label_lists_the_queried_values(data_dir):
  task = tasks.load_task("recall", {**SMALL, "num_pairs": 4, "num_queries": 2, "num_values": 3},
                         data_dir)
  assert task.num_classes == 9
  first_value = recall.FIRST_KEY + 16
  for tokens, label in zip(task.train.tokens, task.train.labels):
    pairs = dict(zip(tokens[0:8:2], tokens[1:8:2] - first_value))
    assert tokens[8] == recall.SEPARATOR
    assert label == 3 * pairs[tokens[9]] + pairs[tokens[10]]


def _evaluate(tokens):
  """An independent ListOps evaluator over token strings (recursive descent)."""
  words = [listops.VOCAB[t] for t in tokens if t != 0]
  def parse(i):
    if words[i].startswith("["):
      op, args, i = words[i], [], i + 1
      while words[i] != "]":
        value, i = parse(i)
        args.append(value)
      result = {"[MAX": max(args), "[MIN": min(args), "[SM": sum(args) % 10,
                "[MED": int(np.floor(np.median(args)))}[op]
      return result, i + 1
    return int(words[i]), i + 1
  value, end = parse(0)
  assert end == len(words)
  return value


def test_listops_labels_evaluate_the_expression(data_dir):
  task = tasks.load_task("listops", {**SMALL, "max_length": 64, "max_depth": 4}, data_dir)
  for tokens, label in zip(task.train.tokens, task.train.labels):
    assert label == _evaluate(tokens)
  lengths = (task.train.tokens != 0).sum(1)
  assert lengths.max() <= 64 and lengths.min() >= 8
  assert len(collections.Counter(task.train.labels)) == 10


def test_generation_is_deterministic_and_cached(data_dir, tmp_path):
  first = tasks.load_task("order", {**SMALL, "max_length": 12}, data_dir)
  again = tasks.load_task("order", {**SMALL, "max_length": 12}, str(tmp_path))  # regenerated
  np.testing.assert_array_equal(first.train.tokens, again.train.tokens)
  np.testing.assert_array_equal(first.test.labels, again.test.labels)
  other_seed = tasks.load_task("order", {**SMALL, "max_length": 12, "seed": 1}, data_dir)
  assert not np.array_equal(first.train.tokens, other_seed.train.tokens)


def test_imdb_reviews_byte_level_under_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=12):
    task = tasks.load_task("imdb_reviews", {"max_length": 64}, str(tmp_path))
  assert task.train.tokens.shape == (12, 64) and task.vocab_size == 257
  assert task.train.tokens.max() <= 256 and set(task.train.labels) <= {0, 1}
  np.testing.assert_array_equal(tasks.byte_tokens("hé"), [ord("h") + 1, 0xC3 + 1, 0xA9 + 1])


def test_unknown_task_and_option():
  with pytest.raises(ValueError, match="unknown task 'sort'"):
    tasks.task_options("sort")


@pytest.mark.parametrize("name", sorted(tasks.BUILT_IN))
def test_every_token_id_has_a_name(name, data_dir):
  task = tasks.load_task(name, SMALL, data_dir)
  assert len(task.token_names) == task.vocab_size and task.token_names[0] == "<pad>"
  assert task.train.tokens.max() < task.vocab_size


def test_recall_rejects_impossible_options(tmp_path):
  with pytest.raises(ValueError, match="num_queries <= num_pairs <= num_keys"):
    tasks.load_task("recall", {**SMALL, "num_pairs": 20, "num_keys": 16}, str(tmp_path))
