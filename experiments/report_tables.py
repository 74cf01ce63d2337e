"""The tables of a sweep's results.md: the design and provenance, the comparisons (from the same
rows as comparisons.csv), each variant at its chosen learning rate, every arm, and, from the
run's logs, attention-logit maxima and probes. Every interval is a 95% interval cut at the
measure's range: Wilson for a share of seeds, Student's t for a mean or a paired difference,
Welch's for an unpaired one (experiments/statistics.py); an equivalence row's is 90%;
numbers carry three significant digits, so that a small nonzero difference shows as one.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from experiments import provenance, statistics, verdicts
from experiments.steps import HYPERPARAMETERS, MEASURES

LEADING = ("eval_accuracy", "eval_nmse", "eval_loss")
MAX_LOGIT = "max_attention_logit"
# per replica, from the training logs: the largest attention logit at the end and at its peak
FINAL_LOGIT, PEAK_LOGIT = f"final_{MAX_LOGIT}", f"peak_{MAX_LOGIT}"
PROBES = ("logit_variance", "entropy", "max_weight", "negative_weight", "first_token_weight",
          "max_activation", "query_grad_norm", "key_grad_norm")
# per-replica columns that are not measurements
IDENTITY = ("name", "seed", "num_classes", "diverged_at", "parameters", verdicts.STEPS_TO,
            FINAL_LOGIT, PEAK_LOGIT) + HYPERPARAMETERS
# Names of measures as a reader knows them; any other name is spelled out from its key.
READABLE = {"eval_accuracy": "Test accuracy", "eval_nmse": "Test NMSE (MSE / target variance)",
            "eval_loss": "Test loss", "loss": "Training loss",
            "eval": "test (training lengths)", MAX_LOGIT: "Largest attention logit",
            "learning_rate": "lr", "validation": "validation stream",
            verdicts.STEPS_TO: "steps to the threshold", "solved": "share of seeds solved"}
INTERVAL_NOTE = "95% t interval over seeds"


def readable(name: str) -> str:
  """A key as a reader reads it.

  >>> readable("eval_accuracy"), readable("length_21_40_accuracy"), readable("length_21_40")
  ('Test accuracy', 'Test accuracy, length 21-40', 'length 21-40')
  >>> readable("validation_length_41_80"), readable("validation_length_41_80_accuracy")
  ('validation stream, length 41-80', 'Validation accuracy, length 41-80')
  >>> readable("final_logit_variance")
  'Final logit variance'
  """
  if name in READABLE:
    return READABLE[name]
  match = re.fullmatch(r"(validation_)?length_(\d+)_(\d+)(?:_(accuracy|loss|nmse))?", name)
  if match:
    validation, low, high, measure = match.groups()
    if validation:
      return (f"Validation {measure}, " if measure else "validation stream, ") + (
          f"length {low}-{high}")
    return (f"Test {measure}, " if measure else "") + f"length {low}-{high}"
  return name.replace("_", " ").capitalize()


def readable_arm(label: str) -> str:
  """An arm's label (the variant's name, then the hyperparameters its grid varies), shortened.

  >>> readable_arm("heads_4 learning_rate=0.001 warmup_steps=10")
  'heads_4 lr=0.001 warmup_steps=10'
  """
  return re.sub(r"\b(\w+)=", lambda m: READABLE.get(m.group(1), m.group(1)) + "=", label)


metric_range = statistics.measure_range


def number(x: float) -> str:
  """Three significant digits: enough to show a small nonzero difference as nonzero.

  >>> number(0.97912), number(-0.00043), number(0.0), number(float("nan"))
  ('0.979', '-0.00043', '0', '—')
  """
  return "—" if not math.isfinite(x) else f"{x:.3g}"


def interval_cell(estimate: float, low: float, high: float) -> str:
  """``estimate [low, high]``, or the estimate alone where the interval is a point."""
  if not math.isfinite(estimate):
    return "diverged"
  if low == high == estimate:
    return number(estimate)
  return f"{number(estimate)} [{number(low)}, {number(high)}]"


def mean_cell(values, name="") -> str:
  """The mean of ``values`` (a measure named ``name``) with its interval, inside its range."""
  return interval_cell(*statistics.mean_interval(values, *metric_range(name)))


def p_cell(p: float) -> str:
  return "—" if not math.isfinite(p) else f"{p:.2g}"


def measure_of(metrics) -> str:
  """The measure of success of these metrics (or records): "accuracy" for classes, "nmse" for
  real-valued targets (lower is better)."""
  names = metrics if isinstance(metrics, dict) else {
      name for record in metrics if record["status"] == "ok" for name in record["metrics"]}
  return next((m for m in MEASURES if f"eval_{m}" in names), "accuracy")


def metric_names(records) -> list[str]:
  names = set()
  for record in records:
    names.update(name for name in record.get("metrics", {}) if name not in IDENTITY)
  extra = sorted(n for n in names if n.endswith(("_accuracy", "_nmse")) and
                 n not in LEADING and not n.startswith(("init_", "final_")))
  return [n for n in LEADING if n in names] + extra + sorted(names - set(LEADING) - set(extra))


def accuracy_columns(records) -> list[str]:
  return [n for n in metric_names(records) if n.endswith(("_accuracy", "_nmse", "_loss")) and
          not n.startswith(("init_", "final_"))]


def arms(record) -> list[tuple[str, list[int]]]:
  """(label, replica indices) for each hyperparameter setting of a finished variant, in the
  order of their values (a rate added by bracketing among the others): the label is the
  variant's name, followed by the hyperparameters its grid varies."""
  metrics = record["metrics"]
  varied = [name for name in HYPERPARAMETERS if len(set(metrics[name])) > 1]
  groups = {}
  for index in range(len(metrics["name"])):
    groups.setdefault(tuple(metrics[name][index] for name in varied), []).append(index)
  return [(" ".join([record["variant"]] + [f"{n}={v:g}" for n, v in zip(varied, key)]), indices)
          for key, indices in sorted(groups.items())]


