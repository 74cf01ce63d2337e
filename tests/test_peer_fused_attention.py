"""jax's cuDNN fused-attention tests, re-run on CPU against their own reference.

Adapted from jax's tests/fused_attention_stablehlo_test.py at tag jax-v0.10.2 (Apache-2.0),
written again in our words. Upstream runs these on CUDA only, holding cuDNN to ``sdpa_ref`` and
``sdpa_train_ref``, a plain-JAX attention; ``sdpa_reference`` below is that reference re-expressed
(logits from the input dtype accumulated in float32, masks added as 0.7 x the float32 minimum,
softmax in float32, probabilities rounded to the input dtype, the product with the values
accumulated in float32). Every CPU implementation of ours and the automatic choice is held to it,
values and gradients, at the tolerances each upstream test uses (rtol = atol; 2e-2 on outputs and
2e-1 on gradients unless a test says otherwise).

Ported: test_sdpa, test_sdpa_inference, test_sdpa_var_seq, test_sdpa_broadcast_bias_and_dbias,
test_sdpa_dbias, test_sdpa_sliding_window_length, test_sdpa_large_head_size,
test_sdpa_packed_layout (segment ids), test_sdpa_residual; also test_sdpa_mla (our contract
takes a value head dim apart from the key's: "xla" must refuse it) and the unpaged substance of
test_sdpa_paged_attention (one query against many keys, the decoding step; upstream's check there
compares the reference with itself).

Skipped, as they need cuDNN or a GPU: the paging itself (page tables are a cuDNN kernel
feature), test_sdpa_grad_sharded_regression_25986 and test_sdpa_shard_map_grad_regression_36008
(cuDNN's SPMD partitioning over 2-4 GPUs; our sharded paths are tests/test_sharding.py's and
tests/test_context_parallel.py's), and DotProductAttentionF8Test's test_sdpa_fp8 and
test_sdpa_fp8_inference (cuDNN's float8 kernels and their scaling metadata).

Shrunk, for CPU time: [4, 1024, 4, H] becomes [2, 256, 4, H] (T = 256 keeps the automatic
choice on "chunked"), test_sdpa's [4, 1024, 8, H] becomes [2, 256, 4, H], test_sdpa_dbias's
batches [1, 16] of [512, 16, 48] become [1, 4] of [256, 4, 48] and the decoding step is one query
against 512 keys, batch 2, 4 heads of 64 (upstream: batch 4, 1024 keys, 8 heads of 64 or 128,
blocks of 64 or 128). test_sdpa_large_head_size
and test_sdpa_packed_layout keep upstream's shapes. test_sdpa's grid drops is_bnth (our one
layout is [..., T, N, H]) and runs 4 of the 16 remaining (head_dim, use_mask, use_bias, dtype)
points, in which every value of each factor appears twice and every pair of values of two
factors appears, but for (use_bias, head_dim) (upstream itself samples 10 of its 32 points).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from peer_helpers import IMPLEMENTATION_IDS
from peer_helpers import IMPLEMENTATIONS
from peer_helpers import allclose
from peer_helpers import normal
from peer_helpers import refuses_float16

SHAPE = (2, 256, 4, 64)  # [B, T, N, H]; upstream's is [4, 1024, 4, 64]
over_implementations = pytest.mark.parametrize("implementation", IMPLEMENTATIONS,
                                               ids=IMPLEMENTATION_IDS)


def masked_logit():
  """What upstream's reference adds where attention is not allowed: large, negative, finite."""
  return 0.7 * float(jnp.finfo(jnp.float32).min)


