"""The drop-in promise, tested the way a flax user meets it: swap one name in a flax model (Linen's
MultiHeadDotProductAttention / MultiHeadAttention / SelfAttention, NNX's MultiHeadAttention) or
pass ``attention_fn=aj.dot_product_attention`` to flax's own modules, change nothing else, and
get flax's parameter tree, auto-names, initial parameters, outputs, dropout masks, decode cache,
sown weights and partitioning metadata. Every comparison is against flax itself (the installed
version), with the same keys.
"""

import functools

import flax.linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import nnx as ajnnx
from conftest import assert_close

B, T, S, D = 2, 6, 5, 16


def _x(seed, shape=(B, T, D)):
  return jax.random.normal(jax.random.key(seed), shape)


def _tree_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class _Model(nn.Module):
  """A flax model as a user writes it: the attention class is the only thing swapped."""
  attention: type
  options: dict

  @nn.compact
  def __call__(self, x, mask=None, deterministic=True, sow_weights=False):
    x = nn.Dense(D)(x)
    x = self.attention(**self.options)(x, mask=mask, deterministic=deterministic,
                                       sow_weights=sow_weights)
    return nn.Dense(3)(x)


LINEN_NAMES = [
    (nn.MultiHeadDotProductAttention, aj.MultiHeadDotProductAttention),
    (nn.MultiHeadAttention, aj.MultiHeadAttention),
]


@pytest.mark.parametrize("theirs_cls, ours_cls", LINEN_NAMES)
@pytest.mark.parametrize("options", [
    dict(num_heads=4),
    dict(num_heads=2, qkv_features=8, out_features=12, use_bias=False, normalize_qk=True),
    dict(num_heads=4, bias_init=nn.initializers.normal(0.5),
         out_kernel_init=nn.initializers.normal(0.1)),
])
def test_linen_swap_gives_flax_tree_names_parameters_and_outputs(theirs_cls, ours_cls, options):
  x = _x(0)
  mask = nn.make_attention_mask(jnp.arange(T) < 4, jnp.arange(T) < 5)  # float32, as flax makes it
  theirs, ours = _Model(theirs_cls, options), _Model(ours_cls, options)
  variables = theirs.init(jax.random.key(1), x, mask)
  _tree_equal(ours.init(jax.random.key(1), x, mask), variables)  # same names, same numbers
  assert f"{theirs_cls.__name__}_0" in variables["params"]
  assert_close(ours.apply(variables, x, mask), theirs.apply(variables, x, mask), 1e-5)


@pytest.mark.parametrize("broadcast_dropout", [True, False])
def test_linen_dropout_draws_flax_masks(broadcast_dropout):
  options = dict(num_heads=4, dropout_rate=0.5, broadcast_dropout=broadcast_dropout)
  x = _x(0)
  theirs = _Model(nn.MultiHeadDotProductAttention, options)
  ours = _Model(aj.MultiHeadDotProductAttention, options)
  variables = theirs.init(jax.random.key(1), x)  # deterministic=True at init, no dropout key
  rngs = {"dropout": jax.random.key(2)}
  expected = theirs.apply(variables, x, deterministic=False, rngs=rngs)
  assert_close(ours.apply(variables, x, deterministic=False, rngs=rngs), expected, 1e-5)
  assert not np.allclose(expected, theirs.apply(variables, x, deterministic=True))


def test_linen_deterministic_follows_flax_rules():
  """With dropout, deterministic is needed in exactly one place (flax's merge_param)."""
  x = _x(0)
  layer = aj.MultiHeadDotProductAttention(num_heads=4, dropout_rate=0.1)
  with pytest.raises(ValueError, match="deterministic"):
    layer.init(jax.random.key(0), x)
  variables = layer.init(jax.random.key(0), x, deterministic=True)
  fixed = aj.MultiHeadDotProductAttention(num_heads=4, dropout_rate=0.1, deterministic=True)
  assert_close(fixed.apply(variables, x), layer.apply(variables, x, deterministic=True), 0)


