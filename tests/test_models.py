"""Tests of the model zoo: shapes, parameter counts, ghost eligibility, losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.models import MODELS, get_model, zoo
from fedjax_dp.models.layers import GHOST_IN

# name -> [(input_shape, num_classes, exact parameter count)]. The first entry is
# the shape of the model's paper; every count must also appear in the docstring.
EXPECTED = {
    "linear_regression": [((10,), 0, 11)],  # Fu et al.: 10 PCA features + bias
    "linear_svm": [((28, 28, 1), 10, 7_850), ((28, 28, 1), 2, 1_570)],
    "logistic": [((28, 28, 1), 10, 7_850)],
    "mlp_784_256_10": [((28, 28, 1), 10, 203_530)],
    "mlp_784_32_10_linear": [((28, 28, 1), 10, 25_450)],
    "cnn_wei_cifar10": [((32, 32, 3), 10, 106_122), ((28, 28, 1), 10, 82_762)],
    "cnn_fu_femnist": [((28, 28, 1), 62, 214_590)],
    "cnn_adpfl_mnist": [((28, 28, 1), 10, 3_274_634), ((32, 32, 3), 10, 4_259_274)],
    "cnn_adpfl_literal": [((28, 28, 1), 10, 6_434_634), ((32, 32, 3), 10, 8_402_314)],
    "cnn_yuan": [((32, 32, 3), 10, 62_006), ((28, 28, 1), 10, 44_426)],
    "cnn_pfl_cifar10": [((32, 32, 3), 10, 1_626_442)],
}
MLPS = ("linear_svm", "logistic", "mlp_784_256_10", "mlp_784_32_10_linear")
# The smallest square input each CNN accepts (stated in the docstrings).
MIN_SIDE = {"cnn_wei_cifar10": 1, "cnn_fu_femnist": 4, "cnn_adpfl_mnist": 1,
            "cnn_adpfl_literal": 1, "cnn_yuan": 16, "cnn_pfl_cifar10": 6}


def _paper_model(name):
  shape, classes, _ = EXPECTED[name][0]
  return get_model(name, shape, classes)


def _np_params(model, seed=0):
  """Random params of the model's shapes, drawn with numpy.

  The structure comes from ``eval_shape`` (tracing only), so tests that need
  params but not ``Model.init`` itself skip compiling the PRNG for every leaf,
  which dominates the runtime of these small models on CPU.
  """
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape) / np.sqrt(max(s.shape[0], 1)), s.dtype),
      shapes)


def test_every_registered_model_has_an_expected_count():
  assert set(EXPECTED) == set(MODELS)
  assert set(MIN_SIDE) == {n for n in MODELS if n.startswith("cnn_")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_init_apply_shapes_and_finite(name):
  model = _paper_model(name)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  x = jax.random.uniform(jax.random.PRNGKey(1), (3, *model.input_shape))
  logits = jax.jit(model.apply)(params, x)
  assert logits.shape == (3, model.num_classes)
  assert logits.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(logits)))
  # Different examples get different logits (the network is not degenerate); the
  # linear regressor starts at zero (Fu spec A10), so it is checked after one change.
  if model.is_regression:
    params = jax.tree_util.tree_map(lambda p: p + 0.1, params)
    logits = model.apply(params, x)
  assert not np.allclose(logits[0], logits[1])


@pytest.mark.parametrize("name,shape,classes,count",
                         [(n, s, c, k) for n, rows in sorted(EXPECTED.items()) for s, c, k in rows])
def test_num_params_exact_and_documented(name, shape, classes, count):
  model = get_model(name, shape, classes)
  assert model.num_params() == count
  # The count also equals the sum over the actual initialised leaves.
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  assert sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params)) == count
  if classes == 10 or name.startswith("cnn_"):  # the binary SVM count is not documented
    doc = zoo.MLP.__doc__ if name in MLPS else MODELS[name].__doc__
    assert f"{count:,}" in doc, f"{name}: {count:,} missing from its docstring"


def _param_modules(params):
  """Paths (tuples of module names) of the modules that own params, and leaf names."""
  modules, leaves = set(), set()
  for path, _ in jax.tree_util.tree_leaves_with_path(params):
    keys = tuple(k.key for k in path)
    modules.add(keys[:-1])
    leaves.add(keys[-1])
  return modules, leaves


def _ghost_dense_modules(model, params):
  """Paths of the modules that sow ``ghost_in``: ``layers.Dense`` and ``layers.Conv``."""
  x = jnp.zeros((2, *model.input_shape))
  # Only the structure matters, so trace without running.
  _, state = jax.eval_shape(
      lambda p: model.module.apply({"params": p}, x, mutable=["intermediates"]), params)
  return {tuple(k.key for k in path[:-2])
          for path, _ in jax.tree_util.tree_leaves_with_path(state["intermediates"])
          if path[-2].key == GHOST_IN}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ghost_flag_matches_dense_only_params(name):
  model = _paper_model(name)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  modules, leaves = _param_modules(params)
  dense = _ghost_dense_modules(model, params)
  # Every ghost layer owns params, and ghost is True exactly when nothing else does.
  assert dense <= modules and dense
  assert model.ghost == (modules == dense)
  if model.ghost:
    assert leaves <= {"kernel", "bias"}
    for module in modules:
      assert set(params[module[0]]) <= {"kernel", "bias"}


def test_every_model_is_ghost_and_cnns_are_marked_conv():
  for name in MODELS:
    model = _paper_model(name)
    assert model.ghost, name
    assert model.conv == (name not in MLPS and name != "linear_regression"), name


@pytest.mark.parametrize("name", sorted(MIN_SIDE))
def test_cnn_small_inputs_work_or_fail_clearly(name):
  if MIN_SIDE[name] <= 8:
    model = get_model(name, (8, 8, 1), 10)
    params = _np_params(model)
    assert model.apply(params, jnp.ones((2, 8, 8, 1))).shape == (2, 10)
    # Grayscale input without a channel axis is accepted too.
    assert model.apply(params, jnp.ones((2, 8, 8))).shape == (2, 10)
  else:
    with pytest.raises(ValueError, match=f"too small.*>= {MIN_SIDE[name]}"):
      get_model(name, (8, 8, 1), 10)
  side = MIN_SIDE[name]
  assert get_model(name, (side, side, 1), 10).num_params() > 0
  if side > 1:
    with pytest.raises(ValueError, match=f"{name}.*too small"):
      get_model(name, (side - 1, side - 1, 1), 10)


def test_cnn_apply_on_too_small_input_raises_clearly():
  model = get_model("cnn_yuan", (32, 32, 3), 10)
  params = _np_params(model)
  with pytest.raises(ValueError, match="too small"):
    model.apply(params, jnp.ones((1, 8, 8, 3)))


def test_cnn_rejects_flat_input_shape():
  with pytest.raises(ValueError, match=r"\(H, W, C\)"):
    get_model("cnn_fu_femnist", (784,), 62)


def test_cnn_per_example_gradients():
  # Materialised per-example gradients (the reference of the ghost-norm tests).
  model = get_model("cnn_yuan", (16, 16, 1), 10)
  params = _np_params(model)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 16, 16, 1))
  y = jnp.arange(4)

  def loss(p, xi, yi):
    return model.per_example_loss(model.apply(p, xi[None]), yi[None])[0]

  grads = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(params, x, y)
  for g, p in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(params)):
    assert g.shape == (4, *p.shape)
    assert np.all(np.isfinite(np.asarray(g)))


def _np_log_softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _np_hinge(logits, labels):
  out = np.zeros(len(labels))
  for i, (s, y) in enumerate(zip(logits, labels)):
    others = max(s[j] for j in range(len(s)) if j != y)
    out[i] = max(0.0, 1.0 + others - s[y])
  return out


def test_cross_entropy_matches_manual_log_softmax():
  model = _paper_model("logistic")
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(7, 10)).astype(np.float32) * 3
  labels = rng.integers(0, 10, size=7)
  got = model.per_example_loss(jnp.asarray(logits), jnp.asarray(labels))
  want = -_np_log_softmax(logits.astype(np.float64))[np.arange(7), labels]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_classes", [2, 5])
def test_multiclass_hinge_matches_numpy(num_classes):
  model = get_model("linear_svm", (6,), num_classes)
  assert model.loss_name == "hinge"
  rng = np.random.default_rng(num_classes)
  logits = rng.normal(size=(50, num_classes)).astype(np.float32)
  labels = rng.integers(0, num_classes, size=50)
  got = np.asarray(model.per_example_loss(jnp.asarray(logits), jnp.asarray(labels)))
  np.testing.assert_allclose(got, _np_hinge(logits, labels), rtol=1e-6, atol=1e-6)
  assert np.any(got == 0) and np.any(got > 0)  # both sides of the hinge are exercised
  if num_classes == 2:
    # The binary hinge max(0, 1 - y' (s_1 - s_0)), y' = +-1.
    sign = 2.0 * labels - 1.0
    binary = np.maximum(0.0, 1.0 - sign * (logits[:, 1] - logits[:, 0]))
    np.testing.assert_allclose(got, binary, rtol=1e-6, atol=1e-6)


def test_get_model_unknown_name():
  with pytest.raises(ValueError, match="model.name") as info:
    get_model("resnet_9000", (28, 28, 1), 10)
  for known in MODELS:
    assert known in str(info.value)


def test_get_model_rejects_bad_num_classes():
  with pytest.raises(ValueError, match="num_classes"):
    get_model("logistic", (28, 28, 1), 1)
