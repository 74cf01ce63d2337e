"""Is the trainer's step bitwise reproducible here, and if not, what breaks it?

  python scripts/determinism_check.py [--steps 20] [--size default] [--dtype float32]
      [--attention-impl xla] [--json FILE]

Runs the trainer's compiled step (scripts/benchmark_train.py's model at ``--size``) ``--steps``
times from the step-0 state, twice in one process (run to run: atomic additions, whose order
varies) and in two processes at once (process to process: XLA's autotuning, which times
candidate kernels and keeps the fastest, can choose differently in each), under three settings:

- "none": no XLA flags;
- "exclude_nondeterministic_ops": ``XLA_FLAGS=--xla_gpu_exclude_nondeterministic_ops=true``,
  which has XLA:GPU leave out the kernels that add with atomics;
- "deterministic_ops": ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``.

Each process prints the losses of its two runs and a digest of their final parameters, and
lists the ops of the compiled step that XLA:GPU can run with atomics (scatter,
select-and-scatter) and the cuDNN calls in it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

SETTINGS = {
    "none": "",
    "exclude_nondeterministic_ops": "--xla_gpu_exclude_nondeterministic_ops=true",
    "deterministic_ops": "--xla_gpu_deterministic_ops=true",
}


def digest(tree) -> str:
  import jax
  import numpy as np
  hasher = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    hasher.update(np.asarray(leaf).tobytes())
  return hasher.hexdigest()[:16]


def worker(size: str, dtype: str, attention_impl: str, steps: int) -> dict:
  """Runs the step ``steps`` times, twice; the digests of both runs and the compiled ops."""
  import jax
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from scripts import benchmark_train as bench
  sizes = bench.ALL_SIZES
  config = bench.benchmark_config(sizes[size], dtype)
  config.model.attention_impl = attention_impl
  tokens, labels = bench.random_batch(sizes[size][0], sizes[size][1])
  step_fn, state, batch = bench.jax_step(config, tokens, labels)
  initial = jax.tree.map(lambda x: x.copy(), state)
  hlo = step_fn.lower(state, batch).compile().as_text()
  digests, losses = [], []
  for _ in range(2):
    state = jax.tree.map(lambda x: x.copy(), initial)
    for _ in range(steps):
      state, metrics = step_fn(state, batch)
    losses.append(float(metrics["loss"][0]))
    digests.append(digest(state.params))
  ops = {name: len(re.findall(pattern, hlo)) for name, pattern in {
      "scatter": r"= \S+ scatter\(", "select-and-scatter": r"select-and-scatter\(",
      "cudnn calls": r'custom_call_target="__cudnn'}.items()}
  return {"digests": digests, "losses": losses, "ops": ops,
          "device": jax.devices()[0].device_kind, "jax": jax.__version__}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--size", default="default", help="a size of scripts/benchmark_train.py")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--attention-impl", default="", help="the model's attention_impl "
                      "(configs/default.py; '' = automatic, cuDNN in 16-bit on Hopper GPUs)")
  parser.add_argument("--json", help="write the results to this file")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print(json.dumps(worker(args.size, args.dtype, args.attention_impl, args.steps)))
    return
  processes = []
  for setting, flags in SETTINGS.items():
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--size", args.size,
               "--dtype", args.dtype, "--attention-impl", args.attention_impl,
               "--steps", str(args.steps)]
    processes += [(setting, subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True))
                  for _ in range(2)]
  runs = {}
  for setting, process in processes:
    output, errors = process.communicate()
    if process.returncode:  # the exception's own line, e.g. XLA's
      last = [line for line in errors.splitlines() if re.match(r"\w+(Error|Exception)", line)]
      runs.setdefault(setting, []).append(
          {"error": last[-1] if last else f"exit {process.returncode}"})
      continue
    runs.setdefault(setting, []).append(json.loads(output.strip().splitlines()[-1]))
  report = {}
  for setting, results in runs.items():
    if any("error" in result for result in results):
      report[setting] = {"error": [result.get("error") for result in results]}
      print(f"{setting:30} failed: {report[setting]['error'][0]}", flush=True)
      continue
    digests = [result["digests"] for result in results]
    report[setting] = {
        "same_in_process": all(a == b for a, b in digests),
        "same_across_processes": digests[0][0] == digests[1][0],
        "losses": [result["losses"] for result in results], "ops": results[0]["ops"],
        "device": results[0]["device"], "jax": results[0]["jax"]}
    print(f"{setting:30} run to run: {'same' if report[setting]['same_in_process'] else 'DIFFER'}"
          f"  process to process: "
          f"{'same' if report[setting]['same_across_processes'] else 'DIFFER'}"
          f"  ops: {results[0]['ops']}", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"size": args.size, "dtype": args.dtype, "attention_impl": args.attention_impl,
                 "steps": args.steps, "report": report}, f, indent=1)


if __name__ == "__main__":
  main()
