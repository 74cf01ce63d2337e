"""The plug-in interface of multi-head attention: a variant is an object whose hooks
``multihead.multi_head_attention_step`` calls, each at its identity by default.

The step, in the order it calls the hooks (shape letters: T queries, S keys, N heads, K
key/value heads, H head dim, D input width)::

  params(in_features, num_heads, head_dim)  {name: (shape, initializer)}, held under
                                             params[variant.name] by the Linen and NNX shells
  prepare(params, inputs_q, inputs_kv)       the state of one call (routers, gates, dynamic mixes),
                                             computed once and handed to the hooks below
  layout(query, key, value)                  the projected heads [..., T|S, N|K, H] rearranged
  attention_arguments(state)                 what it adds to the attention call ({"sinks": ...},
                                             {"normalizer": "sigmoid"}), served by every kernel
                                             that serves those arguments
  logits(state, logits)                      [..., N, T, S] before the bias and the mask
  weights(state, weights)                    weights -> the weights applied (then masked again)
  heads(state, heads)                        each head's output [..., T, N, H] before W_O
  records(state)                             {collection: {name: value}} recorded in
                                             "intermediates" and "losses" (the trainer adds the
                                             losses' mean)
  identity(params)                           (variant, params) at which it is plain MHA (tests)

A variant that overrides the logits or weights hook forms its own maps
(``forms_maps``, set from the overrides): the step hands those hooks (``hooks(state)``) to
``dot_product_attention``, which runs them on the "reference" implementation, the one that forms
every head's [T, S] map. Plain multi-head attention is ``Variant()``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from attention_jax import reference

#: The hooks on the maps [..., N, T, S]; a variant that overrides one forms its own maps.
MAP_HOOKS = ("logits", "weights")
LOSSES = "losses"  # the collection (Linen) or variable type (NNX) of auxiliary losses
#: name -> Variant subclass; ``register`` adds one.
REGISTRY: dict[str, type[Variant]] = {}


def register(cls):
  """Class decorator: makes ``cls`` available by its ``name`` to modules, encoders and configs;
  a name already registered to another class is refused in one line."""
  if REGISTRY.get(cls.name, cls) is not cls:
    raise ValueError(f"head variant name {cls.name!r} is registered already (to "
                     f"{REGISTRY[cls.name].__module__}.{REGISTRY[cls.name].__qualname__}); give "
                     f"{cls.__qualname__} a name of its own.")
  REGISTRY[cls.name] = cls
  return cls


@register
@dataclasses.dataclass(frozen=True)
class Variant:
  """Plain multi-head attention: every hook at its identity. Subclass it (a frozen dataclass,
  so that a layer's variant is hashable and static under jit), override the hooks that change,
  give it a ``name`` of its own (its parameters are held under params[name]) and ``register``
  the class (or name it by import path).

  >>> Variant().heads(None, jnp.ones((3, 4, 8))).shape  # [T, N, H]
  (3, 4, 8)
  """
  name: ClassVar[str] = "mha"
  #: whether the class overrides one of MAP_HOOKS (set for each subclass, never by hand)
  forms_maps: ClassVar[bool] = False
  #: None when decoding with a key/value cache works; else why not, completing
  #: "head variant '<name>' ..." in one line
  decoding: ClassVar[str | None] = None
  #: attention dropout draws one mask [..., N, 1, S] shared by the queries, whatever
  #: broadcast_dropout says (mesh-tensorflow's talking heads)
  dropout_shares_queries: ClassVar[bool] = False

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if "name" not in cls.__dict__:
      raise TypeError(f"head variant class {cls.__qualname__} has no name of its own (it would "
                      f"inherit {cls.name!r}); set name = \"...\" in its body.")
    cls.forms_maps = any(getattr(cls, hook) is not getattr(Variant, hook) for hook in MAP_HOOKS)

  @classmethod
  def for_layer(cls, *, layer: int, num_layers: int, **options) -> Variant:
    """The variant of encoder layer ``layer`` of ``num_layers`` from the encoder config's
    ``head_variant_options``: by default the class's own fields, the same in every layer."""
    del layer, num_layers
    return build(cls, options)

  def check(self, *, num_heads: int, head_dim: int) -> None:
    """Raises ValueError, in one line, for head counts or widths the variant cannot use."""

  def params(self, *, in_features: int, num_heads: int,
             head_dim: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """{name: (shape, initializer)} of the parameters it adds."""
    del in_features, num_heads, head_dim
    return {}

  def value_dim(self, head_dim: int) -> int:
    """The width of each head's value and output after ``layout`` (W_O is [N, this, D_out])."""
    return head_dim

  def query_key_dim(self, head_dim: int) -> int:
    """The width of each query and key head after ``layout`` (QK-norm's scale has it)."""
    return self.value_dim(head_dim)

  def scale_dim(self, head_dim: int) -> int:
    """The d_k of the scale 1/sqrt(d_k), from the projected head dim."""
    return head_dim

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads: int):
    """The state of one call from the variant's parameters and the layer's inputs [..., T, D],
    [..., S, D] (None for self-attention); None by default."""
    del params, inputs_q, inputs_kv, num_heads

  def layout(self, query, key, value):
    return query, key, value

  def attention_arguments(self, state) -> dict[str, Any]:
    """Keyword arguments of ``dot_product_attention`` that the variant sets (sinks, normalizer,
    a score_mod, ...); none by default."""
    del state
    return {}

  def logits(self, state, logits):
    del state
    return logits

  def weights(self, state, weights):
    del state
    return weights

  def hooks(self, state) -> reference.Hooks | None:
    """The hooks on the maps bound to one call's ``state``, for ``dot_product_attention(hooks=)``;
    None when the variant forms no maps."""
    if not self.forms_maps:
      return None
    return reference.Hooks(**{hook: functools.partial(getattr(self, hook), state)
                              for hook in MAP_HOOKS},
                           dropout_shares_queries=self.dropout_shares_queries)

  def heads(self, state, heads):
    del state
    return heads

  def identity(self, params):
    """(variant, the layer's params) at which the layer computes plain multi-head attention, for
    the tests that check it; None when there is no such setting (a sigmoid gate is never 1)."""
    return (self, params) if type(self) is Variant else None

  def records(self, state) -> dict[str, dict[str, jax.Array]]:
    """{collection: {name: value}} to record: "intermediates", and LOSSES (auxiliary losses,
    whose mean the trainer adds to the task's); none by default."""
    del state
    return {}


def get(name: str, **options) -> Variant:
  """The registered variant ``name`` built with ``options`` (its fields).

  >>> get("moh", shared_heads=2, routed_heads=2).name
  'moh'
  """
  return build(variant_class(name), options)


def build(cls: type[Variant], options: dict) -> Variant:
  """``cls(**options)``, refusing in one line an option that is not one of its fields."""
  fields = [field.name for field in dataclasses.fields(cls)]
  if set(options) - set(fields):
    takes = f"the options {fields}" if fields else "no options"
    raise ValueError(f"head variant {cls.name!r} takes {takes}, got "
                     f"{sorted(set(options) - set(fields))}.")
  return cls(**options)


def variant_class(name: str) -> type[Variant]:
  """The class ``name`` stands for: a registered name, or the import path
  ``"package.module:Class"`` of a Variant subclass in your own code, imported here, so that a
  config or the command line can use it without a registration inside attention_jax.

  >>> variant_class("gated").__name__, variant_class("attention_jax.variants.gated:Gated").name
  ('Gated', 'gated')
  """
  if name in REGISTRY:
    return REGISTRY[name]
  module, _, attribute = name.partition(":")
  if not attribute:
    raise ValueError(f"unknown head variant {name!r}; use one of {sorted(REGISTRY)}, or the "
                     f"import path 'package.module:Class' of your own Variant subclass.")
  try:
    cls = getattr(importlib.import_module(module), attribute)
  except (ImportError, AttributeError) as error:
    raise ValueError(f"head variant {name!r} cannot be imported ({error}); make {module!r} "
                     "importable (installed, or on PYTHONPATH) and name a class it defines.") from None
  if not (isinstance(cls, type) and issubclass(cls, Variant)):
    raise ValueError(f"head variant {name!r} is {cls!r}, not a subclass of "
                     "attention_jax.variants.Variant; point the path at one.")
  return cls


def layer_variant(name: str, *, layer: int, num_layers: int, **options) -> Variant:
  """The variant ``name`` of encoder layer ``layer`` (of ``num_layers``).

  >>> layer_variant("overlap", layer=1, num_layers=2).overlap  # MOHSA's schedule: o = index
  1
  """
  return variant_class(name).for_layer(layer=layer, num_layers=num_layers, **options)


def auxiliary_loss(collections) -> jax.Array:
  """The mean over layers of the terms recorded in the LOSSES collection (0 when none are), as
  MoH's engine averages its layers' load-balancing losses.

  >>> auxiliary_loss({"losses": {"block_0": {"load_balancing": (jnp.array(2.0),)}}})
  Array(2., dtype=float32)
  """
  terms = jax.tree.leaves(collections.get(LOSSES, {}))
  return jnp.mean(jnp.stack(terms)) if terms else jnp.zeros((), jnp.float32)