def arm_values(records):
  """(label, {metric: values over the arm's seeds}, record) for every arm of every ok record."""
  return [(label, {name: [values[i] for i in indices] for name, values in r["metrics"].items()},
           r) for r in records if r["status"] == "ok" for label, indices in arms(r)]


def varies_learning_rate(records) -> bool:
  return any(len(set(r["metrics"]["learning_rate"])) > 1 for r in records if r["status"] == "ok")


def provenance_lines(records) -> list[str]:
  summary = provenance.summary([r.get("provenance", {}) for r in records])
  return [f"Provenance (in results.csv): commit {summary['commit']}; Python "
          f"{summary['python']}, jax {summary['jax']}, flax {summary['flax']}, optax "
          f"{summary['optax']}; {summary['machine']}; {summary['date']}.", ""]


def design_lines(design: verdicts.Design, chosen, seeds: int, one_rate: bool) -> list[str]:
  every = all(reference == design.baseline for _, reference in design.comparisons)
  which = (f"every arm against the baseline `{design.baseline}`" if every else
           f"the declared contrasts (baseline `{design.baseline}`)")
  test = {"paired_permutation": f"{design.primary}, mean difference paired by seed, exact "
                                "sign-flip test (between arms that see different data, the "
                                "permutation test of the difference of means)",
          "permutation": f"{design.primary}, difference of means between seeds (unpaired), "
                         "permutation test",
          "solve_rate": f"the share of seeds that solve the task ({design.primary} "
                        f"{'>=' if design.higher_is_better else '<='} {design.solved_at:g}), "
                        "Fisher's exact test",
          "time_to_solve": f"steps until {design.primary} first "
                           f"{'reaches' if design.higher_is_better else 'falls to'} "
                           f"{design.solved_at:g} (a seed that never does counted at step "
                           f"{design.censored_at:g}), paired by seed, exact sign-flip test "
                           "(log-rank where seeds or data differ)"}[design.test]
  on = chosen[0].chosen_on if chosen else verdicts.VALIDATION
  timed = bool(chosen) and chosen[0].chosen_for == verdicts.TIME_TO_THRESHOLD
  if one_rate:
    rates = "one learning rate for every variant, so none was chosen"
  elif on.startswith(verdicts.VALIDATION):
    measured = f"{on}_{chosen[0].chosen_for}" if chosen else ""
    for_primary = (measured == f"{verdicts.VALIDATION}_{design.primary}"
                   or design.primary == f"eval_{chosen[0].chosen_for}") if chosen else True
    elsewhere = not (timed or for_primary)
    rates = ("each variant's learning rate chosen on the validation stream (a test split of "
             "another data seed) for "
             + ("its censored time-to-threshold" if timed else
                f"its final {measured} (the validation stream does not measure "
                f"{design.primary}; ties broken by the lower validation loss)" if elsewhere
                else f"its final {design.primary}")
             + ", reported on the test set; every comparison also at a matched rate, the "
             "reference's")
    if design.test == "time_to_solve" and not timed:
      rates += (" (these records have no validation time-to-threshold, so the rates were "
                "chosen for the final measure, not for the outcome compared)")
  else:
    rates = ("each variant's learning rate chosen **on the test set** (these records have no "
             "validation stream), which flatters the chosen arms")
  ran = {c.variant for c in chosen}  # the family this run tested: comparisons whose arms ran
  tested = ([pair for pair in design.comparisons if set(pair) <= ran] if chosen
            else list(design.comparisons))
  left = len(design.comparisons) - len(tested)
  note = verdicts.power_note(dataclasses.replace(design, comparisons=tuple(tested)), seeds)
  if chosen and left:
    note += (f" The config declares {len(design.comparisons)}; {left} of them name arms this "
             "run did not train.")
  return [f"**Design** (declared in the sweep config): {which}; {test}; {rates}; Holm's "
          f"correction over the family. {note}", ""]