def test_linen_sown_weights_are_flax_weights():
  x = _x(0)
  theirs = _Model(nn.MultiHeadDotProductAttention, dict(num_heads=4))
  ours = _Model(aj.MultiHeadDotProductAttention, dict(num_heads=4))
  variables = theirs.init(jax.random.key(1), x)
  _, expected = theirs.apply(variables, x, sow_weights=True, mutable="intermediates")
  _, got = ours.apply(variables, x, sow_weights=True, mutable="intermediates")
  path = ("intermediates", "MultiHeadDotProductAttention_0", "attention_weights")
  assert_close(got[path[0]][path[1]][path[2]][0], expected[path[0]][path[1]][path[2]][0], 1e-5)
  _, nothing = ours.apply(variables, x, mutable="intermediates")  # flax's default: no sowing
  assert "MultiHeadDotProductAttention_0" not in nothing.get("intermediates", {})


def test_self_attention_and_cross_attention_with_other_widths():
  x, memory, values = _x(0), _x(1, (B, S, 10)), _x(2, (B, S, 7))
  theirs = nn.SelfAttention(num_heads=4)
  ours = aj.SelfAttention(num_heads=4)
  with pytest.warns(DeprecationWarning):  # flax's own warning, from its SelfAttention
    variables = theirs.init(jax.random.key(0), x)
  _tree_equal(ours.init(jax.random.key(0), x), variables)
  assert_close(ours.apply(variables, x), theirs.apply(variables, x), 1e-5)
  # cross-attention: keys and values of other widths than the queries, three inputs
  theirs = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=8)
  ours = aj.MultiHeadDotProductAttention(num_heads=4, qkv_features=8)
  for inputs in ((x, memory), (x, memory, values)):
    variables = theirs.init(jax.random.key(3), *inputs)
    _tree_equal(ours.init(jax.random.key(3), *inputs), variables)
    assert_close(ours.apply(variables, *inputs), theirs.apply(variables, *inputs), 1e-5)


def test_linen_decode_cache_matches_flax():
  options = dict(num_heads=4, decode=True)
  x = _x(0)
  theirs, ours = nn.MultiHeadDotProductAttention(**options), aj.MultiHeadDotProductAttention(
      **options)
  variables = theirs.init(jax.random.key(0), x)
  _tree_equal(ours.init(jax.random.key(0), x), variables)
  cache_theirs = cache_ours = variables["cache"]
  params = {"params": variables["params"]}
  for t in range(T):
    token = x[:, t:t + 1]
    y_theirs, state = theirs.apply({**params, "cache": cache_theirs}, token, mutable="cache")
    cache_theirs = state["cache"]
    y_ours, state = ours.apply({**params, "cache": cache_ours}, token, mutable="cache")
    cache_ours = state["cache"]
    assert_close(y_ours, y_theirs, 1e-5)
  _tree_equal(jax.tree.map(lambda a: np.round(np.asarray(a), 5), cache_ours),
              jax.tree.map(lambda a: np.round(np.asarray(a), 5), cache_theirs))


def test_linen_logical_partitioning_survives_and_maps_to_the_mesh():
  init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "heads", "kv"))
  out_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("heads", "kv", "embed"))
  options = dict(num_heads=4, kernel_init=init, out_kernel_init=out_init)
  x = _x(0)
  theirs = nn.MultiHeadDotProductAttention(**options)
  ours = aj.MultiHeadDotProductAttention(**options)
  boxed_theirs = theirs.init(jax.random.key(0), x)
  boxed_ours = ours.init(jax.random.key(0), x)
  spec_theirs, spec_ours = nn.get_partition_spec(boxed_theirs), nn.get_partition_spec(boxed_ours)
  assert spec_ours == spec_theirs
  assert spec_ours["params"]["query"]["kernel"] == jax.sharding.PartitionSpec(
      "embed", "heads", "kv")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  rules = (("embed", None), ("heads", "model"), ("kv", None))
  shardings = nn.logical_to_mesh_sharding(spec_ours, mesh, rules)
  assert shardings == nn.logical_to_mesh_sharding(spec_theirs, mesh, rules)
  assert shardings["params"]["query"]["kernel"].spec == jax.sharding.PartitionSpec(
      None, "model", None)
  _tree_equal(nn.unbox(boxed_ours), nn.unbox(boxed_theirs))
  assert_close(ours.apply(boxed_ours, x), theirs.apply(boxed_theirs, x), 1e-5)


