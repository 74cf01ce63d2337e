"""Training-step throughput: the trainer's own step against the same model in PyTorch.

  python -m scripts.benchmark_train [--rounds 5] [--methods ...] [--sizes ...] [--json FILE]
      [--dtype bfloat16] [--accelerator-sizes] [--peak-tflops 989]
  python -m scripts.benchmark_train --head-variants  # the head variants' cost against MHA

"attention_jax" is ``experiments.train.train_step_fn``, the compiled step the training loop runs
(one replica, the AdamW update with clipping, the divergence guard), built from
configs/default.py with the model size of each row, post-LN, ReLU feed-forward, CLS pooling, the
sinusoidal encoding and no dropout. "flax.linen" is that step with
``flax.linen.MultiHeadDotProductAttention`` swapped in. "torch" and "torch.compile" are the same
model in PyTorch (``nn.TransformerEncoder``, whose attention is its fused SDPA kernel), AdamW with
the same weight decay and gradient clipping; torch is optional (``pip install torch``) and its
columns are left out without it. Every method runs on the same batch of random tokens (no
padding), in one process, so that they share one environment; each round runs them in a fresh
random order, each for enough steps to take about ``--seconds``, and the table gives the median
tokens/s of the rounds and each method's ratio to torch eager (higher is faster). The training
commands add glibc's huge-page setting themselves (experiments/launch.py); this script does not,
so run it as ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python -m scripts.benchmark_train`` to time
the step as training runs it (docs/performance.md).

``--head-variants`` times the trainer's step with each head variant of attention_jax/variants/
("attention_jax+talking_heads", ...) beside plain "attention_jax", at the default size and the two
sizes of the head-variants ablation (configs/ablations/head_variants.py, a CLS token added), and
gives each one's parameter count and its ratio to plain MHA.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from experiments import config_check, optim, provenance, tasks, train  # noqa: E402
from experiments import replicas as replicas_lib  # noqa: E402

# (name, batch, length, d_model, heads, layers, mlp); length counts the CLS token.
SIZES = {
    "default": (64, 33, 128, 4, 2, 256),   # configs/default.py
    "medium": (32, 256, 256, 8, 4, 1024),
    "long": (8, 1024, 256, 8, 4, 1024),
}
# Sizes that give a GPU or TPU enough work per step to be measured (--accelerator-sizes).
ACCELERATOR_SIZES = {
    "accelerator base": (64, 512, 512, 8, 6, 2048),
    "accelerator long": (8, 4096, 512, 8, 6, 2048),
    "accelerator large": (16, 2048, 1024, 16, 8, 4096),
    "accelerator wide": (32, 1024, 1024, 16, 8, 4096),
}
# Beyond --accelerator-sizes (by name only): the large size with heads of 128 (where attention
# kernels run nearer their peak than at d_k 64), and twice its width.
WIDE_HEAD_SIZES = {
    "accelerator large dk128": (16, 2048, 1024, 8, 8, 4096),
    "accelerator xl": (8, 2048, 2048, 16, 8, 8192),
}
ALL_SIZES = {**SIZES, **ACCELERATOR_SIZES, **WIDE_HEAD_SIZES}  # by name, for --sizes
METHODS = ("attention_jax", "flax.linen", "torch", "torch.compile")
HEAD_VARIANT_METHODS = ("attention_jax",) + tuple(
    f"attention_jax+{name}" for name in aj.variants.REGISTRY if name != "mha")
# (batch, length, d_model, heads, layers, mlp) of configs/ablations/head_variants.py's mqar runs,
# length 8 + a CLS token.
HEAD_VARIANT_SIZES = {"default": SIZES["default"],
                      "ablation 4 heads": (32, 9, 64, 4, 2, 128),
                      "ablation 16 heads": (32, 9, 64, 16, 2, 128)}
NUM_CLASSES, VOCAB_SIZE = 2, 19  # the order task's


class FlaxAttention(nn.Module):
  """flax.linen.MultiHeadDotProductAttention behind MultiHeadAttention's interface."""
  num_heads: int
  scale: Any = "inv_sqrt"
  dropout_rate: float = 0.0
  implementation: Any = None
  qk_transform: Any = None  # identity for the sinusoidal encoding used here

  @nn.compact
  def __call__(self, x, *, mask=None, bias=None, is_causal=False, deterministic=True):
    if bias is not None or is_causal or self.scale != "inv_sqrt":
      raise ValueError("the flax reference supports neither bias, causal masks nor other scales")
    return nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dropout_rate=self.dropout_rate,
                                           name="attention")(x, x, x, mask=mask,
                                                             deterministic=deterministic)


def model_flops_per_step(batch, length, d_model, layers, mlp):
  """Matrix-multiply FLOPs of one training step (forward and backward, 3x the forward), as
  model FLOPs utilisation counts them: per layer and token, the Q, K, V and output projections
  (8 d^2), the feed-forward (4 d mlp) and the attention products Q K^T and P V (4 T d)."""
  per_token = layers * (8 * d_model ** 2 + 4 * d_model * mlp + 4 * length * d_model)
  return 3 * batch * length * per_token


