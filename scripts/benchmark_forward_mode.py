"""What forward mode costs through the blockwise kernel, and what it cost reverse mode.

  python scripts/benchmark_forward_mode.py [--lengths 2048 8192] [--heads 2] [--rounds 3]
      [--json FILE]

Causal self-attention, B = 1, ``heads`` heads of 64, float32, T = S = each of ``lengths``,
``implementation="chunked"``; per method its median time over rounds, XLA's temporary memory
(compiled memory analysis) and both as ratios over the forward alone:

- forward: the output;
- jvp: the output and its tangent (the blockwise tangent kernel);
- grad: the gradients of q, k and v, through the custom JVP's tangent transposed to the
  blockwise backward (what ``jax.grad`` runs);
- grad (custom VJP): the same forward and backward kernels bound as a ``jax.custom_vjp``, as the
  kernel was before it served forward mode (the reverse-mode baseline, same run);
- grad of jvp: a hessian-vector product as reverse over forward.

Each round runs every method once, in an order shuffled per round (benchmark_attention.timed).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attention_jax import chunked  # noqa: E402
from scripts.benchmark_structure import compiled  # noqa: E402
from scripts.benchmark_structure import median_times  # noqa: E402
from scripts.benchmark_structure import print_table  # noqa: E402
from scripts.benchmark_structure import write_json  # noqa: E402


def custom_vjp_attention(query, key, value):
  """Causal chunked attention with the kernel's forward and backward as a custom VJP (no forward
  mode): the reverse-mode path as it was."""
  scale = query.shape[-1] ** -0.5
  pattern, geometry = chunked.plan(query, key, is_causal=True)
  inputs = chunked.prepare(query, key, value, scale=scale, geometry=geometry)

  @jax.custom_vjp
  def kernel(q, k, v):
    return chunked.forward(q, k, v, None, None, inputs.extras, inputs.mods, pattern, geometry)

  def kernel_fwd(q, k, v):
    out, lse = kernel(q, k, v)
    return (out, lse), (q, k, v, out, lse)

  def kernel_bwd(residuals, cotangents):
    q, k, v, out, lse = residuals
    d_q, d_k, d_v, _, _ = chunked.backward(q, k, v, None, None, inputs.extras, inputs.mods,
                                           pattern, geometry, out, lse, cotangents[0])
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype)

  kernel.defvjp(kernel_fwd, kernel_bwd)
  out, lse = kernel(inputs.q, inputs.k, inputs.v)
  return chunked.finish(out, lse, query)


def methods(length, heads):
  """{name: (function of q, k, v, its arguments)} at this length."""
  rng = np.random.default_rng(0)
  q, k, v, t, w = (jnp.asarray(rng.standard_normal((1, length, heads, 64)), jnp.float32)
                   for _ in range(5))
  attention = functools.partial(chunked.chunked_attention, scale=0.125, is_causal=True)
  gradient = lambda f: jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * w), argnums=(0, 1, 2))
  jvp = lambda q, k, v: jax.jvp(attention, (q, k, v), (t, t, t))
  return {
      "forward": (attention, (q, k, v)),
      "jvp": (jvp, (q, k, v)),
      "grad": (gradient(attention), (q, k, v)),
      "grad (custom VJP)": (gradient(custom_vjp_attention), (q, k, v)),
      "grad of jvp": (gradient(lambda q, k, v: jvp(q, k, v)[1]), (q, k, v)),
  }


def rows(length, heads, rounds):
  built = {name: compiled(fn, arrays, backward=False)
           for name, (fn, arrays) in methods(length, heads).items()}
  times = median_times({name: run for name, (run, _) in built.items()}, rounds)
  temp = {name: memory for name, (_, memory) in built.items()}
  ratio = lambda values, name: (None if values[name] is None or not values["forward"]
                                else values[name] / values["forward"])
  return [{"T": length, "heads": heads, "method": name, "ms": 1e3 * times[name],
           "temp MiB": None if temp[name] is None else temp[name] / 2 ** 20,
           "time vs forward": ratio(times, name), "temp vs forward": ratio(temp, name)}
          for name in built]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
  parser.add_argument("--heads", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--json", help="also write the rows to this file")
  args = parser.parse_args(argv)
  table = [row for length in args.lengths for row in rows(length, args.heads, args.rounds)]
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, causal, B 1, "
        f"{args.heads} heads of 64, float32; medians of {args.rounds} rounds")
  print_table(table, {"ms": ".1f", "temp MiB": ".2f", "time vs forward": ".2f",
                      "temp vs forward": ".2f"})
  write_json(table, args.json)


if __name__ == "__main__":
  main()
