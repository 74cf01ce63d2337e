"""The fused score/mask kernel on a GPU: what a mod, a mask and dropout cost inside it, against
the blockwise kernel and torch's compiled FlexAttention, and which blocks, warps and stages suit it.

  python scripts/benchmark_fused.py [--shapes 8192,64 16384,64 8192,128 2048,64 ...]
      [--configs 64:4:2 128x64:4:3 ...] [--tune 8192,64 ...] [--heads 16] [--rounds 3]
      [--torch-cases "causal ALiBi" ...] [--skip-torch] [--interpret] [--json FILE]

1. The table, per length T and head dim H (--shapes; B = 1, --heads heads, bfloat16), forward
   and forward+backward: the fused kernel (``pallas_gpu.flex_attention``, its default blocks)
   on full attention, causal attention (a mask_mod), causal ALiBi (a score_mod beside it), the
   same with attention dropout 0.1, an 8-document mask and a causal sliding window of 1024
   (mask_mods, each with its block mask), causal attention with a T5 relative-position bias
   table (32 buckets per head) held constant and, forward+backward, trained (its gradient too);
   in the forward's group also the jvp (the forward and the tangent kernel) on causal ALiBi and
   on the T5 table with its tangent; the blockwise kernel (``chunked``) on causal ALiBi; torch's
   ``flex_attention`` under torch.compile on the same mods (its block masks made outside the
   timing; --torch-cases, causal ALiBi unless named). The ratios follow each group: a
   score_mod's cost (causal ALiBi / causal), the jvp's (jvp / forward), dropout's (with /
   without), a trained table's (trained / constant), block skipping (8 documents / full) and
   ours / torch.
2. Tuning (--configs BLOCK:WARPS:STAGES, BLOCK as 64 or 128x64) on causal ALiBi at the
   --tune shapes, forward and forward+backward, after that shape's table.

Each sample dispatches its calls back to back and waits once (at least 20 ms a sample); each
round runs every method once, in an order shuffled per round; medians over rounds. Rows go to
--json after every group, so a run cut short keeps what it measured. --interpret runs the kernel
in Pallas' interpreter (a CPU smoke test of this script, not a timing).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from experiments import provenance  # noqa: E402
from attention_jax import pallas_gpu  # noqa: E402
from scripts.benchmark_attention import jax_runner, timed  # noqa: E402
from scripts.benchmark_structure import write_json  # noqa: E402

DOCUMENTS, WINDOW, DROPOUT = 8, 1024, 0.1
BUCKETS, MAX_DISTANCE = 32, 128  # T5's relative-position buckets (one direction: causal)
CASES = ("full", "causal", "causal ALiBi", f"causal ALiBi, dropout {DROPOUT}",
         f"{DOCUMENTS} documents", f"window {WINDOW}", "causal T5 bias",
         "causal T5 bias, trained")


def t5_bucket(distance):
  """T5's bucket of a distance q_idx - kv_idx >= 0: itself below BUCKETS / 2, then logarithmic
  up to MAX_DISTANCE, the last bucket beyond."""
  exact = BUCKETS // 2
  spread = jnp.log(jnp.maximum(distance, 1) / exact) / math.log(MAX_DISTANCE / exact)
  log_bucket = exact + (spread * (BUCKETS - exact)).astype(jnp.int32)
  return jnp.where(distance < exact, distance, jnp.minimum(log_bucket, BUCKETS - 1))


def t5_table(heads):
  return jnp.asarray(np.random.default_rng(0).standard_normal((heads, BUCKETS)), jnp.float32)


def jax_mods(case, length, heads, table=None):
  """(score_mod, mask_mod) of a case, in JAX; ``table`` the T5 cases' [N, BUCKETS]."""
  slopes = aj.positional.alibi_slopes(heads)
  ids = jnp.repeat(jnp.arange(DOCUMENTS), -(-length // DOCUMENTS))[:length]
  alibi = lambda s, b, h, q_idx, kv_idx: s - slopes[h] * (q_idx - kv_idx)  # noqa: E731
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
  table = t5_table(heads) if table is None else table
  t5 = lambda s, b, h, q_idx, kv_idx: s + table[h, t5_bucket(q_idx - kv_idx)]  # noqa: E731
  return {"full": (None, None), "causal": (None, causal), "causal ALiBi": (alibi, causal),
          f"causal ALiBi, dropout {DROPOUT}": (alibi, causal),
          f"{DOCUMENTS} documents": (None, lambda b, h, q_idx, kv_idx: ids[q_idx] == ids[kv_idx]),
          f"window {WINDOW}": (None, lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (
              q_idx - kv_idx < WINDOW)),
          "causal T5 bias": (t5, causal), "causal T5 bias, trained": (t5, causal)}[case]


def fused(case, length, heads, head_dim, config="64:4:2", interpret=False, table=None):
  """attend(q, k, v) through the fused kernel at config = "BLOCK:WARPS:STAGES"."""
  block, num_warps, num_stages = config.split(":")
  blocks = tuple(int(size) for size in block.split("x"))
  score_mod, mask_mod = jax_mods(case, length, heads, table)
  block_mask = None if mask_mod is None else aj.make_block_mask(
      mask_mod, None, None, length, length, block_size=blocks if len(blocks) == 2 else blocks[0])
  dropout = ({"dropout_rate": DROPOUT, "dropout_rng": jax.random.key(0),
              "broadcast_dropout": False} if "dropout" in case else {})
  return lambda q, k, v: pallas_gpu.flex_attention(
      q, k, v, scale=head_dim ** -0.5, score_mod=score_mod, block_mask=block_mask,
      block_size=blocks[0], num_warps=int(num_warps), num_stages=int(num_stages),
      interpret=interpret, **dropout)[0]


def trained_runner(attend_with, shape, dtype):
  """run(calls) of the gradient of sum(attend_with(table)(q, k, v) * cotangent) with respect to
  q, k, v and the T5 table (which the other cases hold constant)."""
  rng = np.random.default_rng(0)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(4))
  table = t5_table(shape[2])
  loss = lambda q, k, v, table: jnp.sum(attend_with(table)(q, k, v) * cotangent)  # noqa: E731
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(q, k, v, table).compile()

  def run(calls=1):
    for _ in range(calls):
      out = compiled(q, k, v, table)
    jax.block_until_ready(out)
  return run


def jvp_runner(attend_with, shape, dtype):
  """run(calls) of jax.jvp of attend_with(table)(q, k, v) along random tangents of q, k, v and
  the T5 table (the tangent kernel after the forward)."""
  rng = np.random.default_rng(0)
  q, k, v, dq, dk, dv = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(6))
  table = t5_table(shape[2])
  tangent = lambda *a: jax.jvp(lambda q, k, v, t: attend_with(t)(q, k, v), a[:4], a[4:])  # noqa
  args = (q, k, v, table, dq, dk, dv, table)
  compiled = jax.jit(tangent).lower(*args).compile()

  def run(calls=1):
    for _ in range(calls):
      out = compiled(*args)
    jax.block_until_ready(out)
  return run


