"""Executable checks of what the explanations of self-attention claim, printed as tables.

  python scripts/theory_checks.py [--samples 65536]

1. Var(q . k) = d_k for unit-variance q, k, and about 1 after the 1/sqrt(d_k) scaling.
2. Without the scaling the softmax saturates as d_k grows (max weight -> 1, entropy -> 0).
3. PE(pos + k) = M_k PE(pos): one matrix per offset maps every sinusoidal position.
4. Self-attention without positional encoding is permutation equivariant; each encoding breaks it.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_jax as aj  # noqa: E402
from attention_jax import reference  # noqa: E402

HEAD_DIMS = (4, 16, 64, 256, 1024)


def logit_statistics(samples: int):
  print("1-2. Logits and softmax of random unit-variance q, k (32 keys per query)")
  print(f"{'d_k':>6} {'Var(q.k)':>10} {'Var(q.k/sqrt(d_k))':>19} "
        f"{'max weight (1, 1/sqrt)':>23} {'entropy/ln 32 (1, 1/sqrt)':>26}")
  for head_dim in HEAD_DIMS:
    q_key, k_key = jax.random.split(jax.random.key(head_dim))
    query = jax.random.normal(q_key, (samples // 32, 32, 1, head_dim))  # [B, T, N, H]
    key = jax.random.normal(k_key, (samples // 32, 32, 1, head_dim))
    row = [head_dim]
    for scale in (1.0, head_dim ** -0.5):
      row.append(float(jnp.var(reference.attention_logits(query, key, scale=scale))))
    for scale in (1.0, head_dim ** -0.5):
      weights = reference.attention_weights(query, key, scale=scale)
      entropy = -jnp.sum(weights * jnp.log(jnp.maximum(weights, 1e-30)), axis=-1)
      row.append((float(jnp.mean(jnp.max(weights, -1))), float(jnp.mean(entropy)) / np.log(32)))
    print(f"{row[0]:>6} {row[1]:>10.2f} {row[2]:>19.3f} {row[3][0]:>11.3f} {row[4][0]:>11.3f}"
          f" {row[3][1]:>13.3f} {row[4][1]:>12.3f}")


def sinusoid_shift(dim: int = 64, length: int = 512):
  print(f"\n3. Sinusoidal PE(pos + k) = M_k PE(pos), d = {dim}, {length} positions")
  print(f"{'k':>6} {'max |PE M_k - PE(+k)|':>22} {'fit of PE(2 pos) (nonlinear)':>29}")
  for offset in (1, 10, 100):
    table = np.asarray(aj.sinusoidal_encoding(2 * length + offset, dim), np.float64)
    source, target = table[:length], table[offset:offset + length]
    fitted, *_ = np.linalg.lstsq(source, target, rcond=None)
    doubled = table[:2 * length:2]
    fitted_doubled, *_ = np.linalg.lstsq(source, doubled, rcond=None)
    print(f"{offset:>6} {np.max(np.abs(source @ fitted - target)):>22.2e} "
          f"{np.max(np.abs(source @ fitted_doubled - doubled)):>29.2e}")


def permutation_equivariance(length: int = 16):
  print(f"\n4. Encoder (2 layers, d_model 64, 4 heads) on {length} tokens: "
        "max |f(P x) - P f(x)| for a random permutation P")
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.permutation(np.arange(1, 64))[:length])[None]  # [1, T], distinct
  permutation = rng.permutation(length)
  for name in aj.POSITIONAL_ENCODINGS:
    config = aj.EncoderConfig(vocab_size=64, d_model=64, num_heads=4, num_layers=2,
                              max_length=length, positional_encoding=name)
    model = aj.TransformerEncoder(config)
    variables = model.init(jax.random.key(0), tokens)
    encode = jax.jit(lambda t, model=model, variables=variables: model.apply(variables, t))
    error = jnp.max(jnp.abs(encode(tokens[:, permutation]) - encode(tokens)[:, permutation]))
    print(f"{name:>12} {float(error):>10.2e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--samples", type=int, default=65536, help="query-key pairs per d_k")
  args = parser.parse_args()
  print(f"JAX {jax.__version__} on {jax.devices()[0].platform}\n")
  logit_statistics(args.samples)
  sinusoid_shift()
  permutation_equivariance()


if __name__ == "__main__":
  main()
