"""Positional-encoding ablation: none, sinusoidal, learned, rope and alibi, trained on strings of
length 1..20 and tested on lengths up to 80 (4x), on two length-generalisation tasks.

  python -m experiments.sweep --config=configs/ablations/positional.py \
      --workdir=workdir/ablations/positional
  python -m experiments.sweep --config=configs/ablations/positional.py:quick --workdir=/tmp/pos
  python -m experiments.sweep --config=configs/ablations/positional.py:accelerator \
      --workdir=workdir/ablations/positional_accelerator

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

`:accelerator` is the study sized for one GPU or TPU: the two order-dependent tasks trained on
lengths up to 64 and tested at 2x, 4x and 8x (up to 512), the five encodings and randomized
positions (drawn from 0..512), 10 seeds x 2 learning rates, 1500
steps, the learning rate chosen for the 8x accuracy on the validation stream's longest strings
(another data seed); its
predictions, fixed before it ran, are ``predictions`` below (python -m experiments.findings).
`:quick` (even_pairs only, tested at 61-80) is a smoke test of the pipeline. The results, with
their runtime and provenance: docs/results/positional.md.
"""

from configs.ablations import check_mode, sweep_config

ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")
# The accelerator preset adds randomized positions (configs/ablations/positional_registered.py).
ACCELERATOR_ENCODINGS = ENCODINGS + ("randomized",)
TASKS = {"even_pairs": {"min_length": 1}, "cycle_navigation": {"min_length": 1},
         "order": {"min_length": 2}}
TRAIN_LENGTH = 20
TEST_LENGTHS = ((21, 40), (41, 60), (61, 80))
# The accelerator preset: (tasks, training length, test lengths, steps, seeds, learning rates).
ACCELERATOR = (("even_pairs", "order"), 64, ((65, 128), (129, 256), (257, 512)), 1500, 10,
               (1e-3, 3e-3))


def length_sweep(mode, *, tasks, encodings, train_length: int, test_lengths, steps: int,
                 model_layers: int = 3, **design):
  """A sweep of ``encodings`` on ``tasks``, trained on lengths up to ``train_length`` and tested
  on each (low, high) of ``test_lengths``; compared with the sinusoidal encoding of the same
  task at the longest test lengths. ``design``: sweep_config's seeds, learning_rates, ..."""
  extra_evals = {f"length_{low}_{high}": {"min_length": low, "max_length": high, "num_train": 1}
                 for low, high in test_lengths}
  sweep = sweep_config(
      mode, steps=steps, eval_every=steps // 4, warmup=100,
      variants=((f"{task}-{name}", {"task": task, "model": {"positional_encoding": name},
                                    "task_options": TASKS[task]})
                for task in tasks for name in encodings),
      baseline=f"{tasks[0]}-sinusoidal",
      primary="length_{}_{}_accuracy".format(*test_lengths[-1]),
      contrasts=((f"{task}-{name}", f"{task}-sinusoidal") for task in tasks
                 for name in encodings if name != "sinusoidal"),
      extra_evals=extra_evals, **design)
  options = sweep.train.task_options
  sweep.train.task_options = {"max_length": train_length, "num_train": options.num_train,
                              "num_test": min(options.num_test, 1000)}
  sweep.train.model.d_model = 64
  sweep.train.model.mlp_dim = 128
  sweep.train.model.num_layers = model_layers
  sweep.train.model.max_length = test_lengths[-1][1]
  return sweep


def get_config(mode=None):
  check_mode(mode)
  quick = mode == "quick"  # a smoke test: the first task, tested at the longest lengths only
  task_names, train_length, test_lengths, steps = tuple(TASKS), TRAIN_LENGTH, TEST_LENGTHS, 1000
  encodings, design = ENCODINGS, {}
  if mode == "accelerator":
    task_names, train_length, test_lengths, steps, seeds, rates = ACCELERATOR
    encodings = ACCELERATOR_ENCODINGS
    design = {"seeds": seeds, "learning_rates": rates,
              "predictions": "configs/ablations/positional.py:accelerator"}
  elif quick:
    task_names, test_lengths = task_names[:1], test_lengths[-1:]
  return length_sweep(mode, tasks=task_names, encodings=encodings, train_length=train_length,
                      test_lengths=test_lengths, steps=steps, **design)


