"""Positions where the claims were made: a causal model. Does the causal mask itself carry position
(Haviv et al. 2022), does a causal model without positions generalise to longer strings at least
as well as one with them (Kazemnejad et al. 2023), and why do randomized positions stall on
`even_pairs`?

  python -m experiments.sweep --config=configs/ablations/positional_causal.py:order \
      --workdir=workdir/ablations/positional_causal/order
  python -m experiments.sweep --config=configs/ablations/positional_causal.py:even_pairs \
      --workdir=workdir/ablations/positional_causal/even_pairs
  python -m experiments.sweep --config=configs/ablations/positional_causal.py:randomized \
      --workdir=workdir/ablations/positional_causal/randomized
  python -m experiments.sweep --config=configs/ablations/positional_causal.py:accelerator \
      --workdir=workdir/ablations/positional_causal/accelerator
  python -m experiments.sweep --config=configs/ablations/positional_causal.py:quick \
      --workdir=/tmp/positional_causal

The model, data and training are configs/ablations/positional_registered.py's, so that this study
reads against that one: 2 layers at d_model 64 (4 heads, feed-forward 128), batch 32, trained on
lengths up to 10 (`order`: 2-10) and tested on 1000 strings at 2x (11-20), 4x (21-40) and 8x
(41-80); `order` 2000 steps, `even_pairs` 3000; each arm's rate chosen from 3e-4 and 1e-3 for its 8x
accuracy on the validation stream's 41-80 strings (another data seed; the committed runs predate
that stream and chose on the training lengths), bracketed by one rate; 10 seeds.

The causal arms set ``model.causal`` (every layer attends to positions up to its own) and read
the sequence's label at its last real token (``model.pooling = "last"``), the one position that
reads the whole string. Haviv et al. train language models (a label at every position, the next
token); Kazemnejad et al. train decoder-only models and score the answer generated after the
input, i.e. the output at the end. These tasks have one label per string, which fixes Kazemnejad
et al.'s reading: the output at the end, read once.

Modes (each one sweep of at most 30 minutes on the 2 CPU cores):

- ``order`` (Haviv et al.; Kazemnejad et al. on `order`): ``order-bidirectional-none-mean`` and
  ``order-causal-none-mean``, no positional encoding and the masked mean of every position as the
  read-out, differ only in the mask: the bidirectional one is permutation invariant (swapping the
  markers keeps the bag of tokens and flips the label: it must sit at chance), the causal one is
  not. Then the causal arms with the last token's read-out: ``order-causal-none`` (NoPE),
  ``-sinusoidal``, ``-learned``, ``-rope`` and ``-alibi`` (ALiBi as Press et al. define it for
  causal models: -slope * (t - s) on the keys s <= t, attention_jax.positional.alibi_bias).
- ``even_pairs`` (Kazemnejad et al.): the five causal arms on `even_pairs`.
- ``randomized`` (the positional page's reading of why randomized positions stall on
  `even_pairs`): the bidirectional CLS classifier of positional_registered.py with the randomized
  encoding drawing positions from 0..80 (as there) and from 0..640, same training lengths: at 41-80
  a test string fills half or more of 0..80, so the gaps between its positions are narrower than
  almost any seen in training; drawn from 0..640 they are as wide as in training.
- ``accelerator``: the three designs together on one GPU or TPU, trained on lengths up to 64 and
  tested at 2x, 4x, 8x (up to 512), randomized positions from 0..512 and 0..4096, 1500 steps,
  rates 1e-3 and 3e-3, 10 seeds (its one family of 28 tested checks can reach 0.05 after Holm).
- ``quick``: a smoke test of the pipeline (``order``'s arms, tested at 41-80 only).

Each mode's primary family: the comparisons its sweep declares (each arm against NoPE of its task
at 8x, ``randomized``: 0..640 against 0..80), the exact paired sign-flip test on 41-80 accuracy,
alpha 0.05 after Holm. Predictions, committed before any run: ``predictions`` below (python -m
experiments.findings); "at least as well" is a non-inferiority margin of MARGIN accuracy.
"""

import ml_collections

from configs.ablations import check_mode, sweep_config
from configs.ablations.positional import CHANCE, TASKS, error_measures

MODES = ("order", "even_pairs", "randomized", "accelerator", "quick")
ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")  # the causal arms; "none": NoPE
TRAIN_LENGTH = 10
TEST_LENGTHS = ((11, 20), (21, 40), (41, 80))
LEARNING_RATES = (3e-4, 1e-3)
STEPS = {"order": 2000, "even_pairs": 3000}
NUM_SEEDS, NUM_LAYERS, BATCH_SIZE = 10, 2, 32
RANGES = (80, 640)  # the randomized encoding's positions: 0..80 (positional_registered) and 0..640
# The accelerator preset: training length, test lengths, steps, rates, randomized ranges.
ACCELERATOR = (64, ((65, 128), (129, 256), (257, 512)), 1500, (1e-3, 3e-3), (512, 4096))
MARGIN = 0.05  # accuracy: "at least as well" / "as well" within this, declared before any run
LEARNED = 0.95  # the design: every arm meant to learn its task reaches this in every seed


