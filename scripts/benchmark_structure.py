"""What structure saves: local-window block skipping and grouped-query attention without copies.

  python scripts/benchmark_structure.py [--rounds 5] [--length 8192] [--window 128]
      [--heads 8] [--group 8] [--structure-length 4096] [--window-widths 64 256 1024]
      [--documents 1 4 16] [--dense-length 2048] [--parts window gqa structure blocks dense]
      [--json FILE]

1. Local window: chunked attention with ``local_window_size=(w, w)`` skips the key blocks outside
   the band; the same band passed as a dense boolean mask makes it visit every block, and full
   attention (no window) is the baseline. Forward and forward+backward at B = 1, T = S = length.
2. Grouped-query attention at ``group`` query heads per key/value head: XLA's temporary memory
   (compiled memory analysis) and time of forward+backward, keys and values used as they are
   (this project groups the queries) against the same call on keys and values copied to every
   query head with jnp.repeat (what GQA costs when a kernel needs equal head counts).
3. Structure as arguments or as a mask_mod: the blockwise kernel with the causal mask, a window,
   both, four documents (segment ids) and key lengths given as ``dot_product_attention``'s
   arguments, against the same structure written as a mask_mod with its block mask (made once,
   outside the timing), forward+backward at ``structure-length``: what one translation of the
   structure into mods, which the fused GPU kernel uses, would cost the blockwise kernel.

4. Blocks: the blockwise kernel under windows of ``window-widths`` keys on each side (and causal
   ones, (w, 0)) and with ``documents`` equal documents (segment ids), forward+backward at
   ``structure-length``, with the blocks it picks by default against square blocks of 128 to
   1024 and the blocks of full attention (1024 x 4096).
5. Dense: the reference path with the structure as arguments or as a mask_mod at
   ``dense-length``, forward+backward: time, XLA's temporary memory, and the mask the dense
   kernels receive (a mask_mod is evaluated on every index, [B, N, T, S]; the arguments keep the
   shapes they broadcast from).

Each round runs every method once, in an order shuffled per round; medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from scripts.benchmark_attention import timed  # noqa: E402


def compiled(fn, arrays, backward):
  """(run, temporary bytes): fn jitted (or its gradient w.r.t. q, k, v) and compiled."""
  if backward:
    cotangent, forward = jnp.ones(arrays[0].shape, arrays[0].dtype), fn
    fn = jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v) * cotangent), argnums=(0, 1, 2))
  executable = jax.jit(fn).lower(*arrays).compile()
  memory = executable.memory_analysis()
  temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
  return (lambda: jax.block_until_ready(executable(*arrays))), temp


def inputs(seed, length, heads, kv_heads=None):
  """q [1, T, N, 64] and k, v [1, T, K, 64] (K: ``kv_heads``, default N): float32 normals."""
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal((1, length, n, 64)), jnp.float32)
          for n in (heads, kv_heads or heads, kv_heads or heads)]


def median_times(runs, rounds):
  """{name: median seconds per call} of each run() (benchmark_attention.timed, a call a sample)."""
  return timed({name: lambda calls=1, run=run: run() for name, run in runs.items()}, rounds, 0.0)


def print_table(rows, formats=None):
  """Print ``rows`` ({column: value}) as aligned columns, every column in the order it first
  appears: a float by ``formats.get(column, ".3g")``, None or a missing value as "-", a column of
  numbers right-aligned."""
  columns, formats = list(dict.fromkeys(column for row in rows for column in row)), formats or {}
  shown = lambda value, column: ("-" if value is None else str(value) if not isinstance(
      value, float) else format(value, formats.get(column, ".3g")))
  lines = [columns] + [[shown(row.get(column), column) for column in columns] for row in rows]
  widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
  numbers = [all(isinstance(row.get(column), (int, float, type(None))) for row in rows)
             for column in columns]
  for line in lines:
    print(" ".join(text.rjust(width) if right else text.ljust(width)
                   for text, width, right in zip(line, widths, numbers)).rstrip())


def write_json(results, path):
  """Write ``results`` (rows, or a dict with them) to ``path`` as JSON (nothing where ``path``
  is None)."""
  if path:
    with open(path, "w") as f:
      json.dump(results, f, indent=1)


def timed_rows(part, methods, arrays, rounds, baseline, backward=True, **columns):
  """A row per method: its median time, XLA's temporary memory (where known) and its time over
  ``baseline``'s; ``columns``: {name: {method: value}}, more columns per method."""
  built = {name: compiled(fn, arrays, backward) for name, fn in methods.items()}
  times = median_times({name: run for name, (run, _) in built.items()}, rounds)
  return [{"part": part, "pass": "fwd+bwd" if backward else "fwd", "method": name,
           "ms": 1e3 * times[name], "temp MiB": None if temp is None else temp / 2 ** 20,
           **{column: values[name] for column, values in columns.items()},
           f"vs {baseline}": times[name] / times[baseline]} for name, (_, temp) in built.items()]


