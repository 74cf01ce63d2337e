"""Where the trainer's step spends its time: the JAX profiler's trace, op by op, by model part.

  python -m scripts.profile_train [--sizes default medium long] [--steps 5] [--torch] [--json F]
      [--dtype bfloat16] [--trace-dir DIR]

Runs the step that scripts/benchmark_train.py times (``experiments.train.train_step_fn``, one
replica), traces ``--steps`` of them with ``jax.profiler``, and attributes each executed HLO
instruction to a part of the model through the ``op_name`` metadata of the compiled program
(Flax's module names and the named scopes of ``multi_head_attention``): the attention core, the
attention's Q/K/V and output projections, the feed-forward, LayerNorm, embedding and positional
encoding, the classifier and loss, and the optimizer update (with the gradient norm and the
divergence guard), each split into forward and backward. Time is the sum of the instructions'
durations on the threads that run them: XLA's CPU runtime may run independent instructions at
once, so the parts can add up to more than the step's wall time, which is printed beside them.
``--torch`` adds the same table for the PyTorch twin from ``torch.profiler`` (self CPU time per
operator, by name), where torch is installed. On a GPU or TPU it also prints, per device stream of
the trace, the share of the traced steps' span in which a kernel runs and the longest gap between
kernels: a step that waits for the host shows as gaps. ``--trace-dir`` keeps the trace, and
``--read-trace DIR`` summarises a kept one by kernel kind (on a machine without the device).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts import benchmark_train  # noqa: E402

# The part of the model an op belongs to, by its op_name path (first match wins).
PARTS = (
    ("attention core", r"/dot_product_attention/"),
    ("attention projections", r"/(qkv|out)_projection/|/attention/(query|key|value|out)"),
    ("feed-forward", r"/(ffn|mlp|feed_forward|FeedForward)[^/]*/"),
    ("LayerNorm", r"/norm_\d+/|/final_norm/"),
    ("embedding + positions", r"/embed/|positional|/encoder/(?!block_)"),
    ("classifier + loss", r"SequenceClassifier|TokenClassifier"),
)
OPTIMIZER = "optimizer update + guard"
# The HLO name of a model parameter: the params field of the step's first argument, the state
# (``args_0``, as experiments.replicas.over_replicas passes the arguments on).
PARAMETER = r"args_0__params__"


def parameter_part(path: str) -> str:
  """The part of the model a parameter at ``path`` ('/encoder/block_0/attention/query/...')
  belongs to; the classifier's for what no pattern names."""
  return next((part for part, pattern in PARTS if re.search(pattern, path)), "classifier + loss")


def part_of(op_name: str) -> str:
  """'<part>, forward|backward' for an op_name; the optimizer for what is outside the model."""
  if not re.search(r"SequenceClassifier|TokenClassifier", op_name):
    return OPTIMIZER if op_name else "unattributed"
  direction = "backward" if "transpose(" in op_name else "forward"
  for part, pattern in PARTS:
    if re.search(pattern, op_name):
      return f"{part}, {direction}"
  return f"other model ops, {direction}"


def weight_gradient_parts(params) -> dict[int, str]:
  """{element count of a parameter: '<part>, backward'}: a product without op_name whose result
  has a parameter's size is that parameter's gradient (dW = X^T dY)."""
  sizes = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    part = parameter_part("/" + "/".join(str(getattr(key, "key", key)) for key in path) + "/")
    sizes.setdefault(leaf[0].size, f"{part}, backward")  # leaf [R, ...]: one replica's size
  return sizes


