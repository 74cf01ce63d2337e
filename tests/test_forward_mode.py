"""Forward mode and second order through the blockwise kernel: jvp, linearize, jacfwd, forward
over reverse and reverse over forward (grad of a jvp: hessian-vector products) against the
float64 dense reference, with tangents into every differentiable input (q, k, v, bias, a
score_mod's closed-over table, sinks), for each feature the kernel serves; dropout (whose mask
the reference does not draw) against float64 central differences of the kernel itself."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax.chunked import chunked_attention
from conftest import assert_close

T, N, K, H = 24, 4, 2, 8  # grouped queries: two query heads per key/value head
BLOCK = 8  # three query and key blocks, so that blocks are skipped and rows span blocks


def _arrays(seed, shapes):
  rng = np.random.default_rng(seed)
  return {name: rng.standard_normal(shape) for name, shape in shapes.items()}


def _gqa_causal_bias_table_sinks_lengths(p):
  table = p["table"]
  return dict(bias=p["bias"], sinks=p["sinks"], is_causal=True,
              score_mod=lambda s, b, h, q_idx, kv_idx: s + table[q_idx - kv_idx + T],
              query_seq_lengths=np.array([T, 17]), key_value_seq_lengths=np.array([13, T]))


def _segments_window_soft_cap_mask(p):
  del p
  segments = np.array([[0] * 10 + [1] * 14, [0] * 3 + [1] * 21])
  mask = np.random.default_rng(7).random((2, 1, T, T)) < 0.8
  return dict(mask=mask, query_segment_ids=segments, key_segment_ids=segments,
              local_window_size=(9, 4), logits_soft_cap=1.5)


def _sigmoid_mask_mod(p):
  del p
  return dict(normalizer="sigmoid", sigmoid_bias=-1.0,
              mask_mod=lambda b, h, q_idx, kv_idx: (q_idx + kv_idx + h) % 3 != 0)


CASES = {  # name: (options from the differentiable inputs, their shapes beyond q, k, v)
    "gqa_causal_bias_table_sinks_lengths": (_gqa_causal_bias_table_sinks_lengths, {
        "bias": (1, N, T, T), "table": (2 * T,), "sinks": (N,)}),
    "segments_window_soft_cap_mask": (_segments_window_soft_cap_mask, {}),
    "sigmoid_mask_mod": (_sigmoid_mask_mod, {}),
}


def _attention(implementation, options):
  """f(inputs) -> out [2, T, N, H] for a dict of differentiable inputs (q, k, v and extras)."""
  def f(p):
    kwargs = options(p)
    if implementation == "chunked":
      return chunked_attention(p["q"], p["k"], p["v"], scale=H ** -0.5, block_q=BLOCK,
                               block_k=BLOCK, **kwargs)
    return aj.dot_product_attention(p["q"], p["k"], p["v"], implementation="reference",
                                    **kwargs)
  return f


def _transforms(f, point, tangent, other, cotangent):
  """Each transform of f at ``point``: {name: value}, every array of a dict by its key."""
  jvp = lambda p: jax.jvp(f, (p,), (tangent,))[1]
  along = lambda s: f(jax.tree.map(lambda x, t, u: x + s[0] * t + s[1] * u, point, tangent,
                                   other))
  loss = lambda p: jnp.sum(f(p) * cotangent)
  return {
      "jvp": jvp(point),
      "linearize": jax.linearize(f, point)[1](tangent),
      "jacfwd": jax.jacfwd(along)(jnp.zeros(2, cotangent.dtype)),
      "forward over reverse": jax.jvp(jax.grad(loss), (point,), (tangent,))[1],
      "reverse over forward": jax.grad(lambda p: jnp.sum(jvp(p) * cotangent) + loss(p))(point),
  }


@pytest.mark.parametrize("case", CASES)
def test_forward_mode_and_second_order_agree_with_the_float64_reference(case):
  options, extra = CASES[case]
  shapes = {"q": (2, T, N, H), "k": (2, T, K, H), "v": (2, T, K, H), **extra}
  point, tangent, other = (_arrays(seed, shapes) for seed in (0, 1, 2))
  cotangent = _arrays(3, {"w": shapes["q"]})["w"]
  as_type = lambda dtype: lambda tree: jax.tree.map(lambda x: jnp.asarray(x, dtype), tree)
  ours = jax.jit(functools.partial(_transforms, _attention("chunked", options)))(
      *map(as_type(jnp.float32), (point, tangent, other, cotangent)))
  with jax.enable_x64():
    expected = jax.jit(functools.partial(_transforms, _attention("reference", options)))(
        *map(as_type(jnp.float64), (point, tangent, other, cotangent)))
    expected = jax.tree.map(np.asarray, expected)
  for name in expected:
    for key, value in jax.tree.leaves_with_path(expected[name]):
      actual = functools.reduce(lambda tree, k: tree[k.key], key, ours[name])
      assert_close(actual, value, 1e-5, f"{name} {jax.tree_util.keystr(key)}")


def test_dropout_tangents_use_the_forward_mask():
  """jvp and grad of a jvp under dropout equal float64 central differences of the kernel itself
  (and of its gradient): the tangent and the backward regenerate the forward's mask."""
  with jax.enable_x64():
    shapes = {"q": (1, T, N, H), "k": (1, T, K, H), "v": (1, T, K, H)}
    p, t = _arrays(0, shapes), _arrays(1, shapes)
    w = _arrays(2, {"w": p["q"].shape})["w"]
    f = lambda p: chunked_attention(p["q"], p["k"], p["v"], scale=H ** -0.5, block_q=BLOCK,
                                    block_k=BLOCK, is_causal=True, dropout_rate=0.3,
                                    dropout_rng=jax.random.key(5))
    grad = jax.jit(jax.grad(lambda p: jnp.sum(f(p) * w)))  # compiled once for both shifts
    f = jax.jit(f)
    shifted = lambda g, e: g(jax.tree.map(lambda x, d: x + e * d, p, t))
    eps = 1e-6
    central = lambda g: jax.tree.map(lambda a, b: (a - b) / (2 * eps), shifted(g, eps),
                                     shifted(g, -eps))
    assert_close(jax.jvp(f, (p,), (t,))[1], central(f), 1e-6, "jvp")
    hvp = jax.jit(jax.grad(lambda p: jnp.sum(jax.jvp(f, (p,), (t,))[1] * w)))(p)
    for name, expected in central(grad).items():
      assert_close(hvp[name], expected, 1e-6, f"grad of jvp {name}")