def test_a_flax_checkpoint_restores_into_ours_with_orbax(tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  x = _x(0)
  theirs = _Model(nn.MultiHeadDotProductAttention, dict(num_heads=4))
  ours = _Model(aj.MultiHeadDotProductAttention, dict(num_heads=4))
  variables = theirs.init(jax.random.key(1), x)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "flax", variables)
  abstract = jax.eval_shape(ours.init, jax.random.key(7), x)
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / "flax", abstract)
  assert_close(ours.apply(restored, x), theirs.apply(variables, x), 1e-5)


@pytest.mark.parametrize("dropout_rate, broadcast_dropout", [(0.0, True), (0.3, True),
                                                             (0.3, False)])
def test_attention_fn_in_flax_linen_module(dropout_rate, broadcast_dropout):
  """flax's own module with our function: init with deterministic=True, training with dropout,
  sowing (``module=``), decoding (flax's float decode mask)."""
  options = dict(num_heads=4, dropout_rate=dropout_rate, broadcast_dropout=broadcast_dropout)
  theirs = nn.MultiHeadDotProductAttention(**options)
  ours = nn.MultiHeadDotProductAttention(**options, attention_fn=aj.dot_product_attention)
  x = _x(0)
  variables = ours.init(jax.random.key(0), x, deterministic=True)
  rngs = {"dropout": jax.random.key(5)}
  for deterministic in (True, False):
    expected, sown_theirs = theirs.apply(variables, x, deterministic=deterministic, rngs=rngs,
                                         sow_weights=True, mutable="intermediates")
    got, sown_ours = ours.apply(variables, x, deterministic=deterministic, rngs=rngs,
                                sow_weights=True, mutable="intermediates")
    assert_close(got, expected, 1e-5)
    assert_close(sown_ours["intermediates"]["attention_weights"][0],
                 sown_theirs["intermediates"]["attention_weights"][0], 1e-5)
  decoding = dict(num_heads=4, decode=True)
  theirs = nn.MultiHeadDotProductAttention(**decoding)
  ours = nn.MultiHeadDotProductAttention(**decoding, attention_fn=aj.dot_product_attention)
  variables = theirs.init(jax.random.key(0), x)
  cache_theirs = cache_ours = variables["cache"]
  for t in range(3):
    y_theirs, state_theirs = theirs.apply({"params": variables["params"], "cache": cache_theirs},
                                          x[:, t:t + 1], mutable="cache")
    y_ours, state_ours = ours.apply({"params": variables["params"], "cache": cache_ours},
                                    x[:, t:t + 1], mutable="cache")
    cache_theirs, cache_ours = state_theirs["cache"], state_ours["cache"]
    assert_close(y_ours, y_theirs, 1e-5)