def rate_cell(c: statistics.Comparison) -> str:
  """Which learning rates a row compares at: each arm's chosen one, or the reference's."""
  return "each its chosen" if c.rate == statistics.CHOSEN else "the reference's (matched)"


def comparison_lines(comparisons, design) -> list[str]:
  """The comparisons table: every row with the rates it uses; an equivalence row (TOST) shows
  its margin and its 90% interval."""
  lines = ["| arm | reference | measure | seeds | difference [interval] | p | p (Holm) | "
           "verdict | learning rates |", "|---|---|---|---|---|---|---|---|---|"]
  for c in comparisons:
    test = f"; TOST ±{c.margin:g}, 90%" if c.is_equivalence else ""
    lines.append(f"| {c.arm} | {c.baseline} | {readable(c.metric)}{test} | {c.n} | "
                 f"{interval_cell(c.estimate, c.low, c.high)} | {p_cell(c.p)} | "
                 f"{p_cell(c.p_adjusted)} | {verdicts.verdict(c, design)} | {rate_cell(c)} |")
  return lines


def chosen_lines(chosen, design, records) -> list[str]:
  measure = measure_of(records)
  higher = MEASURES[measure]
  sign = ">=" if design.higher_is_better else "<="
  lines = ["| variant | learning rate | " + readable(design.primary) + " | solved "
           f"({sign} {design.solved_at:g}) | steps to it (never: {design.censored_at:g}) | "
           "LR sensitivity | parameters |", "|---|---|---|---|---|---|---|"]
  for c in chosen:
    flag = f" ⚑ {c.edge} of the grid" if c.edge else ""
    solved = verdicts.solved(c.metrics[design.primary], design)
    rate, low, high = statistics.rate_interval(int(solved.sum()), len(solved))
    steps = (mean_cell(statistics.restricted_times(c.metrics[verdicts.STEPS_TO],
                                                  design.censored_at))
             if verdicts.STEPS_TO in c.metrics else "—")
    lost = "eval_loss" if higher else f"eval_{measure}"
    losses = [np.nanmean(m[lost]) for _, m, _ in arm_values([c.record])]
    initial = math.log(c.record["metrics"].get("num_classes", [2])[0]) if higher else 1.0
    sensitivity = (f"{statistics.lr_sensitivity(losses, initial):.3f}" if len(losses) > 1
                   else "—")
    lines.append(f"| {c.variant} | {c.learning_rate:g}{flag} | "
                 f"{mean_cell(c.metrics[design.primary], design.primary)} | "
                 f"{int(solved.sum())}/{len(solved)} [{number(low)}, {number(high)}] | {steps} | "
                 f"{sensitivity} | "
                 f"{c.record['metrics'].get('parameters', ['—'])[0]} |")
  return lines


