"""Executable checks of what the explanations of self-attention claim: tables and one figure.

  python scripts/theory_checks.py [--samples 65536] [--out DIR] [--trained RUN_DIR ...]

1. Var(q . k) = d_k for unit-variance q, k, and about 1 after the 1/sqrt(d_k) scaling.
2. Without the scaling the softmax saturates as d_k grows (max weight -> 1, entropy -> 0).
3. PE(pos + k) = M_k PE(pos): one matrix per offset maps every sinusoidal position.
4. Self-attention without positional encoding is permutation equivariant; each encoding breaks it.
5. The "diagonal fallacy": how often a trained head's query t gives its own key t the largest
   logit (only with --trained, the workdirs of trained runs or sweep variants).
With --out, the tables go to DIR/theory_checks.md and the figures to DIR/theory_checks.png (the
scaling checks) and DIR/theory_checks_equivariance.png.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from attention_jax import diagnostics, reference  # noqa: E402
from experiments import figures  # noqa: E402

HEAD_DIMS = (4, 16, 64, 256, 1024)
KEYS = 32  # keys per query in checks 1-2


def logit_statistics(samples: int) -> dict:
  """Per d_k: Var(q.k) unscaled and scaled, mean max weight and entropy / ln(KEYS), both ways."""
  rows = {}
  for head_dim in HEAD_DIMS:
    q_key, k_key = jax.random.split(jax.random.key(head_dim))
    query = jax.random.normal(q_key, (samples // KEYS, KEYS, 1, head_dim))  # [B, T, N, H]
    key = jax.random.normal(k_key, (samples // KEYS, KEYS, 1, head_dim))
    row = {}
    for name, scale in (("unscaled", 1.0), ("scaled", head_dim ** -0.5)):
      logits = reference.attention_logits(query, key, scale=scale)  # [B, 1, T, S]
      weights = reference.logits_to_weights(logits)
      row[f"var_{name}"] = float(jnp.var(logits))
      row[f"max_weight_{name}"] = float(jnp.mean(jnp.max(weights, -1)))
      row[f"entropy_{name}"] = float(jnp.mean(diagnostics.entropy(weights))) / np.log(KEYS)
    rows[head_dim] = row
  return rows


def sinusoid_shift(dim: int = 64, length: int = 512) -> dict:
  """Per offset k: residual of the best linear map PE(pos) -> PE(pos + k), and (a control) of the
  best linear map PE(pos) -> PE(2 pos), which is not linear."""
  rows = {}
  for offset in (1, 10, 100):
    table = np.asarray(aj.sinusoidal_encoding(2 * length + offset, dim), np.float64)
    source, target = table[:length], table[offset:offset + length]
    fitted, *_ = np.linalg.lstsq(source, target, rcond=None)
    doubled = table[:2 * length:2]
    fitted_doubled, *_ = np.linalg.lstsq(source, doubled, rcond=None)
    rows[offset] = (float(np.max(np.abs(source @ fitted - target))),
                    float(np.max(np.abs(source @ fitted_doubled - doubled))))
  return rows


def permutation_equivariance(length: int = 16) -> dict:
  """Per encoding: max |f(P x) - P f(x)| of a 2-layer encoder for a random permutation P."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.permutation(np.arange(1, 64))[:length])[None]  # [1, T], distinct
  permutation = rng.permutation(length)
  errors = {}
  for name in aj.POSITIONAL_ENCODINGS:
    config = aj.EncoderConfig(vocab_size=64, d_model=64, num_heads=4, num_layers=2,
                              max_length=length, positional_encoding=name)
    model = aj.TransformerEncoder(config)
    variables = model.init(jax.random.key(0), tokens)
    encode = jax.jit(lambda t, model=model, variables=variables: model.apply(variables, t))
    errors[name] = float(jnp.max(jnp.abs(encode(tokens[:, permutation])
                                         - encode(tokens)[:, permutation])))
  return errors


def diagonal_fallacy(workdirs, examples: int = 512) -> dict:
  """Per trained run: the fraction of queries whose own key wins, per layer (mean over heads),
  its largest value over heads, and chance (1 / mean number of keys)."""
  from experiments import probes, trained
  rows = {}
  for workdir in workdirs:
    run = trained.load(workdir)
    tokens = run.task.test.tokens[:examples]
    stats = jax.device_get(probes.head_statistics(run.model, run.params, tokens))
    keys = np.mean(np.sum(tokens != run.task.pad_id, axis=1)) + (run.config.model.pooling == "cls")
    rows[workdir] = (np.asarray(stats["diagonal_max"]), 1.0 / keys)
  return rows