def benchmark_config(size, dtype: str):
  """configs/default.py at the model size of ``size`` (no dropout)."""
  batch, length, d_model, heads, layers, mlp = size
  config = config_check.default_config()
  config.model.update(d_model=d_model, num_heads=heads, num_layers=layers, mlp_dim=mlp,
                      dropout_rate=0.0, pooling="cls", positional_encoding="sinusoidal",
                      pre_layer_norm=False)
  config.update(batch_size=batch, compute_dtype=dtype)
  return config


def random_batch(batch, length, seed=0):
  """Token ids [B, T - 1] (no padding: the CLS token makes T) and labels [B]."""
  rng = np.random.default_rng(seed)
  return rng.integers(1, VOCAB_SIZE, (batch, length - 1)), rng.integers(0, NUM_CLASSES, batch)


def jax_step(config, tokens, labels, attention_module=None):
  """(the trainer's compiled step, its step-0 state, the batch) for the model of ``config`` on
  token ids [B, T - 1] and labels [B]."""
  task = tasks.Task(name="random tokens", train=None, test=None, vocab_size=VOCAB_SIZE,
                    num_classes=NUM_CLASSES, max_length=tokens.shape[1], token_names=())
  model_config = dataclasses.replace(config_check.encoder_config(config, task),
                                     attention_module=attention_module)
  model, tx = aj.SequenceClassifier(model_config), optim.optimizer(config)
  state = train.initial_states(model, tx, tokens.shape[1], replicas_lib.replicas_of(config))
  batch = {"tokens": jnp.asarray(tokens[None], jnp.int32),
           "labels": jnp.asarray(labels[None], jnp.int32)}  # one replica
  return train.train_step_fn(config, model, tx, NUM_CLASSES), state, batch


def jax_runner(config, tokens, labels, attention_module=None, on_loss=None):
  """step() runs the trainer's compiled step once on (tokens, labels) and waits for it (and
  passes the loss to ``on_loss``)."""
  step_fn, state, batch = jax_step(config, tokens, labels, attention_module)
  parameters = train.parameter_count(state.params)
  state = [state]

  def step():
    state[0], metrics = step_fn(state[0], batch)
    loss = jax.block_until_ready(metrics["loss"])
    if on_loss is not None:
      on_loss(float(loss[0]))
  step.parameters = parameters
  return step


