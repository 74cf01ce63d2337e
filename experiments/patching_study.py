"""Activation patching as causal evidence for multi_retrieval's "one head per maximum".

The probe (experiments.probes.max_shares) says which head's read-out query attends to the token
that attains maximum i. Patching reads it causally: replace head j's output z (before W_O) on a
clean input with its value on a donor input whose maxima differ, and see which output moves.
``PREDICTIONS`` below was written and committed before any model was patched; ``verdicts``
applies its tests (scipy.stats) to the per-seed numbers ``seed_numbers`` measures.

>>> effect = np.array([[0.9, 0.1], [0.2, 0.8], [0.1, 0.1]])  # [N, D]: heads x maxima
>>> share = np.array([[0.7, 0.0], [0.1, 0.9], [0.2, 0.1]])
>>> int(agreeing_maxima(effect, share))
2

On a trained heads_binding sweep (every arm with at least D heads, each seed at the rate its
report chose on the validation stream):

  python -m experiments.patching_study --sweep=workdir/ablations/heads_binding/multi_retrieval \
      --out=docs/results/heads_binding/patching
"""

from __future__ import annotations

import csv
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from attention_jax import hooks
from experiments import probe_reports, probes, statistics

#: The claims, their tests, alphas and margins (fixed before any run).
PREDICTIONS = {
    "agreement": {
        "claim": "in a seed, the head whose z-patch moves output i the most (mean |change|) is the "
                 "head the probe assigns to maximum i (linear_sum_assignment of max_shares) for "
                 "at least D - 1 of the D maxima",
        "test": "scipy.stats.binomtest(seeds agreeing, seeds, p = P[Binomial(D, 1/N) >= D - 1], "
                "alternative='greater') (the chance of agreeing if effect and probe were "
                "unrelated); and at least 8 of 10 seeds agree",
        "alpha": 0.01, "min_share_of_seeds": 0.8,
    },
    "transfer": {
        "claim": "patching the assigned head of maximum i moves output i by the donor's change of "
                 "maximum i: the least-squares slope of (patched - clean) output i on (donor - "
                 "clean) target i is 1 within the margin, its 95% t interval over seeds inside "
                 "[1 - margin, 1 + margin]",
        "test": "scipy.stats.t interval of the per-seed slope (mean over maxima), two-sided 95%",
        "alpha": 0.05, "margin": 0.35,
    },
    "specificity": {
        "claim": "the same patch leaves the other outputs: the slope of output k != i on the "
                 "donor's change of target i has a 95% t interval over seeds inside [-margin, "
                 "margin]",
        "test": "scipy.stats.t interval of the per-seed mean off-target slope",
        "alpha": 0.05, "margin": 0.2,
    },
    "farthest_point_paths": {
        "claim": "in heads_binding's farthest_point, path patching of one head's contribution "
                 "(hook_result) into the CLS read-out alone, from a donor with another farthest "
                 "point, moves the read-out by at least half the full-input change for the "
                 "head the probe finds attending to the farthest point, and by under a tenth "
                 "for every other head, in at least 8 of 10 seeds",
        "test": "scipy.stats.binomtest(seeds meeting it, seeds, p=0.5, alternative='greater')",
        "alpha": 0.05, "min_share_of_seeds": 0.8,
    },
}
MIN_SEEDS = 10


def head_effects(model, variables, clean, donor, layer: int = 0):
  """Outputs with each head's z patched from ``donor``: clean, donor [B, T, F] (or token ids)
  -> (clean output [B, D], patched outputs [N, B, D]), one patched run per head, vmapped.

  >>> import attention_jax as aj
  >>> model = aj.SequenceClassifier(aj.EncoderConfig(vocab_size=8, d_model=16, num_heads=2,
  ...     num_layers=1, mlp_dim=16, num_classes=3, dropout_rate=0.0))
  >>> tokens = jnp.array([[1, 2, 3], [4, 5, 6]])
  >>> variables = model.init(jax.random.key(0), tokens)
  >>> clean, patched = head_effects(model, variables, tokens, tokens[::-1])
  >>> clean.shape, patched.shape
  ((2, 3), (2, 2, 3))
  """
  name = f"blocks.{layer}.attn.hook_z"
  output, values = hooks.capture(model, variables, clean, [name])
  _, donor_values = hooks.capture(model, variables, donor, [name])
  heads = values[name].shape[-2]
  run = lambda head: hooks.patch(model, variables, clean,
                                 {name: hooks.set_to(donor_values[name], heads=head)})
  return output, jax.vmap(run)(jnp.arange(heads))


def effect_matrix(clean_output, patched) -> np.ndarray:
  """Mean |patched - clean| per head and output: [B, D], [N, B, D] -> [N, D]."""
  return np.mean(np.abs(np.asarray(patched) - np.asarray(clean_output)[None]), axis=1)


def assigned_heads(share) -> np.ndarray:
  """The probe's head of each maximum, distinct heads maximising the summed share: [N, D] ->
  [D] (-1 where there are fewer heads than maxima)."""
  from scipy import optimize
  heads, maxima = optimize.linear_sum_assignment(np.asarray(share), maximize=True)
  out = np.full(np.shape(share)[1], -1)
  out[maxima] = heads
  return out


def agreeing_maxima(effect, share) -> int:
  """How many maxima's most-moving head (argmax over heads of ``effect`` [N, D]) is the probe's
  assigned head (``share`` [N, D])."""
  return int(np.sum(np.argmax(effect, axis=0) == assigned_heads(share)))


