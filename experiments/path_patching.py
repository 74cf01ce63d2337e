"""Path patching as causal evidence for farthest_point: which heads the read-out depends on.

farthest_point (experiments/tasks/farthest_point.py) has no CLS token: every token reads out its
own answer, the point farthest from it, through a linear read-out of its own residual stream.
Path patching (Wang et al. 2023) asks how much of that read-out one head carries directly: head
n's contribution after W_O (``blocks.{l}.attn.hook_result``, at every token) is taken from a
donor input, while every sublayer that reads the residual stream after it (the same block's
feed-forward sublayer, and in a deeper model every later block's attention and feed-forward) is
held at its value on the clean input. So the head's change reaches the read-out only along the
residual stream, through the LayerNorms that lie on it (the model is post-LN, LN(x + F(x)): a
LayerNorm is part of the stream, not a reader of it, and is recomputed). In a one-layer model
that is the head's one path to the read-out besides the feed-forward sublayer; in a two-layer
model a layer-0 head reaches the read-out directly, not through layer 1's input. With talking
heads or DCMHA, the heads' logits and weights are mixed before the weights meet the values, so
head n's ``hook_result`` is z_n W_O^n with z_n = sum_s w'_n(t, s) v_n(s): head n's values under
the mixed weights w'_n, which the probe reads (the weights the values are averaged with).

The measure, per head: the least-squares slope through 0 of the path-patched read-out's change
(patched - clean) on the full-input change (donor output - clean output), over every example,
token and coordinate: 1 if the head alone carries the whole change, 0 if it carries none of it
(``size``, the ratio of the two changes' norms, says how far it moves in any direction). The
probe: each head's share of tokens whose most-attended point is their farthest one (the
``found`` of experiments.probes.farthest_point_found, per head). The prediction,
``patching_study.PREDICTIONS["farthest_point_paths"]``, was committed before any model was
patched; ``meets`` applies it to a seed and ``verdict`` tests the seeds.

>>> share = np.array([[0.8, 0.05, -0.02]])  # [L, N]
>>> found = np.array([[0.9, 0.1, 0.0]])
>>> meets(share, found)
True

On a trained heads_binding farthest_point sweep (every arm with more than one head, each seed at
the rate its report chose on the validation stream); a study run as several sweeps runs it once
per sweep into the same folder, which then holds every arm's rows and verdicts:

  python -m experiments.path_patching \
      --sweep=workdir/ablations/heads_binding/farthest_point \
      --out=docs/results/heads_binding/path_patching
"""

from __future__ import annotations

import csv
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import hooks
from experiments import patching_study, probe_reports, probes, statistics
from experiments.tasks import farthest_point

#: The claim, its test and alpha, committed before any model was patched.
PREDICTION = patching_study.PREDICTIONS["farthest_point_paths"]
AT_LEAST = 0.5  # the probe's head carries at least half the full-input change
UNDER = 0.1  # every other head under a tenth of it
#: Descriptive, chosen after the data (not part of the prediction): a head "finds" the farthest
#: point when it is the most-attended point for at least this share of the tokens.
FINDS = 0.5


def receivers(layer: int, num_layers: int) -> tuple[str, ...]:
  """The hook points of the sublayers that read the residual stream after layer ``layer``'s
  attention: held at their clean values so that a head's result reaches only the read-out.

  >>> receivers(0, 2)
  ('blocks.0.hook_mlp_out', 'blocks.1.hook_attn_out', 'blocks.1.hook_mlp_out')
  """
  later = tuple(f"blocks.{l}.{name}" for l in range(layer + 1, num_layers)
                for name in ("hook_attn_out", "hook_mlp_out"))
  return (f"blocks.{layer}.hook_mlp_out",) + later