def torch_runner(config, tokens, labels, compile_model=False):
  """The same model and optimizer in PyTorch, on the GPU when JAX runs on one, in bfloat16
  autocast when ``config.compute_dtype`` is bfloat16 (GPU only) and with TF32 matrix products in
  float32 on a GPU, as JAX's default precision there; None when torch is not installed."""
  try:
    import torch
  except ImportError:
    return None
  device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  if device == "cpu" and config.compute_dtype != "float32":
    return None
  torch.backends.cuda.matmul.allow_tf32 = True
  torch.manual_seed(0)
  model_config = config.model
  d_model = model_config.d_model

  class EncoderClassifier(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.embed = torch.nn.Embedding(VOCAB_SIZE, d_model)
      self.cls = torch.nn.Parameter(torch.randn(d_model))
      self.register_buffer("table", torch.from_numpy(np.asarray(
          aj.sinusoidal_encoding(tokens.shape[1] + 1, d_model))))
      layer = torch.nn.TransformerEncoderLayer(
          d_model, model_config.num_heads, model_config.mlp_dim, dropout=0.0, activation="relu",
          batch_first=True, norm_first=False)
      self.encoder = torch.nn.TransformerEncoder(layer, model_config.num_layers,
                                                 enable_nested_tensor=False)
      self.logits = torch.nn.Linear(d_model, NUM_CLASSES)

    def forward(self, tokens):
      x = self.embed(tokens)  # [B, T - 1, D]
      x = torch.cat([self.cls.expand(x.shape[0], 1, d_model), x], dim=1) + self.table
      return self.logits(self.encoder(x)[:, 0])  # [B, C]

  model = EncoderClassifier().to(device)
  forward = torch.compile(model) if compile_model else model
  optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                weight_decay=config.weight_decay)
  tokens, labels = torch.from_numpy(tokens).to(device), torch.from_numpy(labels).to(device)
  autocast = lambda: torch.autocast(device, torch.bfloat16,
                                    enabled=config.compute_dtype == "bfloat16")

  def step():
    optimizer.zero_grad(set_to_none=True)
    with autocast():
      loss = torch.nn.functional.cross_entropy(forward(tokens), labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
    optimizer.step()
    loss.item()
  return step


def runners(methods, size, dtype):
  config = benchmark_config(size, dtype)
  tokens, labels = random_batch(size[0], size[1])
  make = {
      "attention_jax": lambda: jax_runner(config, tokens, labels),
      "flax.linen": lambda: jax_runner(config, tokens, labels, FlaxAttention),
      "torch": lambda: torch_runner(config, tokens, labels),
      "torch.compile": lambda: torch_runner(config, tokens, labels, compile_model=True),
  }
  for method in methods:
    if method.startswith("attention_jax+"):  # a head variant of attention_jax's model
      variant = config.copy_and_resolve_references()
      variant.model.head_variant = method.partition("+")[2]
      make[method] = lambda variant=variant: jax_runner(variant, tokens, labels)
  made = {method: make[method]() for method in methods}
  return {method: run for method, run in made.items() if run is not None}


def measure(steps_by_method: dict, rounds: int, seconds: float) -> dict:
  """{method: [seconds per step, one per round]}: each round runs every method for about
  ``seconds`` (the same number of steps in every round), in a fresh random order, after one
  untimed step. A method's first step after another's is slower, as the other's memory use has
  displaced its own (on the 2-core CPU the first JAX step after a torch step took 1.2 s more
  at the medium size, and then ran at its steady rate); a training run takes step after step."""
  repeats = {}
  for method, step in steps_by_method.items():
    step()  # compile and warm up
    started = time.perf_counter()
    step()
    repeats[method] = max(1, round(seconds / max(time.perf_counter() - started, 1e-6)))
  times = {method: [] for method in steps_by_method}
  order, methods = random.Random(0), list(steps_by_method)
  for _ in range(rounds):
    order.shuffle(methods)
    for method in methods:
      steps_by_method[method]()  # untimed: back to the steady state
      started = time.perf_counter()
      for _ in range(repeats[method]):
        steps_by_method[method]()
      times[method].append((time.perf_counter() - started) / repeats[method])
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--seconds", type=float, default=1.0,
                      help="about this long per method and round")
  parser.add_argument("--methods", nargs="+", default=None,
                      choices=METHODS + HEAD_VARIANT_METHODS[1:])
  parser.add_argument("--sizes", nargs="+", default=list(SIZES),
                      choices=list(ALL_SIZES))
  parser.add_argument("--json", help="write the measurements to this file")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="compute dtype of the steps (parameters and optimizer stay float32); "
                      "torch runs bfloat16 as autocast, on a GPU only")
  parser.add_argument("--accelerator-sizes", action="store_true",
                      help="add models sized for a GPU or TPU (longer sequences, wider layers)")
  parser.add_argument("--peak-tflops", type=float, help="the device's peak for --dtype, to "
                      "report model FLOPs utilisation (e.g. 989 for an H100 SXM in bfloat16)")
  parser.add_argument("--head-variants", action="store_true",
                      help="time attention_jax's head variants against plain MHA at the default "
                      "and the head-variants ablation's sizes, with their parameter counts")
  args = parser.parse_args()
  args.methods = args.methods or list(HEAD_VARIANT_METHODS if args.head_variants else METHODS)
  try:
    import torch
    torch.set_num_threads(os.cpu_count())  # as many threads as XLA's CPU backend uses
  except ImportError:
    print("torch is not installed: its columns are left out (pip install torch).")
  sizes = {**{name: ALL_SIZES[name] for name in args.sizes},
           **(ACCELERATOR_SIZES if args.accelerator_sizes else {})}
  if args.head_variants:
    sizes = HEAD_VARIANT_SIZES
  results = []
  for name, size in sizes.items():
    batch, length, d_model, heads, layers, mlp = size
    steps_by_method = runners(args.methods, size, args.dtype)
    parameters = {method: getattr(step, "parameters", None)
                  for method, step in steps_by_method.items()}
    times = measure(steps_by_method, args.rounds, args.seconds)
    step_seconds = {method: statistics.median(t) for method, t in times.items()}
    rates = {method: batch * length / seconds for method, seconds in step_seconds.items()}
    tflops = {method: model_flops_per_step(batch, length, d_model, layers, mlp) / seconds / 1e12
              for method, seconds in step_seconds.items()}
    baseline = "torch" if "torch" in rates else (
        "attention_jax" if args.head_variants and "attention_jax" in rates else None)
    ratios = {method: rate / rates[baseline] for method, rate in rates.items()} if baseline else {}
    cells = ", ".join(
        f"{method} {rates[method]:.0f} tok/s ({step_seconds[method] * 1e3:.1f} ms"
        + (f", {parameters[method]} parameters" if args.head_variants else "")
        + (f", MFU {tflops[method] / args.peak_tflops:.1%}" if args.peak_tflops else "")
        + (f", {ratios[method]:.2f}x {baseline}" if ratios else "") + ")" for method in rates)
    print(f"{name} (B={batch}, T={length}, D={d_model}, N={heads}, L={layers}, "
          f"mlp={mlp}): {cells}", flush=True)
    results.append({"size": name, "batch": batch, "length": length, "d_model": d_model,
                    "heads": heads, "layers": layers, "mlp": mlp, "tokens_per_second": rates,
                    "step_seconds": step_seconds, "all_step_seconds": times,
                    "model_tflops": tflops, "parameters": parameters,
                    f"ratio_to_{baseline or 'torch'}": ratios})
  environment = provenance.benchmark(dtype=args.dtype)
  print(json.dumps(environment))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"environment": environment, "results": results}, f, indent=1)


if __name__ == "__main__":
  main()
