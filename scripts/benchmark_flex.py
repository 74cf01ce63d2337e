"""Custom attention (score_mod, mask_mod, block masks) against PyTorch's FlexAttention.

  python scripts/benchmark_flex.py [--lengths 1024 2048 4096 8192] [--rounds 3]
      [--sparsity-length 4096] [--documents 1 2 4 8] [--block 512] [--torch-eager-max 4096]
      [--fused-configs 128:4:2 ...] [--dtype float32] [--skip-torch] [--json FILE] [--plot FILE]
      [--mask-cost-length 32768] [--mask-cost-documents 8]

1. Against torch: the same causal ALiBi attention written as a score_mod and a mask_mod (a block
   mask made once per length, outside the timing), B = 1, N = 8 heads of 64, in --dtype, at each
   length. Ours: dot_product_attention(implementation="chunked", block_mask=...) under jit.
   "ours, no score_mod" is the same without the score_mod: what the score_mod costs.
   On a GPU, "ours (fused)" is the fused Pallas-Triton kernel (implementation="pallas_gpu"),
   and --fused-configs adds it at other blocks, warps and pipeline stages (for tuning).
   Torch: flex_attention eager (its dense math implementation) and torch.compile'd, forward;
   torch's CPU flex_attention has no backward, so forward+backward compares with torch's eager
   FlexAttention math (``math_attention``) through autograd, the only backward torch offers
   on CPU. Eager torch materialises the T x T scores, so it runs up to --torch-eager-max.
   Where JAX runs on a GPU, torch runs there too, and its compiled FlexAttention (Triton
   kernels) is timed forward and forward+backward.
2. Block sparsity: a document mask (D equal documents, as a mask_mod with its block mask of
   --block) against full attention (no mask) at --sparsity-length, in float32: time and ratio,
   forward and forward+backward; ideally 1/D when a document spans whole blocks. "full" runs the same
   blocks (what skipping saves); "full, default blocks" the kernel's default blocks (what a
   user of full attention would run). --plot writes the figure.
3. What a block mask costs to build: make_block_mask of the --mask-cost-documents document mask
   at --mask-cost-length (block 128, torch's default), the first call (tracing and compiling its
   loop included) and a repeated one, each against one forward+backward of the blockwise call
   that uses it (PyTorch users find create_block_mask costing more than the attention itself).

Each round runs every method once, in an order shuffled per round, after a warm-up; medians
over rounds. Ratios are ours / theirs (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from attention_jax import pallas_gpu  # noqa: E402
from experiments import figures, provenance as provenance_lib  # noqa: E402
from scripts import benchmark_structure  # noqa: E402
from scripts.benchmark_structure import median_times  # noqa: E402

HEADS, HEAD_DIM = 8, 64


def inputs(length, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.standard_normal((1, length, HEADS, HEAD_DIM)).astype(np.float32)
          for _ in range(3)]


def jax_run(attend, arrays, backward, dtype="float32"):
  """attend(q, k, v) jitted (or its gradient w.r.t. q, k, v), compiled, as a timed call."""
  return benchmark_structure.compiled(attend, [jnp.asarray(x, dtype) for x in arrays],
                                      backward)[0]


def alibi_mods(slopes=None):
  """Causal ALiBi as a score_mod and a mask_mod, with JAX's ``slopes`` or torch's."""
  slopes = aj.positional.alibi_slopes(HEADS) if slopes is None else slopes

  def score_mod(score, b, h, q_idx, kv_idx):
    return score - slopes[h] * (q_idx - kv_idx)

  def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx
  return score_mod, causal


def ours(length, block, with_score_mod=True, fused=False):
  """Causal ALiBi (or, without the score_mod, causal attention alone) through the chunked
  kernel with a block mask, or (``fused``) the fused Pallas-Triton kernel (GPU only)."""
  score_mod, causal = alibi_mods()
  block_mask = aj.make_block_mask(causal, None, None, length, length, block_size=block)
  return lambda q, k, v: aj.dot_product_attention(
      q, k, v, score_mod=score_mod if with_score_mod else None, block_mask=block_mask,
      implementation="pallas_gpu" if fused else "chunked")


def fused_tuned(length, config):
  """Causal ALiBi through the fused kernel at ``config`` = "BLOCK:WARPS:STAGES" (GPU only);
  BLOCK: one size for queries and keys, or BQxBK."""
  block, num_warps, num_stages = config.split(":")
  blocks = tuple(int(size) for size in block.split("x"))
  score_mod, causal = alibi_mods()
  block_mask = aj.make_block_mask(causal, None, None, length, length,
                                  block_size=blocks if len(blocks) == 2 else blocks[0])
  return lambda q, k, v: pallas_gpu.flex_attention(
      q, k, v, scale=HEAD_DIM ** -0.5, score_mod=score_mod, block_mask=block_mask,
      num_warps=int(num_warps), num_stages=int(num_stages))[0]


def torch_runs(length, arrays, backward, eager_max, dtype="float32"):
  """The torch peers: {name: timed call}, on the GPU where JAX runs on one."""
  import torch  # pylint: disable=import-outside-toplevel
  from torch.nn.attention import flex_attention as flex  # pylint: disable=import-outside-toplevel
  import importlib  # pylint: disable=import-outside-toplevel
  math_attention = importlib.import_module(
      "torch._higher_order_ops.flex_attention").math_attention
  device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  score_mod, causal = alibi_mods(
      torch.tensor(np.asarray(aj.positional.alibi_slopes(HEADS)), device=device))
  block_mask = flex.create_block_mask(causal, None, None, length, length, device=device)
  q, k, v = (torch.tensor(np.swapaxes(x, 1, 2), device=device).to(getattr(torch, dtype))
             for x in arrays)  # [B, N, T, H]
  runs = {}
  compiled = torch.compile(flex.flex_attention)
  if backward and device == "cuda":  # torch's compiled kernel has a backward on GPUs only
    def compiled_backward():
      leaves = [x.detach().requires_grad_() for x in (q, k, v)]
      compiled(*leaves, score_mod=score_mod, block_mask=block_mask).sum().backward()
      synchronize()
    runs["torch flex compiled"] = compiled_backward
    return runs
  if backward:
    if length <= eager_max:
      def math_backward():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, _, _ = math_attention(*leaves, score_mod, block_mask.as_tuple(), HEAD_DIM ** -0.5,
                                   {})
        out.sum().backward()
      runs["torch math (eager)"] = math_backward
    return runs
  if length <= eager_max:
    runs["torch flex eager"] = lambda: (flex.flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask), synchronize())
  runs["torch flex compiled"] = lambda: (compiled(q, k, v, score_mod=score_mod,
                                                  block_mask=block_mask), synchronize())
  return runs


def torch_rows(args):
  rows = []
  for length in args.lengths:
    arrays = inputs(length)
    for backward in (False, True):
      runs = {"ours (chunked)": jax_run(ours(length, args.block), arrays, backward, args.dtype),
              "ours, no score_mod": jax_run(ours(length, args.block, with_score_mod=False),
                                            arrays, backward, args.dtype)}
      if jax.default_backend() == "gpu":
        runs["ours (fused)"] = jax_run(ours(length, pallas_gpu.BLOCK, fused=True), arrays,
                                       backward, args.dtype)
        for config in args.fused_configs:
          runs[f"fused {config}"] = jax_run(fused_tuned(length, config), arrays, backward,
                                            args.dtype)
      if not args.skip_torch:
        runs.update(torch_runs(length, arrays, backward, args.torch_eager_max, args.dtype))
      times = median_times(runs, args.rounds)
      for name, seconds in times.items():
        rows.append({"part": "vs torch", "T": length, "pass": "fwd+bwd" if backward else "fwd",
                     "method": name, "ms": 1e3 * seconds,
                     "ours / this": times["ours (chunked)"] / seconds})
        print_row(rows[-1])
  return rows


def documents_mask_mod(length, documents):
  ids = jnp.repeat(jnp.arange(documents), -(-length // documents))[:length]
  return lambda b, h, q_idx, kv_idx: ids[q_idx] == ids[kv_idx]


def sparsity_rows(args):
  length = args.sparsity_length
  arrays = inputs(length, seed=1)
  rows = []
  for backward in (False, True):
    runs = {"full": jax_run(lambda q, k, v: aj.chunked_attention(
        q, k, v, scale=HEAD_DIM ** -0.5, block_q=args.block, block_k=args.block), arrays,
        backward),
            "full, default blocks": jax_run(lambda q, k, v: aj.dot_product_attention(
                q, k, v, implementation="chunked"), arrays, backward)}
    sparsity = {}
    for documents in args.documents:
      block_mask = aj.make_block_mask(documents_mask_mod(length, documents), None, None, length,
                                      length, block_size=args.block)
      sparsity[documents] = float(block_mask.sparsity())
      runs[f"{documents} documents"] = jax_run(
          lambda q, k, v, m=block_mask: aj.dot_product_attention(
              q, k, v, block_mask=m, implementation="chunked"), arrays, backward)
    times = median_times(runs, args.rounds)
    for documents in args.documents:
      seconds = times[f"{documents} documents"]
      rows.append({"part": "sparsity", "T": length, "pass": "fwd+bwd" if backward else "fwd",
                   "block": args.block, "documents": documents, "blocks skipped": sparsity[documents],
                   "ms": 1e3 * seconds, "full ms": 1e3 * times["full"],
                   "vs full": seconds / times["full"],
                   "full default blocks ms": 1e3 * times["full, default blocks"],
                   "vs full default blocks": seconds / times["full, default blocks"]})
      print_row(rows[-1])
  return rows


def mask_cost_rows(args):
  length, documents = args.mask_cost_length, args.mask_cost_documents
  mask_mod = documents_mask_mod(length, documents)

  def build():
    return aj.make_block_mask(mask_mod, None, None, length, length).kinds.block_until_ready()
  started = time.perf_counter()
  build()  # the first call: tracing and compiling its loop included
  first = time.perf_counter() - started
  block_mask = aj.make_block_mask(mask_mod, None, None, length, length)
  attend = jax_run(lambda q, k, v: aj.dot_product_attention(
      q, k, v, block_mask=block_mask, implementation="chunked"), inputs(length, seed=2), True)
  times = median_times({"build": build, "fwd+bwd": attend}, args.rounds)
  row = {"part": "mask cost", "T": length, "documents": documents, "block": 128,
         "blocks skipped": float(block_mask.sparsity()), "first build ms": 1e3 * first,
         "build ms": 1e3 * times["build"], "fwd+bwd ms": 1e3 * times["fwd+bwd"],
         "first build / fwd+bwd": first / times["fwd+bwd"],
         "build / fwd+bwd": times["build"] / times["fwd+bwd"]}
  print_row(row)
  return [row]


def print_row(row):
  cells = [f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
           for key, value in row.items() if value is not None]
  print(" | ".join(cells), flush=True)


def plot(rows, path, provenance):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  figure, axis = plt.subplots(figsize=(5.5, 3.8))
  documents = sorted({row["documents"] for row in rows})
  axis.plot(documents, [1 / d for d in documents], "k--", label="ideal: 1 / documents")
  for name, marker in (("fwd", "o"), ("fwd+bwd", "s")):
    mine = [row for row in rows if row["pass"] == name]
    axis.plot([row["documents"] for row in mine], [row["vs full"] for row in mine],
              marker=marker, label=f"{name}: time / full attention, same blocks")
  axis.set_xscale("log", base=2)
  axis.set_yscale("log", base=2)
  axis.set_xticks(documents, [str(d) for d in documents])
  axis.set_xlabel("documents (document mask as a mask_mod)")
  axis.set_ylabel("time relative to full attention")
  axis.set_title(f"Block skipping, T = {rows[0]['T']}, blocks of {rows[0]['block']}",
                 fontsize=10)
  axis.legend(fontsize=8)
  figure.text(0.01, 0.01, "\n".join(textwrap.wrap(provenance, 140)), fontsize=5, color="gray")
  figure.tight_layout(rect=(0, 0.05, 1, 1))
  figures.save(figure, path, dpi=130)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 2048, 4096, 8192],
                      help="the lengths of the comparison with torch (none: skip it)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--block", type=int, default=512, help="our block mask's block size")
  parser.add_argument("--fused-configs", nargs="*", default=[],
                      help="on a GPU, more rows of the fused kernel: BLOCK:WARPS:STAGES each, "
                           "BLOCK as 128 or 128x64 (its default, 'ours (fused)', is 64:4:2)")
  parser.add_argument("--torch-eager-max", type=int, default=4096,
                      help="the longest T at which torch's eager (dense) runs")
  parser.add_argument("--sparsity-length", type=int, default=4096)
  parser.add_argument("--documents", type=int, nargs="*", default=[1, 2, 4, 8],
                      help="document counts of the block-sparsity part (none: skip it)")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="of q, k and v (the comparison with torch)")
  parser.add_argument("--skip-torch", action="store_true")
  parser.add_argument("--mask-cost-length", type=int, default=32768,
                      help="the length at which the block mask's cost is measured (0: skip it)")
  parser.add_argument("--mask-cost-documents", type=int, default=8)
  parser.add_argument("--json", help="write the rows to this file")
  parser.add_argument("--plot", help="write the block-sparsity figure (PNG) here")
  args = parser.parse_args()
  # torch's eager flex_attention warns that it is unfused: that is what it is timed as
  warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
  if not args.skip_torch:
    try:
      import torch  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      parser.error("torch is not installed (pip install -r scripts/requirements-flex.txt), or "
                   "pass --skip-torch")
  rows = torch_rows(args) if args.lengths else []
  rows += sparsity_rows(args) if args.documents else []
  rows += mask_cost_rows(args) if args.mask_cost_length else []
  info = provenance_lib.benchmark()
  print(json.dumps(info))
  if args.plot:
    # the footer: the command without where it wrote, and the machine by its model
    command = " ".join(argument for argument, before in zip(sys.argv, [""] + sys.argv)
                       if not {argument.split("=")[0], before} & {"--plot", "--json"})
    provenance = (f"python {command} | commit {info['commit']} | {info['date']} | "
                  f"{info['machine']} | jax {info['jax']}")
    plot([row for row in rows if row["part"] == "sparsity"], args.plot, provenance)
  benchmark_structure.write_json({"machine": info, "rounds": args.rounds, "rows": rows}, args.json)


if __name__ == "__main__":
  main()