def instruction_parts(hlo_text: str, weight_gradients: dict[int, str]) -> dict[str, str]:
  """{HLO instruction name: part} for the compiled program's text. A fusion takes the most
  common part of the instructions inside it. One without any op_name (XLA's CPU backend drops
  them from the matrix products it hands to YNNPACK) is a weight gradient when its result has a
  parameter's size (``weight_gradients``), else takes the part of the instructions that use its
  result, or else of those it reads. One inside a loop's body (the chunked attention kernel's)
  takes the part of the loop when it has no op_name of its own. A matrix product that reads a
  model parameter (X W forward, dY W^T backward) is that parameter's part: XLA fuses products
  with the elementwise ops around them, whose names (a residual add, a LayerNorm) would
  otherwise claim it."""
  computation, names_in = None, collections.defaultdict(list)
  own, calls, operands, sizes, caller, home = {}, {}, {}, {}, {}, {}
  products = set()  # computations with a matrix product in them
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
    if header and line.rstrip().endswith("{"):
      computation = header.group(1)
      continue
    # An array result, dtype[dims], or a tuple (a loop's state), (...).
    match = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (?:\w+\[([\d,]*)\]|\([^()]*\))(.*)$", line)
    if not match:
      continue
    name, dims, rest = match.groups()
    sizes[name] = -1 if dims is None else int(np.prod([int(d) for d in dims.split(",") if d]))
    op_name = re.search(r'op_name="([^"]*)"', rest)
    called = re.search(r"(?:calls|body)=%([\w.\-]+)", rest)  # a fusion's or a loop's body
    own[name] = op_name.group(1) if op_name else ""
    if called:
      calls[name] = called.group(1)
    for loop_part in re.findall(r"(?:body|condition)=%([\w.\-]+)", rest):
      caller[loop_part] = name
    home[name] = computation
    operands[name] = re.findall(r"%([\w.\-]+)", re.sub(r"(calls|to_apply|body|condition)="
                                                       r"%[\w.\-]+", "", rest))
    if op_name and computation:
      names_in[computation].append(op_name.group(1))
    if re.search(r"\bdot\(", rest):
      products.add(computation)

  def weight_part(name, depth=3):
    """The part of a parameter that reaches instruction ``name`` through layout changes only
    (bitcasts, copies, transposes), as a product's weight does."""
    if re.match(PARAMETER, name):  # e.g. args_0__params__encoder____block_0____attention..
      return parameter_part(name.replace("____", "/") + "/")
    layout = (n for n in operands.get(name, ()) if re.match(r"bitcast|copy|transpose", n)
              or re.match(PARAMETER, n))
    found = (weight_part(n, depth - 1) for n in layout if depth)
    return next((part for part in found if part), None)

  parts, nameless_products = {}, {}
  for name, op_name in own.items():
    inside = names_in.get(calls.get(name, ""), [])
    names = inside or ([op_name] if op_name else [])
    weight = weight_part(name) if calls.get(name) in products else None
    if weight and names:
      direction = "backward" if any("transpose(" in n for n in names) else "forward"
      parts[name] = f"{weight}, {direction}"
    elif weight:
      nameless_products[name] = weight
    elif names:
      parts[name] = collections.Counter(part_of(n) for n in names).most_common(1)[0][0]
  users = collections.defaultdict(list)
  for name, reads in operands.items():
    for operand in reads:
      users[operand].append(name)

  def from_backward_pass(name):  # an op of the backward pass, by its op_name or its fused ones'
    return any("transpose(" in n for n in [own.get(name, "")] + names_in.get(calls.get(name), []))

  for name, weight in nameless_products.items():  # backward when it reads a cotangent
    backward = any(from_backward_pass(n) for n in operands[name])
    parts[name] = f"{weight}, {'backward' if backward else 'forward'}"

  def loop_part(name):  # the part of the innermost loop around instruction ``name``, if any
    loop = caller.get(home.get(name))
    return None if loop is None else parts.get(loop) or loop_part(loop)

  for name in own:
    if name not in parts and loop_part(name):
      parts[name] = loop_part(name)
  for name in own:
    if name not in parts and sizes[name] in weight_gradients and calls.get(name):
      parts[name] = weight_gradients[sizes[name]]
  for name in own:
    if name not in parts:
      for neighbours in (users[name], operands[name]):
        known = [parts[n] for n in neighbours if n in parts]
        if known:
          parts[name] = collections.Counter(known).most_common(1)[0][0]
          break
      else:
        parts[name] = "unattributed"
  # A loop's own trace event spans its body's: only the instructions inside are counted.
  return {name: part for name, part in parts.items() if sizes[name] != -1}


