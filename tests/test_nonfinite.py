"""Non-finite arithmetic (issue 19, P5).

One record with a feature of 3e38 made the clipped upload non-finite, which tells
its two neighbours apart with certainty. Clipping must return a finite vector of
norm <= C for any finite input (and map a non-finite one into the ball), in every
clip mode; the tabular loaders refuse non-finite values, naming the file and row.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedjax_dp.data import tabular
from fedjax_dp.models import get_model
from fedjax_dp.privacy import clipping
from fedjax_dp.training import client as client_lib

F32_MAX = float(np.finfo(np.float32).max)
EXTREME = st.one_of(
    st.floats(-F32_MAX, F32_MAX, width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([3e38, -3e38, F32_MAX, -F32_MAX, 1e-45, -1e-45, 1e-40, 0.0, 1.0]))
CLIP = 0.7


def _norm(tree, ord):
  leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(tree)]
  v = np.concatenate(leaves)
  return float(np.sum(np.abs(v)) if ord == 1 else np.sqrt(np.sum(v * v)))


@settings(max_examples=30, deadline=None)
@given(st.lists(EXTREME, min_size=1, max_size=12), st.sampled_from([1, 2]))
def test_clip_by_norm_finite_and_bounded(values, ord):
  """param_l2 / update_l2 / step_grad_*: any finite vector -> finite, norm <= C; a
  vector already in the ball is unchanged."""
  v = np.asarray(values, np.float32)
  tree = {"a": jnp.asarray(v[: len(v) // 2]), "b": jnp.asarray(v[len(v) // 2:])}
  out, _ = jax.jit(clipping.clip_by_norm, static_argnums=2)(tree, jnp.float32(CLIP), ord)
  flat = np.concatenate([np.asarray(out["a"]), np.asarray(out["b"])])
  assert np.all(np.isfinite(flat))
  assert _norm(out, ord) <= CLIP * (1 + 1e-5)
  if _norm(tree, ord) <= CLIP * (1 - 1e-5):  # unchanged (CPU XLA flushes denormals)
    np.testing.assert_allclose(flat, v, rtol=1e-6, atol=np.finfo(np.float32).tiny)


def test_clip_by_norm_non_finite_maps_into_the_ball():
  for bad in (np.inf, -np.inf, np.nan):
    out, _ = clipping.clip_by_norm({"w": jnp.asarray([1.0, bad, 2.0])}, jnp.float32(CLIP))
    assert np.all(np.asarray(out["w"]) == 0.0)


def _data(model, big, n=4):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n,) + model.input_shape).astype(np.float32)
  x[0].reshape(-1)[:3] = big
  y = rng.integers(0, model.num_classes, n).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(y)


MODELS = ["logistic", "mlp_784_256_10"]  # built at 8 features, 3 classes


@pytest.mark.parametrize("model_name,ghost", [("mlp_784_256_10", True),
                                              ("mlp_784_256_10", False)])
def test_per_example_clipping_finite_and_bounded(model_name, ghost):
  """per_example_l2 / l1, ghost and vmap paths: one example's clipped gradient is
  finite with norm <= C whatever its (finite) features."""
  model = get_model(model_name, (8,), 3)
  params = model.init(jax.random.PRNGKey(0))
  one = jnp.asarray([1.0, 0.0, 0.0, 0.0])
  path = (clipping._ghost_clipped_sum if ghost else
          lambda *a: clipping._vmap_clipped_sum(*a, chunk_size=2))
  fn = jax.jit(lambda x, y, ord: path(model, params, x, y, one, jnp.float32(CLIP), ord)[0],
               static_argnums=2)
  for big in (3e38, -3e38, 1e20, 1e-40):
    x, y = _data(model, big)
    for ord in (1, 2):
      total = fn(x, y, ord)
      leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(total)]
      assert all(np.all(np.isfinite(v)) for v in leaves), (big, ord)
      assert _norm(total, ord) <= CLIP * (1 + 1e-4), (big, ord, _norm(total, ord))


@pytest.mark.parametrize("model_name,placement,clip_mode", [
    ("mlp_784_256_10", "upload", "per_example_l2"), ("logistic", "step", "per_example_l2"),
    ("logistic", "upload", "update_l2"), ("mlp_784_256_10", "upload", "param_l2"),
    ("logistic", "upload", "step_grad_l2")])
def test_record_of_3e38_gives_a_finite_upload(model_name, placement, clip_mode):
  """End to end: a client holding one record with features of 3e38 uploads a finite
  model (before this fix: nan for update_l2), at both noise placements."""
  model = get_model(model_name, (8,), 3)
  params = model.init(jax.random.PRNGKey(0))
  x, y = _data(model, 3e38)
  cfg = client_lib.ClientConfig(local_steps=2, clip_mode=clip_mode,
                                noise_placement=placement)
  hp = client_lib.ClientHParams(lr=jnp.float32(0.5), clip=jnp.float32(CLIP),
                                step_noise=jnp.float32(0.1), upload_noise=jnp.float32(0.1))
  out = jax.jit(lambda p, x, y: client_lib.client_update(
      model, cfg, p, x, y, jnp.ones(4), jax.random.PRNGKey(1), hp))(params, x, y)
  assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree_util.tree_leaves(out.params))


def test_tabular_loader_refuses_non_finite(tmp_path):
  """Lending Club from data.dir: an inf feature or target is refused in one line
  naming the file and the row (a nan feature is a missing value, imputed)."""
  pd = pytest.importorskip("pandas")
  rng = np.random.default_rng(0)
  df = pd.DataFrame({"interest_rate": rng.uniform(5, 20, 30), "income": rng.normal(size=30),
                     "grade": ["A", "B", "C"] * 10})
  df.loc[4, "income"] = np.nan
  df.to_csv(tmp_path / tabular.LENDING_CLUB_CSV, index=False)
  assert np.all(np.isfinite(tabular.load_lending_club(str(tmp_path))[0]))
  df.loc[7, "income"] = np.inf
  df.to_csv(tmp_path / tabular.LENDING_CLUB_CSV, index=False)
  with pytest.raises(ValueError, match=r"loans_full_schema\.csv: row 8 holds a non-finite"):
    tabular.load_lending_club(str(tmp_path))
  with pytest.raises(ValueError, match=r"d\.csv: row 3 holds"):
    tabular.check_finite(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 1e39]]), "d.csv")


@pytest.mark.parametrize("model_name,clip_mode", [("mlp_784_256_10", "per_example_l2"),
                                                  ("logistic", "update_l2")])
def test_fused_one_step_finite_with_a_record_of_3e38(model_name, clip_mode):
  """The fused one-step round (engine default for one full-batch step) reads the
  same clipping: two clients, one holding a record of 3e38, give a finite sum."""
  from fedjax_dp.training import one_step
  model = get_model(model_name, (8,), 3)
  params = model.init(jax.random.PRNGKey(0))
  x, y = _data(model, 3e38, n=6)
  x, y = x.reshape((2, 3, 8)), y.reshape((2, 3))
  cfg = client_lib.ClientConfig(1, 0, clip_mode, "upload")
  hp = client_lib.ClientHParams(lr=jnp.full((2,), 0.5), clip=jnp.full((2,), CLIP),
                                step_noise=jnp.zeros(2), upload_noise=jnp.full((2,), 0.1))
  total, _, _ = jax.jit(lambda p: one_step.block_sum(
      model, cfg, p, x, y, jnp.ones((2, 3)), jax.random.split(jax.random.PRNGKey(1), 2), hp,
      jnp.full((2,), 0.5)))(params)
  assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree_util.tree_leaves(total))
