"""Context-parallel attention on simulated CPU devices: memory per device and time against P.

  python scripts/benchmark_context_parallel.py [--devices 8] [--length 8192] [--heads 8]
      [--kv-heads 2] [--head-dim 64] [--rounds 3] [--budget-mib 64] [--json FILE]

1. For P = 1, 2, 4, ... devices of one mesh axis, causal attention (zigzag-balanced) over a
   sequence of ``length`` tokens, forward+backward: XLA's compiled memory analysis of the
   per-device program (arguments + outputs + temporaries, bytes) and the median time per call, for
   strategy "ring" and "all_gather", beside single-device chunked attention (P = 1).
2. The longest sequence (doubling from 256) whose per-device forward+backward fits
   ``budget_mib`` per device, for each strategy at the largest P.
3. On paper, for a TPU pod: bytes each device moves and FLOPs it computes per attention call
   (forward+backward), and the communication-to-compute time ratio at the stated link bandwidth
   and peak FLOP/s (assumptions you pass in; below 1 the transfers can hide behind the compute).

The simulated devices share this machine's cores, so the times say what the partitioned
programs cost in total, not how fast P real chips would be; the memory figures are what XLA
allocates per device and carry over to real devices of any kind.
"""

from __future__ import annotations

import argparse
import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  count = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else "8"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={count}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from scripts.benchmark_structure import median_times  # noqa: E402
from scripts.benchmark_structure import print_table  # noqa: E402
from scripts.benchmark_structure import write_json  # noqa: E402


def per_device_program(strategy, num_devices, length, args):
  """(run, per-device bytes) of causal forward+backward over ``num_devices`` devices."""
  mesh = Mesh(np.array(jax.devices()[:num_devices]), ("seq",))
  shapes = [(1, length, heads, args.head_dim) for heads in (args.heads, args.kv_heads,
                                                            args.kv_heads)]
  sharding = NamedSharding(mesh, PartitionSpec(None, "seq"))
  arrays = [jax.device_put(jnp.ones(shape, jnp.float32), sharding) for shape in shapes]
  if strategy == "single device":
    attend = lambda q, k, v: aj.chunked_attention(q, k, v, scale=0.125, is_causal=True)
  else:
    attend = lambda q, k, v: aj.context_parallel_attention(
        q, k, v, mesh=mesh, axis_name="seq", strategy=strategy, is_causal=True)
  grads = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v)), argnums=(0, 1, 2))
  executable = jax.jit(grads).lower(*arrays).compile()
  memory = executable.memory_analysis()
  used = sum(getattr(memory, name, 0) or 0 for name in (
      "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"))
  return (lambda: jax.block_until_ready(executable(*arrays))), used


def longest_fitting(strategy, num_devices, budget, args):
  """The longest length (256 doubled) whose per-device program fits ``budget`` bytes."""
  length, best = 256, None
  while length <= args.max_length:
    if per_device_program(strategy, num_devices, length, args)[1] > budget:
      break
    best, length = length, 2 * length
  return best


def on_paper(strategy, length, devices, heads, kv_heads, head_dim, bytes_per_value=2):
  """(bytes moved, FLOPs) per device for one causal forward+backward, bf16 activations.

  Forward: each device receives the other P - 1 shards of K and V (ring: one per step; gather:
  at once), 2 (P-1)/P T K H values. Backward: ring moves K, V, dK, dV per step (dK, dV in
  float32: 2 + 2 x 2 = 6 value-widths), the gather strategy reduce-scatters dK, dV (float32).
  FLOPs: 4 T (T/P) N H for Q K^T and P V, halved by the causal mask, times 3.5 with the
  backward (which recomputes Q K^T and adds dV, dP, dQ, dK).
  """
  shard_values = (devices - 1) / devices * length * kv_heads * head_dim
  if strategy == "ring":
    moved = shard_values * bytes_per_value * 2 + shard_values * (2 * bytes_per_value + 2 * 4)
  else:
    moved = shard_values * bytes_per_value * 2 + shard_values * 2 * 4
  flops = 4 * length * (length / devices) * heads * head_dim / 2 * 3.5
  return moved, flops


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--kv-heads", type=int, default=2)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--budget-mib", type=float, default=64.0)
  parser.add_argument("--max-length", type=int, default=1 << 20)
  parser.add_argument("--pod-length", type=int, default=65536, help="T for the paper estimate")
  parser.add_argument("--pod-devices", type=int, default=64, help="P for the paper estimate")
  parser.add_argument("--link-gb-s", type=float, default=100.0,
                      help="assumed one-way bandwidth to a ring neighbour, GB/s")
  parser.add_argument("--peak-tflops", type=float, default=197.0,
                      help="assumed bf16 peak per chip, TFLOP/s")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  if jax.device_count() < args.devices:
    sys.exit(f"only {jax.device_count()} devices; set XLA_FLAGS="
             f"--xla_force_host_platform_device_count={args.devices} before JAX starts.")

  rows = []
  counts = [2 ** i for i in range(1, int(np.log2(args.devices)) + 1)]
  print(f"causal forward+backward, T = {args.length}, N = {args.heads}, K = {args.kv_heads}, "
        f"H = {args.head_dim}, float32, median of {args.rounds} rounds")
  for strategy, devices in [("single device", 1)] + [(s, p) for p in counts
                                                      for s in aj.context_parallel.STRATEGIES]:
    run, used = per_device_program(strategy, devices, args.length, args)
    seconds = median_times({strategy: run}, args.rounds)[strategy]
    rows.append({"part": "scaling", "strategy": strategy, "devices": devices,
                 "length": args.length, "mib_per_device": used / 2 ** 20, "ms": seconds * 1e3})
  print_table(rows, {"mib_per_device": ".1f", "ms": ".1f"})

  budget = args.budget_mib * 2 ** 20
  print(f"\nlongest T whose forward+backward fits {args.budget_mib:g} MiB per device")
  for strategy, devices in [("single device", 1)] + [(s, args.devices) for s in
                                                     aj.context_parallel.STRATEGIES]:
    best = longest_fitting(strategy, devices, budget, args)
    rows.append({"part": "budget", "strategy": strategy, "devices": devices,
                 "budget_mib": args.budget_mib, "longest_length": best})
  print_table([row for row in rows if row["part"] == "budget"])

  print(f"\non paper, TPU pod: T = {args.pod_length}, P = {args.pod_devices}, bf16, "
        f"{args.link_gb_s:g} GB/s per link, {args.peak_tflops:g} TFLOP/s per chip")
  for strategy in aj.context_parallel.STRATEGIES:
    moved, flops = on_paper(strategy, args.pod_length, args.pod_devices, args.heads,
                            args.kv_heads, args.head_dim)
    ratio = (moved / (args.link_gb_s * 1e9)) / (flops / (args.peak_tflops * 1e12))
    rows.append({"part": "paper", "strategy": strategy, "length": args.pod_length,
                 "devices": args.pod_devices, "bytes_moved": moved, "flops": flops,
                 "comm_to_compute": ratio})
  print_table([row for row in rows if row["part"] == "paper"], {"comm_to_compute": ".3f"})
  write_json(rows, args.json)


if __name__ == "__main__":
  main()