def causal(task: str, encoding: str, pooling: str = "last") -> tuple[str, dict]:
  """The causal arm of ``encoding`` on ``task``, read at the last token (or by the mean)."""
  name = f"{task}-causal-{encoding}" + ("-mean" if pooling == "mean" else "")
  return name, {"task": task, "task_options": TASKS[task], "num_train_steps": STEPS[task],
                "model": {"positional_encoding": encoding, "causal": True, "pooling": pooling}}


def bidirectional(task: str, encoding: str, pooling: str, max_length: int = 0) -> tuple[str, dict]:
  """A bidirectional arm (positional_registered.py's classifier with ``pooling`` "cls")."""
  name = f"{task}-bidirectional-{encoding}" + (f"{max_length}" if max_length else "") + (
      "-mean" if pooling == "mean" else "")
  model = {"positional_encoding": encoding, "causal": False, "pooling": pooling,
           **({"max_length": max_length} if max_length else {})}
  return name, {"task": task, "task_options": TASKS[task], "num_train_steps": STEPS[task],
                "model": model}


def arms(design: str, ranges=RANGES) -> tuple[tuple[str, dict], ...]:
  """The (name, overrides) of ``design``: "order", "even_pairs" or "randomized"."""
  if design == "order":
    return (bidirectional("order", "none", "mean"), causal("order", "none", "mean"),
            *(causal("order", encoding) for encoding in ENCODINGS))
  if design == "even_pairs":
    return tuple(causal("even_pairs", encoding) for encoding in ENCODINGS)
  return tuple(bidirectional("even_pairs", "randomized", "cls", r) for r in ranges)


def comparisons(design: str, ranges=RANGES) -> tuple[str, tuple]:
  """(baseline, contrasts) of ``design``: the primary family."""
  if design == "randomized":
    low, high = (f"even_pairs-bidirectional-randomized{r}" for r in ranges)
    return low, ((high, low),)
  nope = f"{design}-causal-none"
  contrasts = tuple((f"{design}-causal-{e}", nope) for e in ENCODINGS[1:])
  if design == "order":
    contrasts += (("order-causal-none-mean", "order-bidirectional-none-mean"),)
  return nope, contrasts


def get_config(mode="order"):
  check_mode(mode, MODES)
  mode = mode or "order"
  quick, accelerator = mode == "quick", mode == "accelerator"
  designs = ("order", "even_pairs", "randomized") if accelerator else (
      ("order",) if quick else (mode,))
  train_length, test_lengths, steps, rates, ranges = (
      ACCELERATOR if accelerator else (TRAIN_LENGTH, TEST_LENGTHS, max(STEPS.values()),
                                       LEARNING_RATES, RANGES))
  if quick:
    test_lengths, rates = test_lengths[-1:], rates[-1:]
  variants = tuple(arm for design in designs for arm in arms(design, ranges))
  family = [comparisons(design, ranges) for design in designs]
  sweep = sweep_config(
      "quick" if quick else None, steps=steps, eval_every=steps // 2, warmup=100,
      variants=variants, baseline=family[0][0],
      contrasts=tuple(pair for _, pairs in family for pair in pairs),
      primary="length_{}_{}_accuracy".format(*test_lengths[-1]), bracket=1,
      extra_evals={f"length_{low}_{high}": {"min_length": low, "max_length": high,
                                            "num_train": 1} for low, high in test_lengths},
      seeds=NUM_SEEDS, learning_rates=rates,
      predictions=f"configs/ablations/positional_causal.py:{mode}")
  train = sweep.train
  train.task_options = {"max_length": train_length, "num_train": train.task_options.num_train,
                        "num_test": min(train.task_options.num_test, 1000)}
  train.model.update(d_model=64, mlp_dim=128, num_layers=NUM_LAYERS,
                     max_length=test_lengths[-1][1])
  train.batch_size = BATCH_SIZE
  sweep.variants = tuple((name, _steps(overrides, quick, accelerator, steps))
                         for name, overrides in sweep.variants)
  return sweep


