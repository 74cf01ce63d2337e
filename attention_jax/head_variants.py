"""The names of the head variants before they became plug-ins (``attention_jax.variants``, one
file per variant)."""

from attention_jax.variants import LOSSES  # noqa: F401
from attention_jax.variants import REGISTRY
from attention_jax.variants import auxiliary_loss  # noqa: F401
from attention_jax.variants import get
from attention_jax.variants import layer_variant  # noqa: F401
from attention_jax.variants.base import Variant
from attention_jax.variants.overlap import SCHEDULES as OVERLAP_SCHEDULES  # noqa: F401

VARIANTS = tuple(REGISTRY)  # the built-in variants' names
MIXING = tuple(name for name, cls in REGISTRY.items() if cls.forms_maps)


def HeadVariant(name: str = "mha", **settings) -> Variant:  # noqa: N802 (its name as a class)
  """The registered variant ``name`` built with ``settings`` (``variants.get``).

  >>> HeadVariant("moh").moh_heads(16)  # (shared, routed k, routed heads E)
  (8, 4, 8)
  """
  return get(name, **settings)