def test_the_residual_has_a_zero_tangent_and_leaves_the_output_s_alone():
  shapes = {"q": (1, T, N, H), "k": (1, T, K, H), "v": (1, T, K, H)}
  p, t = (jax.tree.map(jnp.asarray, _arrays(seed, shapes)) for seed in (0, 1))
  f = lambda residual: lambda p: chunked_attention(p["q"], p["k"], p["v"], scale=H ** -0.5,
                                                   block_q=BLOCK, block_k=BLOCK, is_causal=True,
                                                   return_residual=residual)
  (_, (d_out, d_lse)) = jax.jvp(f(True), (p,), (t,))
  assert_close(d_out, jax.jvp(f(False), (p,), (t,))[1], 1e-6, "out's tangent")
  assert np.all(np.asarray(d_lse) == 0.0)


CONTEXT_PARALLEL = r"""
import functools, json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
import attention_jax as aj

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "seq"))
rng = np.random.default_rng(0)
B, T, N, K, H = 2, 32, 4, 2, 8
shapes = {"q": (B, T, N, H), "k": (B, T, K, H), "v": (B, T, K, H), "table": (2 * T - 1,)}
point, tangent = ({name: rng.standard_normal(s) for name, s in shapes.items()} for _ in range(2))
cotangent = rng.standard_normal(shapes["q"])
lengths = np.array([21, 32], np.int32)

def attention(strategy):
  def f(p):
    options = dict(is_causal=True, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                   score_mod=lambda s, b, h, q_idx, kv_idx: s + p["table"][q_idx - kv_idx + T - 1])
    if strategy is None:
      return aj.dot_product_attention(p["q"], p["k"], p["v"], implementation="reference",
                                      **options)
    return aj.context_parallel_attention(p["q"], p["k"], p["v"], mesh=mesh, axis_name="seq",
                                         strategy=strategy, load_balance=strategy == "ring",
                                         block_q=8, block_k=8, **options)
  return f

def transforms(f, p, t, w):
  jvp = lambda p: jax.jvp(f, (p,), (t,))[1]
  loss = lambda p: jnp.sum(f(p) * w)
  along = lambda s: f(jax.tree.map(lambda x, d: x + s[0] * d, p, t))
  return {"jvp": jvp(p), "linearize": jax.linearize(f, p)[1](t),
          "jacfwd": jax.jacfwd(along)(jnp.zeros(1, w.dtype))[..., 0],
          "forward over reverse": jax.jvp(jax.grad(loss), (p,), (t,))[1],
          "reverse over forward": jax.grad(lambda p: jnp.sum(jvp(p) * w) + loss(p))(p)}

def run(strategy, dtype, f=None):
  cast = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, dtype), tree)
  out = jax.jit(functools.partial(transforms, f or attention(strategy)))(
      cast(point), cast(tangent), cast(cotangent))
  return jax.tree.map(lambda x: np.asarray(x, np.float64), out)

with jax.enable_x64():
  expected = run(None, jnp.float64)
errors = {}
for strategy in ("ring", "all_gather"):
  got = run(strategy, jnp.float32)
  for name in expected:
    for (path, a), b in zip(jax.tree.leaves_with_path(got[name]), jax.tree.leaves(expected[name])):
      errors[f"{strategy} {name}{jax.tree_util.keystr(path)}"] = float(
          np.max(np.abs(a - b)) / np.max(np.abs(b)))

# A user's own shard_map over the batch (check_vma on), the bias and the table replicated: their
# gradients are summed over the shards once (the table's came out 2x, the bias's failed before).
from jax.sharding import PartitionSpec as P
from attention_jax.chunked import chunked_attention
batch_mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
bias_shape = (1, N, T, T)
point, tangent = ({**p, "bias": rng.standard_normal(bias_shape)} for p in (point, tangent))

def users(kernel):
  def inner(q, k, v, table, bias, lengths):
    options = dict(bias=bias, is_causal=True, query_seq_lengths=lengths,
                   key_value_seq_lengths=lengths,
                   score_mod=lambda s, b, h, q_idx, kv_idx: s + table[q_idx - kv_idx + T - 1])
    if kernel == "reference":
      return aj.dot_product_attention(q, k, v, implementation="reference", **options)
    return chunked_attention(q, k, v, scale=H ** -0.5, block_q=8, block_k=8, **options)
  def f(p):
    arguments = (p["q"], p["k"], p["v"], p["table"], p["bias"], lengths)
    if kernel == "reference":
      return inner(*arguments)
    return jax.shard_map(inner, mesh=batch_mesh, in_specs=(P("data"),) * 3 + (P(), P(), P("data")),
                         out_specs=P("data"))(*arguments)
  return f

with jax.enable_x64():
  expected = run(None, jnp.float64, users("reference"))
got = run(None, jnp.float32, users("chunked"))
for name in expected:
  for (path, a), b in zip(jax.tree.leaves_with_path(got[name]), jax.tree.leaves(expected[name])):
    errors[f"shard_map {name}{jax.tree_util.keystr(path)}"] = float(
        np.max(np.abs(a - b)) / np.max(np.abs(b)))
print(json.dumps(errors))
"""