def sdpa_reference(query, key, value, bias=None, mask=None, *, scale, causal=False,
                   padding=False, window_length=None):
  """Upstream's sdpa_ref in our words. query [B, T, N, H], key [B, S, N, H], value [B, S, N, H_v]
  -> [B, T, N, H_v] in the query's dtype.

  ``causal``: key s <= query t. ``padding``: the first half of the queries and of the keys are
  real, the rest padding (and padded query rows give zeros). ``window_length`` w: causal, and
  keys s > t - w only (cuDNN's sliding window). ``mask``: bool, True = attend.
  """
  logits = jnp.einsum("btnh,bsnh->bnts", query, key,
                      preferred_element_type=jnp.float32) * scale  # [B, N, T, S]
  t = jnp.arange(logits.shape[-2])[:, None]
  s = jnp.arange(logits.shape[-1])[None, :]
  allowed = None
  if causal:
    allowed = s <= t
  elif padding:
    allowed = (t < logits.shape[-2] // 2) & (s < logits.shape[-1] // 2)
  elif window_length is not None:
    allowed = (s <= t) & (s > t - window_length)
  if allowed is not None:  # upstream lets these stand in for the bias
    bias = jnp.where(allowed, 0.0, masked_logit())
  if mask is not None:
    mask = jnp.where(mask, 0.0, masked_logit())
    bias = mask if bias is None else bias.astype(jnp.float32) + mask
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  weights = jax.nn.softmax(logits, axis=-1).astype(query.dtype)
  out = jnp.einsum("bnts,bsnh->btnh", weights, value, preferred_element_type=jnp.float32)
  if padding:
    out = out * (jnp.arange(out.shape[1]) < out.shape[1] // 2)[:, None, None]
  return out.astype(query.dtype)


@functools.lru_cache(maxsize=None)  # one callable per configuration: jit caches by identity
def _ours(implementation, **options):
  return functools.partial(aj.dot_product_attention, implementation=implementation, **options)


@functools.lru_cache(maxsize=None)
def _reference(**options):
  return functools.partial(sdpa_reference, **options)


def _train(q, k, v, g, bias=None, mask=None, extras=None, *, attention):
  """(output, gradients of query, key, value and, given a bias, the bias) of
  ``attention(q, k, v, bias, mask, **extras)`` for the cotangent g: upstream's sdpa_train."""
  run = lambda q, k, v, bias: attention(q, k, v, bias, mask, **(extras or {}))
  out, vjp = jax.vjp(run, q, k, v, bias)
  grads = vjp(g)
  return out, grads if bias is not None else grads[:3]


def _infer(q, k, v, *, attention):
  return attention(q, k, v)


# Ours run under jit, as upstream runs cuDNN. The reference runs eagerly: its few operations
# compile once per shape and dtype and are then shared by every test (one program per test would
# cost about as much compiling as ours do).
_train_jit = jax.jit(_train, static_argnames="attention")
_infer_jit = jax.jit(_infer, static_argnames="attention")


def _qkvg(seed, shape, dtype=jnp.bfloat16):
  return tuple(normal((seed, i), shape, dtype) for i in range(4))


def _check_train(ours, expected, dtype, out_tol=2e-2, grad_tol=2e-1, keep=None):
  """Upstream's asserts: the output at ``out_tol``, every gradient at ``grad_tol``; where
  ``keep`` is False both sides are zeroed first (test_sdpa_packed_layout's padding)."""
  (out, grads), (want, want_grads) = ours, expected
  hide = (lambda x: x) if keep is None else (lambda x: jnp.where(keep, x, 0))
  assert out.dtype == dtype and all(grad.dtype == dtype for grad in grads)
  allclose(hide(out), hide(want), atol=out_tol, rtol=out_tol, name="output")
  names = ("d_query", "d_key", "d_value", "d_bias")
  for name, grad, want_grad in zip(names, grads, want_grads):
    allclose(hide(grad), hide(want_grad), atol=grad_tol, rtol=grad_tol, name=name)


def _refused(implementation, dtype, run):
  """float16 through "xla" on CPU: refused while tracing, in one line naming float16."""
  if not refuses_float16(implementation, dtype):
    return False
  with pytest.raises(ValueError, match="(?i)float16"):
    jax.eval_shape(run)
  return True


def test_the_shrunk_shapes_keep_the_automatic_choice_on_chunked():
  """T = 256 is still long enough for the automatic choice to run the chunked kernel on CPU, so
  the "auto" runs below test that choice, not the reference again."""
  if jax.default_backend() != "cpu":
    pytest.skip("the automatic choice differs on accelerators")
  query = jax.ShapeDtypeStruct(SHAPE, jnp.bfloat16)
  assert aj.select_implementation(query, query, query) == "chunked"


# test_sdpa: masks and biases, float16 and bfloat16, head dims 64 and 128, scale 0.5.

SDPA_POINTS = [  # (head_dim, use_mask, use_bias, dtype)
    (64, False, False, "float16"), (128, False, True, "bfloat16"),
    (64, True, False, "bfloat16"), (128, True, True, "float16")]


@functools.lru_cache(maxsize=None)
def _sdpa_case(head_dim, use_mask, use_bias, dtype):
  shape = SHAPE[:3] + (head_dim,)
  q, k, v, g = _qkvg(head_dim, shape, dtype)
  bias_shape = (shape[0], shape[2], shape[1], shape[1])  # [B, N, T, S]
  bias = normal((5, head_dim), bias_shape, dtype) if use_bias else None
  mask = (jnp.asarray(np.random.default_rng(6).random(bias_shape) < 0.5) if use_mask else None)
  return q, k, v, g, bias, mask


@functools.lru_cache(maxsize=None)
def _sdpa_expected(point):
  return _train(*_sdpa_case(*point), attention=_reference(scale=0.5))


@over_implementations
@pytest.mark.parametrize("point", SDPA_POINTS,
                         ids=[f"h{h}-{'mask' if m else 'nomask'}-{'bias' if b else 'nobias'}-{d}"
                              for h, m, b, d in SDPA_POINTS])
def test_sdpa(point, implementation):
  case = _sdpa_case(*point)
  attention = _ours(implementation, scale=0.5)
  if _refused(implementation, point[-1], lambda: _train_jit(*case, attention=attention)):
    return
  _check_train(_train_jit(*case, attention=attention), _sdpa_expected(point),
               jnp.dtype(point[-1]))


# test_sdpa_inference: the forward pass alone, scale 1.

@over_implementations
def test_sdpa_inference(implementation):
  q, k, v, _ = _qkvg(1, SHAPE)
  out = _infer_jit(q, k, v, attention=_ours(implementation, scale=1.0))
  assert out.dtype == jnp.bfloat16
  want = _infer(q, k, v, attention=_reference(scale=1.0))
  allclose(out, want, atol=2e-2, rtol=2e-2, name="output")


# test_sdpa_var_seq: padding, given to us as sequence lengths (half of each sequence is real).

def _half_lengths(q, k, v, bias, mask, *, implementation):
  half = lambda x: jnp.full(x.shape[:1], x.shape[1] // 2, jnp.int32)
  return aj.dot_product_attention(q, k, v, bias, mask, scale=1.0, query_seq_lengths=half(q),
                                  key_value_seq_lengths=half(k), implementation=implementation)


@over_implementations
def test_sdpa_var_seq(implementation):
  q, k, v, g = _qkvg(2, SHAPE)
  ours = _train_jit(q, k, v, g, attention=functools.partial(_half_lengths,
                                                        implementation=implementation))
  expected = _train(q, k, v, g, attention=_reference(scale=1.0, padding=True))
  _check_train(ours, expected, jnp.bfloat16)


# test_sdpa_broadcast_bias_and_dbias: a bias broadcast over the batch, the heads or both; its
# gradient keeps its shape.

BROADCASTS = {"none": (), "batch": (0,), "heads": (1,), "batch_and_heads": (0, 1)}


@over_implementations
@pytest.mark.parametrize("broadcast", list(BROADCASTS))
def test_sdpa_broadcast_bias_and_dbias(broadcast, implementation):
  q, k, v, g = _qkvg(3, SHAPE)
  b, t, n, _ = SHAPE
  bias_shape = tuple(1 if axis in BROADCASTS[broadcast] else size
                     for axis, size in enumerate((b, n, t, t)))
  bias = normal(4, bias_shape, jnp.bfloat16)
  ours = _train_jit(q, k, v, g, bias, attention=_ours(implementation, scale=1.0))
  assert ours[1][3].shape == bias_shape
  expected = _train(q, k, v, g, bias, attention=_reference(scale=1.0))
  _check_train(ours, expected, jnp.bfloat16)


# test_sdpa_dbias: the bias gradient with and without vmap over the batch (upstream: cuDNN
# computes dbias only for batch 1, and this checks vmap keeps it so). Upstream's [B, 512, 16, 48]
# with B in [1, 16] becomes [B, 256, 4, 48] with B in [1, 4].

def _dbias(x, bias, mask, *, attention, use_vmap):
  """d bias of attention(x, x, x, bias, mask) for the cotangent x; with ``use_vmap`` over a
  leading axis of single examples ([B, 1, T, N, H]), as upstream."""
  run = lambda x, bias: attention(x, x, x, bias, mask)
  if use_vmap:
    run, x, bias = jax.vmap(run), x[:, None], bias[:, None]
  _, vjp = jax.vjp(run, x, bias)
  d_bias = vjp(x)[1]
  return d_bias[:, 0] if use_vmap else d_bias


_dbias_jit = jax.jit(_dbias, static_argnames=("attention", "use_vmap"))


@over_implementations
@pytest.mark.parametrize("batch", [1, 4])
def test_sdpa_dbias(batch, implementation):
  x = normal((7, batch), (batch, 256, 4, 48), jnp.bfloat16)
  bias = normal((8, batch), (batch, 4, 256, 256), jnp.bfloat16)
  mask = jnp.ones((1, 1, 256), bool)
  attention = _ours(implementation, scale=1.0)  # upstream's default scale there
  plain = _dbias_jit(x, bias, mask, attention=attention, use_vmap=False)
  vmapped = _dbias_jit(x, bias, mask, attention=attention, use_vmap=True)
  assert plain.dtype == vmapped.dtype == jnp.bfloat16
  allclose(vmapped, plain, name="d_bias, vmapped against not")  # jax's bfloat16 default, 1e-2
  # Beyond upstream (which compares cuDNN with itself): against the reference, at 2e-1.
  want = _dbias(x, bias, mask, attention=_reference(scale=1.0), use_vmap=False)
  allclose(plain, want, atol=2e-1, rtol=2e-1, name="d_bias")


# test_sdpa_sliding_window_length: causal with a window of 64 keys (the query's own and the 63
# before it); for us, is_causal with local_window_size=(63, 0).

@over_implementations
def test_sdpa_sliding_window_length(implementation):
  q, k, v, g = _qkvg(9, SHAPE)
  ours = _train_jit(q, k, v, g, attention=_ours(implementation, scale=1.0, is_causal=True,
                                            local_window_size=(63, 0)))
  expected = _train(q, k, v, g, attention=_reference(scale=1.0, window_length=64))
  _check_train(ours, expected, jnp.bfloat16)


# test_sdpa_large_head_size: head dim 256, causal; upstream's shape.

@over_implementations
def test_sdpa_large_head_size(implementation):
  q, k, v, g = _qkvg(10, (2, 64, 2, 256))
  ours = _train_jit(q, k, v, g, attention=_ours(implementation, scale=1.0, is_causal=True))
  expected = _train(q, k, v, g, attention=_reference(scale=1.0, causal=True))
  _check_train(ours, expected, jnp.bfloat16, out_tol=1e-2)  # jax's bfloat16 default on outputs


# test_sdpa_packed_layout: several examples packed in each row, given to us as segment ids;
# upstream's shape and layout. Segment id 3 marks padding, compared as zeros.

PACKED_SEGMENTS = [  # (segment id, length) runs of each row, 512 tokens
    [(0, 170), (1, 170), (2, 172)],
    [(0, 150), (1, 187), (3, 3), (2, 172)],
    [(0, 190), (1, 190), (3, 132)],
    [(0, 400), (3, 112)],
]


def _segment_ids():
  return jnp.asarray([np.repeat([i for i, _ in row], [n for _, n in row])
                      for row in PACKED_SEGMENTS], jnp.int32)  # [4, 512]


def _packed_ours(q, k, v, bias, mask, *, segment_ids, implementation):
  return aj.dot_product_attention(q, k, v, bias, mask, scale=0.1, query_segment_ids=segment_ids,
                                  key_segment_ids=segment_ids, implementation=implementation)


def _packed_reference(q, k, v, bias, mask, *, segment_ids):
  same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]  # [B, 1, T, S]
  return sdpa_reference(q, k, v, jnp.where(same, 0.0, masked_logit()), mask, scale=0.1)


@over_implementations
def test_sdpa_packed_layout(implementation):
  segment_ids = _segment_ids()
  real = (segment_ids < 3)[:, :, None, None]  # [B, T, 1, 1]
  q, k, v, g = (x * real.astype(x.dtype) for x in _qkvg(11, (4, 512, 4, 64)))
  ours = _train_jit(q, k, v, g, extras=dict(segment_ids=segment_ids),
                attention=functools.partial(_packed_ours, implementation=implementation))
  expected = _train(q, k, v, g, extras=dict(segment_ids=segment_ids),
                    attention=_packed_reference)
  _check_train(ours, expected, jnp.bfloat16, out_tol=1e-2, grad_tol=1e-2, keep=real)


# test_sdpa_residual: the log-sum-exp residual, forward and through a training step.

@functools.partial(jax.jit, static_argnames="implementation")
def _residual_train(q, k, v, g, g_lse, *, implementation):
  run = lambda q, k, v: aj.dot_product_attention(q, k, v, scale=1.0, return_residual=True,
                                                 implementation=implementation)
  (out, lse), vjp = jax.vjp(run, q, k, v)
  return out, lse, vjp((g, g_lse.astype(lse.dtype)))


def _log_sum_exp_reference(q, k):
  logits = jnp.einsum("btnh,bsnh->btns", q, k, preferred_element_type=jnp.float32)
  return jax.nn.logsumexp(logits, axis=-1)  # [B, T, N]


@over_implementations
def test_sdpa_residual(implementation):
  q, k, v, g = _qkvg(12, SHAPE)
  g_lse = normal(13, SHAPE[:3], jnp.float32)  # upstream's [B, N, T] is cuDNN's layout
  out, lse, grads = _residual_train(q, k, v, g, g_lse, implementation=implementation)
  assert lse.shape == SHAPE[:3] and lse.dtype == jnp.float32
  expected = _train(q, k, v, g, attention=_reference(scale=1.0))
  _check_train((out, grads), expected, jnp.bfloat16)  # the residual itself has no gradient
  allclose(lse, _log_sum_exp_reference(q, k), atol=2e-2, rtol=2e-2, name="log-sum-exp")


# test_sdpa_paged_attention without the pages: one query (a decoding step) against 512 keys,
# forward only as upstream (its other query length, a full prefill, is test_sdpa_inference's).

@over_implementations
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sdpa_decode_step(dtype, implementation):
  q = normal(14, (2, 1, 4, 64), dtype)
  k, v = (normal(i, (2, 512, 4, 64), dtype) for i in (15, 16))
  attention = _ours(implementation, scale=1.0)
  if _refused(implementation, dtype, lambda: _infer_jit(q, k, v, attention=attention)):
    return
  out = _infer_jit(q, k, v, attention=attention)
  assert out.dtype == jnp.dtype(dtype)
  allclose(out, _infer(q, k, v, attention=_reference(scale=1.0)), atol=1e-2, rtol=1e-2,
           name="output")


# test_sdpa_mla: a value head dim (64) apart from the query's and key's (128), forward only.

@over_implementations
def test_sdpa_mla(implementation):
  q, k = (normal((17, i), SHAPE[:3] + (128,), jnp.bfloat16) for i in range(2))
  v = normal(18, SHAPE[:3] + (64,), jnp.bfloat16)
  attention = _ours(implementation, scale=1.0)
  if implementation == "xla":  # jax.nn needs value.shape == key.shape: refused in one line
    with pytest.raises(ValueError, match="value.shape == key.shape"):
      _infer_jit(q, k, v, attention=attention)
    return
  out = _infer_jit(q, k, v, attention=attention)
  assert out.shape == SHAPE[:3] + (64,) and out.dtype == jnp.bfloat16
  allclose(out, _infer(q, k, v, attention=_reference(scale=1.0)), atol=2e-2, rtol=2e-2,
           name="output")
