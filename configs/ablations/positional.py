"""Positional-encoding ablation: none, sinusoidal, learned, rope and alibi, trained on strings of
length 1..20 and tested on lengths up to 80 (4x), on two length-generalisation tasks.

  python -m experiments.sweep --config=configs/ablations/positional.py \
      --workdir=workdir/ablations/positional
  python -m experiments.sweep --config=configs/ablations/positional.py:quick --workdir=/tmp/pos

Question: which encodings keep working on sequences longer than any seen in training? Tasks
(experiments/tasks/formal_languages.py, Delétang et al. 2023): `even_pairs` (first symbol equals
the last: the model must find both ends, so what an encoding says about unseen positions
decides the result) and `cycle_navigation` (a sum mod 5: order does not matter, so no encoding is
needed and any can only add unseen positions) and `order` (is A before B: a local relation,
where a distance penalty should help). Expected from the
literature: Press et al. (2022) Table 2 find ALiBi flat up to about 7x the training length while
sinusoidal collapses; Ruoss et al. (2023) find every standard encoding fails to generalise on
most of these tasks, relative ones (RoPE, ALiBi) doing best. Both studied mostly causal models;
this is an encoder classifier reading a CLS token, which sees both sides of every token.

`:quick` (even_pairs only, tested at 61-80) is a smoke test of the pipeline. The results, with
their runtime and provenance: docs/results/positional.md.
"""

from configs.ablations import sweep_config

ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")
TASKS = {"even_pairs": {"min_length": 1}, "cycle_navigation": {"min_length": 1},
         "order": {"min_length": 2}}
TRAIN_LENGTH = 20
TEST_LENGTHS = ((21, 40), (41, 60), (61, 80))


def get_config(mode=None):
  quick = mode == "quick"  # a smoke test: the first task, tested at the longest lengths only
  tasks = dict(list(TASKS.items())[:1]) if quick else TASKS
  test_lengths = TEST_LENGTHS[-1:] if quick else TEST_LENGTHS
  sweep = sweep_config(
      mode, steps=1000, eval_every=250, warmup=100,
      variants=((f"{task}-{name}", {"task": task, "model": {"positional_encoding": name},
                                    "task_options": options})
                for task, options in tasks.items() for name in ENCODINGS),
      extra_evals={f"length_{low}_{high}": {"min_length": low, "max_length": high,
                                            "num_train": 1}
                   for low, high in test_lengths})
  options = sweep.train.task_options
  sweep.train.task_options = {"max_length": TRAIN_LENGTH, "num_train": options.num_train,
                              "num_test": min(options.num_test, 1000)}
  sweep.train.model.d_model = 64
  sweep.train.model.mlp_dim = 128
  sweep.train.model.num_layers = 3
  sweep.train.model.max_length = TEST_LENGTHS[-1][1]
  return sweep
