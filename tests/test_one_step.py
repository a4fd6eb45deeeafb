"""One full-batch step trained as one weighted batch equals the per-client path."""

import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import toy_federated

from fedjax_dp.models import get_model
from fedjax_dp.privacy import clip_modes
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine, one_step

SHAPE, CLASSES = (4, 4, 1), 3


def _data():
  # Unequal client sizes 6-12, padded to 14 (padding inside every client).
  return toy_federated(9, 12, SHAPE, CLASSES, 0, n_max=14)


def _args(lanes=None):
  idx = [8, 1, 4, 0, 6, 1, 1]
  args = engine.RoundArgs(
      idx=jnp.asarray(idx, jnp.int32), sel_mask=jnp.asarray([1, 1, 1, 1, 1, 0, 0], jnp.float32),
      lr=jnp.asarray([0.7], jnp.float32), clip=jnp.float32(0.9),
      noise=jnp.linspace(0.01, 0.2, len(idx), dtype=jnp.float32),
      central_noise=jnp.float32(0.05), server_lr=jnp.float32(0.9), round=jnp.int32(2),
      seed=jnp.uint32(7))
  if lanes is None:
    return args
  # L points of one cohort: different lr, clip and noise per lane.
  def per_lane(a):
    a = jnp.asarray(a)
    scaled = jnp.issubdtype(a.dtype, jnp.floating) and a.ndim <= 1 and a is not args.sel_mask
    return jnp.stack([a * (1.0 + 0.5 * i) if scaled else a for i in range(lanes)])
  return args._replace(sel_mask=jnp.stack([args.sel_mask] * lanes),
                       **{f: per_lane(getattr(args, f)) for f in args._fields
                          if f != "sel_mask" and getattr(args, f) is not None})


def _assert_close(got, want):
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


# The logistic model's fused hooks (every registered one, both chunk paths) are checked
# by test_every_fused_hook_equals_the_vmapped_reference; these cases add the other
# model families: hidden layers, the hinge loss with l2_reg, aggregated upload noise,
# a CNN.
CASES = [
    ("mlp_784_256_10", client_lib.ClientConfig(1, 0, "update_l2", "none"), False),
    ("mlp_784_256_10", client_lib.ClientConfig(1, 0, "per_example_l2", "upload"), False),
    ("linear_svm", client_lib.ClientConfig(1, 0, "per_example_l2", "upload", l2_reg=0.1), True),
    ("linear_svm", client_lib.ClientConfig(1, 0, "none", "none", l2_reg=0.1), False),
    # CNNs: ghost Conv layers fuse too (rows = every example's output positions).
    ("cnn_wei_cifar10", client_lib.ClientConfig(1, 0, "update_l2", "upload"), False),
]


def _fused_and_reference(model, cfg, params, data, args):
  """The fused round and the per-client one (``fuse_one_step=False``)."""
  want = engine.make_round_fn(model, dataclasses.replace(cfg, fuse_one_step=False))(
      params, data, args)
  return engine.make_round_fn(model, cfg)(params, data, args), want


# Each case runs at one chunk size, alternating between 0 (the whole cohort in one
# block) and 3 (blocks with a padded remainder): both paths meet several cases each,
# at half the compiles of every case at both.
@pytest.mark.parametrize("name,ccfg,aggregate,chunk",
                         [(*case, (0, 3)[i % 2]) for i, case in enumerate(CASES)])
def test_fused_round_equals_per_client_round(name, ccfg, aggregate, chunk):
  model = get_model(name, SHAPE, CLASSES)
  assert one_step.fusable(model, ccfg)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = engine.RoundConfig(ccfg, client_chunk=chunk, aggregate_upload_noise=aggregate)
  _assert_close(*_fused_and_reference(model, cfg, params, _data(), _args()))


def _fused_modes():
  """Every registered clip mode with a fused one-step hook, at each noise placement the
  fused path takes that the mode's proof allows (or none), alternately at chunk sizes
  0 and 3."""
  out = []
  for name, mode in clip_modes.CLIP_MODES.items():
    if mode.client.fused is None:
      continue
    placements = [p for p in ("upload", "central") if p in mode.proof.placements]
    out += [(name, p) for p in placements or ["none"]]
  return [(*mode, (0, 3)[i % 2]) for i, mode in enumerate(out)]


@pytest.mark.parametrize("clip_mode,placement,chunk", _fused_modes())
def test_every_fused_hook_equals_the_vmapped_reference(clip_mode, placement, chunk):
  """The registry decides the fused path: each mode's hook (``ClipMode.client.fused``)
  against ``vmap(client_update)``, the reference, with unequal clients, padding and a
  clip that binds for some."""
  model = get_model("logistic", SHAPE, CLASSES)
  # L1 clipping with the Laplace mechanism it is calibrated for (Fu et al.).
  ccfg = client_lib.ClientConfig(1, 0, clip_mode, placement,
                                 "laplace" if clip_mode.endswith("_l1") else "gaussian")
  assert one_step.fusable(model, ccfg)
  params = jax.jit(model.init)(jax.random.PRNGKey(1))
  cfg = engine.RoundConfig(ccfg, client_chunk=chunk)
  args = _args()._replace(clip=jnp.float32(0.3))
  _assert_close(*_fused_and_reference(model, cfg, params, _data(), args))