def chunked(case, length, heads, block=512):
  score_mod, mask_mod = jax_mods(case, length, heads)
  block_mask = aj.make_block_mask(mask_mod, None, None, length, length, block_size=block)
  return lambda q, k, v: aj.dot_product_attention(
      q, k, v, score_mod=score_mod, block_mask=block_mask, implementation="chunked")


def torch_runner(case, shape, backward, dtype):
  """run(calls) of torch's compiled flex_attention on the same mods, on this GPU."""
  import torch  # pylint: disable=import-outside-toplevel
  from torch.nn.attention import flex_attention as flex  # pylint: disable=import-outside-toplevel
  b, t, n, h = shape
  slopes = torch.tensor(np.asarray(aj.positional.alibi_slopes(n)), device="cuda")
  ids = torch.arange(DOCUMENTS, device="cuda").repeat_interleave(-(-t // DOCUMENTS))[:t]
  alibi = lambda s, b, h, q_idx, kv_idx: s - slopes[h] * (q_idx - kv_idx)  # noqa: E731
  causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
  score_mod, mask_mod = {
      "full": (None, None), "causal": (None, causal), "causal ALiBi": (alibi, causal),
      f"{DOCUMENTS} documents": (None, lambda b, h, q_idx, kv_idx: ids[q_idx] == ids[kv_idx]),
      f"window {WINDOW}": (None, lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (
          q_idx - kv_idx < WINDOW))}[case]
  block_mask = None if mask_mod is None else flex.create_block_mask(
      mask_mod, None, None, t, t, device="cuda")
  generator = torch.Generator(device="cuda").manual_seed(0)
  q, k, v, cotangent = (torch.randn(b, n, t, h, device="cuda", generator=generator).to(
      getattr(torch, dtype)) for _ in range(4))
  compiled = torch.compile(flex.flex_attention)
  if backward:
    q, k, v = (x.requires_grad_() for x in (q, k, v))

  def call():
    out = compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)
    if backward:
      torch.autograd.grad(out, (q, k, v), cotangent)

  def run(calls=1):
    for _ in range(calls):
      call()
    torch.cuda.synchronize()
  return run


def prepared(makers, shape, backward, dtype):
  """{name: run(calls)} of those that compile and run; {name: error} of the others."""
  runners, errors = {}, {}
  for name, make in makers.items():
    try:
      run = make()
      run()  # warm-up (and torch's compilation)
      runners[name] = run
    except Exception as error:  # pylint: disable=broad-except  # reported as a row
      errors[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
      print(f"  {name}: {errors[name]}", flush=True)
  return runners, errors


RATIOS = {  # name: (numerator, denominator)
    "score_mod cost (causal ALiBi / causal)": ("fused causal ALiBi", "fused causal"),
    "dropout cost": (f"fused causal ALiBi, dropout {DROPOUT}", "fused causal ALiBi"),
    "jvp / forward, causal ALiBi": ("fused causal ALiBi, jvp", "fused causal ALiBi"),
    "jvp / forward, T5 table with its tangent": ("fused causal T5 bias, jvp",
                                                 "fused causal T5 bias"),
    "trained table cost (T5 trained / constant)": ("fused causal T5 bias, trained",
                                                   "fused causal T5 bias"),
    "8 documents / full": (f"fused {DOCUMENTS} documents", "fused full"),
    "window / causal": (f"fused window {WINDOW}", "fused causal"),
    "ours / torch, causal ALiBi": ("fused causal ALiBi", "torch causal ALiBi"),
    "ours / torch, causal": ("fused causal", "torch causal"),
    "ours / torch, full": ("fused full", "torch full"),
    "ours / torch, 8 documents": (f"fused {DOCUMENTS} documents", f"torch {DOCUMENTS} documents"),
    "ours / torch, window": (f"fused window {WINDOW}", f"torch window {WINDOW}"),
    "fused / chunked, causal ALiBi": ("fused causal ALiBi", "chunked causal ALiBi"),
}


def group(args, length, head_dim, backward, tune=False):
  shape = (1, length, args.heads, head_dim)
  jax_make = lambda fn: lambda: jax_runner(fn, shape, backward, args.dtype)[0]  # noqa: E731
  if tune:
    makers = {f"fused {config}": jax_make(fused("causal ALiBi", length, args.heads, head_dim,
                                                 config, args.interpret))
              for config in args.configs}
  else:
    makers = {f"fused {case}": jax_make(fused(case, length, args.heads, head_dim,
                                             interpret=args.interpret))
              for case in CASES if "trained" not in case}
    with_table = lambda case: lambda table: fused(  # noqa: E731
        case, length, args.heads, head_dim, interpret=args.interpret, table=table)
    if backward:  # a trained table differs from a constant one only in the backward pass
      makers["fused causal T5 bias, trained"] = lambda: trained_runner(
          with_table("causal T5 bias"), shape, args.dtype)
    else:  # forward mode: the forward and the tangent kernel
      for case in ("causal ALiBi", "causal T5 bias"):
        makers[f"fused {case}, jvp"] = lambda case=case: jvp_runner(
            with_table(case), shape, args.dtype)
    makers["chunked causal ALiBi"] = jax_make(chunked("causal ALiBi", length, args.heads))
    if not args.skip_torch:
      makers.update({f"torch {case}": (lambda case=case: torch_runner(
          case, shape, backward, args.dtype)) for case in args.torch_cases})
  runners, errors = prepared(makers, shape, backward, args.dtype)
  minimum = 0.0 if args.interpret else args.min_sample_ms / 1e3
  times = timed(runners, args.rounds, minimum) if runners else {}
  passname = "fwd+bwd" if backward else "fwd"
  rows = [{"part": "tune" if tune else "table", "T": length, "H": head_dim, "N": args.heads,
           "pass": passname, "method": name, "ms": 1e3 * seconds,
           "tflops": None if "jvp" in name else 4 * length * length * args.heads * head_dim
           * (3 if backward else 1) / seconds / 1e12} for name, seconds in times.items()]
  rows += [{"part": "tune" if tune else "table", "T": length, "H": head_dim, "N": args.heads,
            "pass": passname, "method": name, "error": error} for name, error in errors.items()]
  for row in rows:
    print(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in row.items()), flush=True)
  if not tune:
    for ratio, (top, bottom) in RATIOS.items():
      if top in times and bottom in times:
        rows.append({"part": "ratio", "T": length, "H": head_dim, "pass": passname,
                     "ratio": ratio, "value": times[top] / times[bottom]})
        print(f"  {ratio}: {rows[-1]['value']:.3f}", flush=True)
  return rows


def pairs(text):
  """"T,H" -> (T, H)."""
  try:
    length, head_dim = (int(x) for x in text.split(","))
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not T,H (a length and a head dim, e.g. "
                                     "8192,64)") from None
  return length, head_dim


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", type=pairs, nargs="*", default=[(8192, 64), (16384, 64),
                                                                  (8192, 128), (2048, 64)],
                      help="T,H each: the table's lengths and head dims, in this order")
  parser.add_argument("--tune", type=pairs, nargs="*", default=[(8192, 64), (8192, 128)],
                      help="T,H each: where --configs are timed (after that shape's table)")
  parser.add_argument("--configs", nargs="*", default=[], help="BLOCK:WARPS:STAGES to tune")
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
  parser.add_argument("--torch-cases", nargs="*", default=["causal ALiBi"], choices=CASES,
                      help="the cases torch's compiled flex_attention runs (each compile is slow)")
  parser.add_argument("--min-sample-ms", type=float, default=20.0)
  parser.add_argument("--skip-torch", action="store_true")
  parser.add_argument("--interpret", action="store_true",
                      help="the kernel in Pallas' interpreter: a smoke test, not a timing")
  parser.add_argument("--json", help="write the rows to this file (after every group)")
  args = parser.parse_args()
  if not args.interpret and jax.default_backend() != "gpu":
    parser.error("the fused kernel needs an NVIDIA GPU (--interpret runs it in Pallas' "
                 "interpreter, as a smoke test)")
  if any("dropout" in case or "T5" in case for case in args.torch_cases):
    parser.error("torch's cases here: full, causal, causal ALiBi, the documents and the window")
  if args.interpret:
    args.skip_torch = True
  if not args.skip_torch:
    import torch  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
  info, rows = provenance.benchmark(), []
  groups = []
  for length, head_dim in args.shapes:
    groups += [(length, head_dim, backward, False) for backward in (False, True)]
    if (length, head_dim) in args.tune and args.configs:
      groups += [(length, head_dim, backward, True) for backward in (False, True)]
  for length, head_dim, backward, tune in groups:
    print(f"== T {length}, H {head_dim}, {'fwd+bwd' if backward else 'fwd'}"
          f"{', tuning' if tune else ''}", flush=True)
    rows += group(args, length, head_dim, backward, tune)
    write_json({"machine": info, "rounds": args.rounds, "rows": rows}, args.json)


if __name__ == "__main__":
  main()
