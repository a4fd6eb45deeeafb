"""Clipping bounds hold for every input; noise has the right distribution."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedjax_dp.models import get_model
from fedjax_dp.privacy import clipping, mechanisms

MODEL = get_model("mlp_784_32_10_linear", (3, 3, 1), 4)
PARAMS = MODEL.init(jax.random.PRNGKey(0))


@jax.jit
def _ghost(params, x, y, w, clip):
  return clipping.per_example_clipped_grad_sum(MODEL, params, x, y, w, clip, 2)


@jax.jit
def _ghost_l1(params, x, y, w, clip):
  return clipping.per_example_clipped_grad_sum(MODEL, params, x, y, w, clip, 1)


@jax.jit
def _reference_clipped_norms(params, x, y, clip):
  """Each materialised per-example gradient's norm after clipping."""
  grads = clipping.per_example_grads_reference(MODEL, params, x, y)
  norms = jax.vmap(lambda g: clipping.tree_norm(g, 2))(grads)
  return norms * clipping.clip_factor(norms, clip)


@settings(max_examples=25, deadline=None)
@given(scale=st.sampled_from([0.0, 1e-8, 1.0, 1e4, 1e8]),
       clip=st.floats(1e-4, 1e4), seed=st.integers(0, 2**16))
def test_per_example_clip_bound_holds_for_any_input(scale, clip, seed):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(7, 3, 3, 1)) * scale, jnp.float32)
  y = jnp.asarray(rng.integers(0, 4, 7), jnp.int32)
  params = jax.tree_util.tree_map(lambda p: p * (1 + scale), PARAMS)
  w = jnp.ones(7)
  for fn, ord in ((_ghost, 2), (_ghost_l1, 1)):
    total, _, norms = fn(params, x, y, w, jnp.float32(clip))
    assert np.all(np.isfinite(np.asarray(norms)))
    # The clipped sum of 7 examples has norm <= 7 C (triangle inequality) ...
    assert float(clipping.tree_norm(total, ord)) <= 7 * clip * (1 + 1e-4) + 1e-6
  # ... and each clipped per-example gradient has norm <= C.
  clipped = np.asarray(_reference_clipped_norms(params, x, y, jnp.float32(clip)))
  assert np.all(clipped <= clip * (1 + 1e-5) + 1e-12)


@settings(max_examples=40, deadline=None)
@given(scale=st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e6, 1e30]), clip=st.floats(1e-6, 1e6),
       ord=st.sampled_from([1, 2]))
def test_clip_by_norm_bound(scale, clip, ord):
  tree = {"a": jnp.full((3, 2), scale, jnp.float32), "b": jnp.full((5,), -scale, jnp.float32)}
  out, norm = clipping.clip_by_norm(tree, jnp.float32(clip), ord)
  new = float(clipping.tree_norm(out, ord))
  assert np.isfinite(new)
  assert new <= clip * (1 + 1e-5)
  if float(norm) <= clip:  # inside the ball: unchanged
    np.testing.assert_allclose(out["a"], tree["a"])


def test_ghost_matches_materialised_per_example_clipping():
  rng = np.random.default_rng(1)
  model = get_model("mlp_784_256_10", (4, 4, 1), 10)
  params = jax.jit(model.init)(jax.random.PRNGKey(3))
  x = jnp.asarray(rng.normal(size=(16, 4, 4, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, 16), jnp.int32)
  w = jnp.asarray((np.arange(16) < 13).astype(np.float32))
  plain = type(model)(**{**model.__dict__, "ghost": False})

  @jax.jit
  def ghost_and_reference(params, x, y, w):
    """Both orders' ghost results, materialised references and the vmap-over-chunks
    path, in one compiled call."""
    grads = clipping.per_example_grads_reference(model, params, x, y)
    out = {}
    for ord in (1, 2):
      norms = jax.vmap(functools.partial(clipping.tree_norm, ord=ord))(grads)
      c = clipping.clip_factor(norms, 0.3) * w
      want = jax.tree_util.tree_map(functools.partial(jnp.tensordot, c, axes=1), grads)
      got, _, got_norms = clipping.per_example_clipped_grad_sum(model, params, x, y, w, 0.3,
                                                                ord)
      # The vmap-over-chunks path (used for models without ghost clipping).
      got2, _, _ = clipping.per_example_clipped_grad_sum(plain, params, x, y, w, 0.3, ord, 5)
      out[ord] = (got, got_norms, want, norms, got2)
    return out

  for ord, (got, got_norms, want, norms, got2) in ghost_and_reference(params, x, y, w).items():
    np.testing.assert_allclose(np.asarray(got_norms)[:13], np.asarray(norms)[:13], rtol=1e-4,
                               err_msg=f"ord {ord}")
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"ord {ord}")
    for a, b in zip(jax.tree_util.tree_leaves(got2), jax.tree_util.tree_leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"ord {ord}")


@pytest.mark.parametrize("mechanism,scale", [("gaussian", 0.7), ("laplace", 0.4),
                                             ("gaussian", 3.0)])
def test_noise_distribution_ks(mechanism, scale):
  tree = {"w": jnp.zeros((200, 100)), "b": jnp.zeros((1000,))}
  noise = mechanisms.noise_like(jax.random.PRNGKey(42), tree, jnp.float32(scale), mechanism)
  sample = np.concatenate([np.ravel(v) for v in jax.tree_util.tree_leaves(noise)])
  dist = stats.norm(scale=scale) if mechanism == "gaussian" else stats.laplace(scale=scale)
  assert stats.kstest(sample, dist.cdf).pvalue > 1e-3
  assert abs(sample.mean()) < 5 * dist.std() / np.sqrt(sample.size)
  np.testing.assert_allclose(sample.std(), dist.std(), rtol=0.02)
  # Leaves get independent streams.
  assert abs(np.corrcoef(np.ravel(noise["w"])[:1000], noise["b"])[0, 1]) < 0.1


def test_zero_scale_is_exactly_zero_and_unknown_mechanism_errors():
  tree = {"w": jnp.ones((3,))}
  out = mechanisms.add_noise(jax.random.PRNGKey(0), tree, 0.0, "gaussian")
  np.testing.assert_array_equal(out["w"], tree["w"])
  with pytest.raises(ValueError, match="privacy.mechanism"):
    mechanisms.noise_like(jax.random.PRNGKey(0), tree, 1.0, "cauchy")
