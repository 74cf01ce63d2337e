"""The fused Pallas-Triton kernel for score/mask functions, as far as a CPU can check it: its
forward, backward and tangent (jvp, linearize, jacfwd) in Pallas' interpreter against the dense
reference (with the same mods), the refusals, and the lowering of all four kernels to Triton for
CUDA (for a GPU this machine does not have)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import _checks
from attention_jax import attention as attention_lib
from attention_jax import pallas_gpu
from attention_jax import reference as reference_lib
from conftest import assert_close

B, T, S, N, K, H = 2, 40, 36, 4, 2, 8  # T, S not multiples of the blocks; K < N (GQA)
SLOPES = jnp.asarray([0.5, 0.25, 0.125, 0.0625])
DOCS = jnp.repeat(jnp.arange(4), 10)  # four documents of 10 tokens


def alibi(s, b, h, q_idx, kv_idx):
  return s - SLOPES[h] * jnp.abs(q_idx - kv_idx)


def soft_cap(s, b, h, q_idx, kv_idx):
  return 2.0 * jnp.tanh(s / 2.0) + jnp.where(b == 1, 0.5, 0.0)


def causal(b, h, q_idx, kv_idx):
  return q_idx >= kv_idx


def same_document(b, h, q_idx, kv_idx):
  return (DOCS[q_idx] == DOCS[kv_idx]) & (q_idx >= kv_idx)


def late_start(b, h, q_idx, kv_idx):  # rows 0-5 of head 0 attend to nothing
  return (kv_idx < q_idx - 5) | (h > 0)


def _inputs(seed=0, value_dim=12):
  rng = np.random.default_rng(seed)
  draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  return draw(B, T, N, H), draw(B, S, K, H), draw(B, S, K, value_dim), draw(B, T, N, value_dim)


@pytest.mark.parametrize("score_mod, mask_mod, block_size", [
    (alibi, causal, 16), (soft_cap, same_document, 16), (None, late_start, 32),
    (alibi, None, 16)])
def test_outputs_and_gradients_equal_the_reference(score_mod, mask_mod, block_size):
  q, k, v, cotangent = _inputs()
  kwargs = dict(scale=0.3, score_mod=score_mod, mask_mod=mask_mod)

  def fused(q, k, v):
    out, lse = pallas_gpu.flex_attention(q, k, v, block_size=block_size, interpret=True,
                                          **kwargs)
    return out, lse

  def dense(q, k, v):
    out, lse = aj.dot_product_attention(q, k, v, implementation="reference", empty_rows="zero",
                                        return_residual=True, **kwargs)
    return out, lse

  loss = lambda f: lambda *a: jnp.sum(f(*a)[0] * cotangent)  # the contract's lse: no gradient
  expected = jax.jit(lambda *a: (dense(*a), jax.grad(loss(dense), (0, 1, 2))(*a)))(q, k, v)
  actual = jax.jit(lambda *a: (fused(*a), jax.grad(loss(fused), (0, 1, 2))(*a)))(q, k, v)
  (out, lse), grads = actual
  (want_out, want_lse), want_grads = expected
  assert_close(out, want_out, rtol=1e-5, name="output")
  finite = np.isfinite(np.asarray(want_lse))
  np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), finite)  # empty rows: -inf
  assert_close(np.where(finite, lse, 0.0), np.where(finite, want_lse, 0.0), rtol=1e-5, name="lse")
  for name, got, want in zip("qkv", grads, want_grads):
    assert_close(got, want, rtol=1e-5, name=f"d{name}")


TABLES = {  # name: (table shape, its index from (h, q_idx, kv_idx), the entry's factor there)
    "learned ALiBi slopes, by head": ((N,), lambda h, t, s: (h,), lambda t, s: -abs(t - s)),
    "T5 bias, by head and distance": ((N, T + S - 1), lambda h, t, s: (h, t - s + S - 1),
                                      lambda t, s: 1),
    "by key position, one per pair": ((S // 2,), lambda h, t, s: (s // 2,), lambda t, s: 1),
    "a decay per query": ((T,), lambda h, t, s: (t,), lambda t, s: -0.1 * abs(t - s)),
}


def _table_case(name, seed=4):
  shape, index, factor = TABLES[name]
  table = jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)
  score_mod = lambda table: lambda s, b, h, q_idx, kv_idx: s * 0.9 + table[  # noqa: E731
      index(h, q_idx, kv_idx)] * factor(q_idx, kv_idx)
  return table, score_mod, (index, factor)


def _float64_gradients(q, k, v, cotangent, table, read_as, scale):
  """numpy, float64: causal attention with score 0.9 s + table[index] * factor, and the
  gradient of sum(out * cotangent) with respect to the table (dL/dS times the factor, summed
  onto each entry it read)."""
  index, factor = read_as
  q, k, v, cotangent, table = (np.asarray(x, np.float64) for x in (q, k, v, cotangent, table))
  k, v = (np.repeat(x, N // K, axis=2) for x in (k, v))
  h, t, s = np.ix_(np.arange(N), np.arange(T), np.arange(S))
  read = tuple(np.broadcast_to(i, (N, T, S)) for i in index(h, t, s))
  weight = np.broadcast_to(factor(t, s), (N, T, S))
  logits = 0.9 * scale * np.einsum("bthd,bshd->bhts", q, k) + table[read] * weight
  logits = np.where(causal(0, h, t, s), logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  d_weights = np.einsum("bthd,bshd->bhts", cotangent, v)
  d_logits = weights * (d_weights - np.sum(d_weights * weights, -1, keepdims=True))
  d_table = np.zeros_like(table)
  np.add.at(d_table, read, d_logits.sum(0) * weight)
  return d_table


@pytest.mark.parametrize("name", list(TABLES))
def test_a_closed_over_table_gets_its_gradient_from_the_kernel(name):
  """Tables indexed by head, by distance and by position (two keys per entry: several reads of
  one entry in a block), traced, against the float64 gradient; q's gradient too, and the same
  sums on a second run (a fixed order, no atomics)."""
  q, k, v, cotangent = _inputs(value_dim=H)
  table, score_mod, read_as = _table_case(name)

  def loss(table, q):
    out, _ = pallas_gpu.flex_attention(q, k, v, scale=0.3, score_mod=score_mod(table),
                                       mask_mod=causal, block_size=16, interpret=True)
    return jnp.sum(out * cotangent)
  d_table, d_q = jax.jit(jax.grad(loss, (0, 1)))(table, q)
  assert_close(d_table, _float64_gradients(q, k, v, cotangent, table, read_as, 0.3), rtol=1e-5,
               name="d table")
  dense = lambda table, q: jnp.sum(aj.dot_product_attention(  # noqa: E731
      q, k, v, scale=0.3, score_mod=score_mod(table), mask_mod=causal,
      implementation="reference") * cotangent)
  assert_close(d_q, jax.grad(dense, 1)(table, q), rtol=1e-5, name="dq")
  again = jax.jit(jax.grad(loss, (0, 1)))(table, q)[0]
  np.testing.assert_array_equal(np.asarray(again), np.asarray(d_table))


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs a GPU")
@pytest.mark.parametrize("name", list(TABLES))
def test_on_a_gpu_a_trained_table_gets_its_gradient_from_the_compiled_kernel(name):
  """As above, compiled (float32 at TF32's tolerance), the same bits on a second run."""
  q, k, v, cotangent = _inputs(value_dim=H)
  table, score_mod, read_as = _table_case(name)
  loss = lambda table: jnp.sum(pallas_gpu.flex_attention(  # noqa: E731
      q, k, v, scale=0.3, score_mod=score_mod(table), mask_mod=causal, block_size=16)[0]
      * cotangent)
  d_table = jax.jit(jax.grad(loss))(table)
  assert_close(d_table, _float64_gradients(q, k, v, cotangent, table, read_as, 0.3), rtol=2e-3,
               name="d table")
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss))(table)), np.asarray(d_table))