def test_forward_mode_and_second_order_through_context_parallelism():
  """Both strategies on 8 simulated devices (the ring in the zigzag layout), causal, grouped
  queries, lengths and a score_mod's table, against the unsharded float64 reference; and the
  blockwise kernel inside a user's shard_map over the batch with a replicated bias and table."""
  from training_helpers import on_eight_devices
  errors = on_eight_devices(CONTEXT_PARALLEL)
  # jvp, linearize, jacfwd; the second orders per input (q, k, v, table; and bias in shard_map)
  assert len(errors) == 2 * (3 + 2 * 4) + 3 + 2 * 5
  for case, relative_error in errors.items():
    assert relative_error <= 1e-5, (case, relative_error)


CONTROL_FLOW_IN_A_MOD = r"""
import functools, json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import attention_jax as aj
from attention_jax.chunked import chunked_attention

mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
B, T, N, H = 2, 16, 2, 8
rng = np.random.default_rng(0)
shapes = {"q": (B, T, N, H), "k": (B, T, N, H), "v": (B, T, N, H), "table": (2 * T - 1,)}
point, tangent = ({n: rng.standard_normal(s) for n, s in shapes.items()} for _ in range(2))
w = rng.standard_normal(shapes["q"])
lengths = np.array([11, 16], np.int32)

def by_cond(table):  # a different read of the table above and below the diagonal
  return lambda s, b, h, qi, ki: jax.lax.cond(qi >= ki, lambda: s + table[qi - ki + T - 1],
                                              lambda: s - 0.5 * table[ki - qi + T - 1])

def by_scan(table):  # three decaying reads, accumulated onto the score
  def mod(s, b, h, qi, ki):
    step = lambda c, i: (c + table[jnp.clip(qi - ki + T - 1 - i, 0, 2 * T - 2)] * 0.5 ** i, None)
    return jax.lax.scan(step, s, jnp.arange(3))[0]
  return mod

def users(kernel, mod):
  def inner(q, k, v, table, lengths):
    options = dict(key_value_seq_lengths=lengths, score_mod=mod(table))
    if kernel == "reference":
      return aj.dot_product_attention(q, k, v, implementation="reference", **options)
    return chunked_attention(q, k, v, scale=H ** -0.5, block_q=8, block_k=8, **options)
  def f(p):
    arguments = (p["q"], p["k"], p["v"], p["table"], lengths)
    if kernel == "reference":
      return inner(*arguments)
    return jax.shard_map(inner, mesh=mesh, in_specs=(P("data"),) * 3 + (P(), P("data")),
                         out_specs=P("data"))(*arguments)
  return f

def transforms(f, p, t, w):
  loss = lambda p: jnp.sum(f(p) * w)
  jvp = lambda p: jax.jvp(f, (p,), (t,))[1]
  return {"grad": jax.grad(loss)(p)["table"],
          "reverse over forward": jax.grad(lambda p: jnp.sum(jvp(p) * w))(p)["table"]}

def run(f, dtype):
  cast = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, dtype), tree)
  out = jax.jit(functools.partial(transforms, f))(cast(point), cast(tangent), cast(w))
  return jax.tree.map(lambda x: np.asarray(x, np.float64), out)

errors = {}
for name, mod in (("cond", by_cond), ("scan", by_scan)):
  with jax.enable_x64():
    expected = run(users("reference", mod), jnp.float64)
  got = run(users("chunked", mod), jnp.float32)
  for transform in expected:
    errors[f"{name} {transform}"] = float(np.max(np.abs(got[transform] - expected[transform]))
                                          / np.max(np.abs(expected[transform])))
print(json.dumps(errors))
"""


