"""Named hook points: capture a model's inner values, or run it with some of them replaced.

The names (TransformerLens' where it has one), per layer ``l`` of an encoder (``blocks.{l}.``;
a layer on its own has the ``attn.`` names alone)::

  blocks.{l}.hook_resid_pre         [B, T, D]     the block's input (the residual stream)
  blocks.{l}.attn.hook_q            [B, T, N, H]  queries per head (after QK-norm and RoPE)
  blocks.{l}.attn.hook_k            [B, S, K, H]  keys per key/value head (K < N: grouped-query)
  blocks.{l}.attn.hook_v            [B, S, K, H]  values per key/value head
  blocks.{l}.attn.hook_attn_scores  [B, N, T, S]  the scaled logits (after the bias, before the
                                                  mask); [B, N, R, S] for R ``query_rows``
  blocks.{l}.attn.hook_pattern      [B, N, T, S]  the softmax weights (before dropout)
  blocks.{l}.attn.hook_z            [B, T, N, H]  each head's output before W_O
  blocks.{l}.attn.hook_result       [B, T, N, D]  each head's contribution after W_O (its z
                                                  times its rows of W_O; their sum + b_O is the
                                                  attention's output)
  blocks.{l}.hook_attn_out          [B, T, D]     the attention sublayer's output
  blocks.{l}.hook_resid_mid         [B, T, D]     the stream after the attention sublayer
  blocks.{l}.hook_mlp_out           [B, T, D]     the feed-forward sublayer's output
  blocks.{l}.hook_resid_post        [B, T, D]     the block's output

The model calls ``point(name, value)`` at each; outside ``capture`` and ``patch`` that returns
``value`` and adds nothing to the computation, so a model asked for no hook traces to the same
jaxpr. Inside, the hooks asked for are read and replaced as the model is traced (a context, as
``flax.linen.intercept_methods`` is), so both are pure functions of the variables and inputs
and compose with ``jit``, ``vmap`` and ``grad``.

Under a scan over layers (``nn.scan``, ``nnx.scan``, ``lax.scan``) the body is traced once. With
``layer(index)`` around the body's call (``index`` the scan's counter, e.g. scanned over
``jnp.arange(L)``), its hook points have the names of the unrolled model, ``blocks.{l}.*``: a
patch of ``blocks.{l}.attn.hook_z`` applies at layer ``l`` alone, and ``capture`` cuts layer
``l``'s value from the values the scan stacks [L, ...] (a Linen scan given
``variable_axes={"hooks": 0}``; for NNX, ``layer(index, block)`` names the module the scan
runs, whose sown state ``nnx.scan`` stacks). Without ``layer``, the body has one set of names
(``attn.hook_z``): a patch applies at every layer, and a Linen scan's captured values come
stacked [L, ...] under that name.
A head variant's layout (differential's 2N sub-heads) is what hook_q, hook_k and hook_v see.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
import sys
from typing import Any, Callable, NamedTuple

from flax import traverse_util
import jax
import jax.numpy as jnp

#: The axes of the query position and of the head (None where there is none) of each hook,
#: by the last part of its name.
AXES = {
    "hook_resid_pre": (-2, None), "hook_resid_mid": (-2, None), "hook_resid_post": (-2, None),
    "hook_attn_out": (-2, None), "hook_mlp_out": (-2, None),
    "hook_q": (-3, -2), "hook_k": (-3, -2), "hook_v": (-3, -2), "hook_z": (-3, -2),
    "hook_result": (-3, -2), "hook_attn_scores": (-2, -3), "hook_pattern": (-2, -3),
}
#: The Linen collection that ``capture`` has a Linen model sow its hooked values in (so that
#: ``nn.scan`` over layers, given ``variable_axes={"hooks": 0}``, stacks them).
COLLECTION = "hooks"
#: The hooks on the maps [B, N, T, S].
MAPS = ("attn.hook_attn_scores", "attn.hook_pattern")
#: The prefix of the hook names inside ``layer(index)``, whose layer is the scan's index.
ANY_LAYER = "blocks.*"
_LAYER_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


class Patch(NamedTuple):
  """A replacement of a hooked value: ``fn(clean) -> new``, applied where ``heads`` and
  ``positions`` (ints, arrays of ints, traced too; None: all) select; the rest stays clean.

  >>> clean = jnp.ones((1, 2, 3, 4))  # [B, T, N, H], as hook_z
  >>> zero(heads=1).apply("hook_z", clean)[0, :, :, 0]
  Array([[1., 0., 1.],
         [1., 0., 1.]], dtype=float32)
  """
  fn: Callable
  heads: Any = None
  positions: Any = None

  def apply(self, hook: str, clean):
    new = jnp.broadcast_to(self.fn(clean), clean.shape).astype(clean.dtype)
    if self.heads is None and self.positions is None:
      return new
    position_axis, head_axis = AXES[hook]
    chosen = jnp.ones((), bool)
    for axis, picked in ((position_axis, self.positions), (head_axis, self.heads)):
      if picked is not None:
        if axis is None:
          raise ValueError(f"{hook} has no head axis; patch it without heads=.")
        size = clean.shape[axis]
        hit = jnp.isin(jnp.arange(size), jnp.atleast_1d(jnp.asarray(picked)))
        chosen = chosen & jnp.reshape(hit, (size,) + (1,) * (-axis - 1))
    return jnp.where(chosen, new, clean)


def set_to(value, *, heads=None, positions=None) -> Patch:
  """Replaces the selection with ``value`` (broadcast to the hooked shape), e.g. the value
  captured on another input.

  >>> set_to(jnp.zeros(4)).apply("hook_resid_pre", jnp.ones((1, 3, 4))).sum()
  Array(0., dtype=float32)
  """
  return Patch(lambda clean: value, heads, positions)


def add(delta, *, heads=None, positions=None) -> Patch:
  """Adds ``delta`` to the selection (zeros: attribution patching's point of differentiation).

  >>> add(1.0, positions=0).apply("hook_resid_pre", jnp.zeros((1, 2, 3)))[0, :, 0]
  Array([1., 0.], dtype=float32)
  """
  return Patch(lambda clean: clean + delta, heads, positions)


def zero(*, heads=None, positions=None) -> Patch:
  """Zero-ablation of the selection.

  >>> zero().apply("hook_z", jnp.ones((1, 2, 3, 4))).sum()
  Array(0., dtype=float32)
  """
  return Patch(jnp.zeros_like, heads, positions)


def mean_ablate(mean=None, *, heads=None, positions=None) -> Patch:
  """Replaces the selection with ``mean`` (e.g. the mean over a reference data set); None: the
  clean value's mean over the batch (axis 0).

  >>> mean_ablate().apply("hook_resid_pre", jnp.arange(4.0).reshape(2, 2, 1))[:, :, 0]
  Array([[1., 2.],
         [1., 2.]], dtype=float32)
  """
  if mean is None:
    return Patch(lambda clean: jnp.mean(clean, axis=0, keepdims=True), heads, positions)
  return Patch(lambda clean: mean, heads, positions)


@dataclasses.dataclass
class _Session:
  """The hooks asked for in one ``capture`` or ``patch``: what to record, what to replace."""
  wanted: frozenset
  patches: dict
  query_rows: Any = None
  captured: dict = dataclasses.field(default_factory=dict)
  reached: set = dataclasses.field(default_factory=set)
  prefix: tuple = ()
  layer: Any = None  # inside ``layer``: the scan's traced layer index
  owner: Any = None  # inside ``layer``: the NNX module whose state the scan stacks


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("hooks", default=None)


def _full(session: _Session, name: str) -> str:
  return ".".join(session.prefix + (name,))


@contextlib.contextmanager
def scope(name: str):
  """Names the hook points called inside with ``name.`` first (an encoder's ``blocks.{l}``);
  nothing outside ``capture`` and ``patch``.

  >>> with scope("blocks.0"):
  ...   point("hook_resid_pre", 1.0)
  1.0
  """
  session = _SESSION.get()
  if session is None or (session.layer is not None and re.fullmatch(r"blocks\.\d+", name)):
    yield  # inside ``layer``, a block's own blocks.{l} gives way to the scan's index
    return
  outer = session.prefix
  session.prefix = outer + (name,)
  try:
    yield
  finally:
    session.prefix = outer


@contextlib.contextmanager
def layer(index, module=None):
  """Inside the body of a scan over layers: the hook points called inside are those of layer
  ``index`` (an int, traced: the scan's counter), ``blocks.{index}.*`` as in the unrolled model.
  ``module``: for an NNX model, the module the scan runs (``nnx.scan`` stacks what ``capture``
  sows in it); a Linen model needs none. Nothing outside ``capture`` and ``patch``. The body
  does not know the scan's length: a patch of a layer past it changes nothing.

  >>> def body(x, index):  # under lax.scan, over the layers 0, 1, 2
  ...   with layer(index):
  ...     return point("attn.hook_z", x) + 1.0, None
  >>> zero_at_1 = {"blocks.1.attn.hook_z": zero()}
  >>> run = lambda x: jax.lax.scan(body, x, jnp.arange(3))[0]
  >>> patch(run, None, jnp.ones(2), zero_at_1)  # (1 + 1) -> 0, then + 1, + 1
  Array([2., 2.], dtype=float32)
  """
  session = _SESSION.get()
  if session is None:
    yield
    return
  outer = session.prefix, session.layer, session.owner
  session.prefix, session.layer, session.owner = outer[0] + (ANY_LAYER,), index, module
  try:
    yield
  finally:
    session.prefix, session.layer, session.owner = outer


def asks(name: str) -> bool:
  """Whether the running ``capture`` or ``patch`` reads or replaces hook ``name`` here (so that
  a model forms a value only hooks need, such as each head's W_O contribution, only then).

  >>> asks("attn.hook_result")
  False
  """
  session = _SESSION.get()
  return session is not None and (_named(session, name, session.wanted)
                                  or _named(session, name, session.patches))


def patched(name: str) -> bool:
  """Whether the running ``patch`` replaces hook ``name`` here."""
  session = _SESSION.get()
  return session is not None and _named(session, name, session.patches)


def _named(session: _Session, name: str, names) -> bool:
  """Whether hook ``name`` here is among ``names`` (inside ``layer``: at any layer)."""
  full = _full(session, name)
  if session.layer is not None and full.startswith(ANY_LAYER + "."):
    return any(_layer_of(other, full[len(ANY_LAYER) + 1:]) is not None for other in names)
  return full in names


def query_rows():
  """The query rows [R] whose maps ``capture`` was asked for (None: every row)."""
  session = _SESSION.get()
  return None if session is None else session.query_rows


def point(name: str, value):
  """The hook point ``name`` (the scope's prefix added): ``value``, replaced where a ``patch``
  asks, and recorded where a ``capture`` asks. Outside both: ``value`` itself.

  >>> point("attn.hook_z", 2.0)
  2.0
  """
  session = _SESSION.get()
  if session is None:
    return value
  full = _full(session, name)
  if session.layer is not None and full.startswith(ANY_LAYER + "."):
    return _point_in_layer(session, full, value)
  if full in session.patches:
    session.reached.add(full)
    value = _as_patch(full, session.patches[full]).apply(name.rsplit(".", 1)[-1], value)
  if full in session.wanted:
    module = _linen_module()
    if module is not None and module.is_mutable_collection(COLLECTION):
      module.sow(COLLECTION, full, value)  # Linen's store, which nn.scan stacks over layers
    elif full in session.captured:
      raise ValueError(_reached_twice(full))
    else:
      session.captured[full] = value
  return value


def _layer_of(name: str, rest: str):
  """l where ``name`` is ``blocks.{l}.{rest}``, else None."""
  match = _LAYER_NAME.fullmatch(name)
  return int(match[1]) if match and match[2] == rest else None


def _point_in_layer(session: _Session, full: str, value):
  """``point`` inside ``layer``: each patch of ``blocks.{l}.*`` applied where the scan's index
  is l; the value sown (every layer's, for the scan to stack) if any layer's is asked for."""
  rest = full[len(ANY_LAYER) + 1:]
  for name, replacement in session.patches.items():
    at = _layer_of(name, rest)
    if at is not None:
      session.reached.add(name)
      patched_value = _as_patch(name, replacement).apply(rest.rsplit(".", 1)[-1], value)
      value = jnp.where(session.layer == at, patched_value, value)
  if any(_layer_of(name, rest) is not None for name in session.wanted):
    module = _linen_module()
    if module is not None and module.is_mutable_collection(COLLECTION):
      module.sow(COLLECTION, full, value)  # nn.scan stacks it with variable_axes={"hooks": 0}
    elif session.owner is not None and hasattr(session.owner, "__captures__"):
      session.owner.sow(_stacked_type(), full, value)  # nnx.scan stacks the module's state
    else:
      raise ValueError(f"{full!r} inside hooks.layer is captured through the scan's stacked "
                       "state: give an NNX model's hooks.layer(index, module) the module the "
                       "scan runs (a Linen scan: variable_axes={'hooks': 0}).")
  return value


@functools.cache
def _stacked_type():
  """The NNX variable type that ``capture`` has a scanned NNX module sow its hooked values in."""
  from flax import nnx  # here: hooks loads NNX only for an NNX model

  class HookValues(nnx.Variable):
    """Hooked values sown inside ``hooks.layer``, stacked over the layers by ``nnx.scan``."""
  return HookValues


#: The flax releases whose private flax.linen.module._context.module_stack _linen_module reads.
MODULE_STACK_CHECKED = "flax 0.12.6 to 0.12.12"


def _reached_twice(name: str) -> str:
  """The one-line refusal of a hook point captured twice in one call."""
  return (f"hook point {name!r} was reached twice; give each layer a scope of its own "
          "(hooks.scope(f'blocks.{layer}')).")


def _linen_module():
  """The Linen module whose method is running (None outside one, or without Linen loaded)."""
  linen = sys.modules.get("flax.linen.module")
  if linen is None:
    return None
  # Private flax, kept to this one function: Linen offers no public "module now running" (a hook
  # point is a plain function called from inside a module's method, and sows through it).
  try:
    stack = linen._context.module_stack
  except AttributeError:
    raise ImportError("attention_jax.hooks reads flax's private flax.linen.module._context."
                      f"module_stack, which this flax lacks (checked with {MODULE_STACK_CHECKED});"
                      " install a flax in that range.") from None
  return stack[-1] if stack else None


def _as_patch(name: str, replacement) -> Patch:
  if isinstance(replacement, Patch):
    return replacement
  if callable(replacement):
    return Patch(replacement)
  if isinstance(replacement, (jax.Array, float, int)) or hasattr(replacement, "shape"):
    return set_to(replacement)
  raise TypeError(f"the patch of {name!r} is {type(replacement).__name__}; give an array, a "
                  "function of the clean value or a hooks.Patch (set_to, add, zero, mean_ablate).")


def _run(model, variables, inputs, call: dict, session: _Session):
  """``model`` on ``inputs`` (an array or a tuple of them): a Linen module applied to
  ``variables`` (what it sows in ``COLLECTION`` added to ``session.captured``), an NNX module
  (with its state replaced by ``variables`` when given; what it sows inside ``layer`` added), or
  a plain function of the inputs (``variables`` unused)."""
  inputs = inputs if isinstance(inputs, tuple) else (inputs,)
  nnx = sys.modules.get("flax.nnx")
  if nnx is not None and isinstance(model, nnx.Module):
    if variables is not None:
      model = nnx.merge(nnx.graphdef(model), variables)
    if not session.wanted:
      return model(*inputs, **call)
    output, state = nnx.capture(lambda module: module(*inputs, **call), _stacked_type())(model)
    sown = traverse_util.flatten_dict(nnx.to_pure_dict(state))
  elif not callable(getattr(model, "apply", None)):  # a function of ``inputs``, e.g. a scan
    return model(*inputs, **call)
  elif not session.wanted:
    return model.apply(variables, *inputs, **call)
  else:
    output, state = model.apply(variables, *inputs, mutable=[COLLECTION], **call)
    sown = traverse_util.flatten_dict(dict(state.get(COLLECTION, {})))
  for path, values in sown.items():
    if len(values) > 1 or path[-1] in session.captured:
      raise ValueError(_reached_twice(path[-1]))
    session.captured[path[-1]] = values[0]
  return output


def _cut_layers(session: _Session) -> None:
  """Adds to ``session.captured`` each ``blocks.{l}.*`` asked for that a scan stacked under
  ``blocks.*.*`` [L, ...]: its layer l."""
  for name in session.wanted - set(session.captured):
    match = _LAYER_NAME.fullmatch(name)
    stacked = session.captured.get(f"{ANY_LAYER}.{match[2]}") if match else None
    if stacked is not None and int(match[1]) < stacked.shape[0]:
      session.captured[name] = stacked[int(match[1])]


@contextlib.contextmanager
def _session(session: _Session):
  token = _SESSION.set(session)
  try:
    yield session
  finally:
    _SESSION.reset(token)


def capture(model, variables, inputs, hooks, *, query_rows=None, patches=None, **call):
  """Runs ``model`` and returns (its output, {name: value} of ``hooks``), a pure function of
  ``variables`` and ``inputs`` (jit, vmap over seeds or inputs, grad).

  Args:
    model: a Linen module (applied to ``variables``), an NNX module (``variables``: an
      ``nnx.State`` of it, or None for its own), or a function of ``inputs`` (``variables``:
      None).
    inputs: the model's positional input(s), an array or a tuple.
    hooks: hook names (the module docstring lists them).
    query_rows: int [R]: form the maps (hook_attn_scores, hook_pattern) only for these query
      rows, from the log-sum-exp of whatever kernel runs (the blockwise kernels never form
      [T, S]); None: every row, formed beside the kernel.
    patches: as ``patch``'s, applied in the same run (the values captured are the patched ones).
    **call: the model's keyword arguments.

  >>> import attention_jax as aj
  >>> model = aj.TransformerEncoder(aj.EncoderConfig(vocab_size=16, d_model=32, num_layers=2))
  >>> tokens = jnp.ones((3, 5), int)  # [B, T]
  >>> variables = model.init(jax.random.key(0), tokens)
  >>> _, values = capture(model, variables, tokens, ["blocks.1.attn.hook_z"])
  >>> values["blocks.1.attn.hook_z"].shape  # [B, T, N, H]
  (3, 5, 4, 8)
  """
  hooks = [hooks] if isinstance(hooks, str) else list(hooks)
  session = _Session(frozenset(hooks), dict(patches or {}), query_rows)
  with _session(session):
    output = _run(model, variables, inputs, call, session)
  _cut_layers(session)
  _check_reached((set(hooks) - set(session.captured)) | (set(session.patches) - session.reached))
  return output, {name: session.captured[name] for name in hooks}


def patch(model, variables, inputs, patches, **call):
  """``model``'s output with hooked values replaced: ``patches`` {name: replacement}, where a
  replacement is an array (set), a function of the clean value, or a ``Patch`` choosing heads
  and positions (``set_to``, ``add``, ``zero``, ``mean_ablate``). Pure, as ``capture``.

  >>> import attention_jax as aj
  >>> model = aj.TransformerEncoder(aj.EncoderConfig(vocab_size=16, d_model=32, num_layers=2))
  >>> tokens = jnp.ones((3, 5), int)  # [B, T]
  >>> variables = model.init(jax.random.key(0), tokens)
  >>> ablated = patch(model, variables, tokens, {"blocks.0.attn.hook_z": zero(heads=2)})
  >>> ablated.shape
  (3, 5, 32)
  """
  session = _Session(frozenset(), dict(patches))
  with _session(session):
    output = _run(model, variables, inputs, call, session)
  _check_reached(set(patches) - session.reached)
  return output


def _check_reached(missing) -> None:
  if missing:
    raise ValueError(f"no hook point {sorted(missing)[0]!r} in this model; its names are listed "
                     "in attention_jax.hooks (e.g. 'blocks.0.attn.hook_z').")


def attribution(model, variables, inputs, hooks, metric: Callable, **call):
  """Attribution patching: {name: (clean value, d metric / d value)} for each hook, from one
  forward and one backward pass; ``(corrupt - clean) * gradient`` summed over a selection
  estimates the effect of patching it. ``metric``: the model's output -> a scalar.

  >>> import attention_jax as aj
  >>> layer = aj.MultiHeadAttention(num_heads=4)  # a layer alone: the "attn." names
  >>> x = jnp.ones((3, 5, 16))  # [B, T, D]
  >>> variables = layer.init(jax.random.key(0), x)
  >>> values = attribution(layer, variables, x, ["attn.hook_z"], jnp.sum)
  >>> values["attn.hook_z"][1].shape  # the gradient, [B, T, N, H]
  (3, 5, 4, 4)
  """
  hooks = list(hooks)
  shapes = jax.eval_shape(lambda v, x: capture(model, v, x, hooks, **call)[1], variables, inputs)
  deltas = {name: jnp.zeros(s.shape, s.dtype) for name, s in shapes.items()}

  def measured(deltas):
    output, values = capture(model, variables, inputs, hooks,
                             patches={name: add(delta) for name, delta in deltas.items()},
                             **call)
    return metric(output), values

  gradients, values = jax.grad(measured, has_aux=True)(deltas)
  return {name: (values[name], gradients[name]) for name in hooks}