def _steps(overrides: dict, quick: bool, accelerator: bool, steps: int) -> dict:
  """A variant's own length of training (the quick and accelerator presets: one for all),
  evaluated halfway and at the end."""
  own = steps // 10 if quick else steps if accelerator else overrides["num_train_steps"]
  return {**overrides, "num_train_steps": own, "eval_every_steps": own // 2,
          "checkpoint_every_steps": own // 2}


def _non_inferior(task: str, others, measure: str) -> tuple:
  """NoPE errs at most MARGIN more than each of ``others`` (non-inferiority): each other arm's
  error above NoPE's error less MARGIN (``measure``, NoPE offset by MARGIN), by the exact
  sign-flip test."""
  nope = f"{task}-causal-none"
  return tuple(("above", f"{task}-causal-{other}", nope,
                {"measure": measure, "at": f"{measure.split(',')[0]} (error; NoPE's less the "
                                           f"margin {MARGIN:g})"}) for other in others)


def predictions(mode="order") -> dict:
  """The predictions, fixed before any run (python -m experiments.findings): each arm at its
  rate chosen on the validation stream, paired by seed; errors are 1 - accuracy on 1000 test
  strings; "near chance": the 95% interval of the mean accuracy at most CHANCE (0.6).

  order:
  - D (the design): every arm but the bidirectional one without positions reaches 0.95 test
    accuracy on the training lengths in every seed; every chosen rate inside the rates tried.
  - H1 (permutation invariance): without positions the bidirectional classifier (mean read-out)
    is near chance on the training lengths.
  - H2 (Haviv et al. 2022: the causal mask carries position): the causal model without positions,
    the same classifier but for the mask, errs less there than the bidirectional one.
  - H3 (Haviv et al. 2022: causal models without positions close to those with): on the training
    lengths causal NoPE within MARGIN of causal sinusoidal (TOST).
  - K1 (Kazemnejad et al. 2023: NoPE generalises at least as well): at 2x, 4x and 8x causal NoPE
    errs at most MARGIN more than causal sinusoidal, learned, RoPE and ALiBi (non-inferiority: each
    one's error above NoPE's less MARGIN).
  - K2 (Kazemnejad et al. 2023): causal NoPE extrapolates: its accuracy at 2x above CHANCE.
  even_pairs: D, K1 and K2 on `even_pairs`.
  randomized:
  - D: both arms reach 0.95 on the training lengths in every seed.
  - G (the gap-density reading of the positional page): drawn from 0..640 the randomized encoding
    errs less than drawn from 0..80 at 4x and 8x.
  accelerator: all of the above at its lengths and ranges (one family).
  """
  check_mode(mode, MODES)
  mode = mode or "order"
  accelerator = mode == "accelerator"
  _, test_lengths, _, _, ranges = ACCELERATOR if accelerator else (
      TRAIN_LENGTH, TEST_LENGTHS, None, None, RANGES)
  if mode == "quick":
    test_lengths = test_lengths[-1:]
  lengths = [f"{low}-{high}" for low, high in test_lengths]
  designs = ("order", "even_pairs", "randomized") if accelerator else (
      ("order",) if mode == "quick" else (mode,))
  training = {"measure": "training accuracy"}
  training_error = {"measure": "training error", "at": "the training lengths (error)"}
  measures = {"primary": {"column": "eval_accuracy"}, **error_measures(test_lengths),
              "training accuracy": {"column": "eval_accuracy"},
              "training error": {"column": "eval_accuracy", "read": "error"}}
  rows = []
  for design in designs:
    tag = f" {design}" if accelerator else ""  # one table over the three designs
    if design == "randomized":
      low, high = (f"even_pairs-bidirectional-randomized{r}" for r in ranges)
      rows += [(f"D{tag}", "even_pairs, randomized, training lengths",
                tuple(("reaches", arm, LEARNED, {"rate_in_text": True}) for arm in (low, high))),
               ("G", f"even_pairs, {', '.join(lengths[1:])}",
                tuple(("above", low, high, {"measure": x, "at": x}) for x in lengths[1:]))]
      continue
    task = design
    nope = f"{task}-causal-none"
    learners = [name for name, _ in arms(design, ranges) if "bidirectional" not in name]
    rows.append((f"D{tag}", f"{task}, training lengths",
                 tuple(("reaches", arm, LEARNED, {"rate_in_text": True}) for arm in learners)
                 + (("rates_inside",),)))
    if task == "order":
      rows += [
          ("H1", "order, training lengths",
           (("near_chance", "order-bidirectional-none-mean", CHANCE, training),)),
          ("H2", "order, training lengths",
           (("above", "order-bidirectional-none-mean", "order-causal-none-mean",
             training_error),)),
          ("H3", "order, training lengths",
           (("within", nope, "order-causal-sinusoidal", MARGIN, training_error),))]
    for x in lengths:
      measures[f"{x}, {task} NoPE less {MARGIN:g}"] = {
          "column": "length_{}_{}_accuracy".format(*x.split("-")), "read": "error",
          "offsets": {nope: MARGIN}}
    rows += [(f"K1{tag}", f"{task}, {', '.join(lengths)}",
              tuple(check for x in lengths for check in _non_inferior(
                  task, ENCODINGS[1:], f"{x}, {task} NoPE less {MARGIN:g}"))),
             (f"K2{tag}", f"{task}, {lengths[0]}",
              (("above_level", nope, CHANCE, {"measure": f"{lengths[0]} accuracy"}),))]
  return {"setting": "test lengths", "measures": measures, "predictions": tuple(rows),
          "alpha": 0.05}