def test_a_trained_table_read_through_cond_or_scan_in_a_mod_inside_a_users_shard_map():
  """A score_mod whose closed-over table flows into lax.cond or lax.scan, the blockwise kernel
  inside a user's shard_map over the batch (the table replicated, lengths per shard): the
  table's gradient and its reverse-over-forward second derivative against the float64
  reference (lax.cond failed before: its branch's pvary met a table that varies already)."""
  from training_helpers import on_eight_devices
  errors = on_eight_devices(CONTROL_FLOW_IN_A_MOD)
  assert len(errors) == 4
  for case, relative_error in errors.items():
    assert relative_error <= 1e-5, (case, relative_error)


def test_a_loop_carry_from_a_constant_in_a_mod_under_shard_map_is_one_line():
  """Under shard_map a mod's indices vary over the mesh axes; a loop whose carry starts from a
  constant then changes its type: one line naming the fix (it read 'must take 5 arguments')."""
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  table = jnp.arange(4.0)
  mod = lambda s, b, h, qi, ki: s + jax.lax.fori_loop(0, 2, lambda i, c: c + table[qi % 4],
                                                      0.0)
  x = jnp.ones((1, 8, 1, 8))
  f = jax.shard_map(lambda x: chunked_attention(x, x, x, scale=0.5, block_q=8, block_k=8,
                                                score_mod=mod), mesh=mesh, in_specs=P("data"),
                    out_specs=P("data"))
  with pytest.raises(ValueError, match="score_mod: a loop's carry.*jnp.zeros_like") as error:
    f(x)
  assert "\n" not in str(error.value)