def test_only_the_tables_being_differentiated_cost_the_kernel_work():
  """A traced table that is not differentiated (computed inside jit, say) adds no output to
  the backward kernels; one that is adds each one's share of its gradient."""
  q, k, v, _ = _inputs(value_dim=H)
  table, score_mod, _ = _table_case("T5 bias, by head and distance")

  def loss(table, q):
    return jnp.sum(pallas_gpu.flex_attention(q, k, v, scale=0.3, score_mod=score_mod(table),
                                             block_size=16, interpret=True)[0])

  def outputs(argnums):
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums))(table, q)
    calls = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    return sorted(len(e.outvars) for e in calls)
  assert outputs(1) == [1, 2, 2]  # dQ; forward (out, lse); dK and dV
  assert outputs((0, 1)) == [2, 2, 3]  # dQ and dK/dV with their shares of the tables'


def _equations(jaxpr):
  for equation in jaxpr.eqns:
    yield equation
    for param in equation.params.values():
      inner = getattr(param, "jaxpr", param)
      if hasattr(inner, "eqns"):
        yield from _equations(inner)


def test_the_log_sum_exp_has_its_gradient():
  """Unlike the contract's residual (stop_gradient), the kernel's log-sum-exp is differentiable:
  against the logsumexp of the dense modded, masked logits."""
  q, k, v, _ = _inputs(2)

  def dense(q, k):
    logits = jnp.einsum("bthd,bshd->bhts", q, jnp.repeat(k, N // K, axis=2)) * 0.3
    b, h, t, s = np.ix_(*(np.arange(n) for n in logits.shape))
    logits = jnp.where(causal(b, h, t, s), alibi(logits, b, h, t, s), -jnp.inf)
    return jnp.sum(jax.nn.logsumexp(logits, axis=-1))

  fused = lambda q, k: jnp.sum(pallas_gpu.flex_attention(
      q, k, v, scale=0.3, score_mod=alibi, mask_mod=causal, block_size=16, interpret=True)[1])
  for got, want in zip(jax.grad(fused, (0, 1))(q, k), jax.grad(dense, (0, 1))(q, k)):
    assert_close(got, want, rtol=1e-5)


def test_a_block_mask_skips_its_empty_blocks_and_gives_the_same_numbers():
  q, k, v, _ = _inputs(1, value_dim=H)
  block_mask = aj.make_block_mask(same_document, None, None, T, S, block_size=16)
  assert float(block_mask.sparsity()) > 0.0
  fused = pallas_gpu.flex_attention(q, k, v, scale=0.3, block_mask=block_mask, interpret=True)
  dense = aj.dot_product_attention(q, k, v, scale=0.3, mask_mod=same_document,
                                   implementation="reference", return_residual=True)
  assert_close(fused[0], dense[0], rtol=1e-5, name="output")
  assert_close(fused[1], dense[1], rtol=1e-5, name="lse")
  odd = aj.make_block_mask(same_document, None, None, T, S)  # blocks of 40: not Triton's
  assert odd.block_q == 40
  fused_odd = pallas_gpu.flex_attention(q, k, v, scale=0.3, block_mask=odd, interpret=True)
  assert_close(fused_odd[0], dense[0], rtol=1e-5, name="output, its kinds at blocks of 64")
  oblong = aj.make_block_mask(same_document, None, None, T, S, block_size=(32, 16))
  fused_oblong = pallas_gpu.flex_attention(q, k, v, scale=0.3, block_mask=oblong, interpret=True)
  assert_close(fused_oblong[0], dense[0], rtol=1e-5, name="output, blocks of 32 x 16")
  order, _ = pallas_gpu._block_order(block_mask.kinds, 3, 3, transpose=False)
  counts = np.asarray(order).reshape(3, 4)[:, 0]  # per query block: non-empty key blocks
  np.testing.assert_array_equal(counts, np.sum(np.asarray(block_mask.kinds[0, 0]) != 0, axis=1))


def test_full_blocks_skip_the_mask_mod():
  """Blockwise causal at blocks of 16: every non-empty block is full, so the mask_mod is never
  evaluated, and the numbers stay the reference's; a block mask that calls every block full
  (wrongly) shows that the mask_mod is indeed skipped there."""
  q, k, v, _ = _inputs(6, value_dim=H)
  block_causal = lambda b, h, q_idx, kv_idx: q_idx // 16 >= kv_idx // 16
  block_mask = aj.make_block_mask(block_causal, None, None, T, S, block_size=16)
  assert set(np.unique(np.asarray(block_mask.kinds)).tolist()) == {0, 2}  # empty or full
  fused = pallas_gpu.flex_attention(q, k, v, scale=0.3, block_mask=block_mask, interpret=True)
  dense = aj.dot_product_attention(q, k, v, scale=0.3, mask_mod=block_causal,
                                   implementation="reference")
  assert_close(fused[0], dense, rtol=1e-5)
  every_block_full = dataclasses.replace(block_mask, kinds=jnp.full_like(block_mask.kinds, 2))
  lied = pallas_gpu.flex_attention(q, k, v, scale=0.3, block_mask=every_block_full,
                                   interpret=True)
  unmasked = aj.dot_product_attention(q, k, v, scale=0.3, implementation="reference")
  assert_close(lied[0], unmasked, rtol=1e-5)


def test_what_the_kernel_cannot_run_is_refused_in_one_line():
  q, k, v, _ = _inputs()
  forms_array = lambda s, b, h, q_idx, kv_idx: s + jnp.cumsum(SLOPES)[h]
  with pytest.raises(ValueError, match="applies 'cumsum' to the whole array.*chunked"):
    pallas_gpu.flex_attention(q, k, v, scale=1.0, score_mod=forms_array, interpret=True)

  def trained(table):
    mod = lambda s, b, h, q_idx, kv_idx: s + table[q_idx % 64, kv_idx % 65]
    return pallas_gpu.flex_attention(q, k, v, scale=1.0, score_mod=mod, interpret=True)[0]
  with pytest.raises(ValueError, match="gradients to closed-over floating arrays of up to 4096 "
                                       "entries together; this mod's traced ones have 4160"):
    jax.grad(lambda s: jnp.sum(trained(s)))(jnp.zeros((64, 65)))
  with pytest.raises(ValueError, match="powers of two from 16"):
    pallas_gpu.flex_attention(q, k, v, scale=1.0, block_size=24, interpret=True)


@pytest.mark.parametrize("dropout_rate, trained", [(0.0, False), (0.1, False), (0.0, True)])
def test_the_three_kernels_lower_to_triton_in_bfloat16(dropout_rate, trained):
  def loss(q, k, v, mask, lengths, table):  # with the structure arrays read as tables, traced
    relative = lambda s, b, h, q_idx, kv_idx: (  # noqa: E731  # trained with ``trained``: a
        alibi(s, b, h, q_idx, kv_idx) + table[h, jnp.clip(q_idx - kv_idx, 0, 31)]  # T5 table,
        - table[h, 0] * (q_idx - kv_idx) / 64 + table[h, kv_idx % 32] / 8)  # a slope, per key
    out = pallas_gpu.pallas_gpu_attention(q, k, v, mask, scale=0.125, score_mod=relative,
                                          mask_mod=same_document, key_value_seq_lengths=lengths,
                                          is_causal=True, dropout_rate=dropout_rate,
                                          dropout_rng=jax.random.key(0),
                                          broadcast_dropout=False)
    return jnp.sum(out.astype(jnp.float32))

  shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (
      ((B, T, N, 64), jnp.bfloat16), ((B, S, K, 64), jnp.bfloat16),
      ((B, S, K, 64), jnp.bfloat16), ((B, 1, 1, S), jnp.bool_), ((B,), jnp.int32),
      ((N, 32), jnp.float32))]
  argnums = (0, 1, 2, 5) if trained else (0, 1, 2)
  assert _triton_calls(jax.grad(loss, argnums), shapes) == 3


def _triton_calls(fn, shapes) -> int:
  """The Triton kernels in ``fn`` lowered for CUDA (no GPU needed) at ``shapes``."""
  lower = lambda: jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))  # noqa: E731
  try:
    lowered = lower()
  except RuntimeError as error:  # newer JAX asks which GPU to lower for: an H200
    assert "abstract GPU device" in str(error), error
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132,
                                         platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",),
                                                                  abstract_device=device)):
      lowered = lower()
  return len(re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", lowered.as_text()))


def test_the_tangent_kernel_lowers_to_triton_in_bfloat16():
  """jvp with dropout and tangents into a traced table: the forward and the tangent kernel."""
  def tangent(q, k, v, mask, lengths, table):
    def attend(q, k, v, table):
      relative = lambda s, b, h, q_idx, kv_idx: (  # noqa: E731
          alibi(s, b, h, q_idx, kv_idx) + table[h, jnp.clip(q_idx - kv_idx, 0, 31)])
      return pallas_gpu.pallas_gpu_attention(
          q, k, v, mask, scale=0.125, score_mod=relative, mask_mod=same_document,
          key_value_seq_lengths=lengths, is_causal=True, dropout_rate=0.1,
          dropout_rng=jax.random.key(0), broadcast_dropout=False)
    return jax.jvp(attend, (q, k, v, table), (q, k, v, table))[1]

  shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (
      ((B, T, N, 64), jnp.bfloat16), ((B, S, K, 64), jnp.bfloat16),
      ((B, S, K, 64), jnp.bfloat16), ((B, 1, 1, S), jnp.bool_), ((B,), jnp.int32),
      ((N, 32), jnp.float32))]
  assert _triton_calls(tangent, shapes) == 2