def trace_events(directory: str, phase: str = "X") -> list[dict]:
  """The events of one phase ("X": complete, "M": metadata) of the perfetto trace that
  jax.profiler wrote under ``directory``."""
  path = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)[0]
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return [event for event in events if event.get("ph") == phase]


# A GPU kernel that no HLO instruction is named after (a cuDNN or cuBLAS call, which XLA may run
# inside a CUDA graph), by its kind: (part, pattern of the kernel's name).
KERNEL_KINDS = (("attention core (cuDNN)", r"cudnn|fmha|sdpa"),
                ("matrix products (cuBLAS, GEMM fusions)", r"gemm|nvjet|xmma|cutlass|cublas"),
                ("copies and fills", r"^mem(cpy|set)"))


def device_pids(metadata: list[dict]) -> set:
  """The trace's processes that are devices ("/device:GPU:0"; none on a CPU)."""
  return {event["pid"] for event in metadata
          if event.get("name") == "process_name" and "/device:" in event["args"]["name"]}


def attribute(events: list[dict], metadata: list[dict], parts: dict[str, str],
              steps: int) -> dict[str, float]:
  """Seconds per step by part: an event named after an HLO instruction of ``parts`` (XLA:GPU
  writes the name's dots as underscores, or names it in args.hlo_op) goes to that part; any
  other device kernel to its kind (KERNEL_KINDS), or to "other XLA kernels"."""
  parts = {**parts, **{name.replace(".", "_"): part for name, part in parts.items()}}
  devices = device_pids(metadata)
  seconds = collections.Counter()
  for event in events:
    name = event["name"] if event["name"] in parts else event.get("args", {}).get("hlo_op")
    if name in parts:
      part = parts[name]
    elif event["pid"] in devices:
      part = next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, event["name"],
                                                                        re.IGNORECASE)),
                  "other XLA kernels")
    else:
      continue
    seconds[part] += event["dur"] * 1e-6 / steps
  return dict(seconds)


def device_streams(events: list[dict], metadata: list[dict]) -> dict[str, dict]:
  """{device stream: its kernels' busy share of their span, the longest gap in ms, the kernel
  count}, for the threads of a "/device:" process (none on a CPU)."""
  names = {(event["pid"], event.get("tid")): event["args"]["name"] for event in metadata
           if event.get("name") in ("process_name", "thread_name")}
  devices = device_pids(metadata)
  intervals = collections.defaultdict(list)
  for event in events:
    if event["pid"] in devices:
      intervals[event["pid"], event.get("tid")].append((event["ts"], event["ts"] + event["dur"]))
  streams = {}
  for (pid, tid), spans in intervals.items():
    spans.sort()
    busy, gap, end = 0.0, 0.0, spans[0][0]
    for start, stop in spans:  # merge overlapping kernels
      gap = max(gap, start - end)
      busy += max(0.0, stop - max(start, end))
      end = max(end, stop)
    name = f"{names.get((pid, None), pid)} / {names.get((pid, tid), tid)}"
    streams[name] = {"busy": busy / max(end - spans[0][0], 1e-9), "longest_gap_ms": gap * 1e-3,
                     "kernels": len(spans)}
  return streams