def _largest_array(fn, *args) -> int:
  """The most elements of any array in the lowered program of ``fn`` (every loop body and the
  tangent primitive's expansion included)."""
  import re
  text = jax.jit(fn).lower(*args).as_text()
  sizes = [np.prod([int(d) for d in shape.rstrip("x").split("x")])
           for shape in re.findall(r"tensor<((?:\d+x)+)[a-z]", text)]
  return int(max(sizes))


def test_the_tangent_of_a_long_causal_call_holds_no_t_by_s_array():
  """T = S = 8192: the tangent (jvp) and reverse over forward (grad of a jvp) hold no array larger
  than the forward's largest, which is far from [T, S] (a sixteenth of it)."""
  length = 8192
  x = jax.ShapeDtypeStruct((1, length, 2, 64), jnp.float32)
  f = lambda q, k, v: aj.dot_product_attention(q, k, v, is_causal=True, implementation="chunked")
  jvp = lambda q, k, v: jax.jvp(f, (q, k, v), (q, k, v))[1]
  hvp = jax.grad(lambda q, k, v: jnp.sum(jvp(q, k, v)), (0, 1, 2))
  forward = _largest_array(f, x, x, x)
  assert forward < length * length // 16
  assert _largest_array(jvp, x, x, x) <= forward
  assert _largest_array(hvp, x, x, x) <= forward


def test_a_vmap_over_tangents_holds_one_copy_of_the_residuals():
  """jacfwd-style: a vmap of a jvp over V tangent directions with the point shared keeps the
  residuals (q, k, v, the output, the [T, S] mask) unbatched: no array of V x T x S (the
  tangent primitive broadcast every unbatched operand V times before)."""
  length, directions = 512, 8
  x = jax.ShapeDtypeStruct((1, length, 2, 16), jnp.float32)
  t = jax.ShapeDtypeStruct((directions, 1, length, 2, 16), jnp.float32)
  mask = jnp.tril(jnp.ones((length, length), bool))
  f = lambda q, k, v: chunked_attention(q, k, v, None, mask, scale=0.25, block_q=64, block_k=64)
  along = jax.vmap(lambda d, q, k, v: jax.jvp(f, (q, k, v), (d, d, d))[1],
                   in_axes=(0, None, None, None))
  second = jax.vmap(jax.grad(lambda q, d: jnp.sum(jax.jvp(f, (q, q, q), (d, d, d))[1])),
                    in_axes=(None, 0))
  bound = max(_largest_array(f, x, x, x), directions * length * 2 * 16)
  assert bound < directions * length * length // 4
  assert _largest_array(along, t, x, x, x) <= bound
  assert _largest_array(second, x, t) <= bound


