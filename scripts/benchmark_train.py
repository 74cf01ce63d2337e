"""Training-step throughput of the encoder classifier: this project's attention vs flax.linen's.

  python scripts/benchmark_train.py [--rounds 5] [--json FILE] [--dtype bfloat16]
      [--accelerator-sizes] [--peak-tflops 989]

Both models are the same SequenceClassifier (sinusoidal encoding, post-LN, AdamW step), except
that one uses attention_jax.MultiHeadAttention (whose default implementation is chosen per
backend and length) and the other flax.linen.MultiHeadDotProductAttention. Each round runs one
jitted train step of each, in an order shuffled per round; the table gives median tokens/s, the
step time, the model's matrix-multiply TFLOP/s (and its utilisation of --peak-tflops) and the
ratio. --dtype bfloat16 computes in bfloat16 with float32 parameters, as the trainer does.
"""

from __future__ import annotations

import argparse
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
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402

# (name, batch, length, d_model, heads, layers, mlp)
SETTINGS = [
    ("configs/default.py model", 64, 33, 128, 4, 2, 256),
    ("PERF_NOTES model", 32, 256, 256, 8, 4, 1024),
    ("long sequences", 8, 1024, 256, 8, 4, 1024),
]
# Sizes that give a GPU or TPU enough work per step to be measured (--accelerator-sizes).
ACCELERATOR_SETTINGS = [
    ("accelerator base", 64, 512, 512, 8, 6, 2048),
    ("accelerator long", 8, 4096, 512, 8, 6, 2048),
    ("accelerator wide", 32, 1024, 1024, 16, 8, 4096),
]


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


def train_step_fn(config, batch, length, dtype=jnp.float32):
  model = aj.SequenceClassifier(config)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, config.vocab_size, (batch, length)), jnp.int32)
  labels = jnp.asarray(rng.integers(0, config.num_classes, batch), jnp.int32)
  params = model.init(jax.random.key(0), tokens)["params"]
  tx = optax.adamw(1e-3)

  def loss_fn(params, dropout_rng):  # parameters stay float32; compute in dtype, as the trainer
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    logits = model.apply({"params": params}, tokens, deterministic=False,
                         rngs={"dropout": dropout_rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                           labels).mean()

  @jax.jit
  def step(params, opt_state, dropout_rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, dropout_rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  state = [params, tx.init(params)]

  def run():
    state[0], state[1], loss = step(state[0], state[1], jax.random.key(1))
    jax.block_until_ready(loss)
  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--json", help="write the measurements to this file")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="compute dtype (parameters and optimizer stay float32)")
  parser.add_argument("--accelerator-sizes", action="store_true",
                      help="add models sized for a GPU or TPU (longer sequences, wider layers)")
  parser.add_argument("--peak-tflops", type=float, help="the device's peak for --dtype, to "
                      "report model FLOPs utilisation (e.g. 989 for an H100 SXM in bfloat16)")
  args = parser.parse_args()
  dtype = jnp.dtype(args.dtype)
  results = []
  for name, batch, length, d_model, heads, layers, mlp in SETTINGS + (
      ACCELERATOR_SETTINGS if args.accelerator_sizes else []):
    base = dict(vocab_size=64, d_model=d_model, num_heads=heads, num_layers=layers, mlp_dim=mlp,
                max_length=length, positional_encoding="sinusoidal", num_classes=10,
                pooling="mean", dropout_rate=0.1)
    runners = {"attention_jax": train_step_fn(aj.EncoderConfig(**base), batch, length, dtype),
               "flax.linen": train_step_fn(aj.EncoderConfig(**base, attention_module=FlaxAttention),
                                           batch, length, dtype)}
    for run in runners.values():
      run()  # compile and warm up
    times = {method: [] for method in runners}
    order, methods = random.Random(0), list(runners)
    for _ in range(args.rounds):
      order.shuffle(methods)  # neither model always runs right after the other
      for method in methods:
        started = time.perf_counter()
        runners[method]()
        times[method].append(time.perf_counter() - started)
    step_seconds = {m: statistics.median(t) for m, t in times.items()}
    rates = {m: batch * length / seconds for m, seconds in step_seconds.items()}
    ratio = rates["attention_jax"] / rates["flax.linen"]
    tflops = model_flops_per_step(batch, length, d_model, layers, mlp) / step_seconds[
        "attention_jax"] / 1e12
    mfu = f", MFU {tflops / args.peak_tflops:.1%}" if args.peak_tflops else ""
    print(f"{name:>26} B={batch} T={length} D={d_model} N={heads} L={layers}: "
          f"attention_jax {rates['attention_jax']:8.0f} tok/s "
          f"({step_seconds['attention_jax'] * 1e3:.2f} ms/step, {tflops:.1f} model TFLOP/s{mfu}), "
          f"flax.linen {rates['flax.linen']:8.0f} tok/s, ratio {ratio:.2f}", flush=True)
    results.append({"setting": name, "batch": batch, "length": length, "d_model": d_model,
                    "heads": heads, "layers": layers, "mlp": mlp, "tokens_per_second": rates,
                    "step_seconds": step_seconds, "model_tflops": tflops, "ratio": ratio})
  print(json.dumps({"jax": jax.__version__, "device": str(jax.devices()[0]),
                    "device_kind": jax.devices()[0].device_kind, "dtype": args.dtype,
                    "cpus": os.cpu_count()}))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