@pytest.mark.parametrize("options", [
    dict(),
    # head_dim 8: at 2, flax's one-pass LayerNorm variance (E[x^2] - E[x]^2) and our two-pass
    # one differ by ~1e-2 where a head's two values nearly agree (ours is the accurate one)
    dict(qkv_features=32, out_features=12, use_bias=False, normalize_qk=True),
    dict(num_kv_heads=2),
    dict(in_kv_features=10),
])
def test_nnx_swap_gives_flax_state_and_outputs(options):
  theirs = nnx.MultiHeadAttention(4, D, decode=False, rngs=nnx.Rngs(0), **options)
  ours = ajnnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0), **options)
  # the same rngs give flax's parameters, under flax's names
  _tree_equal(nnx.to_pure_dict(nnx.state(ours, nnx.Param)),
              nnx.to_pure_dict(nnx.state(theirs, nnx.Param)))
  other = ajnnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(9), **options)
  nnx.update(other, nnx.state(theirs))  # flax's weights load into ours
  x = _x(0)
  kv = _x(1, (B, S, options.get("in_kv_features", D)))
  mask = nnx.make_causal_mask(jnp.ones((B, T)))[..., :T, :T]  # float32
  assert_close(other(x, kv, mask=mask[..., :S]), theirs(x, kv, mask=mask[..., :S]), 1e-5)
  if kv.shape[-1] == D:  # self-attention needs keys as wide as the queries
    # flax's causal mask, as flax before 0.12.8 takes no is_causal at the call
    assert_close(other(x, is_causal=True), theirs(x, mask=mask), 1e-5)


@pytest.mark.parametrize("broadcast_dropout", [True, False])
def test_nnx_dropout_draws_flax_masks_from_the_same_rngs(broadcast_dropout):
  options = dict(dropout_rate=0.5, broadcast_dropout=broadcast_dropout)
  theirs = nnx.MultiHeadAttention(4, D, decode=False, rngs=nnx.Rngs(0, dropout=1),
                                  **options)
  ours = ajnnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0, dropout=1), **options)
  x = _x(0)
  for _ in range(2):  # the kept streams advance alike
    assert_close(ours(x, deterministic=False), theirs(x, deterministic=False), 1e-5)
  call_rngs = lambda: nnx.Rngs(dropout=3)
  assert_close(ours(x, deterministic=False, rngs=call_rngs()),
               theirs(x, deterministic=False, rngs=call_rngs()), 1e-5)
  with pytest.raises(ValueError, match="deterministic"):
    ours(x)  # dropout without a decision, as flax
  ours.eval()
  theirs.eval()
  assert_close(ours(x), theirs(x), 1e-5)


def test_nnx_partitioning_metadata_survives():
  init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
  options = dict(kernel_init=init, kernel_metadata={"note": "kept"}, decode=False)
  # flax's eager sharding needs a mesh; its axis is Auto (sharding by the compiler, the mode of
  # Linen's logical partitioning): Explicit axes are not served (see the guide)
  mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
  with jax.set_mesh(mesh):
    theirs = nnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0), **options)
    ours = ajnnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0), **options)
    spec = lambda module: nnx.get_partition_spec(nnx.state(module, nnx.Param))
    assert jax.tree.leaves(spec(ours)) == jax.tree.leaves(spec(theirs))
    assert ours.query.kernel.get_metadata()["out_sharding"] == (None, "model")
    assert ours.query.kernel.get_metadata()["note"] == "kept"
    x = _x(0)
    assert_close(ours(x), theirs(x), 1e-5)


def test_nnx_decode_and_sow_match_flax():
  theirs = nnx.MultiHeadAttention(4, D, decode=True, rngs=nnx.Rngs(0))
  ours = ajnnx.MultiHeadAttention(4, D, decode=True, rngs=nnx.Rngs(0))
  x = _x(0)
  theirs.init_cache(x.shape)
  ours.init_cache(x.shape)
  for t in range(T):
    assert_close(ours(x[:, t:t + 1]), theirs(x[:, t:t + 1]), 1e-5)
  _tree_equal(jax.tree.map(lambda a: np.round(np.asarray(a), 5), nnx.state(ours, nnx.Cache)),
              jax.tree.map(lambda a: np.round(np.asarray(a), 5), nnx.state(theirs, nnx.Cache)))
  theirs_sown = nnx.capture(theirs, nnx.Intermediate)(x, sow_weights=True, decode=False)[1]
  ours_sown = nnx.capture(ours, nnx.Intermediate)(x, sow_weights=True, decode=False)[1]
  assert_close(ours_sown["attention_weights"][0], theirs_sown["attention_weights"][0], 1e-5)