def test_a_vmap_over_some_tangents_agrees_with_a_loop():
  """The batched tangent primitive with some operands unbatched: a vmap over query tangents with
  the key tangent shared, its gradient in that shared tangent (summed over the directions), and
  a vmap of grad of a jvp, each equal to the loop over directions."""
  shapes = {"q": (1, T, N, H), "k": (1, T, K, H), "v": (1, T, K, H)}
  p, t = (jax.tree.map(jnp.asarray, _arrays(seed, shapes)) for seed in (0, 1))
  directions = jnp.asarray(np.random.default_rng(2).standard_normal((2,) + shapes["q"]),
                           jnp.float32)
  w = jnp.asarray(_arrays(3, {"w": shapes["q"]})["w"], jnp.float32)
  mask = np.random.default_rng(4).random((T, T)) < 0.7
  f = lambda q, k, v: chunked_attention(q, k, v, None, mask, scale=H ** -0.5, block_q=BLOCK,
                                        block_k=BLOCK, is_causal=True)
  jvp = lambda d, d_k: jax.jvp(f, (p["q"], p["k"], p["v"]), (d, d_k, t["v"]))[1]
  in_k = lambda d_k, over: jnp.sum(over(lambda d: jnp.sum(jvp(d, d_k) * w)))
  vmapped = lambda g: jax.vmap(g)(directions)
  looped = lambda g: jnp.stack([g(d) for d in directions])
  hvp = lambda d: jax.grad(lambda q: jnp.sum(jax.jvp(f, (q, p["k"], p["v"]),
                                                     (d, t["k"], t["v"]))[1] * w))(p["q"])
  both = jax.jit(lambda over: {  # the same three, batched and looped, in one program each
      "vmap of a jvp": over(lambda d: jvp(d, t["k"])),
      "grad in the shared key tangent": jax.grad(in_k)(t["k"], over),
      "vmap of grad of a jvp": over(hvp)}, static_argnums=0)
  batched, expected = both(vmapped), both(looped)
  for name, value in expected.items():
    assert_close(batched[name], value, 1e-5, name)


def test_third_order_by_forward_mode_agrees_and_reverse_over_reverse_is_one_line():
  """Third derivatives with forward mode outermost (jvp of a jvp of a jvp, jacfwd of a hessian)
  agree with the float64 reference; reverse mode over a gradient or a second derivative (a grad
  of a grad, a grad of a hessian, a grad of a grad of a jvp) is one line naming the orders served
  (JAX's raw error about dynamic loop bounds before), as is second order through the fused
  kernel."""
  from attention_jax import pallas_gpu
  shapes = {"q": (1, 16, 2, H), "w": (1, 16, 2, H)}
  p = {name: jnp.asarray(x, jnp.float32) for name, x in _arrays(0, shapes).items()}

  def f(implementation, p):
    def at(s):
      q = p["q"] * s
      if implementation == "chunked":
        out = chunked_attention(q, q, q, scale=H ** -0.5, block_q=BLOCK, block_k=BLOCK,
                                is_causal=True)
      else:
        out = aj.dot_product_attention(q, q, q, is_causal=True, implementation="reference")
      return jnp.sum(out * p["w"])
    return at
  jvp = lambda g: lambda s: jax.jvp(g, (s,), (jnp.ones_like(s),))[1]
  third = lambda g: {"jvp of a jvp of a jvp": jvp(jvp(jvp(g)))(jnp.float32(1.0)),
                     "jacfwd of a hessian": jax.jacfwd(jax.hessian(g))(jnp.float32(1.0))}
  got = jax.jit(lambda p: third(f("chunked", p)))(p)
  with jax.enable_x64():
    expected = jax.jit(lambda p: third(f("reference", p)))(
        jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), p))
  for name, value in expected.items():
    assert_close(got[name], value, 1e-4, name)
  chunked = f("chunked", p)
  for name, transform in {"grad of a grad": jax.grad(jax.grad(chunked)),
                          "grad of a hessian": jax.grad(jax.hessian(chunked)),
                          "grad of a grad of a jvp": jax.grad(jax.grad(jvp(chunked)))}.items():
    with pytest.raises(ValueError, match="serves first order.*jax.hessian.*grad of a grad.*"
                                         "is refused.*jax.jvp or jax.jacfwd") as error:
      jax.jit(transform)(jnp.float32(1.0))
    assert "\n" not in str(error.value), name
  fused = lambda s: jnp.sum(pallas_gpu.flex_attention(p["q"] * s, p["q"], p["q"], scale=0.25,
                                                      block_size=16, interpret=True)[0])
  with pytest.raises(ValueError, match="pallas_gpu' serves reverse mode.*grad of a grad\\) has "
                                       "no fused kernel.*'chunked', which serves jax.hessian"):
    jax.jit(jax.grad(jax.grad(fused)))(jnp.float32(1.0))