def test_update_clipping_binds_and_lanes_agree():
  """Some clients are clipped, some not; L lanes of one cohort equal L single rounds."""
  model = get_model("logistic", SHAPE, CLASSES)
  ccfg = client_lib.ClientConfig(1, 0, "update_l2", "upload")
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _data()
  x, y, m = data.x[:5], data.y[:5], data.mask[:5]
  norms = jax.jit(jax.vmap(lambda xi, yi, mi: client_lib.clipping.tree_norm(
      jax.tree_util.tree_map(jnp.subtract, client_lib.client_update(
          model, dataclasses.replace(ccfg, clip_mode="none", noise_placement="none"), params,
          xi, yi, mi, jax.random.PRNGKey(0),
          client_lib.ClientHParams(jnp.full((1,), 0.7), 1.0, 0.0, 0.0)).params, params))))(
              x, y, m)
  assert np.min(norms) < 0.9 < np.max(norms)  # lane 0's clip binds for some clients only
  cfg = engine.RoundConfig(ccfg, client_chunk=3)
  lanes = _args(lanes=3)
  many = jax.tree_util.tree_map(lambda a: jnp.stack([a] * 3), params)
  got, gm = jax.jit(lambda p, d, a: engine.cohort_step(model, cfg, p, d, a, jnp.ones(3, bool)))(
      many, data, lanes)
  ref = jax.jit(lambda p, d, a: engine.round_step(
      model, dataclasses.replace(cfg, fuse_one_step=False), p, d, a))
  for i in range(3):
    lane = operator.itemgetter(i)
    want, wm = ref(params, data, jax.tree_util.tree_map(lane, lanes))
    _assert_close(jax.tree_util.tree_map(lane, (got, gm)), (want, wm))


@pytest.mark.parametrize("ccfg", [
    client_lib.ClientConfig(2, 0, "update_l2", "central"),
    client_lib.ClientConfig(1, 4, "update_l2", "central"),
    client_lib.ClientConfig(1, 0, "param_l2", "upload"),
    client_lib.ClientConfig(1, 0, "per_example_l2", "step"),
    client_lib.ClientConfig(1, 0, "update_l2", "central", l2_reg=0.1),
])
def test_not_fusable(ccfg):
  model = get_model("logistic", SHAPE, CLASSES)
  assert not one_step.fusable(model, ccfg)
  with pytest.raises(ValueError, match="does not apply"):
    one_step.block_sum(model, ccfg, None, None, None, jnp.ones((2, 3)), None, None, None)


@pytest.fixture(scope="module")
def explicit():
  """Wei's MNIST shape in miniature (n > d) and its per-client round (the reference
  of both chunk sizes below, computed once)."""
  shape, clip = (2, 2, 1), 1.5
  model = get_model("mlp_784_256_10", shape, CLASSES)
  n_max = 48
  # Every layer takes the explicit branch of one_step's flop rule.
  for d, o in ((4, 256), (256, CLASSES)):
    assert n_max * (d + o) > 2 * d * o
  data = toy_federated(9, 40, shape, CLASSES, 1, n_max=n_max)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  ccfg = client_lib.ClientConfig(1, 0, "update_l2", "central")
  args = _args()._replace(clip=jnp.float32(clip))
  want = engine.make_round_fn(model, engine.RoundConfig(ccfg, fuse_one_step=False))(
      params, data, args)
  return model, data, params, ccfg, args, clip, want


@pytest.mark.parametrize("chunk", [1, 4])  # one client per block (a plain dot), or several
def test_update_clipping_with_explicit_client_gradients(explicit, chunk):
  """n > d: every layer forms the clients' [d, o] gradients explicitly (Wei's MNIST
  shape, n = 800 > d = 784) and sums them scaled; equals the per-client path, with
  central noise, unequal client sizes, padding and a clip that binds for some."""
  model, data, params, ccfg, args, clip, want = explicit
  got = engine.make_round_fn(model, engine.RoundConfig(ccfg, client_chunk=chunk))(
      params, data, args)
  _assert_close(got, want)
  if chunk > 1:
    return

  # Each client alone through block_sum (weight 1, no noise): its update's norm is
  # min(raw norm, C), and the clip binds for some clients only.
  x, y, m = data.x[:6], data.y[:6], data.mask[:6]
  hp = client_lib.ClientHParams(jnp.full((1,), 0.7), jnp.float32(clip), 0.0, 0.0)
  quiet = dataclasses.replace(ccfg, noise_placement="none")

  def norms(c, xi, yi, mi):
    raw = client_lib.client_update(model, dataclasses.replace(c, clip_mode="none"), params, xi,
                                   yi, mi, jax.random.PRNGKey(0), hp).params
    total, _, _ = one_step.block_sum(
        model, c, params, xi[None], yi[None], mi[None], jax.random.PRNGKey(0)[None],
        jax.tree_util.tree_map(lambda a: jnp.reshape(a, (1,) + jnp.shape(a)), hp), jnp.ones(1))
    diff = lambda a: client_lib.clipping.tree_norm(jax.tree_util.tree_map(jnp.subtract, a, params))
    return diff(raw), diff(total)

  raw, clipped = jax.jit(jax.vmap(lambda *a: norms(quiet, *a)))(x, y, m)
  assert np.min(raw) < clip < np.max(raw)
  np.testing.assert_allclose(clipped, np.minimum(raw, clip), rtol=1e-4)