@pytest.mark.parametrize("dropout_rate", [0.0, 0.3])
def test_attention_fn_in_flax_nnx_module(dropout_rate):
  options = dict(dropout_rate=dropout_rate, decode=False)
  theirs = nnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0, dropout=1), **options)
  ours = nnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0, dropout=1), **options,
                                attention_fn=aj.dot_product_attention)
  x = _x(0)
  causal = nnx.make_causal_mask(jnp.ones((B, T)))  # float32; flax < 0.12.8 has no is_causal
  for deterministic in (True, False):
    expected, sown_theirs = nnx.capture(theirs, nnx.Intermediate)(
        x, deterministic=deterministic, sow_weights=True, mask=causal)
    got, sown_ours = nnx.capture(ours, nnx.Intermediate)(
        x, deterministic=deterministic, sow_weights=True, mask=causal)
    assert_close(got, expected, 1e-5)
    assert_close(sown_ours["attention_weights"][0], sown_theirs["attention_weights"][0], 1e-5)


@pytest.mark.parametrize("make_mask", [
    lambda: nn.make_attention_mask(jnp.arange(T) < 4, jnp.arange(S) < 3),
    lambda: nn.make_causal_mask(jnp.ones((B, T)))[..., :S],
    lambda: jnp.tril(jnp.ones((T, S))),
    lambda: jnp.ones((B, 1, T, S)).at[0, 0, 2].set(0.0).at[1, 0, :, 1].set(0.0),
])
def test_masks_of_any_dtype_read_as_flax_reads_them(make_mask):
  """A float or int mask attends where nonzero; boolean gives the same numbers."""
  query, key, value = _x(0, (B, T, 4, 8)), _x(1, (B, S, 4, 8)), _x(2, (B, S, 4, 8))
  mask = make_mask()
  expected = nn.dot_product_attention(query, key, value, mask=mask)
  for implementation in ("reference", "xla", "chunked"):
    got = aj.dot_product_attention(query, key, value, mask=mask, implementation=implementation)
    assert_close(got, expected, 1e-5, implementation)
  assert_close(aj.dot_product_attention(query, key, value, mask=mask.astype(bool)), expected,
               1e-5)
  assert_close(aj.dot_product_attention(query, key, value, mask=mask.astype(jnp.int32)),
               expected, 1e-5)


@pytest.mark.parametrize("implementation", ["reference", "xla", "chunked"])
def test_empty_rows_give_the_mean_of_the_values_as_jax_nn_and_flax(implementation):
  """A row with no key: flax and jax.nn give the mean of V (uniform weights); rows past the
  query length: zeros, as jax.nn. empty_rows="zero" keeps zeros everywhere."""
  query, key, value = _x(0, (B, T, 4, 8)), _x(1, (B, S, 4, 8)), _x(2, (B, S, 4, 8))
  mask = jnp.ones((B, 1, T, S), bool).at[0, :, 1].set(False).at[1, :, 4].set(False)
  got = aj.dot_product_attention(query, key, value, mask=mask, implementation=implementation)
  assert_close(got, nn.dot_product_attention(query, key, value, mask=mask), 1e-5)
  assert_close(got, jax.nn.dot_product_attention(query, key, value, mask=mask), 1e-5)
  lengths = jnp.array([5, 3])
  keys = jnp.array([4, 0])  # the second example has no key at all
  options = dict(query_seq_lengths=lengths, key_value_seq_lengths=keys)
  assert_close(aj.dot_product_attention(query, key, value, implementation=implementation,
                                        **options),
               jax.nn.dot_product_attention(query, key, value, **options), 1e-5)
  zero = aj.dot_product_attention(query, key, value, mask=mask, implementation=implementation,
                                  empty_rows="zero")
  assert np.all(np.asarray(zero[0, 1]) == 0) and np.all(np.asarray(zero[1, 4]) == 0)
  grads = jax.grad(lambda v: jnp.sum(aj.dot_product_attention(
      query, key, v, mask=mask, implementation=implementation) ** 2))(value)
  expected = jax.grad(lambda v: jnp.sum(nn.dot_product_attention(
      query, key, v, mask=mask) ** 2))(value)
  assert_close(grads, expected, 1e-5)


