"""Attention speed and memory: this project's implementations against jax.nn, flax and torch.

  python scripts/benchmark_attention.py [--rounds 5] [--json FILE] [--long] [--shapes B,T,N,H ...]
      [--methods NAME ...] [--causal] [--blocks BQxBK ...] [--floor] [--dropout RATE] [--plot PNG]
  python scripts/benchmark_attention.py --replot FILE.json --plot PNG  # a saved run, drawn again

Forward and forward+backward (gradients of sum(out * cotangent) w.r.t. q, k, v), float32 unless
--dtype says otherwise; the accelerator kernels ("cudnn", "pallas_tpu") join on their backend. Each
round calls every method once per shape, in an order shuffled per round, so that drifts on a
shared machine and the after-effects of one method on the next hit all of them alike. The table
gives the median over rounds after a warm-up call, GFLOP/s (forward FLOPs 4*B*N*T*S*H,
forward+backward 3x that), XLA's peak temporary memory for the compiled JAX functions, and the
time ratio against jax.nn.dot_product_attention. torch's scaled_dot_product_attention joins when
torch is installed (it is not a dependency).

--causal masks future keys in every method (GFLOP/s still counts all T x S logits). --blocks adds
chunked attention with the given query x key block sizes (methods "chunked:1024x4096", ...), to
compare block shapes side by side. --dropout adds "chunked:dropout" (and "reference:dropout"
where --methods names the reference), the blockwise kernel (the dense reference) with attention
dropout at that rate (the blockwise kernel regenerates its mask per block; the reference draws
flax's masks), beside the same kernels without it. --floor adds "floor": the block math alone,
the least that a blockwise kernel written in plain JAX ops does on this backend (see
block_math_floor). --plot draws each method's time relative to a peer (torch's SDPA where it ran,
else jax.nn) against T, forward and forward+backward, for the most common head size of the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import flax.linen as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from experiments import provenance  # noqa: E402

SHAPES = [(8, 128, 8, 64), (4, 512, 8, 64), (1, 2048, 8, 64), (1, 4096, 8, 64), (1, 8192, 8, 64)]
LONG_SHAPES = [(1, 32768, 8, 64), (1, 65536, 8, 64)]
MEMORY_EFFICIENT = ("chunked", "cudnn", "pallas_tpu", "pallas", "tokamax", "torch_sdpa")


def jax_methods(is_causal=False):
  """This project's implementations that run on this backend, plus the jax and flax peers."""
  backend = jax.default_backend()
  ours = {name: (lambda q, k, v, name=name: aj.dot_product_attention(
              q, k, v, implementation=name, is_causal=is_causal))
          for name in aj.IMPLEMENTATIONS
          if aj.attention.KERNELS[name].backend in (None, backend)}
  ours["default"] = lambda q, k, v: aj.dot_product_attention(q, k, v, is_causal=is_causal)

  def flax_attention(q, k, v):
    causal = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool)) if is_causal else None
    return nn.dot_product_attention(q, k, v, mask=causal)
  peers = {"jax.nn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=is_causal)}
  if backend == "gpu":  # jax.nn's own choice, and each of its two kernels by name
    peers.update({f"jax.nn:{kernel}": (lambda q, k, v, kernel=kernel: jax.nn.dot_product_attention(
        q, k, v, is_causal=is_causal, implementation=kernel)) for kernel in ("xla", "cudnn")})
    peers.update(pallas_gpu_methods(is_causal))
  return {**ours, **peers, "flax.linen": flax_attention}


def pallas_gpu_methods(is_causal=False, interpret=False):
  """The Pallas flash kernels for NVIDIA GPUs that are installed: JAX's own (jax.experimental's
  Triton kernel, "pallas:triton", and its Mosaic GPU kernel for Hopper, "pallas:mosaic") and
  tokamax's ("tokamax" = its own choice, "tokamax:mosaic", "tokamax:triton"; not a dependency).
  ``interpret`` runs JAX's Triton kernel in Pallas' interpreter (any backend, for the tests)."""
  methods = {}
  try:
    with warnings.catch_warnings():  # deprecated in favour of tokamax, still shipped
      warnings.simplefilter("ignore", DeprecationWarning)
      from jax.experimental.pallas.ops.gpu import attention as triton_attention
    methods["pallas:triton"] = lambda q, k, v: triton_attention.mha(
        q, k, v, None, sm_scale=q.shape[-1] ** -0.5, causal=is_causal, interpret=interpret)
  except ImportError as error:
    print(f"pallas:triton left out: {error}", file=sys.stderr)
  try:
    from jax.experimental.pallas.ops.gpu import attention_mgpu
    # Blocks of JAX's own tests; the backward pass needs them named. Two compute warpgroups
    # per block of queries, so T must be a multiple of 128. The kernel does not scale, and it
    # takes float16 only (bfloat16 failed on an H200, jax 0.11.2).
    config = attention_mgpu.TuningConfig(
        block_q=64, block_kv=128, max_concurrent_steps=2, causal=is_causal, compute_wgs_bwd=2,
        block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    methods["pallas:mosaic"] = lambda q, k, v: attention_mgpu.attention(
        q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype), k, v, config)
  except ImportError as error:
    print(f"pallas:mosaic left out: {error}", file=sys.stderr)
  try:
    import tokamax
    for kernel in (None, "mosaic", "triton"):
      methods["tokamax" + (f":{kernel}" if kernel else "")] = (
          lambda q, k, v, kernel=kernel: tokamax.dot_product_attention(
              q, k, v, is_causal=is_causal, implementation=kernel))
  except ImportError as error:
    print(f"tokamax left out: {error}", file=sys.stderr)
  return methods


def chunked_with_blocks(block, is_causal=False):
  """Chunked attention with the query x key block sizes of ``block`` ("1024x4096")."""
  block_q, block_k = (int(size) for size in block.split("x"))
  return lambda q, k, v: aj.chunked_attention(q, k, v, scale=q.shape[-1] ** -0.5,
                                              is_causal=is_causal, block_q=block_q,
                                              block_k=block_k)


def block_math_floor(query, key, value, block_q=1024):
  """Attention as the least work a blockwise kernel in plain JAX ops can do: not a usable kernel.

  The operations are the ones every implementation must do. The inputs are moved to head-major
  order and scaled. Then, per (example, head) pair and block of up to ``block_q`` queries, the
  forward pass computes logits = Q K^T, their row max, exp, the row sum, P V / sum and the
  log-sum-exp, and moves the output back to [B, T, N, H]. The backward pass (a custom VJP)
  recomputes each block's probabilities from the log-sum-exp and does the five products of a
  flash backward, as the chunked kernel does (transposed blocks: dV += P^T dO, dK += dS^T Q,
  dQ^T = K^T dS^T). As many pairs run side by side as in the chunked kernel.

  Everything else is left out: no masks or padding, no online softmax (all S keys form one block,
  so there is no running max, sum or correction). It needs non-causal attention and T a multiple
  of its query block.
  """
  batch, length, heads, dim = query.shape
  block_q = min(length, block_q)
  pairs = aj.blocks.Geometry(length, key.shape[1], block_q, key.shape[1]).pairs_per_step
  heads_first = lambda x: x.transpose(0, 2, 1, 3).reshape(batch * heads, -1, dim)  # [B * N, L, H]
  blocks = lambda x: x.reshape((-1, block_q) + x.shape[1:])  # [T, ...] -> [T / bq, bq, ...]

  def forward_pair(qkv):
    q, k, v = qkv

    def query_block(q_block):
      logits = q_block @ k.T  # [bq, S]
      row_max = jnp.max(logits, axis=-1)
      probs = jnp.exp(logits - row_max[:, None])
      row_sum = jnp.sum(probs, axis=-1)
      return probs @ v / row_sum[:, None], row_max + jnp.log(row_sum)  # [bq, H], [bq]
    out, lse = lax.map(query_block, blocks(q))
    return out.reshape(q.shape), lse.reshape(-1)

  def backward_pair(inputs):
    q, k, v, out, lse, d_out = inputs
    delta = jnp.sum(d_out * out, axis=-1)  # [T]
    k_t = lax.optimization_barrier(k.T)  # [H, S]

    def query_block(carry, xs):
      d_k, d_v = carry
      q_block, lse_block, delta_block, do_block = xs
      probs_t = jnp.exp(k @ q_block.T - lse_block[None, :])  # [S, bq]
      d_logits_t = probs_t * (v @ do_block.T - delta_block[None, :])
      return (d_k + d_logits_t @ q_block, d_v + probs_t @ do_block), k_t @ d_logits_t  # dQ^T
    (d_k, d_v), d_q_t = lax.scan(query_block, (jnp.zeros_like(k), jnp.zeros_like(v)),
                                 tuple(map(blocks, (q, lse, delta, d_out))))
    return jnp.swapaxes(d_q_t, 1, 2).reshape(q.shape), d_k, d_v

  @jax.custom_vjp
  def attend(q, k, v):
    return lax.map(forward_pair, (q, k, v), batch_size=pairs)[0]

  def attend_forward(q, k, v):
    out, lse = lax.map(forward_pair, (q, k, v), batch_size=pairs)
    return out, (q, k, v, out, lse)

  def attend_backward(residuals, d_out):
    return lax.map(backward_pair, residuals + (d_out,), batch_size=pairs)

  attend.defvjp(attend_forward, attend_backward)
  scaled = query * jnp.asarray(dim ** -0.5, query.dtype)
  out = attend(heads_first(scaled), heads_first(key), heads_first(value))  # [B * N, T, H]
  return out.reshape(batch, heads, length, dim).transpose(0, 2, 1, 3)


def jax_runner(fn, shape, backward, dtype):
  """run(calls) that runs fn ``calls`` times and blocks once, plus XLA's temp memory in bytes."""
  rng = np.random.default_rng(0)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(4))
  if backward:
    def loss(q, k, v):
      return jnp.sum(fn(q, k, v) * cotangent)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
  else:
    compiled = jax.jit(fn).lower(q, k, v).compile()
  memory = compiled.memory_analysis()
  temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None

  def run(calls=1):  # dispatched one after another, waited for once
    for _ in range(calls):
      out = compiled(q, k, v)
    jax.block_until_ready(out)
  return run, temp


