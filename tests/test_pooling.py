"""Max pooling as a reshape and a max (layers.max_pool) against flax's reduce_window."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.models import zoo
from fedjax_dp.models.layers import max_pool

# (H, W, window, padding): even and odd sizes, windows 2 and 3, floor and ceil.
CASES = [(8, 8, 2, "VALID"), (7, 5, 2, "VALID"), (7, 5, 2, "SAME"), (14, 14, 2, "SAME"),
         (9, 7, 3, "VALID"), (7, 8, 3, "SAME"), (3, 3, 1, "VALID")]


def _flax_pool(x, window, padding):
  return nn.max_pool(x, (window, window), strides=(window, window), padding=padding)


def _argmax_reference_grad(x, window, padding, cot):
  """Per-element reference: each output's cotangent goes to its window's argmax."""
  h, w = x.shape[1:3]
  pads = jax.lax.padtype_to_pads((h, w), (window,) * 2, (window,) * 2, padding)
  xp = np.pad(x, [(0, 0), *pads, (0, 0)], constant_values=-np.inf)
  g = np.zeros_like(xp)
  for b, i, j, k in np.ndindex(cot.shape):
    win = xp[b, i * window:(i + 1) * window, j * window:(j + 1) * window, k]
    a, e = np.unravel_index(np.argmax(win), win.shape)
    g[b, i * window + a, j * window + e, k] += cot[b, i, j, k]
  (hl, _), (wl, _) = pads
  return g[:, hl:hl + h, wl:wl + w, :]


@pytest.mark.parametrize("h,w,window,padding", CASES)
def test_max_pool_equals_flax_and_argmax_reference_without_ties(h, w, window, padding):
  x = np.random.default_rng(h * w + window).normal(size=(2, h, w, 3)).astype(np.float32)
  ours = max_pool(jnp.asarray(x), window, padding)
  ref = _flax_pool(jnp.asarray(x), window, padding)
  assert ours.shape == ref.shape
  np.testing.assert_array_equal(ours, ref)
  cot = np.random.default_rng(1).normal(size=ref.shape).astype(np.float32)
  grad = jax.vjp(lambda v: max_pool(v, window, padding), jnp.asarray(x))[1](cot)[0]
  flax_grad = jax.vjp(lambda v: _flax_pool(v, window, padding), jnp.asarray(x))[1](cot)[0]
  np.testing.assert_array_equal(grad, flax_grad)
  np.testing.assert_allclose(grad, _argmax_reference_grad(x, window, padding, cot), atol=1e-6)


def test_ties_go_to_the_first_maximum_as_in_flax():
  x = jnp.array([[0., 1.], [1., 1.], [2., 2.], [2., 0.]]).reshape(1, 4, 2, 1)
  ours = jax.grad(lambda v: max_pool(v, 2).sum())(x).ravel()
  theirs = jax.grad(lambda v: _flax_pool(v, 2, "VALID").sum())(x).ravel()
  np.testing.assert_array_equal(ours, [0, 1, 0, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(ours, theirs)


def test_bad_padding_is_refused():
  with pytest.raises(ValueError, match="padding"):
    max_pool(jnp.zeros((1, 4, 4, 1)), 2, "FULL")


@pytest.mark.parametrize("name,shape", [("cnn_pfl_cifar10", (12, 12, 3)),
                                        ("cnn_adpfl_mnist", (7, 7, 1))])
def test_cnn_gradients_equal_flax_pooling_despite_relu_zero_ties(name, shape, monkeypatch):
  """After a ReLU the ties are zeros from negative inputs (many with this init), whose
  ReLU derivative is 0: the model's parameter gradients equal those with flax pooling."""
  model = zoo.get_model(name, shape, 10)
  params = model.init(jax.random.PRNGKey(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (4, *shape))
  y = jnp.arange(4) % 10

  def grads():
    loss = lambda p: jnp.sum(model.per_example_loss(model.apply(p, x), y))
    return jax.jit(jax.grad(loss))(params)

  ours = grads()
  monkeypatch.setattr(zoo, "max_pool",
                      lambda v, window, padding: _flax_pool(v, window, padding))
  theirs = grads()
  for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