def test_the_function_takes_flax_positional_arguments_and_refuses_unserved_ones():
  query = key = value = _x(0, (B, T, 4, 8))
  rng = jax.random.key(3)
  expected = nn.dot_product_attention(query, key, value, None, None, False, rng, 0.4, False)
  got = aj.dot_product_attention(query, key, value, None, None, False, rng, 0.4, False)
  assert_close(got, expected, 1e-5)
  assert_close(aj.dot_product_attention(query, key, value, dropout_rate=0.4, deterministic=True),
               nn.dot_product_attention(query, key, value), 1e-5)  # no key needed
  with pytest.raises(ValueError, match="einsum_dot_general"):
    aj.dot_product_attention(query, key, value, einsum_dot_general=jax.lax.dot_general)
  with pytest.raises(ValueError, match="qkv_dot_general"):
    aj.MultiHeadDotProductAttention(num_heads=4, qkv_dot_general=jax.lax.dot_general).init(
        jax.random.key(0), _x(0))
  with pytest.raises(ValueError, match="out_dot_general"):
    ajnnx.MultiHeadAttention(4, D, out_dot_general=jax.lax.dot_general, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="out_sharding"):
    ajnnx.MultiHeadAttention(4, D, rngs=nnx.Rngs(0))(_x(0),
                                                     out_sharding=jax.sharding.PartitionSpec())
  with pytest.raises(ValueError, match="qkv_promote_dtype"):
    ajnnx.MultiHeadAttention(4, D, qkv_promote_dtype=lambda arrays, dtype: arrays, rngs=nnx.Rngs(0))
  bf16 = aj.dot_product_attention(query, key, value, dtype=jnp.bfloat16)
  assert bf16.dtype == jnp.bfloat16


def test_select_implementation_takes_a_call_s_arguments():
  """What a call would run, asked with the call's own arguments."""
  query = key = value = _x(0, (B, T, 4, 8))
  call = dict(is_causal=True, local_window_size=(2, 0), query_seq_lengths=jnp.array([3, 6]),
              dropout_rate=0.1, deterministic=True, broadcast_dropout=False, empty_rows="zero")
  assert aj.select_implementation(query, key, value, backend="cpu", **call) == "reference"
  assert aj.select_implementation(query, key, value, dropout_rate=0.1, implementation="chunked",
                                  deterministic=True) == "chunked"
  with pytest.raises(TypeError, match="local_window"):
    aj.select_implementation(query, key, value, local_window=2)


def test_an_attention_fn_that_cannot_serve_a_setting_says_so():
  """flax's function takes no ``scale``: a module asking for another scale refuses in one line
  instead of silently applying 1/sqrt(H)."""
  x = _x(0)
  plain = aj.MultiHeadDotProductAttention(num_heads=4, attention_fn=nn.dot_product_attention)
  variables = plain.init(jax.random.key(0), x)
  assert_close(plain.apply(variables, x),
               aj.MultiHeadDotProductAttention(num_heads=4).apply(variables, x), 1e-5)
  scaled = aj.MultiHeadDotProductAttention(num_heads=4, attention_fn=nn.dot_product_attention,
                                           scale=1.0)
  with pytest.raises(ValueError, match="takes no 'scale'"):
    scaled.apply(variables, x)
  fn = functools.partial(nn.dot_product_attention)
  with pytest.raises(ValueError, match="takes no 'is_causal'"):
    aj.MultiHeadDotProductAttention(num_heads=4, attention_fn=fn).apply(variables, x,
                                                                       is_causal=True)