def window_rows(length, window, heads, rounds):
  q, k, v = inputs(0, length, heads)
  band = aj.masks.local_window_mask(length, length, (window, window))
  methods = {
      "full": lambda q, k, v: aj.dot_product_attention(q, k, v, implementation="chunked"),
      "window as a dense mask": lambda q, k, v: aj.dot_product_attention(
          q, k, v, mask=band, implementation="chunked"),
      "window (blocks skipped)": lambda q, k, v: aj.dot_product_attention(
          q, k, v, local_window_size=window, implementation="chunked"),
  }
  return [row for backward in (False, True)
          for row in timed_rows("window", methods, (q, k, v), rounds, "full", backward)]


def gqa_rows(length, heads, group, rounds):
  q, k, v = inputs(1, length, heads, heads // group)
  rows = []
  for implementation in ("reference", "chunked"):
    def grouped(q, k, v, implementation=implementation):
      return aj.dot_product_attention(q, k, v, implementation=implementation)

    def copied(q, k, v, implementation=implementation):
      k, v = (jnp.repeat(x, group, axis=-2) for x in (k, v))  # [1, S, N, 64]
      return aj.dot_product_attention(q, k, v, implementation=implementation)

    rows += timed_rows(f"gqa {implementation}",
                       {"grouped queries": grouped, "copied keys/values": copied}, (q, k, v),
                       rounds, "copied keys/values")
  return rows


def structures(length):
  """{name: (dot_product_attention's arguments, the same structure as a mask_mod)}."""
  window, documents, kept = 256, 4, 3 * length // 4
  segments = jnp.repeat(jnp.arange(documents), length // documents)[None]  # [1, T]
  return {
      "causal": (dict(is_causal=True), lambda b, h, i, j: j <= i),
      "window": (dict(local_window_size=window), lambda b, h, i, j: abs(i - j) <= window),
      "causal window": (dict(is_causal=True, local_window_size=window),
                        lambda b, h, i, j: (j <= i) & (i - j <= window)),
      "4 documents": (dict(query_segment_ids=segments, key_segment_ids=segments),
                      lambda b, h, i, j: segments[0, i] == segments[0, j]),
      "key lengths": (dict(key_value_seq_lengths=jnp.array([kept])), lambda b, h, i, j: j < kept),
  }


def structure_rows(length, heads, rounds):
  q, k, v = inputs(2, length, heads)
  rows = []
  for name, (arguments, mask_mod) in structures(length).items():
    # the block mask at its default blocks (128), and at the blocks the kernel takes for the
    # arguments (so that only the translation differs)
    geometry = aj.chunked.plan(q, k, is_causal=arguments.get("is_causal", False),
                               local_window_size=arguments.get("local_window_size"),
                               segment_ids="query_segment_ids" in arguments)[1]
    kernel_blocks = (geometry.block_q, geometry.block_k)
    block_masks = {"mask_mod + block mask": aj.block_masks.make_block_mask(
                       mask_mod, None, None, length, length),
                   "mask_mod + block mask, the kernel's blocks": aj.block_masks.make_block_mask(
                       mask_mod, None, None, length, length, block_size=kernel_blocks)}
    methods = {"arguments": lambda q, k, v, a=arguments: aj.dot_product_attention(
        q, k, v, implementation="chunked", **a)}
    for method, block_mask in block_masks.items():
      methods[method] = lambda q, k, v, m=mask_mod, bm=block_mask: aj.dot_product_attention(
          q, k, v, implementation="chunked", mask_mod=m, block_mask=bm)
    rows += timed_rows(f"structure: {name}", methods, (q, k, v), rounds, "arguments")
  return rows


def dense_rows(length, heads, rounds):
  """The dense reference path with each structure as arguments or as a mask_mod: time and XLA's
  temporary memory, and the size of the mask that the dense kernels receive either way."""
  q, k, v = inputs(4, length, heads)
  rows = []
  for name, (arguments, mask_mod) in structures(length).items():
    methods = {"arguments": lambda q, k, v, a=arguments: aj.dot_product_attention(
                   q, k, v, implementation="reference", **a),
               "mask_mod": lambda q, k, v, m=mask_mod: aj.dot_product_attention(
                   q, k, v, implementation="reference", mask_mod=m)}
    structure = {field: value for field, value in arguments.items()
                 if field not in ("is_causal", "local_window_size")}  # lengths, segment ids
    masks = {"arguments": aj.attention.structure_mask(
                 None, length, length, local_window_size=arguments.get("local_window_size"),
                 **structure),
             "mask_mod": aj.mods.dense(None, mask_mod, q.dtype, (1,), heads, length, length)[1]}
    rows += timed_rows(
        f"dense: {name}", methods, (q, k, v), rounds, "arguments",
        **{"mask shape": {m: None if mask is None else str(tuple(mask.shape))
                          for m, mask in masks.items()},
           "mask KiB": {m: 0.0 if mask is None else mask.size * mask.dtype.itemsize / 2 ** 10
                        for m, mask in masks.items()}})
  return rows


def block_rows(length, heads, widths, documents, rounds):
  q, k, v = inputs(3, length, heads)
  cases = {}  # name: the structure's arguments
  for width in widths:
    cases[f"window ({width}, {width})"] = dict(local_window_size=(width, width))
    cases[f"window ({width}, 0)"] = dict(local_window_size=(width, 0))
  for count in documents:
    segments = jnp.repeat(jnp.arange(count), -(-length // count))[None, :length]  # [1, T]
    cases[f"{count} documents"] = dict(query_segment_ids=segments, key_segment_ids=segments)
  rows = []
  for name, arguments in cases.items():
    chosen = aj.chunked.plan(q, k, local_window_size=arguments.get("local_window_size"),
                             segment_ids="query_segment_ids" in arguments)[1]
    blocks = {"default": (None, None)} | {f"{b}x{b}": (b, b) for b in (128, 256, 512, 1024)}
    blocks["1024x4096"] = (1024, 4096)
    methods = {method: lambda q, k, v, b=b, a=arguments: aj.chunked.chunked_attention(
        q, k, v, scale=0.125, block_q=b[0], block_k=b[1], **a) for method, b in blocks.items()}
    for row in timed_rows(f"blocks: {name}", methods, (q, k, v), rounds, "default"):
      if row["method"] == "default":
        row["method"] = f"default ({chosen.block_q}x{chosen.block_k})"
      rows.append(row)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--length", type=int, default=8192, help="T = S of the window rows")
  parser.add_argument("--window", type=int, default=128, help="keys on each side: (w, w)")
  parser.add_argument("--heads", type=int, default=8, help="query heads")
  parser.add_argument("--group", type=int, default=8, help="query heads per key/value head")
  parser.add_argument("--gqa-length", type=int, default=2048, help="T = S of the GQA rows")
  parser.add_argument("--structure-length", type=int, default=4096,
                      help="T = S of the structure rows")
  parser.add_argument("--dense-length", type=int, default=2048, help="T = S of the dense rows")
  parser.add_argument("--window-widths", nargs="+", type=int, default=[64, 256, 1024],
                      help="keys on each side of the windows of the blocks rows")
  parser.add_argument("--documents", nargs="+", type=int, default=[1, 4, 16],
                      help="documents per sequence of the blocks rows")
  parser.add_argument("--parts", nargs="+", default=["window", "gqa", "structure"],
                      choices=["window", "gqa", "structure", "blocks", "dense"])
  parser.add_argument("--json", help="write the rows to this file")
  args = parser.parse_args()
  if args.heads % args.group:
    parser.error(f"--heads {args.heads} must be a multiple of --group {args.group}")
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {os.cpu_count()} CPUs; "
        f"median of {args.rounds} rounds")
  rows = []
  if "window" in args.parts:
    rows += window_rows(args.length, args.window, args.heads, args.rounds)
  if "gqa" in args.parts:
    rows += gqa_rows(args.gqa_length, args.heads, args.group, args.rounds)
  if "structure" in args.parts:
    rows += structure_rows(args.structure_length, args.heads, args.rounds)
  if "dense" in args.parts:
    rows += dense_rows(args.dense_length, args.heads, args.rounds)
  if "blocks" in args.parts:
    rows += block_rows(args.structure_length, args.heads, args.window_widths, args.documents,
                       args.rounds)
  for part in dict.fromkeys(row["part"] for row in rows):
    print()
    print_table([row for row in rows if row["part"] == part])
  write_json(rows, args.json)


if __name__ == "__main__":
  main()