def torch_runner(shape, backward, dtype, is_causal=False):
  """torch's scaled_dot_product_attention on the GPU when JAX runs on one, else on the CPU."""
  import torch
  import torch.nn.functional as F
  torch.manual_seed(0)
  device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  b, t, n, h = shape  # torch wants [B, N, T, H]
  dtype = getattr(torch, dtype)
  q, k, v = (torch.randn(b, n, t, h, dtype=dtype, device=device, requires_grad=backward)
             for _ in range(3))
  cotangent = torch.randn(b, n, t, h, dtype=dtype, device=device)

  def run(calls=1):
    for _ in range(calls):
      out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
      if backward:
        torch.autograd.grad(out, (q, k, v), cotangent)
    if device == "cuda":
      torch.cuda.synchronize()
  if device != "cuda":
    return run, None
  before = torch.cuda.memory_allocated()
  torch.cuda.reset_peak_memory_stats()
  run()
  return run, torch.cuda.max_memory_allocated() - before  # what one call holds beyond its inputs


def calls_per_sample(run, minimum_seconds):
  """How many calls one timed sample takes, so that a sample lasts minimum_seconds. A sample
  dispatches its calls back to back and waits once at the end (as a training loop does), so
  on an accelerator it measures the device's time per call rather than the host's round trip."""
  started = time.perf_counter()
  run()
  return max(1, math.ceil(minimum_seconds / max(time.perf_counter() - started, 1e-9)))


