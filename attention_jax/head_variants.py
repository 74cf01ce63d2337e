"""The names of the head variants before they became plug-ins (``attention_jax.variants``, one
file per variant): ``HeadVariant(name, **settings)`` builds the registered variant ``name``.

>>> HeadVariant("moh").moh_heads(16)  # (shared, routed k, routed heads E)
(8, 4, 8)
"""

from attention_jax.variants import LOSSES  # noqa: F401
from attention_jax.variants import REGISTRY
from attention_jax.variants import auxiliary_loss  # noqa: F401
from attention_jax.variants import get as HeadVariant  # noqa: N812
from attention_jax.variants import layer_variant  # noqa: F401
from attention_jax.variants.overlap import SCHEDULES as OVERLAP_SCHEDULES  # noqa: F401

VARIANTS = tuple(REGISTRY)  # the built-in variants' names
MIXING = tuple(name for name, cls in REGISTRY.items() if cls.forms_maps)
