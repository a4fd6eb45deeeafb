"""Client and server optimizers (fedjax_dp.optimizers): each equals optax applied by
hand, sgd and fedavg are the arithmetic of before bit for bit, the server state is
carried per lane and checkpointed, and the fused one-step path is used only where
it is exact."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import toy_federated

from fedjax_dp import optimizers
from fedjax_dp.models import get_model
from fedjax_dp.privacy import clip_modes
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine, one_step, rounds

SHAPE, CLASSES = (4, 4, 1), 3


def _model():
  return get_model("logistic", SHAPE, CLASSES)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _assert_close(got, want, rtol=2e-5, atol=2e-6):
  for a, b in zip(_leaves(got), _leaves(want)):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ the records
def test_registries_build_directions_without_learning_rate():
  g = {"w": jnp.array([1.0, -2.0])}
  for registry in (optimizers.CLIENT_OPTIMIZERS, optimizers.SERVER_OPTIMIZERS):
    for name, opt in registry.items():
      assert opt.name == name and opt.summary
      tx = opt.direction()
      d, _ = tx.update(g, tx.init(g), g)
      assert jax.tree_util.tree_structure(d) == jax.tree_util.tree_structure(g)
  # A record is hashable and equal to its copy (part of the compiled round's key).
  a = optimizers.client_optimizer({"optimizer": "momentum", "momentum": 0.5})
  b = optimizers.client_optimizer({"optimizer": "momentum", "momentum": 0.5})
  assert a == b and hash(a) == hash(b) and dict(a.hparams) == {"momentum": 0.5}
  assert a != optimizers.client_optimizer({"optimizer": "momentum", "momentum": 0.6})
  with pytest.raises(ValueError, match="server.optimizer: unknown 'adagrad'"):
    optimizers.server_optimizer({"optimizer": "adagrad"})
  # Each record's `stateful` says whether its direction has state (fedavg's carried
  # structure is the bare model); its init gives None then.
  for registry in (optimizers.CLIENT_OPTIMIZERS, optimizers.SERVER_OPTIMIZERS):
    for opt in registry.values():
      assert opt.stateful == bool(jax.tree_util.tree_leaves(opt.direction().init(g))), opt.name
      assert (opt.init(g) is None) == (not opt.stateful)
  assert not optimizers.FEDAVG.stateful and optimizers.FEDADAM.stateful
  user = optimizers.from_transformation(optax.sgd(0.1))
  assert user.own_lr and user.stateful and user.step_weights_fn is None
  assert not optimizers.SGD.own_lr


def test_step_weights():
  lrs = np.array([0.5, 0.25, 0.125])
  assert optimizers.SGD.step_weights(lrs) is lrs  # the same numbers, the same float ops
  mom = optimizers.MOMENTUM.with_values({"momentum": 0.5})
  np.testing.assert_allclose(mom.step_weights(lrs),
                             [0.5 + 0.5 * 0.25 + 0.25 * 0.125, 0.25 + 0.5 * 0.125, 0.125])
  np.testing.assert_array_equal(
      optimizers.MOMENTUM.with_values({"momentum": 0.0}).step_weights(lrs), lrs)
  assert optimizers.ADAM.step_weights(lrs) is None and optimizers.ADAM.step_weights_fn is None
  user = optimizers.from_transformation(optax.sgd(0.1))
  assert user.own_lr and user.step_weights(lrs) is None
  with pytest.raises(TypeError, match="GradientTransformation"):
    optimizers.from_transformation(lambda g: g)


def test_heavy_ball_weights_are_the_upload_of_a_linear_model_run():
  """The upload of E momentum steps on gradients fixed in advance is w_1 - sum_j A_j g_j."""
  rng = np.random.default_rng(0)
  lrs, beta = rng.uniform(0.1, 1.0, 5), 0.7
  grads = rng.normal(size=(5, 3))
  tx = optax.trace(beta)
  w, st = np.zeros(3), tx.init(jnp.zeros(3))
  for s in range(5):
    d, st = tx.update(jnp.asarray(grads[s]), st)
    w = w - lrs[s] * np.asarray(d, np.float64)
  a = optimizers.heavy_ball_weights(lrs, beta)
  np.testing.assert_allclose(w, -(a[:, None] * grads).sum(0), rtol=1e-5)


# ------------------------------------------------------------------ the client
def _client_cfg(opt, steps=3, **kw):
  kw.setdefault("clip_mode", "per_example_l2")
  return client_lib.ClientConfig(local_steps=steps, optimizer=opt, **kw)


def _hand_client(model, mode_name, params, x, y, mask, tx, steps, clip):
  """One client's local steps by hand: the clip mode's clipped mean gradient, then
  ``optax`` (learning rate inside, updates added). A Python loop over the steps,
  jitted as a whole (and called once per client) by the test."""
  mode = clip_modes.get(mode_name)
  denom = jnp.maximum(jnp.sum(mask), 1.0)
  state = tx.init(params)
  for _ in range(steps):
    gsum, _, _ = mode.client.grad(model, params, x, y, mask, clip, denom, 64)
    g = jax.tree_util.tree_map(lambda v: v / denom, gsum)
    u, state = tx.update(g, state, params)
    params = optax.apply_updates(params, u)
  return params


@pytest.mark.parametrize("name,opt,tx", [
    ("momentum", optimizers.MOMENTUM.with_values({"momentum": 0.8}),
     optax.sgd(0.3, momentum=0.8)),
    ("adam", optimizers.ADAM.with_values({"beta1": 0.8, "beta2": 0.99, "eps": 1e-6}),
     optax.adam(0.3, b1=0.8, b2=0.99, eps=1e-6)),
    ("user", optimizers.from_transformation(optax.adamw(0.05, weight_decay=0.1)),
     optax.adamw(0.05, weight_decay=0.1)),
])
def test_vmapped_client_equals_a_hand_loop_with_optax(name, opt, tx):
  model, data = _model(), toy_federated(3, 12, SHAPE, CLASSES, 1)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = _client_cfg(opt, steps=3)
  lr = 1.0 if opt.own_lr else 0.3
  hp = client_lib.ClientHParams(lr=jnp.full((3, 3), lr), clip=jnp.full((3,), 0.8),
                                step_noise=jnp.zeros(3), upload_noise=jnp.zeros(3))
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(3), i))(jnp.arange(3))
  out = jax.jit(jax.vmap(lambda x, y, m, k, h: client_lib.client_update(
      model, cfg, params, x, y, m, k, h)))(data.x, data.y, data.mask, keys, hp)
  # The hand loop, compiled once and called per client (eager, every small op of
  # every step and client compiled on its own).
  hand = jax.jit(lambda x, y, m: _hand_client(model, "per_example_l2", params, x, y, m,
                                              tx, 3, 0.8))
  for i in range(3):
    want = hand(data.x[i], data.y[i], data.mask[i])
    _assert_close(jax.tree_util.tree_map(lambda a, i=i: a[i], out.params), want)


def _old_client_update(model, cfg, global_params, x, y, mask, key, hp):
  """client_update as written before the optimizers (full batch, no noise)."""
  lr = jnp.broadcast_to(jnp.asarray(hp.lr, jnp.float32), (cfg.local_steps,))
  mode = clip_modes.get(cfg.clip_mode)

  def step(params, lr_s):
    denom = jnp.maximum(jnp.sum(mask), 1.0)
    gsum, _, _ = mode.client.grad(model, params, x, y, mask, hp.clip, denom, cfg.chunk_size)
    new = jax.tree_util.tree_map(lambda p, g: p - lr_s * (g / denom + cfg.l2_reg * p),
                                 params, gsum)
    return mode.client.after_step(new, hp.clip), None

  params, _ = jax.lax.scan(step, global_params, lr, unroll=cfg.local_steps)
  return mode.client.after_local(params, global_params, hp.clip)[0]


def test_sgd_client_is_bit_identical_to_the_step_of_before():
  model, data = _model(), toy_federated(2, 12, SHAPE, CLASSES, 2)
  params = jax.jit(model.init)(jax.random.PRNGKey(1))
  cfg = _client_cfg(optimizers.SGD, steps=3, l2_reg=0.05)
  hp = client_lib.ClientHParams(lr=jnp.array([0.5, 0.3, 0.2]), clip=jnp.float32(0.7),
                                step_noise=jnp.float32(0), upload_noise=jnp.float32(0))
  args = (data.x[0], data.y[0], data.mask[0], jax.random.PRNGKey(0), hp)
  got = jax.jit(lambda *a: client_lib.client_update(model, cfg, params, *a).params)(*args)
  want = jax.jit(lambda *a: _old_client_update(model, cfg, params, *a))(*args)
  for a, b in zip(_leaves(got), _leaves(want)):
    np.testing.assert_array_equal(a, b)


def test_step_noise_and_update_clipping_hold_with_adam():
  """Update clipping: the upload stays in the C ball after any optimizer; step noise:
  the optimizer post-processes the noised clipped sum (a draw at scale 0 equals the
  noiseless run, and noise moves the upload)."""
  model, data = _model(), toy_federated(3, 12, SHAPE, CLASSES, 3)
  params = jax.jit(model.init)(jax.random.PRNGKey(2))
  adam = optimizers.ADAM
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(5), i))(jnp.arange(3))

  # One compiled program per config: the noise scale and clip are traced.
  update = jax.jit(jax.vmap(client_lib.client_update,
                            in_axes=(None, None, None, 0, 0, 0, 0, 0)), static_argnums=(0, 1))

  def run(cfg, noise, clip=0.05):
    hp = client_lib.ClientHParams(lr=jnp.full((3, 2), 0.5), clip=jnp.full((3,), clip),
                                  step_noise=jnp.full((3,), noise),
                                  upload_noise=jnp.full((3,), noise))
    return update(model, cfg, params, data.x, data.y, data.mask, keys, hp)

  clipped = run(_client_cfg(adam, 2, clip_mode="update_l2", noise_placement="none"), 0.0)
  delta = jax.tree_util.tree_map(lambda a, p: a - p[None], clipped.params, params)
  norms = np.sqrt(sum(np.sum(np.square(d), axis=tuple(range(1, d.ndim)))
                      for d in _leaves(delta)))
  assert np.all(norms <= 0.05 * (1 + 1e-5)) and np.all(clipped.update_norm > 0.05)
  step_cfg = _client_cfg(adam, 2, noise_placement="step")
  quiet = run(step_cfg, 0.0, clip=1.0)
  _assert_close(quiet.params, run(_client_cfg(adam, 2), 0.0, clip=1.0).params)
  noisy = run(step_cfg, 0.5, clip=1.0)
  assert not np.allclose(_leaves(noisy.params)[0], _leaves(quiet.params)[0])


def test_fused_one_step_only_where_exact():
  model = get_model("mlp_784_256_10", SHAPE, CLASSES)
  base = client_lib.ClientConfig(1, 0, "per_example_l2", "upload")
  assert one_step.fusable(model, base)
  assert one_step.fusable(model, dataclasses.replace(base, optimizer=optimizers.MOMENTUM))
  assert not one_step.fusable(model, dataclasses.replace(base, optimizer=optimizers.ADAM))
  user = optimizers.from_transformation(optax.sgd(1.0))
  assert not one_step.fusable(model, dataclasses.replace(base, optimizer=user))


def test_momentum_one_step_fused_equals_per_client():
  """One step of momentum from a fresh trace is SGD's: the fused path gives the
  per-client momentum round."""
  model, data = get_model("mlp_784_256_10", SHAPE, CLASSES), toy_federated(5, 10, SHAPE,
                                                                           CLASSES, 4)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  ccfg = client_lib.ClientConfig(1, 0, "per_example_l2", "upload",
                                 optimizer=optimizers.MOMENTUM)
  args = _round_args(5)
  fused = engine.make_round_fn(model, engine.RoundConfig(ccfg))(params, data, args)[0]
  plain = engine.make_round_fn(model, engine.RoundConfig(ccfg, fuse_one_step=False))(
      params, data, args)[0]
  _assert_close(fused, plain)


# ------------------------------------------------------------------ the server
def _round_args(k, t=0, central=0.0, server_lr=1.0, noise=0.0):
  return engine.RoundArgs(
      idx=jnp.arange(k, dtype=jnp.int32), sel_mask=jnp.ones(k), lr=jnp.full((1,), 0.5),
      clip=jnp.float32(1.0), noise=jnp.full((k,), noise), central_noise=jnp.float32(central),
      server_lr=jnp.float32(server_lr), round=jnp.int32(t), seed=jnp.uint32(11))


def test_fedavg_server_step_is_bit_identical_to_the_step_of_before():
  rng = np.random.default_rng(0)
  w = {"a": jnp.asarray(rng.normal(size=(7, 5)), jnp.float32)}
  agg = {"a": jnp.asarray(rng.normal(size=(7, 5)), jnp.float32)}
  for lr in (1.0, 0.37, 2.5):
    got, st = jax.jit(lambda w, a, lr: rounds._server_step(optimizers.FEDAVG, w, a, lr, None))(
        w, agg, jnp.float32(lr))
    want = jax.jit(lambda w, a, lr: jax.tree_util.tree_map(lambda p, x: p + lr * (x - p), w, a))(
        w, agg, jnp.float32(lr))
    assert st is None
    np.testing.assert_array_equal(got["a"], want["a"])


@pytest.mark.parametrize("opt,tx_of_lr", [
    (optimizers.FEDAVGM.with_values({"momentum": 0.6}), lambda lr: optax.sgd(lr, momentum=0.6)),
    (optimizers.FEDADAM.with_values({"tau": 1e-2}),
     lambda lr: optax.adam(lr, b1=0.9, b2=0.99, eps=1e-2)),
    (optimizers.FEDYOGI, lambda lr: optax.yogi(lr, b1=0.9, b2=0.99, eps=1e-3)),
])
def test_server_optimizer_equals_optax_on_the_noisy_aggregate(opt, tx_of_lr):
  """Three rounds with central noise: the carried model and state equal optax applied
  by hand to the pseudo-gradient w - (noisy aggregate) of each round."""
  model, data = _model(), toy_federated(4, 10, SHAPE, CLASSES, 5)
  ccfg = client_lib.ClientConfig(1, 0, "update_l2", "central")
  avg = engine.RoundConfig(ccfg, aggregation="fixed", expected_fraction=1.0)
  cfg = dataclasses.replace(avg, server_optimizer=opt)
  assert rounds.carries_state(cfg) and not rounds.carries_state(avg)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  carried = engine.carried_params(cfg, params)
  assert isinstance(carried, engine.CarriedParams) and carried.noise is None
  fn = jax.jit(lambda p, a: engine.round_step(model, cfg, p, data, a))
  agg_fn = jax.jit(lambda p, a: engine.round_step(model, avg, p, data, a))
  tx = tx_of_lr(0.05)  # (optax.yogi starts v at 1e-6 = tau^2, as fedyogi does)
  hand, state = params, tx.init(params)
  for t in range(3):
    args = _round_args(4, t, central=0.01, server_lr=0.05)
    carried, _ = fn(carried, args)
    # fedavg at server_lr 1 moves the model onto the noisy aggregate (same keys).
    agg, _ = agg_fn(hand, args._replace(server_lr=jnp.float32(1.0)))
    grad = jax.tree_util.tree_map(lambda w, a: w - a, hand, agg)
    u, state = tx.update(grad, state, hand)
    hand = optax.apply_updates(hand, u)
    _assert_close(carried.model, hand, rtol=1e-4, atol=1e-6)


def test_server_state_is_per_lane_and_inactive_lanes_keep_it():
  model, data = _model(), toy_federated(4, 10, SHAPE, CLASSES, 6)
  ccfg = client_lib.ClientConfig(1, 0, "update_l2", "central")
  cfg = engine.RoundConfig(ccfg, aggregation="fixed", server_optimizer=optimizers.FEDADAM)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  one = engine.carried_params(cfg, params)
  lanes = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), one)
  args = _round_args(4, central=0.01, server_lr=0.05)
  two = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), args)
  two = two._replace(server_lr=jnp.array([0.05, 0.2], jnp.float32))
  out, _ = jax.jit(lambda p, a, on: engine.cohort_step(model, cfg, p, data, a, on))(
      lanes, two, jnp.array([True, False]))
  single, _ = jax.jit(lambda p, a: engine.round_step(model, cfg, p, data, a))(one, args)
  _assert_close(jax.tree_util.tree_map(lambda a: a[0], out), single)
  _assert_close(jax.tree_util.tree_map(lambda a: a[1], out), one, rtol=0, atol=0)


def test_carried_state_dict_leaves_out_absent_parts():
  p = {"w": np.ones(2, np.float32)}
  assert rounds.carried_state_dict(p) == {"w": p["w"]}
  noise_only = rounds.CarriedParams(p, {"b": np.zeros(3, np.float32)})
  assert set(rounds.carried_state_dict(noise_only)) == {"model", "noise"}  # as before
  both = rounds.CarriedParams(p, None, (optax.EmptyState(), {"m": np.zeros(2)}))
  d = rounds.carried_state_dict(both)
  assert set(d) == {"model", "opt"}
  back = rounds.carried_from_state_dict(both, d)
  assert back.noise is None and np.array_equal(back.opt[1]["m"], np.zeros(2))
  with pytest.raises(ValueError, match="carried state"):
    rounds.carried_from_state_dict(both, rounds.carried_state_dict(noise_only))


# ------------------------------------------------------------------ from Python
def test_a_transformation_from_python_runs_and_its_learning_rate_is_its_own():
  """build() takes optimizers from Python: a configured lr beside one that carries its
  own is refused naming both; the run equals the registered optimizer with the same
  numbers (no noise at epsilon = inf, so the configs' noise streams do not matter)."""
  from _helpers import small_config  # pylint: disable=import-outside-toplevel

  from fedjax_dp import config as config_lib  # pylint: disable=import-outside-toplevel
  from fedjax_dp import experiment  # pylint: disable=import-outside-toplevel

  sets = {"rounds": "3", "data.num_clients": "4", "data.samples_per_client": "20",
          "server.clients_per_round": "4", "model.name": "logistic", "progress": "false",
          "privacy.epsilon": "inf", "client.clip_mode": "update_l2", "client.lr": "0.1"}
  user = optimizers.from_transformation(optax.adam(0.02), name="my_adam")
  with pytest.raises(config_lib.ConfigError, match="server.lr=0.5 with server.optimizer="
                     "'my_adam' passed from Python"):
    experiment.build(small_config(sets, **{"server.lr": "0.5"}), server_optimizer=user)
  cfg = small_config(sets)
  setup = experiment.build(cfg, server_optimizer=user,
                           client_optimizer=optimizers.from_transformation(optax.sgd(0.5)))
  assert setup.round_cfg.server_optimizer is user
  got = experiment.run(cfg, setup=setup).rows
  want = experiment.run(small_config(sets, **{
      "server.optimizer": "fedadam", "server.lr": "0.02", "server.beta2": "0.999",
      "server.tau": "1e-8", "client.lr": "0.5"})).rows
  for a, b in zip(got, want):
    assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)