def report(samples, trained_dirs) -> tuple[str, dict]:
  logits = logit_statistics(samples)
  lines = [f"JAX {jax.__version__} on {jax.devices()[0].platform}", "",
           f"1-2. Logits and softmax of random unit-variance q, k ({KEYS} keys per query, "
           f"{samples} pairs per d_k)", "",
           "| d_k | Var(q.k) | Var(q.k / sqrt(d_k)) | max weight, unscaled | max weight, scaled | "
           "entropy / ln 32, unscaled | entropy / ln 32, scaled |", "|---" * 7 + "|"]
  for head_dim, r in logits.items():
    lines.append(f"| {head_dim} | {r['var_unscaled']:.2f} | {r['var_scaled']:.3f} | "
                 f"{r['max_weight_unscaled']:.3f} | {r['max_weight_scaled']:.3f} | "
                 f"{r['entropy_unscaled']:.3f} | {r['entropy_scaled']:.3f} |")
  lines += ["", "3. Sinusoidal PE(pos + k) = M_k PE(pos), d = 64, 512 positions", "",
            "| k | max abs residual of PE M_k vs PE(+k) | control: fit of PE(2 pos) |",
            "|---|---|---|"]
  lines += [f"| {k} | {a:.2e} | {b:.2e} |" for k, (a, b) in sinusoid_shift().items()]
  equivariance = permutation_equivariance()
  lines += ["", "4. Encoder (2 layers, d_model 64, 4 heads), 16 tokens: max |f(P x) - P f(x)| for "
            "a random permutation P", "", "| encoding | error |", "|---|---|"]
  lines += [f"| {name} | {error:.2e} |" for name, error in equivariance.items()]
  fallacy = diagonal_fallacy(trained_dirs) if trained_dirs else {}
  if fallacy:
    lines += ["", "5. Diagonal fallacy: fraction of test queries whose own key has the largest "
              "logit, in trained models", "",
              "| run | per layer (mean over heads) | most diagonal head | chance |",
              "|---|---|---|---|"]
    for workdir, (rate, chance) in fallacy.items():
      layers = ", ".join(f"{value:.3f}" for value in rate.mean(axis=1))
      lines.append(f"| {workdir} | {layers} | {rate.max():.3f} | {chance:.3f} |")
  return "\n".join(lines) + "\n", {"logits": logits, "equivariance": equivariance}


def figure(data, path):
  """Two figures: the scaling checks (three panels) at ``path``, the permutation-equivariance
  error beside it (``path`` with ``_equivariance``)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  dims = list(data["logits"])
  fig, axes = plt.subplots(1, 3, figsize=(figures.WIDTH, 3.2))
  for name, style in (("unscaled", "o-"), ("scaled", "s--")):
    label = "q·k" if name == "unscaled" else "q·k / √dₖ"
    for axis, measure in zip(axes, ("var", "max_weight", "entropy")):
      axis.plot(dims, [data["logits"][d][f"{measure}_{name}"] for d in dims], style, label=label)
  axes[0].plot(dims, dims, ":", color="gray", label="dₖ")
  axes[0].set_yscale("log")
  for axis, title in zip(axes, ("variance of the logits", "mean largest weight",
                                "entropy / ln 32 (32 keys)")):
    axis.set_xscale("log", base=2)
    axis.set_xlabel("dₖ (head size)")
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
  fig.tight_layout()
  figures.save(fig, path)
  names = list(data["equivariance"])
  fig, axis = plt.subplots(figsize=(5.5, 3.6))
  axis.bar(names, [max(data["equivariance"][n], 1e-9) for n in names])
  axis.set_yscale("log")
  axis.set_ylabel("largest |f(Px) - P f(x)|")
  axis.set_title("Permutation equivariance of the encoder, by positional encoding", fontsize=9)
  fig.tight_layout()
  figures.save(fig, path.replace(".png", "_equivariance.png"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--samples", type=int, default=65536, help="query-key pairs per d_k")
  parser.add_argument("--out", default=None, help="directory for theory_checks.md and .png")
  parser.add_argument("--trained", nargs="*", default=[], help="trained runs for check 5")
  args = parser.parse_args()
  text, data = report(args.samples, args.trained)
  print(text)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "theory_checks.md"), "w") as f:
      f.write(text)
    figure(data, os.path.join(args.out, "theory_checks.png"))


if __name__ == "__main__":
  main()
