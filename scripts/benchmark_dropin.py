"""The drop-in modules against the flax modules they replace: forward + backward time.

  python scripts/benchmark_dropin.py [--rounds 7] [--lengths 128 256 512 1024] [--batch 8]
      [--width 256] [--heads 8] [--json FILE]

For each length T, one training-shaped call of each module on x [B, T, width] with the same
parameters: the gradient of sum(output * cotangent) with respect to the parameters and x,
jitted, in four pairs -- Linen (flax.linen.MultiHeadDotProductAttention against
attention_jax.MultiHeadDotProductAttention) and NNX (flax.nnx.MultiHeadAttention against
attention_jax.nnx.MultiHeadAttention), each without a mask and causal. Each round runs every
module once, in an order shuffled per round; medians over rounds, and ours / flax's per pair.
"""

from __future__ import annotations

import argparse
import os
import sys

import flax.linen as nn
from flax import nnx
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from experiments import provenance  # noqa: E402
from attention_jax import nnx as ajnnx  # noqa: E402
from scripts.benchmark_structure import median_times  # noqa: E402
from scripts.benchmark_structure import write_json  # noqa: E402


def linen_step(module_cls, x, heads, causal):
  """A jitted forward + backward of a Linen module (the parameters flax's init gives)."""
  module = module_cls(num_heads=heads)
  mask = nn.make_causal_mask(jnp.ones(x.shape[:2])) if causal else None
  params = nn.MultiHeadDotProductAttention(num_heads=heads).init(jax.random.key(0), x)
  cotangent = jnp.ones_like(x)
  loss = lambda params, x: jnp.sum(module.apply(params, x, mask=mask) * cotangent)
  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return lambda: jax.block_until_ready(step(params, x))


def nnx_step(module_cls, x, heads, causal):
  """A jitted forward + backward of an NNX module built from the same Rngs as flax's."""
  module = module_cls(heads, x.shape[-1], decode=False, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(module)
  cotangent = jnp.ones_like(x)

  def loss(params, x):
    return jnp.sum(nnx.merge(graphdef, params)(x, is_causal=causal) * cotangent)
  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return lambda: jax.block_until_ready(step(params, x))


PAIRS = {
    "linen": (linen_step, nn.MultiHeadDotProductAttention, aj.MultiHeadDotProductAttention),
    "nnx": (nnx_step, nnx.MultiHeadAttention, ajnnx.MultiHeadAttention),
}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--width", type=int, default=256)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--json", help="also write the rows here")
  args = parser.parse_args(argv)
  rows = []
  for length in args.lengths:
    x = jax.random.normal(jax.random.key(1), (args.batch, length, args.width))
    for flavour, (make, theirs, ours) in PAIRS.items():
      for causal in (False, True):
        runs = {"flax": make(theirs, x, args.heads, causal),
                "attention_jax": make(ours, x, args.heads, causal)}
        times = median_times(runs, args.rounds)
        rows.append({"flavour": flavour, "T": length, "causal": causal,
                     "flax ms": 1e3 * times["flax"], "ours ms": 1e3 * times["attention_jax"],
                     "ours / flax": times["attention_jax"] / times["flax"]})
        print(f"{flavour:5s} T={length:5d} causal={causal!s:5s} flax {rows[-1]['flax ms']:8.2f} "
              f"ms  ours {rows[-1]['ours ms']:8.2f} ms  ours/flax {rows[-1]['ours / flax']:.2f}",
              flush=True)
  machine = provenance.benchmark(batch=args.batch, width=args.width, heads=args.heads,
                                 rounds=args.rounds)
  write_json({"machine": machine, "rows": rows}, args.json)
  return rows


if __name__ == "__main__":
  main()