def path_patched(model, variables, clean, donor, layer: int = 0):
  """The read-out with each head of ``layer`` path-patched from ``donor``: clean, donor
  [B, T, F] -> (clean output, donor output [B, T, C], patched outputs [N, B, T, C]), one
  patched run per head, vmapped.

  >>> import attention_jax as aj
  >>> model = aj.TokenClassifier(aj.EncoderConfig(vocab_size=1, input_features=3, d_model=8,
  ...     num_heads=2, num_layers=2, mlp_dim=8, num_classes=3, dropout_rate=0.0))
  >>> x = jax.random.normal(jax.random.key(1), (2, 4, 3))  # [B, T, F]
  >>> variables = model.init(jax.random.key(0), x)
  >>> clean, donor, patched = path_patched(model, variables, x, x[::-1])
  >>> patched.shape  # [N, B, T, C]
  (2, 2, 4, 3)
  """
  result = f"blocks.{layer}.attn.hook_result"
  held = receivers(layer, model.config.num_layers)
  batch = len(clean)
  outputs, values = hooks.capture(model, variables, jnp.concatenate([clean, donor]),
                                  [result, *held])  # both inputs in one run: [2 B, ...]
  frozen = {name: hooks.set_to(values[name][:batch]) for name in held}
  run = lambda head: hooks.patch(model, variables, clean, {
      result: hooks.set_to(values[result][batch:], heads=head), **frozen})
  heads = jnp.arange(values[result].shape[-2])
  return outputs[:batch], outputs[batch:], jax.vmap(run)(heads)


def path_shares(clean_output, donor_output, patched) -> tuple[np.ndarray, np.ndarray]:
  """(share, size) per head: the slope through 0 of (patched - clean) on (donor - clean) over
  every example, token and coordinate, and the ratio of their norms. Arrays [B, T, C],
  [B, T, C], [N, B, T, C] -> [N], [N].

  >>> clean, donor = np.zeros((1, 2, 1)), np.ones((1, 2, 1))
  >>> share, size = path_shares(clean, donor, np.stack([0.5 * donor, -donor]))
  >>> share.tolist(), size.tolist()
  ([0.5, -1.0], [0.5, 1.0])
  """
  clean = np.asarray(clean_output, np.float64)
  full = (np.asarray(donor_output, np.float64) - clean).ravel()
  moved = (np.asarray(patched, np.float64) - clean[None]).reshape(len(patched), -1)
  return moved @ full / (full @ full), np.linalg.norm(moved, axis=1) / np.linalg.norm(full)


def farthest_found(model, params, x) -> np.ndarray:
  """Each head's share of tokens whose most-attended point is their farthest one: x [B, T, d]
  -> [L, N] (experiments.probes.farthest_point_found's ``found``, per layer and head)."""
  _, weights, _ = probes.capture(model, params, x)  # [L][B, N, T, T]
  far = farthest_point.farthest(np.asarray(x))  # [B, T]
  return np.stack([np.mean(np.asarray(w).argmax(-1) == far[:, None], axis=(0, 2))
                   for w in weights])


def meets(share, found) -> bool:
  """The prediction on one seed: the head the probe finds attending to the farthest point most
  (argmax of ``found`` [L, N]) carries at least AT_LEAST of the full change (``share`` [L, N])
  and every other head less than UNDER in size (|share|)."""
  share, probe = np.ravel(share), int(np.argmax(found))
  return bool(share[probe] >= AT_LEAST and np.all(np.abs(np.delete(share, probe)) < UNDER))


def seed_numbers(run, num_examples: int = 256) -> dict[str, np.ndarray]:
  """One trained farthest_point replica (experiments.trained.Trained) -> {found, share, size}
  [L, N] over its first ``num_examples`` test examples; the donor of example b is example
  b + 1 (rolled), whose every point has another farthest point."""
  x = np.asarray(run.task.test.tokens[:num_examples])  # [B, T, d]
  donor = np.roll(x, 1, axis=0)
  variables = {"params": run.params}
  shares = [path_shares(*jax.jit(functools.partial(path_patched, run.model, layer=layer))(
                variables, x, donor)) for layer in range(run.model.config.num_layers)]
  return {"found": farthest_found(run.model, run.params, x),
          "share": np.stack([share for share, _ in shares]),
          "size": np.stack([size for _, size in shares])}


def seed_row(numbers: dict[str, np.ndarray]) -> dict:
  """A seed's summary: the probe's head (layer, head), its found share, path share and size,
  the largest |share| of the other heads, the sum of every head's share (each patched alone),
  whether the seed meets the prediction; and (descriptive) how many heads find the farthest
  point (found >= FINDS), the sum of their shares and the largest |share| of the rest."""
  found, share = numbers["found"], numbers["share"]
  probe = int(np.argmax(found))
  layer, head = np.unravel_index(probe, found.shape)
  return {"heads": found.size, "layers": found.shape[0], "probe_layer": int(layer),
          "probe_head": int(head), "found": float(found.flat[probe]),
          "share_probe": float(share.flat[probe]), "size_probe": float(numbers["size"].flat[probe]),
          "share_other": float(np.max(np.abs(np.delete(share.ravel(), probe)))),
          "share_total": float(np.sum(share)), "meets": meets(share, found),
          "finders": int(np.sum(found >= FINDS)),
          "share_finders": float(np.sum(share[found >= FINDS])),
          "share_rest": float(np.max(np.abs(share[found < FINDS]), initial=0.0))}