@pytest.mark.parametrize("options", [
    dict(is_causal=True), dict(local_window_size=(3, 2)), dict(is_causal=True, local_window_size=(
        6, 4), logits_soft_cap=1.5, score_mod=alibi), dict(mask_mod=late_start),
    dict(mask_mod=late_start, return_residual=True),
    dict(query_seq_lengths=np.array([40, 17]), key_value_seq_lengths=np.array([30, 5]),
         is_causal=True),
    dict(query_segment_ids=np.repeat([[0, 1], [2, 3]], 20, axis=1),
         key_segment_ids=np.repeat([[0, 1], [3, 2]], 18, axis=1), return_residual=True),
    dict(mask=np.random.default_rng(5).random((B, 1, T, S)) < 0.3, score_mod=alibi),
    dict(mask=np.arange(S) % 3 > 0, query_seq_lengths=np.array([12, 40])),
    dict(block_mask=aj.make_block_mask(causal, None, None, T, S, block_size=16),
         query_seq_lengths=np.array([40, 17]), key_value_seq_lengths=np.array([30, 5]),
         query_segment_ids=np.repeat([[0, 1], [2, 3]], 20, axis=1),
         key_segment_ids=np.repeat([[0, 1], [3, 2]], 18, axis=1))])
def test_the_contracts_structure_as_mods_gives_the_reference(options):
  """is_causal, windows, lengths, segment ids, masks, the soft cap, empty rows (zeros: what
  dot_product_attention makes of them, its empty_rows, is tested for every kernel in
  test_attention) and the residual, as dot_product_attention gives them (the fused call is what
  implementation="pallas_gpu" runs on a GPU); the structure arrays are traced (jit), as in a
  model."""
  q, k, v, cotangent = _inputs(4)
  options = {"scale": 0.3, **options}
  window = _checks.local_window(options.pop("local_window_size", None))
  arrays = {name: value for name, value in options.items() if isinstance(value, np.ndarray)}
  options = {name: value for name, value in options.items() if name not in arrays}
  fused = lambda q, k, v, arrays: pallas_gpu.pallas_gpu_attention(
      q, k, v, local_window_size=window, interpret=True, empty_rows="zero", **arrays, **options)
  dense = lambda q, k, v, arrays: aj.dot_product_attention(
      q, k, v, local_window_size=window, implementation="reference", empty_rows="zero",
      **arrays, **options)
  for got, want in zip(*(x if isinstance(x, tuple) else (x,) for x in (
      jax.jit(fused)(q, k, v, arrays), dense(q, k, v, arrays)))):
    assert_close(np.nan_to_num(got, neginf=0.0), np.nan_to_num(want, neginf=0.0), rtol=1e-5)
  if "block_mask" in options:  # the blocks skipped per example in the backward kernels too
    loss = lambda f: lambda *a: jnp.sum(f(*a, arrays) * cotangent)
    grads = jax.jit(jax.grad(loss(fused), (0, 1, 2)))(q, k, v)
    for name, got, want in zip("qkv", grads, jax.grad(loss(dense), (0, 1, 2))(q, k, v)):
      assert_close(got, want, rtol=1e-5, name=f"d{name}")


