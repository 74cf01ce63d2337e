"""The built-in TFDS tasks: deterministic, correct labels, and the properties they are built for."""

import collections

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import tasks
from experiments.tasks import listops, mqar, order, synthetic

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


def test_mqar_targets_are_the_values_listed_after_the_queried_keys(data_dir):
  options = {**SMALL, "num_pairs": 6, "num_queries": 4, "num_keys": 10, "num_values": 7,
             "length": 20}
  task = tasks.load_task("mqar", options, data_dir)
  assert task.token_level and task.num_classes == 7 and task.train.labels.shape == (200, 20)
  names = task.token_names
  for tokens, targets in zip(task.train.tokens, task.train.labels):
    words = [names[t] for t in tokens]
    for position, word in enumerate(words):  # independently: read the words left to right
      first = words.index(word)
      if word.startswith("k") and first < position:  # a key seen before: a query
        assert names[tokens[first + 1]] == f"v{targets[position]}"
      else:
        assert targets[position] == synthetic.IGNORE
    assert sum(w.startswith("k") for w in words[12:]) == 4  # the query section
    assert len({w for w in words[:12:2]}) == 6  # distinct listed keys
  values = task.train.labels[task.train.labels != synthetic.IGNORE]
  assert set(values) == set(range(7))


def _even_pairs(word):
  return int((word.count("ab") + word.count("ba")) % 2 == 0)


def _cycle_position(word):
  position = 0
  for move in word:
    position = (position + {"+": 1, "0": 0, "-": -1}[move]) % 5
  return position


@pytest.mark.parametrize("name, evaluate, classes", [("even_pairs", _even_pairs, 2),
                                                     ("cycle_navigation", _cycle_position, 5)])
def test_length_tasks_labels_against_a_direct_evaluation(name, evaluate, classes, data_dir):
  task = tasks.load_task(name, {**SMALL, "min_length": 3, "max_length": 12}, data_dir)
  lengths = (task.train.tokens != 0).sum(1)
  assert lengths.min() == 3 and lengths.max() == 12 and task.max_length == 12
  for tokens, label in zip(task.train.tokens, task.train.labels):
    assert label == evaluate("".join(task.token_names[t] for t in tokens if t))
  assert len(set(task.train.labels)) == classes
  assert max(collections.Counter(task.train.labels).values()) < 200 * 1.5 / classes
  longer = tasks.load_task(name, {**SMALL, "min_length": 13, "max_length": 48}, data_dir)
  assert ((longer.test.tokens != 0).sum(1) >= 13).all() and longer.max_length == 48


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


@pytest.mark.parametrize("name", sorted(name for name in tasks.BUILT_IN
                                         if not tasks.is_regression(name)))
def test_every_token_id_has_a_name(name, data_dir):
  task = tasks.load_task(name, SMALL, data_dir)
  assert len(task.token_names) == task.vocab_size and task.token_names[0] == "<pad>"
  assert task.train.tokens.max() < task.vocab_size


def test_mqar_rejects_impossible_options(tmp_path):
  with pytest.raises(ValueError, match="num_queries <= num_pairs <= num_keys"):
    tasks.load_task("mqar", {**SMALL, "num_pairs": 20, "num_keys": 16}, str(tmp_path))
  with pytest.raises(ValueError, match="length >= 2 \\* num_pairs \\+ num_queries = 24"):
    tasks.load_task("mqar", {**SMALL, "length": 20}, str(tmp_path))