def verdict(rows: list[dict]) -> dict:
  """The prediction tested on an arm's seeds (``seed_row``'s dicts): seeds meeting it,
  scipy.stats.binomtest against 1/2 (one-sided), and whether it holds (p < alpha and at least
  the declared share of seeds).

  >>> verdict([{"meets": s < 9} for s in range(10)])["holds"]
  True
  >>> verdict([{"meets": s < 8} for s in range(10)])["holds"]  # p 0.055
  False
  """
  meeting = sum(bool(row["meets"]) for row in rows)
  p, holds = statistics.seeds_beyond_chance(meeting, len(rows), 0.5, PREDICTION["alpha"],
                                            PREDICTION["min_share_of_seeds"])
  return {"seeds": len(rows), "meeting": meeting, "p": p, "holds": holds}


def arm_summaries(per_arm: dict[str, list[dict]]) -> list[dict]:
  """One row per arm: the verdict, Holm's p over the arms (statistics.adjust), and means with
  95% t intervals over seeds (statistics.mean_interval, cut at each measure's range) of
  ``seed_row``'s numbers."""
  found = {arm: verdict(rows) for arm, rows in per_arm.items()}
  comparisons = statistics.adjust([statistics.Comparison(
      "meets", arm, "chance", v["seeds"], v["meeting"] / v["seeds"], math.nan, math.nan,
      v["p"], "binomtest")
      for arm, v in found.items()])
  out = []
  for (arm, rows), adjusted in zip(per_arm.items(), comparisons):
    row = {"arm": arm, "heads": rows[0]["heads"], **found[arm],
           "p_adjusted": adjusted.p_adjusted}
    row["holds"] = "yes" if row["holds"] else "no"
    for key, lower, upper in (("found", 0, 1), ("share_probe", -np.inf, np.inf),
                              ("share_other", 0, np.inf), ("finders", 0, row["heads"]),
                              ("share_finders", -np.inf, np.inf), ("share_rest", 0, np.inf),
                              ("share_total", -np.inf, np.inf)):
      row[key], row[f"{key}_low"], row[f"{key}_high"] = statistics.mean_interval(
          [r[key] for r in rows], lower, upper)
    out.append(row)
  return out


def verdicts_table(summaries: list[dict]) -> str:
  """A markdown table of ``arm_summaries``."""
  cell = lambda row, key, form: (f"{row[key]:{form}} [{row[key + '_low']:{form}}, "
                                 f"{row[key + '_high']:{form}}]")
  lines = ["| arm | heads | probe's head finds the farthest point [95% t] | its path share "
           "[95% t] | largest other \\|share\\| [95% t] | seeds meeting | binomial p | Holm p "
           "| holds |", "|" + "---|" * 9]
  lines += [f"| {r['arm']} | {r['heads']} | {cell(r, 'found', '.3f')} | "
            f"{cell(r, 'share_probe', '.3f')} | {cell(r, 'share_other', '.3f')} | "
            f"{r['meeting']} of {r['seeds']} | {r['p']:.2g} | {r['p_adjusted']:.2g} | "
            f"{r['holds']} |" for r in summaries]
  return "\n".join(lines) + "\n"


def shared_table(summaries: list[dict]) -> str:
  """A markdown table of ``arm_summaries``' descriptive columns: the heads that find the farthest
  point, their summed share, the largest |share| of the others and every head's shares summed."""
  cell = lambda row, key: (f"{row[key]:.2f} [{row[key + '_low']:.2f}, "
                           f"{row[key + '_high']:.2f}]")
  lines = [f"| arm | heads | heads finding it (found >= {FINDS:g}) | their summed share | largest "
           "\\|share\\| of the others | every head's share summed |", "|" + "---|" * 6]
  lines += [f"| {r['arm']} | {r['heads']} | " + " | ".join(
      cell(r, key) for key in ("finders", "share_finders", "share_rest", "share_total")) + " |"
      for r in summaries]
  return "\n".join(lines) + "\n"


