"""Activation patching of every head: one vmapped call against Python loops over the heads.

  python -m scripts.benchmark_patching [--rounds 7] [--layers 4] [--heads 8] [--batch 16]
      [--length 32] [--width 128] [--json FILE]

A trained-size-free encoder (random parameters) of ``--layers`` blocks and ``--heads`` heads; the
experiment zero-ablates each head's z (``attn.hook_z``) in turn, layer by layer, and measures the
change of the output (mean |patched - clean| per patch): L x N patched forward passes. Four
ways, each giving the same L x N effects (checked):

  vmapped      one jitted call, vmapped over the L x N (layer, head) pairs
  by layer     L jitted calls, each vmapped over the N heads of one layer (the layers below it
               are not batched: vmap batches only what depends on the head)
  loop, jit    a Python loop over the pairs, each a call of a jitted function of the head
               (compiled once per layer before timing)
  loop, eager  a Python loop over the pairs, each patched forward run op by op (no jit), as a
               hook library without a compiler runs it

Each round runs every way once, in an order shuffled per round; medians over rounds, and each
way's time over the by-layer one's, from the same run.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from attention_jax import hooks  # noqa: E402
from experiments import provenance  # noqa: E402
from scripts.benchmark_structure import median_times  # noqa: E402
from scripts.benchmark_structure import write_json  # noqa: E402


def ablation(layers: int, heads: int):
  """(layer, head) -> patches zeroing that head's z, as data: every layer's hook is patched, with
  heads=-1 (no head) except at ``layer``, so one function serves every pair under vmap; a
  ``layer`` given as a Python int patches that layer's hook alone."""
  def patches(layer, head):
    if isinstance(layer, int):
      return {f"blocks.{layer}.attn.hook_z": hooks.zero(heads=head)}
    return {f"blocks.{index}.attn.hook_z": hooks.zero(heads=jnp.where(layer == index, head, -1))
            for index in range(layers)}
  return patches


def runners(model, variables, tokens, layers: int, heads: int):
  """{name: () -> effects [L * N]}, the three ways of the module docstring."""
  clean = model.apply(variables, tokens)
  patches = ablation(layers, heads)
  effect = lambda layer, head: jnp.mean(jnp.abs(
      hooks.patch(model, variables, tokens, patches(layer, head)) - clean))
  pairs = jnp.stack(jnp.meshgrid(jnp.arange(layers), jnp.arange(heads), indexing="ij"),
                    -1).reshape(-1, 2)  # [L * N, 2]
  vmapped = jax.jit(jax.vmap(lambda pair: effect(pair[0], pair[1])))
  one = jax.jit(effect)
  by_layer = [jax.jit(jax.vmap(functools.partial(effect, layer))) for layer in range(layers)]
  return {
      "vmapped": lambda: jax.block_until_ready(vmapped(pairs)),
      "by layer": lambda: jax.block_until_ready(jnp.concatenate(
          [run(jnp.arange(heads)) for run in by_layer])),
      "loop, jit": lambda: jax.block_until_ready(jnp.stack(
          [one(layer, head) for layer, head in pairs])),
      "loop, eager": lambda: jax.block_until_ready(jnp.stack(
          [effect(layer, head) for layer, head in pairs])),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=32)
  parser.add_argument("--width", type=int, default=128)
  parser.add_argument("--json", help="also write the result here")
  args = parser.parse_args(argv)
  config = aj.EncoderConfig(vocab_size=64, d_model=args.width, num_heads=args.heads,
                            num_layers=args.layers, mlp_dim=2 * args.width, dropout_rate=0.0)
  model = aj.TransformerEncoder(config)
  tokens = jax.random.randint(jax.random.key(1), (args.batch, args.length), 1, 64)
  variables = model.init(jax.random.key(0), tokens)
  runs = runners(model, variables, tokens, args.layers, args.heads)
  effects = {name: run() for name, run in runs.items()}
  disagreement = max(float(jnp.max(jnp.abs(e - effects["vmapped"]))) for e in effects.values())
  times = median_times(runs, args.rounds)
  result = {"ms": {name: 1e3 * t for name, t in times.items()},
            "over by layer": {name: t / times["by layer"] for name, t in times.items()},
            "largest disagreement": disagreement, "patches": args.layers * args.heads}
  for name, t in times.items():
    print(f"{name:12s} {1e3 * t:9.2f} ms  x{t / times['by layer']:7.1f} the by-layer time",
          flush=True)
  print(f"{result['patches']} patches; effects agree to {disagreement:.1e}")
  result["machine"] = provenance.benchmark(
      backend=jax.default_backend(), **{k: v for k, v in vars(args).items() if k != "json"})
  write_json(result, args.json)
  return result


if __name__ == "__main__":
  main()