def test_it_is_chosen_by_name_on_a_gpu_and_refuses_what_it_cannot_serve():
  q = k = v = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  select = lambda **kw: aj.select_implementation(q, k, v, backend="gpu",
                                                 device_kind="NVIDIA H200", **kw)
  assert select(implementation="pallas_gpu", score_mod=alibi, is_causal=True) == "pallas_gpu"
  # chosen on Hopper, where it was timed, for score and mask functions (and the soft cap, one)
  assert select(score_mod=alibi) == "pallas_gpu"
  assert select(mask_mod=causal) == "pallas_gpu"
  assert select(logits_soft_cap=30.0) == "pallas_gpu"
  assert select() == "cudnn"  # plain attention stays with cuDNN
  assert select(dropout_rate=0.1) == "reference"  # flax's masks while the weights are small
  assert aj.select_implementation(q, k, v, backend="gpu", device_kind="NVIDIA A100",
                                  score_mod=alibi) == "chunked"  # not timed there

  def with_table(table):  # a mod over a traced floating array
    mod = lambda s, b, h, q_idx, kv_idx: s + table[h % table.shape[0]]  # noqa: E731
    return aj.select_implementation(q, k, v, backend="gpu", device_kind="NVIDIA H200",
                                    score_mod=mod)
  chosen = []
  for size in (8, pallas_gpu.MAX_TRAINED + 1):  # its gradient fits the kernel's registers, or not
    jax.jit(lambda table: chosen.append(with_table(table)))(jnp.ones(size))
  assert chosen == ["pallas_gpu", "chunked"]
  assert select(implementation="pallas_gpu", mask=jnp.ones((512, 512), bool),
                key_value_seq_lengths=jnp.array([3, 4])) == "pallas_gpu"
  assert select(implementation="pallas_gpu", dropout_rate=0.1) == "pallas_gpu"  # its own masks
  for arguments, named in [(dict(bias=jnp.ones((512, 512))), "bias only written as a score_mod"),
                           (dict(sinks=jnp.zeros(8)), "sinks"),
                           (dict(return_weights=True), "cannot return them")]:
    with pytest.raises(ValueError, match=f"'pallas_gpu' cannot serve this call: .*{named}"):
      select(implementation="pallas_gpu", **arguments)
  with pytest.raises(ValueError, match="runs only on the gpu backend"):
    aj.select_implementation(q, k, v, implementation="pallas_gpu", backend="cpu")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs a GPU")