def _write_csv(path: str, rows: list[dict]) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def measure(sweep: str, num_examples: int = 256) -> list[dict]:
  """``seed_numbers`` of every seed of every arm of ``sweep`` with more than one head, at its
  chosen rate: a row per arm, seed, layer and head (found, share, size)."""
  numbers = probe_reports.per_arm(sweep, lambda run: seed_numbers(run, num_examples),
                                  lambda heads: heads > 1)
  return [{"arm": arm, "seed": seed, "layer": layer, "head": head,
           **{key: float(n[key][layer, head]) for key in ("found", "share", "size")}}
          for arm, per_seed in numbers.items() for seed, n in enumerate(per_seed)
          for layer, head in np.ndindex(n["found"].shape)]


def seeds_of(heads_rows: list[dict]) -> dict[str, list[dict[str, np.ndarray]]]:
  """``measure``'s rows (or heads.csv's) back to {arm: [{found, share, size} [L, N] per seed]}.

  >>> rows = [{"arm": "a", "seed": 0, "layer": 0, "head": h, "found": h, "share": 0.5 * h,
  ...          "size": h} for h in range(2)]
  >>> seeds_of(rows)["a"][0]["share"]
  array([[0. , 0.5]])
  """
  grouped: dict[str, dict[int, list[dict]]] = {}
  for row in heads_rows:
    grouped.setdefault(row["arm"], {}).setdefault(int(row["seed"]), []).append(row)
  out = {}
  for arm, seeds in grouped.items():
    out[arm] = []
    for seed in sorted(seeds):
      rows = seeds[seed]
      shape = (1 + max(int(r["layer"]) for r in rows), 1 + max(int(r["head"]) for r in rows))
      arrays = {key: np.full(shape, np.nan) for key in ("found", "share", "size")}
      for r in rows:
        for key in arrays:
          arrays[key][int(r["layer"]), int(r["head"])] = float(r[key])
      out[arm].append(arrays)
  return out


def summarise(heads_rows: list[dict], out: str) -> list[dict]:
  """From the per-head rows of every arm: writes path_patching.csv (``seed_row`` per arm and
  seed), arms.csv and verdicts.md (``arm_summaries``: Holm over every arm; the prediction's
  table, then the descriptive one) to ``out``, and returns the summaries."""
  per_arm = {arm: [seed_row(n) for n in per_seed]
             for arm, per_seed in seeds_of(heads_rows).items()}
  summaries = arm_summaries(per_arm)
  _write_csv(os.path.join(out, "path_patching.csv"),
             [{"arm": arm, "seed": seed, **row} for arm, rows in per_arm.items()
              for seed, row in enumerate(rows)])
  _write_csv(os.path.join(out, "arms.csv"), summaries)
  with open(os.path.join(out, "verdicts.md"), "w") as f:
    f.write(verdicts_table(summaries) + "\nDescriptive, after the data (not the prediction): how "
            "the read-out is shared between the heads.\n\n" + shared_table(summaries))
  return summaries


def write(sweep: str, out: str, num_examples: int = 256) -> list[dict]:
  """``measure`` of ``sweep``, its rows put in ``out``/heads.csv (replacing those of the same
  arms, keeping the other arms': a study run as several sweeps is measured one sweep at a time),
  then ``summarise`` over every arm of heads.csv; returns the summaries."""
  rows = measure(sweep, num_examples)
  if not rows:
    raise ValueError(f"{sweep} has no arm with more than one head to patch.")
  path = os.path.join(out, "heads.csv")
  kept = []
  if os.path.exists(path):
    with open(path, newline="") as f:
      arms = {row["arm"] for row in rows}
      kept = [row for row in csv.DictReader(f) if row["arm"] not in arms]
  os.makedirs(out, exist_ok=True)
  _write_csv(path, kept + rows)
  return summarise(kept + rows, out)


def main():
  summaries = patching_study.run_command_line(
      __doc__, write, "a farthest_point sweep's workdir (results.csv, "
      "variants/); run once per sweep of a study, same --out", "where the CSVs and verdicts.md go")
  for row in summaries:
    print(row["arm"], f"{row['meeting']} of {row['seeds']}", f"p {row['p']:.2g}", row["holds"])


if __name__ == "__main__":
  main()