CHANCE = 0.6  # accuracy "near chance" (chance is 0.5 on both tasks), its interval's upper end


def error_measures(test_lengths) -> dict:
  """The predictions' measures: per (low, high) of ``test_lengths``, the error (1 - accuracy)
  on that test set, and its accuracy ("<low>-<high> accuracy"), at each arm's chosen rate."""
  column = "length_{}_{}_accuracy".format
  return {**{f"{low}-{high}": {"column": column(low, high), "read": "error"}
             for low, high in test_lengths},
          **{f"{low}-{high} accuracy": {"column": column(low, high)} for low, high in test_lengths}}


def predictions(mode=None) -> dict:
  """The predictions of ``:accelerator``, fixed before the sweep ran (python -m
  experiments.findings): trained on lengths up to 64, the error (1 - accuracy) on each longer
  test set at each arm's rate chosen on the validation stream, paired by seed; "near chance":
  accuracy at most CHANCE, the upper end of its 95% interval included.

  - P1 (Press et al. 2022): on `order` ALiBi extrapolates: at 4x and 8x the training length it
    errs less than the sinusoidal and the learned encoding.
  - P2: on `order` at 8x ALiBi also errs less than RoPE (its distance penalty keeps attention
    local, RoPE's rotation angles at unseen distances are new).
  - P3 (this study on the CPU, Ruoss et al. 2023): on `even_pairs` at 2x RoPE errs less than
    the sinusoidal and the learned encoding.
  - P4 (Ruoss et al. 2023): on `even_pairs` no encoding generalises to 8x: each is near chance.
  - P5 (Ruoss et al. 2023, added with the randomized arm before the preset ever ran): randomized
    positions err less than the sinusoidal encoding at 4x and 8x on both tasks.
  """
  check_mode(mode, ("accelerator",))
  tasks, _, test_lengths = ACCELERATOR[:3]
  return {"setting": "test lengths", "measures": error_measures(test_lengths),
          "predictions": extrapolation(tasks, test_lengths, ENCODINGS)}


def extrapolation(tasks, test_lengths, near_chance, at=False) -> tuple:
  """P1-P5 of ``predictions`` on ``tasks`` at ``test_lengths`` (2x, 4x, 8x the training
  lengths; error_measures'), P4 over the encodings ``near_chance``; ``at``: each comparison
  names its test set as the rates' too."""
  x2, x4, x8 = (f"{low}-{high}" for low, high in test_lengths)

  def errs_more(arm, than, x):
    return ("above", arm, than, {"measure": x, **({"at": x} if at else {})})
  return (
      ("P1", f"order, {x4} and {x8}",
       tuple(errs_more(f"order-{other}", "order-alibi", x) for x in (x4, x8)
             for other in ("sinusoidal", "learned"))),
      ("P2", f"order, {x8}", (errs_more("order-rope", "order-alibi", x8),)),
      ("P3", f"even_pairs, {x2}", tuple(errs_more(f"even_pairs-{other}", "even_pairs-rope", x2)
                                        for other in ("sinusoidal", "learned"))),
      ("P4", f"even_pairs, {x8}",
       tuple(("near_chance", f"even_pairs-{name}", CHANCE, {"measure": f"{x8} accuracy"})
             for name in near_chance)),
      ("P5", f"both tasks, {x4} and {x8}",
       tuple(errs_more(f"{task}-sinusoidal", f"{task}-randomized", x) for task in tasks
             for x in (x4, x8))),
  )