@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 2e-3), (jnp.bfloat16, 3e-2)])
def test_on_a_gpu_the_compiled_kernels_equal_the_reference(dtype, rtol):
  """Float32 at TF32's tolerance: Triton's dots round their inputs to TF32 on NVIDIA GPUs."""
  rng = np.random.default_rng(3)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in (
      (2, 300, 4, 64), (2, 280, 2, 64), (2, 280, 2, 64), (2, 300, 4, 64)))
  ids = lambda length: jnp.broadcast_to(jnp.arange(length) // 100, (2, length))  # 3 documents
  kwargs = dict(scale=0.125, score_mod=alibi, is_causal=True,
                key_value_seq_lengths=jnp.array([280, 150]), query_segment_ids=ids(300),
                key_segment_ids=ids(280))
  fused = lambda q, k, v: aj.dot_product_attention(q, k, v, implementation="pallas_gpu",
                                                   **kwargs)
  dense = lambda q, k, v: aj.dot_product_attention(
      q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
      implementation="reference", **kwargs)
  run = lambda f: jax.jit(lambda *a: (f(*a), jax.grad(
      lambda *b: jnp.sum(f(*b).astype(jnp.float32) * cotangent.astype(jnp.float32)),
      (0, 1, 2))(*a)))(q, k, v)
  (out, grads), (want, want_grads) = run(fused), run(dense)
  assert_close(out, want, rtol=rtol, name="output")
  for name, got, expected in zip("qkv", grads, want_grads):
    assert_close(got, expected, rtol=rtol, name=f"d{name}")


# Control flow in a mod: each primitive, its value written out with jnp.where (the reference).
def _cond(s, b, h, q_idx, kv_idx):
  return jax.lax.cond(q_idx >= kv_idx, lambda: s, lambda: s - 1.0)


def _switch(s, b, h, q_idx, kv_idx):
  return jax.lax.switch(h % 3, [lambda: s, lambda: 0.5 * s, lambda: s + SLOPES[h]])


def _scan(s, b, h, q_idx, kv_idx):  # one carry, no xs: the case that once came out wrong
  return jax.lax.scan(lambda c, _: (0.5 * c + s, None), 0.0, None, length=3)[0]


def _fori(s, b, h, q_idx, kv_idx):
  return jax.lax.fori_loop(0, 4, lambda i, c: c - 0.1 * jnp.abs(q_idx - kv_idx) / (i + 1), s)


def _while(s, b, h, q_idx, kv_idx):
  return jax.lax.while_loop(lambda c: c[0] < kv_idx % 3, lambda c: (c[0] + 1, c[1] - 0.2),
                            (0, s))[1]


def _mask_cond(b, h, q_idx, kv_idx):
  return jax.lax.cond(h == 0, lambda: q_idx >= kv_idx, lambda: jnp.abs(q_idx - kv_idx) < 8)


def _mask_switch(b, h, q_idx, kv_idx):
  return jax.lax.switch(h % 2, [lambda: q_idx >= kv_idx, lambda: q_idx <= kv_idx + 6])


def _mask_fori(b, h, q_idx, kv_idx):  # a boolean carry
  return jax.lax.fori_loop(0, 3, lambda i, c: c | (q_idx - kv_idx == i), q_idx - kv_idx > 6)


def _mask_while(b, h, q_idx, kv_idx):
  return jax.lax.while_loop(lambda c: c[0] < kv_idx % 3, lambda c: (c[0] + 1, c[1]),
                            (0, q_idx >= kv_idx))[1]


CONTROL_FLOW = {  # name: (score_mod, mask_mod, the same two without control flow)
    "cond": (_cond, None, lambda s, b, h, q, kv: jnp.where(q >= kv, s, s - 1.0), None),
    "switch": (_switch, None, lambda s, b, h, q, kv: jnp.where(
        h % 3 == 0, s, jnp.where(h % 3 == 1, 0.5 * s, s + SLOPES[h])), None),
    "scan": (_scan, None, lambda s, b, h, q, kv: 1.75 * s, None),
    "fori_loop": (_fori, None, lambda s, b, h, q, kv: s - 0.1 * jnp.abs(q - kv) * 25 / 12,
                  None),
    "while_loop": (_while, None, lambda s, b, h, q, kv: s - 0.2 * (kv % 3), None),
    "mask cond": (None, _mask_cond, None, lambda b, h, q, kv: jnp.where(
        h == 0, q >= kv, jnp.abs(q - kv) < 8)),
    "mask switch": (None, _mask_switch, None, lambda b, h, q, kv: jnp.where(
        h % 2 == 0, q >= kv, q <= kv + 6)),  # no row empty
    "mask fori_loop": (None, _mask_fori, None, lambda b, h, q, kv: (q - kv > 6) | (
        (q - kv >= 0) & (q - kv < 3))),
    "mask while_loop": (None, _mask_while, None, lambda b, h, q, kv: q >= kv),
}
PATHS = ["reference", "xla", "chunked", "chunked_blocks", "block_mask", "context_parallel",
         "pallas_gpu"]


def _run(path, q, k, v, score_mod, mask_mod):
  """Attention with the mods on ``path``: the implementations by name, the blockwise kernel in
  blocks of 8 (with a block mask of the mask_mod), the context-parallel drop-in, or the fused
  kernel in Pallas' interpreter."""
  kwargs = dict(scale=0.3, score_mod=score_mod, mask_mod=mask_mod)
  if path == "pallas_gpu":
    return pallas_gpu.flex_attention(q, k, v, block_size=16, interpret=True, **kwargs)[0]
  if path == "chunked_blocks":
    return aj.chunked_attention(q, k, v, block_q=8, block_k=8, **kwargs)
  if path == "block_mask":
    block_mask = aj.make_block_mask(mask_mod or aj.noop_mask, None, N, q.shape[1], S,
                                    block_size=8)
    return aj.chunked_attention(q, k, v, scale=0.3, score_mod=score_mod, block_mask=block_mask)
  if path == "context_parallel":
    return aj.ContextParallel(jax.make_mesh((1,), ("seq",)), "seq")(q, k, v, **kwargs)
  return aj.dot_product_attention(q, k, v, implementation=path, **kwargs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("construct", list(CONTROL_FLOW))
def test_control_flow_in_a_mod_is_served_right_or_refused_in_one_line(construct, path):
  """Against the same mods written without control flow, evaluated by numpy broadcasting (not
  through the mods' own machinery)."""
  q, k, v, _ = _inputs(value_dim=H)  # xla wants value's shape to be key's
  if path == "context_parallel":  # self-attention over one sequence: T = S
    q = q[:, :S]
  score_mod, mask_mod, plain_score, plain_mask = CONTROL_FLOW[construct]
  b, h, t, s = np.ogrid[:1, :N, :q.shape[1], :S]
  mask = None if plain_mask is None else np.asarray(plain_mask(b, h, t, s))  # [1, N, T, S]
  scores = None if plain_score is None else (
      lambda logits: plain_score(logits, b, h, t, s))  # on the dense [B, N, T, S] logits

  def expected(q):
    return reference_lib.reference_attention(q, k, v, None, mask, scale=0.3, score_mod=scores)
  run = lambda q: _run(path, q, k, v, score_mod, mask_mod)  # noqa: E731
  if path == "xla" and score_mod is not None:  # xla serves masks only: refused, as any score_mod
    with pytest.raises(ValueError, match="cannot serve score_mod"):
      run(q)
    return
  if path == "pallas_gpu" and "while_loop" in construct:
    with pytest.raises(ValueError, match=r"^[^\n]*cannot evaluate a lax.while_loop in a mod"
                                         r"[^\n]*use implementation='chunked'\.$"):
      run(q)
    return
  assert_close(run(q), expected(q), rtol=2e-5, name=f"{construct} on {path}")
  if construct == "while_loop":
    return  # JAX differentiates no while_loop in reverse mode, on any path
  grad = lambda f: jax.grad(lambda q: jnp.sum(jnp.sin(f(q))))(q)  # noqa: E731
  assert_close(grad(run), grad(expected), rtol=5e-5, name=f"dq, {construct} on {path}")


def test_a_long_loop_or_a_scan_over_arrays_is_refused_by_the_fused_kernel_in_one_line():
  q, k, v, _ = _inputs()
  long_loop = lambda s, b, h, q_idx, kv_idx: jax.lax.fori_loop(0, 100, lambda i, c: c * 0.99, s)
  over_array = lambda s, b, h, q_idx, kv_idx: jax.lax.scan(
      lambda c, x: (c + x, None), s, SLOPES)[0]
  for mod, message in [(long_loop, "up to 32 iterations; this one has 100"),
                       (over_array, "scans over arrays")]:
    with pytest.raises(ValueError, match=r"^[^\n]*" + message + r"[^\n]*chunked'\.$"):
      pallas_gpu.flex_attention(q, k, v, scale=1.0, score_mod=mod, interpret=True)
    # the blockwise kernel serves them
    assert np.all(np.isfinite(aj.chunked_attention(q, k, v, scale=1.0, score_mod=mod)))


def test_without_pallas_triton_the_kernel_is_refused_in_one_line_naming_chunked(monkeypatch):
  """jax deprecated Pallas' Triton backend (0.11) and will remove it: simulated by an import
  that fails."""
  import sys
  from jax.experimental import pallas
  monkeypatch.setitem(sys.modules, "jax.experimental.pallas.triton", None)  # import fails
  monkeypatch.delattr(pallas, "triton", raising=False)  # as if never imported
  q, k, v, _ = _inputs(value_dim=H)
  reason = pallas_gpu.missing_backend()
  assert "needs Pallas' Triton backend" in reason and "implementation='chunked'" in reason
  on_gpu = attention_lib.Request(backend="gpu", device_kind="NVIDIA H100 80GB HBM3")
  assert attention_lib.unsupported_reason("pallas_gpu", q, k, v, on_gpu) == reason
  assert attention_lib._choose(q, k, v, on_gpu, None).name != "pallas_gpu"  # automatic choice
  with pytest.raises(ValueError, match=r"^[^\n]*Triton backend[^\n]*'chunked'[^\n]*$"):
    pallas_gpu.flex_attention(q, k, v, scale=1.0, mask_mod=causal)
  # the interpreter (how this machine runs it) needs no backend
  out, _ = pallas_gpu.flex_attention(q, k, v, scale=1.0, mask_mod=causal, interpret=True)
  assert_close(out, aj.dot_product_attention(q, k, v, scale=1.0, mask_mod=causal), rtol=2e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs a GPU")
@pytest.mark.parametrize("construct", [c for c in CONTROL_FLOW if "while_loop" not in c])
def test_on_a_gpu_control_flow_in_a_mod_compiles_and_equals_the_interpreter(construct):
  """What the interpreter checks above on any machine holds for the kernel Triton compiled
  (float32 at TF32's tolerance; while_loop is refused before lowering, as above)."""
  q, k, v, _ = _inputs(value_dim=H)
  score_mod, mask_mod, _, _ = CONTROL_FLOW[construct]
  attend = lambda interpret: lambda q: pallas_gpu.flex_attention(  # noqa: E731
      q, k, v, scale=0.3, score_mod=score_mod, mask_mod=mask_mod, block_size=16,
      interpret=interpret)[0]
  compiled, interpreted = attend(False), attend(True)
  assert_close(jax.jit(compiled)(q), interpreted(q), rtol=2e-3, name=construct)
  grad = lambda f: jax.jit(jax.grad(lambda q: jnp.sum(jnp.sin(f(q)))))(q)  # noqa: E731
  assert_close(grad(compiled), grad(interpreted), rtol=2e-3, name=f"dq, {construct}")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs a GPU")
@pytest.mark.parametrize("broadcast", [False, True])
def test_on_a_gpu_compiled_dropout_drops_the_blockwise_kernels_entries(broadcast):
  """The compiled kernel's counter-based masks are the blockwise kernel's (outputs and gradients
  agree at TF32's tolerance; a different mask would differ by far more)."""
  q, k, v, cotangent = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in _inputs(
      value_dim=H))
  common = dict(scale=H ** -0.5, mask_mod=causal, dropout_rate=0.2,
                dropout_rng=jax.random.key(4), broadcast_dropout=broadcast)
  fused = lambda q, k, v: pallas_gpu.flex_attention(  # noqa: E731
      q, k, v, block_size=16, **common)[0]
  blockwise = lambda q, k, v: aj.chunked_attention(  # noqa: E731
      q, k, v, block_q=8, block_k=8, **common)
  run = lambda f: jax.jit(lambda *a: (f(*a), jax.grad(  # noqa: E731
      lambda *b: jnp.sum(f(*b) * cotangent), (0, 1, 2))(*a)))(q, k, v)
  (out, grads), (want, want_grads) = run(fused), run(blockwise)
  assert_close(out, want, rtol=2e-3, name="output")
  for name, got, expected in zip("qkv", grads, want_grads):
    assert_close(got, expected, rtol=2e-3, name=f"d{name}")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs a GPU")
def test_on_a_gpu_the_compiled_kernel_gives_each_rows_largest_score():
  q, k, v, _ = _inputs(value_dim=H)
  _, lse, best = pallas_gpu.flex_attention(q, k, v, scale=0.3, score_mod=alibi, mask_mod=late_start,
                                           return_max_scores=True)
  _, want_lse, want = pallas_gpu.flex_attention(q, k, v, scale=0.3, score_mod=alibi,
                                                mask_mod=late_start, return_max_scores=True,
                                                interpret=True)
  finite = np.isfinite(np.asarray(want))
  np.testing.assert_array_equal(np.isfinite(np.asarray(best)), finite)
  np.testing.assert_allclose(np.asarray(best)[finite], np.asarray(want)[finite], rtol=2e-3,
                             atol=2e-3)
  np.testing.assert_allclose(np.asarray(lse)[finite], np.asarray(want_lse)[finite], rtol=2e-3,
                             atol=2e-3)


_LOWER_FOR_A_GPU = """
import jax, jax.numpy as jnp
from attention_jax import pallas_gpu
q = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
attend = lambda q, k, v: pallas_gpu.pallas_gpu_attention(q, k, v, scale=0.1, is_causal=True)
lower = lambda: jax.jit(attend).trace(q, q, q).lower(lowering_platforms=("cuda",))
try:
  lower()
except RuntimeError:  # newer JAX asks which GPU: an H200
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",),
                                                                abstract_device=device)):
    lower()
"""


def test_jax_s_deprecation_of_pallas_triton_stays_hidden_under_python_s_default_filters():
  """Chosen automatically on Hopper, the kernel is compiled for users who never named it: jax
  (0.11 on) warns that Pallas' Triton backend is deprecated when it lowers a Triton kernel, from
  inside jax, which Python's default filters hide (pytest and -W default show it)."""
  import subprocess
  import sys
  run = lambda *flags: subprocess.run(  # noqa: E731
      [sys.executable, *flags, "-c", _LOWER_FOR_A_GPU], capture_output=True, text=True,
      timeout=300)
  quiet, shown = run(), run("-W", "default")
  assert quiet.returncode == 0 and shown.returncode == 0, quiet.stderr[-1500:]
  assert "deprecated" not in quiet.stderr
  if tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 11):  # the warning exists
    assert "Pallas Triton backend is deprecated" in shown.stderr


def _first_order(f, point, tangent, other):
  """jvp, linearize and jacfwd (along two directions) of f at ``point``: {name: value}."""
  along = lambda s: f(jax.tree.map(lambda x, t, u: x + s[0] * t + s[1] * u, point, tangent,
                                   other))
  return {"jvp": jax.jvp(f, (point,), (tangent,))[1],
          "linearize": jax.linearize(f, point)[1](tangent),
          "jacfwd": jax.jacfwd(along)(jnp.zeros(2, jax.tree.leaves(point)[0].dtype))}


def _against_float64(fused, dense, shapes, rtol=1e-5):
  """Forward mode of ``fused`` (float32, Pallas' interpreter) against ``dense`` in float64, at
  random points and directions of the arrays ``shapes`` names."""
  draw = lambda seed: {name: np.random.default_rng(seed).standard_normal(shape)  # noqa: E731
                       for name, shape in shapes.items()}
  point, tangent, other = draw(0), draw(1), draw(2)
  as_type = lambda dtype: lambda tree: jax.tree.map(lambda x: jnp.asarray(x, dtype), tree)
  ours = jax.jit(lambda *a: _first_order(fused, *a))(*map(as_type(jnp.float32),
                                                          (point, tangent, other)))
  with jax.enable_x64():
    expected = jax.tree.map(np.asarray, jax.jit(lambda *a: _first_order(dense, *a))(
        *map(as_type(jnp.float64), (point, tangent, other))))
  for name in expected:
    for got, want in zip(jax.tree.leaves(ours[name]), jax.tree.leaves(expected[name])):
      assert_close(got, want, rtol=rtol, name=name)


def _t5(table):  # a bias by head and distance, written as a score_mod, and a soft cap
  return lambda s, b, h, q_idx, kv_idx: 2.0 * jnp.tanh((s + table[h, q_idx - kv_idx + S]) / 2.0)


FORWARD_CASES = {  # name: (the contract's options from the inputs, extra input shapes)
    "gqa, causal, lengths, a score_mod table with its tangent, soft cap": (
        lambda p: dict(is_causal=True, score_mod=_t5(p["table"]), logits_soft_cap=3.0,
                       query_seq_lengths=jnp.array([T, 29]),
                       key_value_seq_lengths=jnp.array([21, S])),
        {"table": (N, T + S)}),
    "segments, window, a mask and a mask_mod": (
        lambda p: dict(local_window_size=(9, 4), mask=jnp.asarray(
            np.random.default_rng(7).random((B, 1, T, S)) < 0.8),
            query_segment_ids=jnp.asarray([[0] * 12 + [1] * 28, [0] * 5 + [1] * 35]),
            key_segment_ids=jnp.asarray([[0] * 12 + [1] * 24, [0] * 5 + [1] * 31]),
            mask_mod=lambda b, h, q_idx, kv_idx: (q_idx + kv_idx + h) % 5 != 0), {}),
}


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_mode_through_the_fused_kernel_agrees_with_the_float64_reference(case):
  """jvp, linearize and jacfwd through the tangent kernel (the forward's walk over key blocks,
  each block's logits differentiated in the kernel, tangents into a closed-over table too)
  against the float64 dense reference (observed: at most 2.8e-7 of the largest entry)."""
  options, extra = FORWARD_CASES[case]
  attend = lambda fn, **kw: lambda p: fn(  # noqa: E731
      p["q"], p["k"], p["v"], scale=0.3, **options(p), **kw)
  fused = attend(pallas_gpu.pallas_gpu_attention, interpret=True)
  dense = attend(aj.dot_product_attention, implementation="reference", empty_rows="zero")
  shapes = {"q": (B, T, N, H), "k": (B, S, K, H), "v": (B, S, K, H), **extra}
  _against_float64(fused, dense, shapes)


def test_the_log_sum_exp_has_its_tangent():
  """The kernel's log-sum-exp (differentiable, unlike the contract's residual) against the
  float64 jvp of the dense logsumexp, with rows that attend to nothing (zero tangent)."""
  def fused(p):
    return pallas_gpu.flex_attention(p["q"], p["k"], p["v"], scale=0.3, score_mod=alibi,
                                     mask_mod=late_start, block_size=16, interpret=True)[1]

  def dense(p):
    logits = jnp.einsum("bthd,bshd->bhts", p["q"], jnp.repeat(p["k"], N // K, axis=2)) * 0.3
    b, h, t, s = np.ix_(*(np.arange(n) for n in logits.shape))
    logits = jnp.where(late_start(b, h, t, s), alibi(logits, b, h, t, s), -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.swapaxes(jnp.where(jnp.isfinite(lse), lse, -jnp.inf), 1, 2)  # [B, T, N]

  fused_tangent = lambda p, t: jax.jvp(fused, (p,), (t,))[1]  # noqa: E731
  shapes = {"q": (B, T, N, H), "k": (B, S, K, H), "v": (B, S, K, H)}
  p, t = ({name: jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)
           for name, shape in shapes.items()} for seed in (0, 1))
  got = jax.jit(fused_tangent)(p, t)
  with jax.enable_x64():
    as64 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), tree)  # noqa: E731
    want = np.asarray(jax.jvp(dense, (as64(p),), (as64(t),))[1])
  empty = ~np.isfinite(np.asarray(fused(p)))
  assert empty.any() and np.all(np.asarray(got)[empty] == 0.0)
  assert_close(np.where(empty, 0.0, got), np.where(empty, 0.0, want), rtol=1e-5, name="d lse")


def test_dropout_tangents_use_the_forward_mask():
  """With dropout, the fused kernel's jvp equals the blockwise kernel's (the same counter-based
  mask for the same key; the blockwise tangent is checked against central differences in
  test_forward_mode): the tangent regenerates the forward's mask."""
  q, k, v, _ = _inputs(3, value_dim=H)
  tangents = _inputs(4, value_dim=H)[:3]
  options = dict(scale=0.3, is_causal=True, dropout_rate=0.3, dropout_rng=jax.random.key(2),
                 broadcast_dropout=False)
  fused = lambda *a: pallas_gpu.pallas_gpu_attention(*a, interpret=True, **options)  # noqa: E731
  blockwise = lambda *a: aj.dot_product_attention(  # noqa: E731
      *a, implementation="chunked", empty_rows="zero", **options)
  got = jax.jit(lambda *a: jax.jvp(fused, a, tangents))(q, k, v)
  want = jax.jvp(blockwise, (q, k, v), tangents)
  assert_close(got[0], want[0], rtol=1e-5, name="out")
  assert_close(got[1], want[1], rtol=1e-5, name="d out")


def test_second_order_through_the_fused_kernel_is_refused_in_one_line():
  q = jax.random.normal(jax.random.key(0), (1, 32, 2, 16))
  fused = lambda q: pallas_gpu.flex_attention(q, q, q, scale=0.25, block_size=16,  # noqa: E731
                                              interpret=True)[0]
  loss = lambda q: jnp.sum(fused(q) ** 2)  # noqa: E731
  for transform in (lambda: jax.grad(lambda q: jnp.sum(jax.jvp(fused, (q,), (q,))[1]))(q),
                    lambda: jax.hessian(lambda s: loss(q * s))(1.0)):
    with pytest.raises(ValueError, match="second order.*implementation='chunked'") as error:
      transform()
    assert "\n" not in str(error.value)