def timed(runners, rounds, minimum_seconds):
  """{name: median seconds per call} of each run(calls) (calls_per_sample), the first call a
  warm-up, in a fresh order each round so that no method always follows another."""
  repeats = {name: calls_per_sample(run, minimum_seconds) for name, run in runners.items()}
  samples = {name: [] for name in runners}
  order = random.Random(0)
  for _ in range(rounds):
    names = list(runners)
    order.shuffle(names)
    for name in names:
      started = time.perf_counter()
      runners[name](repeats[name])
      samples[name].append((time.perf_counter() - started) / repeats[name])
  return {name: statistics.median(values) for name, values in samples.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--long", action="store_true", help="add T = 32768 and 65536 (forward, "
                      "memory-efficient methods only)")
  parser.add_argument("--shapes", nargs="*", help="B,T,N,H tuples instead of the default rows")
  parser.add_argument("--methods", nargs="*", help="a subset of the method names")
  parser.add_argument("--json", help="write the measurements to this file")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                      help="input dtype (cuDNN flash attention needs bfloat16 or float16)")
  parser.add_argument("--causal", action="store_true", help="causal attention in every method")
  parser.add_argument("--blocks", nargs="*", default=[], help="BQxBK chunked block sizes to add")
  parser.add_argument("--min-sample-ms", type=float, default=20.0, help="on an accelerator, "
                      "repeat a call within one timed sample until it lasts this long")
  parser.add_argument("--dropout", type=float, default=0.0, help="add the chunked kernel and the "
                      "reference with attention dropout at this rate")
  parser.add_argument("--floor", action="store_true", help="add the block-math floor (not "
                      "causal; T up to 1024 or a multiple of 1024)")
  parser.add_argument("--plot", help="draw the times relative to a peer by length (PNG)")
  parser.add_argument("--replot", metavar="JSON", help="measure nothing: draw --plot from the "
                      "measurements a run saved with --json")
  args = parser.parse_args()
  if args.replot:
    if not args.plot:
      parser.error("--replot draws a figure: give its path with --plot")
    with open(args.replot) as f:
      saved = json.load(f)
    plot(saved["results"], saved["machine"], args.plot)
    return

  shapes = ([tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes
            else list(SHAPES))
  for block in args.blocks:
    if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", block):
      parser.error(f"--blocks {block!r} is not BQxBK; write the query and key block sizes as "
                   "positive integers joined by x, e.g. 1024x4096")
  methods = jax_methods(args.causal)
  try:
    import torch  # noqa: F401
    methods["torch_sdpa"] = None
    torch.set_num_threads(os.cpu_count())
  except ImportError:
    pass
  if args.methods:
    methods = {name: fn for name, fn in methods.items() if name in args.methods}
  # Asked for by their own flags, so --methods does not filter them out.
  methods.update({f"chunked:{block}": chunked_with_blocks(block, args.causal)
                  for block in args.blocks})
  if args.floor:
    methods["floor"] = block_math_floor
  if args.dropout:  # the reference only where asked for: its dense masks' memory slows the
    # method timed after it (the blockwise kernel with dropout measured 1.7x instead of 1.0x)
    with_dropout = ["chunked"] + (["reference"] if "reference" in (args.methods or []) else [])
    methods.update({f"{name}:dropout": (
        lambda q, k, v, name=name: aj.dot_product_attention(
            q, k, v, implementation=name, is_causal=args.causal, dropout_rate=args.dropout,
            dropout_rng=jax.random.key(0))) for name in with_dropout})

  cases = [(shape, backward) for shape in shapes for backward in (False, True)]
  if args.long:
    cases += [(shape, False) for shape in LONG_SHAPES]
  results = []
  for shape, backward in cases:
    long_row = shape in LONG_SHAPES
    runners = {}
    for name, fn in methods.items():
      if long_row and name.split(":")[0] not in MEMORY_EFFICIENT:
        continue
      if name.split(":")[0] == "reference" and shape[1] > 8192:
        continue
      if name == "floor" and (args.causal or shape[1] % min(shape[1], 1024)):
        continue
      try:
        runners[name] = (torch_runner(shape, backward, args.dtype, args.causal) if fn is None
                         else jax_runner(fn, shape, backward, args.dtype))
        runners[name][0]()  # warm-up
      except Exception as error:  # an implementation that cannot run this size is reported
        results.append({"shape": shape, "backward": backward, "method": name,
                        "error": f"{type(error).__name__}: {str(error)[:120]}"})
        runners.pop(name, None)
    # On an accelerator a call can take less time than the jitter of the host's dispatch, so a
    # sample there repeats the call for at least --min-sample-ms and reports the mean per call.
    minimum = args.min_sample_ms / 1e3 if jax.default_backend() != "cpu" else 0.0
    times = timed({name: run for name, (run, _) in runners.items()}, args.rounds, minimum)
    b, t, n, h = shape
    flops = 4 * b * n * t * t * h * (3 if backward else 1)
    baseline = times.get("jax.nn")
    for name, (_, temp) in runners.items():
      median = times[name]
      results.append({"shape": shape, "backward": backward, "method": name, "median_s": median,
                      "gflops": flops / median / 1e9, "temp_bytes": temp,
                      "time_vs_jax_nn": median / baseline if baseline else None})
    print_rows([r for r in results if r["shape"] == shape and r["backward"] == backward])

  machine = provenance.benchmark(dtype=args.dtype, causal=args.causal)
  print(json.dumps(machine))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"machine": machine, "rounds": args.rounds, "results": results}, f, indent=1)
  if args.plot:
    plot(results, machine, args.plot)


