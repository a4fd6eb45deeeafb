"""CNN rounds with convolutions as im2col matmuls equal the per-client reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import toy_federated

from fedjax_dp.models import get_model
from fedjax_dp.models.zoo import with_conv_impl
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

SHAPE, CLASSES = (6, 6, 1), 3
# The paper CNNs the rounds run: pfl's (two stacked 3x3 convolutions, a hidden dense
# layer) and Wei's (one padded 5x5 convolution and max-pooling, here on three input
# channels), which compiles in half the time.
PFL, WEI = ("cnn_pfl_cifar10", SHAPE), ("cnn_wei_cifar10", (6, 6, 3))
# pfl's per-example round and its lanes share a reference (one compiled client update).
PER_EXAMPLE_STEP = client_lib.ClientConfig(2, 4, "per_example_l2", "step")


def _args(noise, steps, lanes=None):
  args = engine.RoundArgs(
      idx=jnp.asarray([4, 1, 2, 2, 0], jnp.int32),
      sel_mask=jnp.asarray([1, 1, 1, 0, 1], jnp.float32),
      lr=jnp.full((steps,), 0.3, jnp.float32), clip=jnp.float32(0.5),
      noise=jnp.asarray(noise, jnp.float32), central_noise=jnp.float32(0.05),
      server_lr=jnp.float32(1.0), round=jnp.int32(3), seed=jnp.uint32(11))
  if lanes is None:
    return args
  # L points of one cohort, with different lr, clip and noise scales per lane.
  scale = jnp.arange(1.0, lanes + 1.0)
  return args._replace(
      idx=jnp.stack([args.idx] * lanes), sel_mask=jnp.stack([args.sel_mask] * lanes),
      lr=scale[:, None] * args.lr, clip=scale * args.clip, noise=scale[:, None] * args.noise,
      central_noise=scale * args.central_noise, server_lr=jnp.ones(lanes),
      round=jnp.full(lanes, 3, jnp.int32), seed=jnp.full(lanes, 11, jnp.uint32),
      data_id=jnp.zeros(lanes, jnp.int32), stream=jnp.zeros(lanes, jnp.int32))


# One client's update with XLA convolutions (the model's own conv_impl), compiled once
# per (model, config) and called per client.
_client_update = jax.jit(client_lib.client_update, static_argnums=(0, 1))


def _setup(model_shape):
  name, shape = model_shape
  data = toy_federated(6, 10, shape, CLASSES, 0, n_max=12)
  model = get_model(name, shape, CLASSES)
  return model, jax.jit(model.init)(jax.random.PRNGKey(0)), data


def _reference_round(model, ccfg, params, data, args):
  """A Python loop over the selected clients with XLA convolutions, then the weighted
  mean and the server's central noise: the engine's per-client semantics."""
  outs, counts = [], []
  for k, i in enumerate(np.asarray(args.idx)):
    if float(args.sel_mask[k]) == 0:
      continue
    key = engine.client_keys(args.seed, args.round, jnp.asarray([i]))[0]
    hp = client_lib.ClientHParams(args.lr, args.clip, args.noise[k], args.noise[k])
    out = _client_update(model, ccfg, params, data.x[i], data.y[i], data.mask[i], key, hp)
    outs.append(jax.device_get(out.params))
    counts.append(float(data.counts[i]))
  # The weighted mean in float32 NumPy (as jnp would, without compiling each small op).
  w = (np.asarray(counts) / np.sum(counts)).astype(np.float32)
  agg = jax.tree_util.tree_map(lambda *ps: sum(wi * p for wi, p in zip(w, ps)), *outs)
  if ccfg.noise_placement == "central":
    from fedjax_dp.privacy import mechanisms
    agg = mechanisms.add_noise(engine.server_key(args.seed, args.round), agg,
                               args.central_noise, ccfg.mechanism)
  return agg


def _close(got, want):
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=3e-5, atol=3e-6)


# Every clipping mode and noise placement; minibatches and full batches; padded
# clients (sizes 5-10 in slots of 12) and a padding slot; chunks that do not divide K
# (here and in the lanes test); multi-step rounds (the scan of local steps).
CASES = [
    (PFL, PER_EXAMPLE_STEP, 0),
    (WEI, client_lib.ClientConfig(2, 0, "per_example_l1", "upload", "laplace"), 0),
    (WEI, client_lib.ClientConfig(2, 3, "param_l2", "upload"), 0),
    (WEI, client_lib.ClientConfig(2, 4, "update_l2", "central"), 2),
    (PFL, client_lib.ClientConfig(1, 0, "none", "none"), 0),
]


@pytest.mark.parametrize("model_shape,ccfg,chunk", CASES)
def test_im2col_round_equals_per_client_conv_reference(model_shape, ccfg, chunk):
  model, params, data = _setup(model_shape)
  assert model.module.conv_impl == "conv"  # the reference's; the round's is im2col
  cfg = engine.RoundConfig(ccfg, client_chunk=chunk, conv_impl="im2col", fuse_one_step=False)
  args = _args([0.05, 0.1, 0.02, 0.3, 0.07], ccfg.local_steps)
  got, metrics = engine.make_round_fn(model, cfg)(params, data, args)
  _close(got, _reference_round(model, ccfg, params, data, args))
  assert float(metrics.num_selected) == 4


def test_im2col_lanes_equal_single_points():
  model, params, data = _setup(PFL)
  ccfg = PER_EXAMPLE_STEP
  lanes = _args([0.05, 0.1, 0.02, 0.3, 0.07], 2, lanes=2)
  cfg = engine.RoundConfig(ccfg, client_chunk=2, conv_impl="im2col")
  many = jax.tree_util.tree_map(lambda a: jnp.stack([a] * 2), params)
  got, _ = jax.jit(lambda p, d, a: engine.cohort_step(model, cfg, p, d, a, jnp.ones(2, bool)))(
      many, data, lanes)
  for i in range(2):
    lane = jax.tree_util.tree_map(lambda a, i=i: a[i], lanes)
    _close(jax.tree_util.tree_map(lambda a, i=i: a[i], got),
           _reference_round(model, ccfg, params, data, lane))


def test_conv_impl_choice_and_validation():
  assert engine.conv_impl_for(engine.RoundConfig(), "cpu") == "im2col"
  assert engine.conv_impl_for(engine.RoundConfig(), "gpu") == "im2col"
  assert engine.conv_impl_for(engine.RoundConfig(), "tpu") == "conv"
  assert engine.conv_impl_for(engine.RoundConfig(conv_impl="conv"), "cpu") == "conv"
  with pytest.raises(ValueError, match="server.conv_impl"):
    engine.RoundConfig(conv_impl="winograd")
  mlp = get_model("logistic", SHAPE, CLASSES)
  assert with_conv_impl(mlp, "im2col") is mlp
  cnn = get_model("cnn_yuan", (16, 16, 1), CLASSES)
  assert with_conv_impl(cnn, "im2col").module.conv_impl == "im2col"
  assert with_conv_impl(cnn, "conv") is cnn