#: The most columns of one Markdown table: wider ones are split (the first column repeated), so
#: that no column hides behind a scroll bar on a page at 1280 px.
MAX_COLUMNS = 6


def split_table(first: str, headers: list[str], rows: list[list[str]]) -> list[str]:
  """A Markdown table (rows begin with the ``first`` column's cell), as lines: one table of at
  most MAX_COLUMNS columns, or several, each with the first column and the next headers, one
  blank line between them."""
  lines = []
  for start in range(0, max(len(headers), 1), MAX_COLUMNS - 1):
    part = slice(start, start + MAX_COLUMNS - 1)
    lines += ([""] if lines else []) + [
        "| " + " | ".join([first] + headers[part]) + " |",
        "|---" * (len(headers[part]) + 1) + "|"]
    lines += ["| " + " | ".join(row[:1] + row[1:][part]) + " |" for row in rows]
  return lines


def markdown(title, records, design: verdicts.Design, comparisons, chosen,
             logits=None) -> str:
  """The report. ``logits``: {arm label: (final, peak)} of the largest attention logit, from the
  run's logs (absent in a report made from results.csv alone)."""
  armed = arm_values(records)
  seeds = max((len(metrics["seed"]) for _, metrics, _ in armed), default=0)
  lines = [f"## {title}", "", *provenance_lines(records),
           *design_lines(design, chosen, seeds, not varies_learning_rate(records))]
  lines += ["### Comparisons", "", "Arm minus reference, each at its chosen learning rate "
            "(the Holm family), then the arm at the reference's chosen rate where its grid has it "
            "(matched: outside the family, p unadjusted) "
            f"({INTERVAL_NOTE}, Welch's unpaired; for a share of seeds, Newcombe's interval).",
            "",
            *comparison_lines(comparisons, design)]
  edges = [c.variant for c in chosen if c.edge]
  lines += ["", "### Each variant at its chosen learning rate", "",
            f"Means with their {INTERVAL_NOTE}; solved: seeds at the threshold, with Wilson's "
            "interval; LR sensitivity: Wortsman et al. (2023) eq. 1 over the grid."
            + (f" ⚑: the chosen rate is at the edge of the grid tried ({', '.join(edges)}), "
               "so the optimum may lie outside it." if edges else ""), "",
            *chosen_lines(chosen, design, records)]
  columns = accuracy_columns(records)
  lines += ["", "### Every arm", "", f"Every setting on every test set ({INTERVAL_NOTE}); "
            "a run whose loss went non-finite is 'diverged', left out of the means and "
            "counted. Descriptive: the comparisons above are the tests.", "",
            *split_table("arm", [readable(c) for c in columns] + ["diverged", "seconds"], [
                [readable_arm(label)] + [mean_cell(metrics[c], c) for c in columns]
                + [str(sum(1 for step in metrics.get("diverged_at", []) if step)),
                   f"{metrics.get('seconds', [math.nan])[0]:.0f}"]
                for label, metrics, _ in armed])]
  if logits:
    lines += ["", "Largest attention logit (over layers, heads and a training batch) at the "
              "last log step, and its peak during training (mean over seeds; diverged runs "
              "included):", "", "| arm | final | peak |", "|---|---|---|"]
    lines += [f"| {readable_arm(label)} | {final:.3g} | {peak:.3g} |"
              for label, (final, peak) in logits.items()]
  probes = [p for p in PROBES if armed and f"init_{p}" in armed[0][1]
            and f"final_{p}" in armed[0][1]]
  if probes:
    lines += ["", "Attention at initialisation → after training (one test batch; means over "
              "layers, heads and seeds; gradient norms of the loss w.r.t. W_Q and W_K):", "",
              *split_table("arm", [readable(p) for p in probes], [
                  [readable_arm(label)] + [f"{np.nanmean(metrics['init_' + p]):.3g} → "
                                           f"{np.nanmean(metrics['final_' + p]):.3g}"
                                           for p in probes]
                  for label, metrics, _ in armed])]
  failed = [record for record in records if record["status"] != "ok"]
  if failed:
    lines += ["", "Failed variants:", ""] + [f"- {r['variant']}: {r['error']}" for r in failed]
  return "\n".join(lines) + "\n"