def plot(results, machine, path):
  """Each method's median time over the peer's (torch_sdpa where it ran, else jax.nn) against T,
  forward and forward+backward side by side, at the run's most common head size and heads."""
  from experiments import figures  # noqa: PLC0415 -- matplotlib only when drawing
  import matplotlib.pyplot as plt  # noqa: PLC0415
  measured = [r for r in results if "median_s" in r]
  peer = "torch_sdpa" if any(r["method"] == "torch_sdpa" for r in measured) else "jax.nn"
  heads = statistics.mode(tuple(r["shape"][2:]) for r in measured)  # (N, H)
  time = {(tuple(r["shape"]), r["backward"], r["method"]): r["median_s"] for r in measured
          if tuple(r["shape"][2:]) == heads}
  figure, axes = plt.subplots(1, 2, figsize=(figures.WIDTH, 3.6), sharey=True)
  methods = sorted({m for _, _, m in time if m != peer})
  for axis, backward in zip(axes, (False, True)):
    for number, method in enumerate(methods):
      points = sorted((shape[1], time[shape, b, m] / time[shape, b, peer])
                      for shape, b, m in time if b == backward and m == method
                      and (shape, b, peer) in time)
      if points:
        axis.plot(*zip(*points), marker="osD^v*"[number % 6], label=method)
    axis.axhline(1.0, color="gray", linestyle=":")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    lengths = sorted({shape[1] for shape, _, _ in time})
    axis.set_xticks(lengths, [str(t) for t in lengths])
    axis.yaxis.set_major_formatter(lambda y, _: f"{y:g}")
    axis.yaxis.set_minor_formatter(lambda y, _: f"{y:g}")
    axis.set_xlabel("sequence length T")
    axis.set_title("forward + backward" if backward else "forward", fontsize=11)
  axes[0].set_ylabel(f"time / {peer} (lower is faster)")
  axes[1].legend(fontsize=9)
  figure.suptitle(f"{machine['device_kind']}, {machine['dtype']}, {heads[0]} heads of "
                  f"{heads[1]}, jax {machine['jax']}" + (f", torch {machine['torch']}"
                                                          if machine.get("torch") else ""),
                  fontsize=11)
  figure.tight_layout()
  figures.save(figure, path)


def print_rows(rows):
  for row in rows:
    b, t, n, h = row["shape"]
    label = f"({b}, {t}, {n}, {h}) {'fwd+bwd' if row['backward'] else 'fwd':7}"
    if "error" in row:
      print(f"{label} {row['method']:>11}  failed: {row['error']}")
      continue
    temp = "" if row["temp_bytes"] is None else f"{row['temp_bytes'] / 2**20:9.1f} MiB"
    ratio = "" if row["time_vs_jax_nn"] is None else f"{row['time_vs_jax_nn']:6.2f}x"
    print(f"{label} {row['method']:>11} {row['median_s'] * 1e3:10.2f} ms "
          f"{row['gflops']:7.1f} GFLOP/s {ratio:>8} {temp:>13}", flush=True)


if __name__ == "__main__":
  main()
