"""Writes docs/API.md: every public name of attention_jax with its signature and docstring.

  python scripts/api_reference.py          # rewrite docs/API.md
  python scripts/api_reference.py --check  # exit 1 if docs/API.md is out of date (a test runs it)
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import attention_jax as aj  # noqa: E402
from attention_jax import attention  # noqa: E402
from attention_jax import diagnostics  # noqa: E402
from attention_jax import head_variants  # noqa: E402
from attention_jax import nnx  # noqa: E402

PATH = os.path.join(ROOT, "docs", "API.md")


def public_names(module):
  exported = getattr(module, "__all__", None) or dir(module)
  return [name for name in exported if not name.startswith("_") and not inspect.ismodule(
      getattr(module, name)) and getattr(getattr(module, name), "__module__", module.__name__)
          .startswith("attention_jax")]


def entry(qualified: str, obj) -> str:
  if inspect.isclass(obj) or inspect.isfunction(obj):
    try:
      signature = re.sub(r" at 0x[0-9a-f]+", "", str(inspect.signature(obj)))  # no addresses
    except (TypeError, ValueError):
      signature = "(...)"
    kind = "class" if inspect.isclass(obj) else "def"
    head = f"### `{qualified}`\n\n```python\n{kind} {qualified.split('.')[-1]}{signature}\n```\n"
    return head + "\n```text\n" + inspect.cleandoc(obj.__doc__ or "") + "\n```\n"
  if isinstance(obj, dict) and all(isinstance(v, str) for v in obj.values()):
    return f"### `{qualified}`\n\n" + "".join(f"- `{k}`: {v}\n" for k, v in obj.items())
  value = f"a dict keyed by {sorted(obj)}" if isinstance(obj, dict) else repr(obj)
  return f"### `{qualified}`\n\n`{qualified}`: {value}\n"


def render() -> str:
  parts = ["# attention_jax API reference", "",
           "Generated from the docstrings by `python scripts/api_reference.py`; a test keeps it "
           "current. Shape letters: B batch dims, T query length, S key length, N query heads, "
           "K key/value heads, H head dim (d_k), D model width.", ""]
  for name in sorted(public_names(aj), key=str.lower):
    parts.append(entry(f"attention_jax.{name}", getattr(aj, name)))
  parts += ["## attention_jax.attention: the automatic choice and what each implementation "
            "supports", ""]
  for name in ("TRANSFORMS", "MEASURED_ON", "CHUNKED_MIN_LENGTH_CPU", "XLA_MAX_LOGITS_BYTES_GPU"):
    parts.append(entry(f"attention_jax.attention.{name}", getattr(attention, name)))
  parts += ["## attention_jax.nnx: the Flax NNX modules", "",
            inspect.cleandoc(nnx.__doc__), ""]
  for name in sorted(public_names(nnx), key=str.lower):
    if getattr(getattr(nnx, name), "__module__", None) == "attention_jax.nnx":
      parts.append(entry(f"attention_jax.nnx.{name}", getattr(nnx, name)))
  parts += ["## attention_jax.head_variants: talking heads, DCMHA, MoH, overlapping heads", "",
            inspect.cleandoc(head_variants.__doc__), ""]
  for name in ("HeadVariant", "layer_variant", "parameter_specs", "overlapping_heads",
               "mix_heads", "dcmha_dynamic_weights", "dcmha_compose", "mixed_maps",
               "mixed_attention", "moh_router", "load_balancing_loss", "sown", "auxiliary_loss"):
    parts.append(entry(f"attention_jax.head_variants.{name}", getattr(head_variants, name)))
  parts += ["## attention_jax.diagnostics", ""]
  for name in ("entropy", "attention_distance", "diagonal_is_max", "per_head_mean",
               "logit_variance", "negative_weight", "head_usage", "head_statistics"):
    parts.append(entry(f"attention_jax.diagnostics.{name}", getattr(diagnostics, name)))
  return "\n".join(parts)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true")
  args = parser.parse_args()
  text = render()
  if args.check:
    current = open(PATH).read() if os.path.exists(PATH) else ""
    if current != text:
      sys.exit("docs/API.md is out of date: run python scripts/api_reference.py")
    return
  os.makedirs(os.path.dirname(PATH), exist_ok=True)
  with open(PATH, "w") as f:
    f.write(text)
  print(f"wrote {PATH}")


if __name__ == "__main__":
  main()