def test_the_forward_mode_benchmark_times_every_method(tmp_path):
  import json
  from conftest import load_script
  path = tmp_path / "rows.json"
  load_script("benchmark_forward_mode").main(["--lengths", "32", "--heads", "1", "--rounds", "1",
                                              "--json", str(path)])
  rows = json.loads(path.read_text())
  assert [row["method"] for row in rows] == ["forward", "jvp", "grad", "grad (custom VJP)",
                                             "grad of jvp"]
  assert all(row["ms"] > 0 for row in rows) and rows[0]["time vs forward"] == 1.0


def _reverse_only_stand_in(name):
  """A kernel in cuDNN's calling convention around a custom VJP whose backward is twice the true
  gradient (so that a test can tell it ran), wrapped as attention.py wraps cuDNN's."""
  from attention_jax import _checks
  product = jax.custom_vjp(lambda x, y: x * y)
  product.defvjp(lambda x, y: (x * y, (x, y)),
                 lambda saved, g: (2 * g * saved[1], 2 * g * saved[0]))
  kernel = lambda q, k, bias, mask, *, scale: product(q * scale, jnp.where(mask, k, 0.0))
  return _checks.reverse_only(kernel, name)


REVERSE_ONLY_TRANSFORMS = {  # name: the transform of a scalar function f at q
    "jvp": lambda f, q: jax.jvp(f, (q,), (q,)),
    "jvp of a jit": lambda f, q: jax.jvp(jax.jit(f), (q,), (q,)),
    "jvp of a checkpoint": lambda f, q: jax.jvp(jax.checkpoint(f), (q,), (q,)),
    "jvp in a scan": lambda f, q: jax.jvp(lambda q: jax.lax.scan(
        lambda c, _: (c + f(q), None), 0.0, None, length=2)[0], (q,), (q,)),
    "vmap of a jvp": lambda f, q: jax.vmap(lambda t: jax.jvp(f, (q,), (t,))[1])(q[None]),
    "linearize": lambda f, q: jax.linearize(f, q)[1](q),
    "jacfwd": lambda f, q: jax.jacfwd(f)(q),
    "hessian": lambda f, q: jax.hessian(f)(q),
    "jit of a hessian": lambda f, q: jax.jit(jax.hessian(f))(q),
    "grad of a jvp": lambda f, q: jax.grad(lambda q: jax.jvp(f, (q,), (q,))[1])(q),
}


@pytest.mark.parametrize("name", ("cudnn", "pallas_tpu"))
def test_a_reverse_only_kernel_refuses_forward_mode_in_one_line(name):
  """cuDNN's and the Pallas TPU kernel's custom VJPs have no tangent: forward mode and second
  order through them are one line naming the kernel that serves them wherever the kernel is
  traced (inside jit, checkpoint, scan, vmap; JAX's raw error escaped there before); reverse
  mode runs the kernel's own backward, also under jit, checkpoint and vmap."""
  run = _reverse_only_stand_in(name)
  q, mask = jnp.arange(3.0), jnp.array([True, False, True])
  f = lambda q: jnp.sum(run(q, q, None, mask, scale=0.5))
  for transform, apply in REVERSE_ONLY_TRANSFORMS.items():
    with pytest.raises(ValueError, match=f"implementation='{name}' has reverse mode only.*"
                                         "jax.jvp, jax.jacfwd, jax.linearize.*jax.hessian.*"
                                         "implementation='chunked'") as error:
      apply(f, q)
    assert "\n" not in str(error.value), transform
  twice = np.array([0.0, 0.0, 4.0])  # the stand-in's backward: 2 (k * scale + q * scale * mask)
  for gradient in (jax.grad(f), jax.jit(jax.grad(f)), jax.grad(jax.checkpoint(f))):
    np.testing.assert_array_equal(gradient(q), twice)
  np.testing.assert_array_equal(jax.vmap(jax.grad(f))(q[None]), twice[None])