def slopes(clean_output, patched, clean_target, donor_target, share) -> tuple[float, float]:
  """(on-target, off-target) least-squares slopes through 0 of the output change on the donor's
  target change, patching each maximum's assigned head, averaged over maxima (and over the other
  outputs for off-target). Arrays: [B, D], [N, B, D], [B, D], [B, D], [N, D]."""
  change = np.asarray(donor_target) - np.asarray(clean_target)  # [B, D]
  moved = np.asarray(patched) - np.asarray(clean_output)[None]  # [N, B, D]
  heads = assigned_heads(share)
  on, off = [], []
  for i, head in enumerate(heads):
    if head < 0:
      continue
    fit = lambda y: float(change[:, i] @ y / (change[:, i] @ change[:, i]))
    on.append(fit(moved[head, :, i]))
    off.extend(fit(moved[head, :, k]) for k in range(change.shape[1]) if k != i)
  return float(np.mean(on)), float(np.mean(off))


def seed_numbers(run, num_examples: int = 256) -> dict[str, float]:
  """One trained multi_retrieval replica (experiments.trained.Trained) -> its per-seed numbers:
  agreeing maxima, on- and off-target slopes, heads N and maxima D. The donor of example b is
  example b + 1 (rolled) of the test split."""
  x = np.asarray(run.task.test.tokens[:num_examples])
  y = np.asarray(run.task.test.labels[:num_examples])
  donor = np.roll(x, 1, axis=0)
  clean_output, patched = head_effects(run.model, {"params": run.params}, x, donor)
  share = probes.max_shares(run, num_examples)
  on, off = slopes(clean_output, patched, y, np.roll(y, 1, axis=0), share)
  heads, maxima = share.shape
  return {"agreeing": agreeing_maxima(effect_matrix(clean_output, patched), share),
          "slope_on": on, "slope_off": off, "heads": heads, "maxima": maxima}


def _interval(values, alpha: float) -> tuple[float, float]:
  values = np.asarray(values, float)
  return stats.t.interval(1 - alpha, len(values) - 1, loc=values.mean(), scale=stats.sem(values))


def verdicts(rows: list[dict]) -> dict[str, dict]:
  """``PREDICTIONS`` tested on per-seed rows (``seed_numbers``' dicts, one per seed).

  >>> rows = [{"agreeing": 4, "slope_on": 1.0 + 0.01 * s, "slope_off": 0.01 * s, "heads": 4,
  ...          "maxima": 4} for s in range(10)]
  >>> {name: v["holds"] for name, v in verdicts(rows).items()}
  {'agreement': True, 'transfer': True, 'specificity': True}
  """
  if len(rows) < 2:
    raise ValueError(f"{len(rows)} seed(s): the tests need at least 2 (the study asks for "
                     f"{MIN_SEEDS}); train more replicas.")
  heads, maxima = rows[0]["heads"], rows[0]["maxima"]
  chance = float(stats.binom.sf(maxima - 2, maxima, 1 / heads))
  agree = sum(row["agreeing"] >= maxima - 1 for row in rows)
  spec = PREDICTIONS["agreement"]
  p, holds = statistics.seeds_beyond_chance(agree, len(rows), chance, spec["alpha"],
                                            spec["min_share_of_seeds"])
  out = {"agreement": {"seeds": len(rows), "agreeing_seeds": agree, "chance": chance, "p": p,
                       "holds": holds}}
  for name, key, centre in (("transfer", "slope_on", 1.0), ("specificity", "slope_off", 0.0)):
    spec = PREDICTIONS[name]
    low, high = _interval([row[key] for row in rows], spec["alpha"])
    out[name] = {"mean": float(np.mean([row[key] for row in rows])), "low": float(low),
                 "high": float(high), "holds": bool(centre - spec["margin"] <= low
                                                    and high <= centre + spec["margin"])}
  return out


def _maxima(sweep: str) -> int:
  variants = os.path.join(sweep, "variants")
  with open(os.path.join(variants, sorted(os.listdir(variants))[0], "config.json")) as f:
    return int(json.load(f)["task_options"]["num_retrievals"])


def write(sweep: str, out: str, num_examples: int = 256) -> dict[str, dict]:
  """``seed_numbers`` for every seed of every arm of ``sweep`` with at least D heads, at its
  chosen rate; writes patching.csv (one row per arm and seed) and patching.json (``verdicts`` per
  arm) to ``out`` and returns the verdicts."""
  maxima = _maxima(sweep)
  rows = probe_reports.per_arm(sweep, lambda run: seed_numbers(run, num_examples),
                               lambda heads: heads >= maxima)
  if not rows:
    raise ValueError(f"{sweep} has no arm with at least {maxima} heads to patch.")
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "patching.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, ["arm", "seed", "agreeing", "slope_on", "slope_off", "heads",
                                "maxima"])
    writer.writeheader()
    for arm, per_seed in rows.items():
      writer.writerows({"arm": arm, "seed": seed, **numbers}
                       for seed, numbers in enumerate(per_seed))
  found = {arm: verdicts(per_seed) for arm, per_seed in rows.items()}
  with open(os.path.join(out, "patching.json"), "w") as f:
    json.dump(found, f, indent=1)
  return found


def run_command_line(doc: str, write_fn, sweep_help: str, out_help: str):
  """A patching study's command line (probe_reports.command_line with --out required and
  --examples): ``write_fn(sweep, out, examples)``'s result."""
  return probe_reports.command_line(
      doc, lambda args: write_fn(args.sweep, args.out, args.examples),
      sweep=dict(required=True, help=sweep_help), out=dict(required=True, help=out_help),
      examples=dict(type=int, default=256, help="test examples patched per seed"))


def main():
  found = run_command_line(__doc__, write,
                           "a multi_retrieval sweep's workdir (results.csv, variants/)",
                           "where patching.csv and patching.json go")
  for arm, result in found.items():
    print(arm, {name: v["holds"] for name, v in result.items()})


if __name__ == "__main__":
  main()