def profile_jax(size, steps: int, dtype: str = "float32", trace_dir: str | None = None) -> dict:
  config = benchmark_train.benchmark_config(size, dtype)
  tokens, labels = benchmark_train.random_batch(size[0], size[1])
  step_fn, state, batch = benchmark_train.jax_step(config, tokens, labels)
  step_fn = step_fn.lower(state, batch).compile()  # the program both attributed and run
  parts = instruction_parts(step_fn.as_text(), weight_gradient_parts(state.params))
  for _ in range(2):  # warm up
    state, metrics = step_fn(state, batch)
  jax.block_until_ready(metrics)
  with tempfile.TemporaryDirectory() as scratch:
    directory = trace_dir or scratch
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    started = time.perf_counter()
    for _ in range(steps):
      state, metrics = step_fn(state, batch)
    jax.block_until_ready(metrics)
    wall = (time.perf_counter() - started) / steps
    jax.profiler.stop_trace()
    events, metadata = trace_events(directory), trace_events(directory, "M")
  return {"step_seconds": wall, "parts": attribute(events, metadata, parts, steps),
          "device_streams": device_streams(events, metadata)}


def profile_torch(size, steps: int, dtype: str = "float32") -> dict | None:
  try:
    from torch.profiler import ProfilerActivity, profile
  except ImportError:
    return None
  config = benchmark_train.benchmark_config(size, dtype)
  tokens, labels = benchmark_train.random_batch(size[0], size[1])
  step = benchmark_train.torch_runner(config, tokens, labels)
  for _ in range(2):
    step()
  with profile(activities=[ProfilerActivity.CPU]) as profiler:
    started = time.perf_counter()
    for _ in range(steps):
      step()
    wall = (time.perf_counter() - started) / steps
  seconds = {event.key: event.self_cpu_time_total * 1e-6 / steps
             for event in profiler.key_averages()}
  return {"step_seconds": wall, "parts": seconds}


def print_table(title, result, top=None):
  total = sum(result["parts"].values())
  print(f"\n{title}: step {result['step_seconds'] * 1e3:.1f} ms wall, ops sum to "
        f"{total * 1e3:.1f} ms")
  rows = sorted(result["parts"].items(), key=lambda item: -item[1])[:top]
  for part, seconds in rows:
    print(f"  {part:<40} {seconds * 1e3:9.2f} ms  {seconds / total:6.1%}")
  for stream, activity in result.get("device_streams", {}).items():
    print(f"  device stream {stream}: busy {activity['busy']:.1%} of its span, longest gap "
          f"{activity['longest_gap_ms']:.3f} ms, {activity['kernels']} kernels")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", nargs="+", default=list(benchmark_train.SIZES),
                      choices=list(benchmark_train.ALL_SIZES))
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--trace-dir", help="keep the JAX trace here (one folder per size)")
  parser.add_argument("--torch", action="store_true", help="profile the PyTorch twin too")
  parser.add_argument("--json", help="write the breakdowns to this file")
  parser.add_argument("--read-trace", metavar="DIR", help="only summarise a trace kept by "
                      "--trace-dir (of --steps steps): device kernels by kind, streams")
  args = parser.parse_args()
  if args.read_trace:
    events, metadata = trace_events(args.read_trace), trace_events(args.read_trace, "M")
    devices = device_pids(metadata)
    kernels = [event for event in events if event["pid"] in devices]
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    print_table(f"{args.read_trace} (step: the device's span / {args.steps})",
                {"step_seconds": span * 1e-6 / args.steps,
                 "parts": attribute(events, metadata, {}, args.steps),
                 "device_streams": device_streams(events, metadata)})
    return
  report = {}
  for name in args.sizes:
    size = benchmark_train.ALL_SIZES[name]
    trace_dir = args.trace_dir and os.path.join(args.trace_dir, name.replace(" ", "_"))
    report[name] = {"size": size, "jax": profile_jax(size, args.steps, args.dtype, trace_dir)}
    print_table(f"{name} {size} attention_jax", report[name]["jax"])
    if args.torch:
      report[name]["torch"] = profile_torch(size, args.steps, args.dtype)
      if report[name]["torch"] is not None:
        print_table(f"{name} {size} torch (self CPU time, top 15 operators)",
                    report[name]["torch"], top=15)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  main()
