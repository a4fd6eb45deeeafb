"""Ghost clipping for convolutions: norms and clipped sums without per-example gradients."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.models.base import Model
from fedjax_dp.models.layers import Conv, Dense, flatten
from fedjax_dp.models.zoo import get_model
from fedjax_dp.privacy import clipping


class _TwoConvs(nn.Module):
  """conv -> relu -> conv -> flatten -> dense, with configurable layer shapes."""

  specs: tuple  # ((features, (kh, kw), padding, use_bias), ...)

  @nn.compact
  def __call__(self, x):
    for features, kernel, padding, bias in self.specs:
      x = nn.relu(Conv(features, kernel, padding, use_bias=bias)(x))
    return Dense(3)(flatten(x))


# (input shape, conv layers): kernels 1x1 to 5x5, non-square kernels, VALID / SAME /
# explicit asymmetric padding, 1 to 8 channels, with and without bias. The 2x2
# feature map of the third case makes its second layer take the Gram branch.
CASES = [
    ((6, 6, 1), ((4, (3, 3), "VALID", True), (2, (1, 1), "VALID", True))),
    ((7, 5, 3), ((5, (2, 3), "SAME", False), (3, (5, 5), ((2, 2), (1, 3)), True))),
    ((4, 4, 8), ((8, (3, 3), "VALID", True), (16, (1, 1), "VALID", True))),
]


def _ghost_and_reference(model, params, x, y, w, clip_scale):
  """Ghost results and materialised references for ord 1 and 2, in one compiled call."""
  grads = clipping.per_example_grads_reference(model, params, x, y)
  out = {}
  for ord in (1, 2):
    norms = jax.vmap(functools.partial(clipping.tree_norm, ord=ord))(grads)
    clip = clip_scale * jnp.median(norms)  # some examples clipped, some not
    c = clipping.clip_factor(norms, clip) * w
    want = jax.tree_util.tree_map(functools.partial(jnp.tensordot, c, axes=1), grads)
    got, _, got_norms = clipping.per_example_clipped_grad_sum(model, params, x, y, w, clip, ord)
    out[ord] = (got, got_norms, want, norms)
  return out


@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv_ghost_norms_and_clipped_sum_equal_materialised(case):
  shape, specs = CASES[case]
  model = Model("two_convs", _TwoConvs(specs), shape, 3, ghost=True, conv=True)
  params = jax.jit(model.init)(jax.random.PRNGKey(case))
  rng = np.random.default_rng(case)
  x = jnp.asarray(rng.normal(size=(5, *shape)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, 5), jnp.int32)
  w = jnp.asarray([1, 1, 1, 1, 0], jnp.float32)
  out = jax.jit(functools.partial(_ghost_and_reference, model))(params, x, y, w, 0.5)
  for ord, (got, got_norms, want, norms) in out.items():
    np.testing.assert_allclose(got_norms[:4], norms[:4], rtol=1e-5, err_msg=f"ord {ord}")
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"ord {ord}")


def test_gram_and_explicit_branches_agree():
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.normal(size=(3, 2, 2, 72)), jnp.float32)  # T = 4, d = 72
  g = jnp.asarray(rng.normal(size=(3, 2, 2, 16)), jnp.float32)
  gram = clipping.layer_norm_parts(a, g, True, 2)  # 4 * 88 <= 72 * 16: Gram
  per_example = jnp.einsum("ntd,nto->ndo", a.reshape(3, 4, 72), g.reshape(3, 4, 16))
  want = jnp.sum(per_example ** 2, (1, 2)) + jnp.sum(jnp.sum(g, (1, 2)) ** 2, -1)
  np.testing.assert_allclose(gram, want, rtol=1e-5)


@pytest.mark.parametrize("padding", ["SAME", "VALID", ((1, 2), (0, 1))])
def test_conv_layer_matches_flax_conv_in_both_impls(padding):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 7, 6, 3))
  ref = nn.Conv(4, (3, 2), padding=padding, kernel_init=nn.initializers.normal())
  want_params = ref.init(jax.random.PRNGKey(1), x)["params"]
  p = {"params": {"kernel": want_params["kernel"], "bias": jnp.arange(4.0)}}
  want = ref.apply(p, x)
  for impl in ("conv", "im2col"):
    ours = Conv(4, (3, 2), padding, kernel_init=nn.initializers.normal(), impl=impl)
    got_params = ours.init(jax.random.PRNGKey(1), x)["params"]
    assert jax.tree_util.tree_map(jnp.shape, got_params) == jax.tree_util.tree_map(
        jnp.shape, want_params)
    np.testing.assert_allclose(ours.apply(p, x), want, rtol=1e-5, atol=1e-5)
    # The sown unfolded input times the reshaped kernel is the convolution.
    y, state = ours.apply(p, x, mutable=["intermediates"])
    (cols,) = state["intermediates"]["ghost_in"]
    np.testing.assert_allclose(cols @ p["params"]["kernel"].reshape(-1, 4) + p["params"]["bias"],
                               y, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="conv_impl"):
    Conv(4, (3, 2), impl="fft").init(jax.random.PRNGKey(1), x)


def test_clipped_per_example_gradients_never_exceed_clip():
  """For inputs of every scale, each example's clipped gradient has norm <= C."""
  model = get_model("cnn_pfl_cifar10", (8, 8, 1), 4)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)
  clip = 0.7

  @jax.jit
  def clipped_norms(x, y):
    layers, _, flat = clipping.ghost_layers(model, params, x, y, jnp.ones(6))
    grads = clipping.per_example_grads_reference(model, params, x, y)
    out = []
    for ord in (1, 2):
      c = clipping.clip_factor(clipping.ghost_norms(layers, flat, ord), clip)
      clipped = jax.tree_util.tree_map(
          lambda g, c=c: g * c.reshape((-1,) + (1,) * (g.ndim - 1)), grads)
      out.append(jax.vmap(functools.partial(clipping.tree_norm, ord=ord))(clipped))
    return out

  for scale in (1e-3, 1.0, 1e3):
    x = jnp.asarray(scale * rng.normal(size=(6, 8, 8, 1)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, 6), jnp.int32)
    for norms in clipped_norms(x, y):
      assert np.all(np.isfinite(norms))
      assert float(jnp.max(norms)) <= clip * (1 + 1e-5), (scale, norms)
