"""Sensitivity harness: the plan's Delta against neighbouring datasets, searched.

For each (clip mode, placement, selection, aggregation, local steps, batch) the
config accepts, draw neighbouring datasets -- random ones, and adversarial ones that
put every example just outside the hinge so that one replaced example flips the
active set of all the others after step 1 (finding B1) -- run what the engine runs
without noise, and assert that the released quantity never moves by more than the
:class:`PrivacyPlan`'s sensitivity, in the norm of the mechanism (L2 Gaussian, L1
Laplace). The release is the client's upload (``'upload'``), one step's clipped
gradient sum at given parameters (``'step'``: the noise is drawn on it, and the
next step conditions on the noisy output), or the aggregate of a round that the
selection rule can draw (``'central'``: small cohorts included).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp import config as config_lib
from fedjax_dp import experiment, optimizers
from fedjax_dp.audit import mechanisms as audit_mechanisms
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.data.federated import build_federated_data
from fedjax_dp.models import get_model
from fedjax_dp.privacy import clip_modes, selection
from fedjax_dp.privacy.clip_modes import base as clip_base
from fedjax_dp.privacy.clip_modes import update_l2
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

N = 6          # examples per client
TRIALS = 96    # neighbouring pairs per configuration (half random, half adversarial)
MODEL = get_model("linear_svm", (2,), 2)


def _cfg(**sets):
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in sets.items()])


def _dist(a, b, ord):
  diff = jnp.concatenate([jnp.ravel(u - v) for u, v in zip(jax.tree_util.tree_leaves(a),
                                                            jax.tree_util.tree_leaves(b))])
  return jnp.sum(jnp.abs(diff)) if ord == 1 else jnp.sqrt(jnp.sum(jnp.square(diff)))


def _pairs(seed, lr, clip):
  """``TRIALS`` (params, x, y, x', y') with D, D' differing in example 0."""
  rng = np.random.default_rng(seed)
  half = TRIALS // 2
  # Random: Gaussian features, labels and parameters.
  x = rng.normal(size=(TRIALS, N, 2)) * rng.choice([0.3, 3.0], size=(TRIALS, 1, 1))
  y = rng.integers(0, 2, (TRIALS, N))
  kernel = rng.normal(size=(TRIALS, 2, 2))
  bias = rng.normal(size=(TRIALS, 2))
  # Adversarial (B1): identical examples of label 0 whose margin b_0 - b_1 sits just
  # above 1, within what one replaced example's first step can move it.
  x[half:] = rng.normal(size=(TRIALS - half, 1, 2)) * 1e-3
  y[half:] = 0
  kernel[half:] = 0.0
  margin = 1.0 + rng.uniform(0.0, 2.0, TRIALS - half) * lr * clip / N
  bias[half:] = np.stack([margin / 2, -margin / 2], axis=1)
  x2, y2 = x.copy(), y.copy()
  x2[:, 0] = rng.normal(size=(TRIALS, 2)) * rng.choice([0.0, 1.0, 5.0], size=(TRIALS, 1))
  y2[:, 0] = 1 - y[:, 0]
  params = {"Dense_0": {"kernel": kernel, "bias": bias}}
  f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
  return (jax.tree_util.tree_map(f32, params), f32(x), jnp.asarray(y, jnp.int32), f32(x2),
          jnp.asarray(y2, jnp.int32))


UPLOAD_CASES = [  # clip_mode, mechanism, E, batch, l2_reg
    ("per_example_l2", "gaussian", 1, 0, 0.0),
    ("per_example_l2", "gaussian", 3, 4, 0.1),
    ("per_example_l1", "laplace", 3, 0, 0.0),
    ("per_example_l1", "gaussian", 2, 4, 0.0),  # an L1 bound is an L2 bound
    ("param_l2", "gaussian", 2, 0, 0.0),
    ("update_l2", "gaussian", 3, 4, 0.0),
    ("param_l2", "laplace", 2, 0, 0.0),     # L1: 2 C sqrt(d) (Yuan's Laplace baseline)
    ("update_l2", "laplace", 2, 0, 0.0),
]


@pytest.mark.parametrize("clip_mode,mechanism,steps,batch,l2_reg", UPLOAD_CASES)
def test_upload_release_within_plan_sensitivity(clip_mode, mechanism, steps, batch, l2_reg):
  lr, clip = 0.5, 1.0
  cfg = _cfg(**{"client.clip_mode": clip_mode, "privacy.mechanism": mechanism,
                "client.local_steps": steps, "client.batch_size": batch,
                "client.l2_reg": l2_reg, "client.lr": lr, "client.clip": clip,
                "data.num_clients": 1, "server.clients_per_round": 1})
  plan = plan_from_config(cfg, np.array([N]), num_params=MODEL.num_params())
  ord = 1 if mechanism == "laplace" else 2
  d = _upload_moves(cfg, steps, lr, clip, ord, len(clip_mode) + steps)
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  assert d.max() > 0.0


STEP_GRAD_CASES = [  # clip_mode, mechanism, E, batch, the clip's norm
    ("step_grad_l1", "laplace", 3, 0, 1), ("step_grad_l1", "gaussian", 2, 0, 1),
    ("step_grad_l2", "gaussian", 2, 4, 2)]


@pytest.mark.parametrize("clip_mode,mechanism,steps,batch,clip_ord", STEP_GRAD_CASES)
def test_step_grad_upload_within_client_level_sensitivity(clip_mode, mechanism, steps, batch,
                                                          clip_ord):
  """Fu et al.'s per-step gradient clipping, client-level neighbours: the client's
  WHOLE dataset is replaced (random data, and data whose gradients point the other
  way); the upload never moves more than ``2 C sum_s eta_s``, and an opposite-gradient
  step attains its share ``2 eta C`` of it."""
  lr, clip = 0.5, 1.0
  cfg = _cfg(**{"client.clip_mode": clip_mode, "privacy.mechanism": mechanism,
                "client.local_steps": steps, "client.batch_size": batch, "client.lr": lr,
                "client.clip": clip, "data.num_clients": 1, "server.clients_per_round": 1,
                "server.selection": "round_robin"})
  plan = plan_from_config(cfg, np.array([N]))
  assert plan.event(np.ones(1)).level == "client"
  np.testing.assert_allclose(plan.sensitivity, 2 * clip * lr * steps)
  ccfg = dataclasses.replace(experiment.round_config(cfg).client,
                             noise_placement="none")
  hp = client_lib.ClientHParams(jnp.full((steps,), lr, jnp.float32), jnp.float32(clip),
                                jnp.float32(0), jnp.float32(0))
  ord = 1 if mechanism == "laplace" else 2
  mask = jnp.ones(N, jnp.float32)
  params, x, y, _, _ = _pairs(7 + steps, lr, clip)
  rng = np.random.default_rng(steps)
  x2 = jnp.asarray(rng.normal(size=x.shape) * rng.choice([0.1, 10.0], (TRIALS, 1, 1)),
                   jnp.float32)
  y2 = jnp.asarray(rng.integers(0, 2, y.shape), jnp.int32)
  # Opposite pairs: large inputs, D all label 0 and D' all label 1, zero parameters: the
  # hinge is active for every example in both runs, so g and g' point opposite ways.
  half = TRIALS // 2
  params = jax.tree_util.tree_map(lambda p: p.at[half:].set(0.0), params)
  big = jnp.asarray(rng.normal(size=(TRIALS - half, 1, 2)) * 50.0, jnp.float32)
  x = x.at[half:].set(jnp.broadcast_to(big, (TRIALS - half, N, 2)))
  x2 = x2.at[half:].set(x[half:])
  y = y.at[half:].set(0)
  y2 = y2.at[half:].set(1)

  @jax.jit
  @jax.vmap
  def moved(params, x, y, x2, y2, key):
    a = client_lib.client_update(MODEL, ccfg, params, x, y, mask, key, hp).params
    b = client_lib.client_update(MODEL, ccfg, params, x2, y2, mask, key, hp).params
    return _dist(a, b, ord), _dist(a, b, clip_ord)

  keys = jax.random.split(jax.random.PRNGKey(5), TRIALS)
  d, d_clip = map(np.asarray, moved(params, x, y, x2, y2, keys))
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  # Each opposite step moves the two runs 2 eta C apart in the clip's norm (the hinge
  # then saturates).
  assert d_clip[half:].max() > 0.9 * 2 * lr * clip, d_clip[half:].max()


def test_adversarial_search_finds_the_active_set_flip():
  """The search is not vacuous: with E = 2 it finds pairs that move the upload beyond
  ``2 C sum_s eta_s / b``, the sensitivity before the fix (finding B1)."""
  lr, clip = 0.5, 1.0
  ccfg = client_lib.ClientConfig(local_steps=2, clip_mode="per_example_l2",
                                 noise_placement="none")
  hp = client_lib.ClientHParams(jnp.full((2,), lr, jnp.float32), jnp.float32(clip),
                                jnp.float32(0), jnp.float32(0))
  mask = jnp.ones(N, jnp.float32)
  key = jax.random.PRNGKey(0)

  @jax.jit
  @jax.vmap
  def moved(params, x, y, x2, y2):
    a = client_lib.client_update(MODEL, ccfg, params, x, y, mask, key, hp).params
    b = client_lib.client_update(MODEL, ccfg, params, x2, y2, mask, key, hp).params
    return _dist(a, b, 2)

  d = np.asarray(moved(*_pairs(0, lr, clip)))
  assert d.max() > 1.2 * (2 * clip * 2 * lr / N)


STEP_CASES = [("per_example_l2", "gaussian"), ("per_example_l1", "laplace"),
              ("per_example_l1", "gaussian")]


@pytest.mark.parametrize("name,mech", STEP_CASES)
def test_step_release_within_plan_sensitivity(name, mech):
  """``'step'`` noises each step's sum of clipped gradients: 2 C for any parameters,
  measured in the mechanism's norm (L1 for Laplace, L2 for Gaussian)."""
  clip = 1.0
  ord = 1 if mech == "laplace" else 2
  grad = clip_modes.get(name).client.grad  # the step's clipped sum, as the client computes it
  cfg = _cfg(**{"client.clip_mode": name, "privacy.mechanism": mech,
                "privacy.placement": "step", "client.local_steps": 3,
                "data.num_clients": 1, "server.clients_per_round": 1})
  plan = plan_from_config(cfg, np.array([N]))
  mask = jnp.ones(N, jnp.float32)

  @jax.jit
  @jax.vmap
  def moved(params, x, y, x2, y2):
    a = grad(MODEL, params, x, y, mask, clip, jnp.float32(N), 64)[0]
    b = grad(MODEL, params, x2, y2, mask, clip, jnp.float32(N), 64)[0]
    return _dist(a, b, ord)

  d = np.asarray(moved(*_pairs(5, 0.5, clip)))
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  assert d.max() > 0.5 * plan.sensitivity[0]


MOMENTUM_CASES = [  # clip_mode, mechanism, E, batch, momentum
    ("per_example_l2", "gaussian", 3, 4, 0.9),
    ("per_example_l2", "gaussian", 2, 0, 0.5),
    ("per_example_l1", "laplace", 3, 0, 0.9),
]


@pytest.mark.parametrize("clip_mode,mechanism,steps,batch,beta", MOMENTUM_CASES)
def test_momentum_upload_within_step_weighted_sensitivity(clip_mode, mechanism, steps, batch,
                                                          beta):
  """Heavy-ball local steps: the plan's bound is per-example clipping's with the step
  weights A_j = sum_{s>=j} eta_s beta^(s-j) for eta_j (clip_modes.base.step_weights),
  and the upload never moves more, random and adversarial (B1) pairs alike."""
  lr, clip = 0.5, 1.0
  cfg = _cfg(**{"client.clip_mode": clip_mode, "privacy.mechanism": mechanism,
                "client.local_steps": steps, "client.batch_size": batch, "client.lr": lr,
                "client.clip": clip, "client.optimizer": "momentum", "client.momentum": beta,
                "data.num_clients": 1, "server.clients_per_round": 1})
  config_lib.validate(cfg)
  plan = plan_from_config(cfg, np.array([N]))
  a = optimizers.heavy_ball_weights(np.full(steps, lr), beta)
  b = batch or N
  np.testing.assert_allclose(plan.sensitivity, 2 * clip * (a[0] / b + a[1:].sum()))
  ord = 1 if mechanism == "laplace" else 2
  d = _upload_moves(cfg, steps, lr, clip, ord, 31 + steps)
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  assert d.max() > 0.0


def test_momentum_step_grad_upload_reaches_its_bound_beyond_sgds():
  """Per-step gradient clipping with momentum, client level: data whose gradients
  point the other way at every step (a hinge that never saturates) moves the upload
  by 2 C sum_j A_j, the plan's bound, which is MORE than SGD's 2 C sum_s eta_s: the
  step weights are needed, and the harness reaches them."""
  lr, clip, steps, beta = 0.1, 1.0, 4, 0.9
  cfg = _cfg(**{"client.clip_mode": "step_grad_l2", "client.local_steps": steps,
                "client.lr": lr, "client.clip": clip, "client.optimizer": "momentum",
                "client.momentum": beta, "data.num_clients": 1,
                "server.clients_per_round": 1, "server.selection": "round_robin"})
  plan = plan_from_config(cfg, np.array([N]))
  weights = optimizers.heavy_ball_weights(np.full(steps, lr), beta)
  np.testing.assert_allclose(plan.sensitivity, 2 * clip * weights.sum())
  ccfg = dataclasses.replace(experiment.round_config(cfg).client,
                             noise_placement="none")
  hp = client_lib.ClientHParams(jnp.full((steps,), lr, jnp.float32), jnp.float32(clip),
                                jnp.float32(0), jnp.float32(0))
  mask = jnp.ones(N, jnp.float32)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(TRIALS, N, 2)) * 1e-2, jnp.float32)
  params = {"Dense_0": {"kernel": jnp.zeros((TRIALS, 2, 2)), "bias": jnp.zeros((TRIALS, 2))}}
  y, y2 = jnp.zeros((TRIALS, N), jnp.int32), jnp.ones((TRIALS, N), jnp.int32)

  @jax.jit
  @jax.vmap
  def moved(params, x):
    a = client_lib.client_update(MODEL, ccfg, params, x, y[0], mask, jax.random.PRNGKey(0),
                                 hp).params
    b = client_lib.client_update(MODEL, ccfg, params, x, y2[0], mask, jax.random.PRNGKey(0),
                                 hp).params
    return _dist(a, b, 2)

  d = np.asarray(moved(params, x))
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  assert d.max() > 0.95 * plan.sensitivity[0] and d.max() > 2 * clip * lr * steps * 1.5


def test_optimizers_without_a_step_bound_are_refused_where_it_counts():
  """Adam and a transformation from Python at the step-weighted placements: one
  line naming both fields, from the config's checks and from the plan alike; update
  clipping and step noise take any optimizer."""
  for mode in ("per_example_l2", "per_example_l1", "step_grad_l2", "step_grad_l1"):
    cfg = _cfg(**{"client.clip_mode": mode, "client.optimizer": "adam",
                  "privacy.mechanism": "laplace" if mode.endswith("l1") else "gaussian"})
    with pytest.raises(config_lib.ConfigError, match=(
        f"client.optimizer='adam' with client.clip_mode='{mode}' at "
        "privacy.placement='upload'")):
      config_lib.validate(cfg)
    with pytest.raises(ValueError, match="client.optimizer='adam'"):
      plan_from_config(cfg, np.array([N]))
  user = optimizers.from_transformation(optax.sgd(0.1), name="my_sgd")
  with pytest.raises(ValueError, match="client.optimizer='my_sgd' with client.clip_mode"):
    plan_from_config(_cfg(), np.array([N]), client_optimizer=user)
  for sets in ({"client.clip_mode": "update_l2"}, {"privacy.placement": "step"},
               {"client.clip_mode": "param_l2"}):
    cfg = _cfg(**sets, **{"client.optimizer": "adam", "client.local_steps": 3})
    config_lib.validate(cfg)
    assert np.all(np.isfinite(plan_from_config(cfg, np.array([N]), num_params=6,
                                               client_optimizer=user).sensitivity))
  # Momentum with l2_reg: one step is SGD's; several are refused.
  one = _cfg(**{"client.optimizer": "momentum", "client.l2_reg": 0.1})
  config_lib.validate(one)
  np.testing.assert_allclose(plan_from_config(one, np.array([N])).sensitivity,
                             plan_from_config(_cfg(**{"client.l2_reg": 0.1}),
                                              np.array([N])).sensitivity)
  with pytest.raises(config_lib.ConfigError, match="client.l2_reg=0.1 over 2 local steps"):
    config_lib.validate(_cfg(**{"client.optimizer": "momentum", "client.l2_reg": 0.1,
                                "client.local_steps": 2}))


CENTRAL_CASES = [  # selection, aggregation, K, q
    ("uniform", "normalized", 3, 0.0),
    ("round_robin", "normalized", 3, 0.0),   # U = 8: every third round selects 2
    ("uniform", "unnormalized", 3, 0.0),
    ("poisson", "fixed", 0, 0.3),
    ("cyclic_poisson", "fixed", 3, 0.5),  # f = q K / U, the expected share of a group
]
# Every registered mode with a central-noise proof is searched on every case.
CENTRAL_MODES = clip_modes.supporting("central")


@pytest.mark.parametrize("clip_mode", CENTRAL_MODES)
@pytest.mark.parametrize("selection_name,aggregation,k,q", CENTRAL_CASES)
def test_central_release_within_plan_sensitivity(selection_name, aggregation, k, q,
                                                 clip_mode):
  """Replace one selected client's data entirely, in cohorts the rule can draw
  (Poisson: down to a single client), and measure the aggregate."""
  worst, sens = central_moves(clip_mode, selection_name, aggregation, k, q)
  assert worst <= sens * (1 + 1e-5), (worst, sens)
  assert worst > 0.0


def central_moves(clip_mode, selection_name, aggregation, k, q, trials=3):
  """``(worst, plan sensitivity)``: how far the aggregate of a central-noise round
  moves (noiseless) when one selected client's data is replaced entirely, over the
  cohorts the rule draws in 6 rounds (Poisson: also cohorts of one and two)."""
  u, clip, lr = 8, 1.0, 3.0
  rng = np.random.default_rng(1)
  sizes = rng.integers(2, N + 1, u)
  x = rng.normal(size=(sizes.sum(), 2)).astype(np.float32)
  y = rng.integers(0, 2, sizes.sum()).astype(np.int32)
  bounds = np.concatenate([[0], np.cumsum(sizes)])
  clients = [np.arange(bounds[i], bounds[i + 1]) for i in range(u)]
  data = build_federated_data(x, y, clients)
  cfg = _cfg(**{"data.num_clients": u, "server.selection": selection_name,
                "server.clients_per_round": max(k, 1), "server.q": q,
                "server.aggregation": aggregation, "privacy.placement": "central",
                "client.clip_mode": clip_mode, "client.clip": clip, "client.lr": lr})
  plan = plan_from_config(cfg, np.asarray(data.counts))
  rcfg = experiment.round_config(cfg)
  rcfg = dataclasses.replace(rcfg, client=dataclasses.replace(rcfg.client,
                                                              noise_placement="none"))
  fn = engine.make_round_fn(MODEL, rcfg)
  slots = engine.cohort_size(selection_name, u, max(k, 1), q)
  cohorts = [engine.select_clients(selection_name, u, max(k, 1), q, 0, t) for t in range(6)]
  if selection_name == "poisson":  # the small draws that broke the normalized weights
    for ids in ([2], [2, 5]):
      idx, sel = np.zeros(slots, np.int32), np.zeros(slots, np.float32)
      idx[:len(ids)], sel[:len(ids)] = ids, 1.0
      idx[len(ids):] = ids[0]
      cohorts.append((idx, sel))
  params = MODEL.init(jax.random.PRNGKey(0))
  worst = 0.0
  for t, (idx, sel) in enumerate(cohorts):
    if not np.any(sel > 0):  # an empty Poisson draw: no client to replace
      continue
    args = engine.RoundArgs(
        idx=jnp.asarray(idx), sel_mask=jnp.asarray(sel), lr=jnp.asarray([lr], jnp.float32),
        clip=jnp.float32(clip), noise=jnp.zeros(slots, jnp.float32),
        central_noise=jnp.float32(0), server_lr=jnp.float32(1), round=jnp.int32(t),
        seed=jnp.uint32(0))
    a, _ = fn(params, data, args)
    target = int(idx[sel > 0][0])
    for trial in range(trials):
      flip = data._replace(
          x=data.x.at[target].set(jnp.asarray(rng.normal(size=data.x.shape[1:]) * 5,
                                              jnp.float32)),
          y=data.y.at[target].set(1 - data.y[target]))
      b, _ = fn(params, flip, args)
      worst = max(worst, float(_dist(a, b, 2)))
  return worst, float(plan.sensitivity[0])


def test_central_poisson_normalized_refused_and_round_robin_smallest_cohort():
  cfg = _cfg(**{"data.num_clients": 8, "server.selection": "poisson", "server.q": 0.3,
                "privacy.placement": "central", "client.clip_mode": "update_l2"})
  with pytest.raises(ValueError, match="server.aggregation='fixed'"):
    plan_from_config(cfg, np.full(8, 4))
  rule = selection.get_rule("round_robin")
  assert rule.min_cohort(8, 3, 0.0) == 2


@pytest.mark.parametrize("mechanism", ["tree", "bandmf"])
@pytest.mark.parametrize("selection_name,k,rounds", [("round_robin", 2, 12), ("all", 6, 6)])
def test_correlated_release_within_plan_matrix_sensitivity(mechanism, selection_name, k,
                                                           rounds):
  """The matrix mechanism's release ``C G`` (tree aggregation, BandMF) moves by at most
  ``s_i Delta`` between neighbours (privacy.correlated.base): search per-round
  differences ``u_t`` (norm <= 1 on client i's realised rounds, 0 elsewhere) --
  random, equal, alternating, and projected gradient ascent on ``||C U||_F`` -- for
  every client, against the plan's ``s_i^2``; equal ``u_t`` attain it (C^T C >= 0)."""
  from fedjax_dp.privacy import correlated
  u = 6
  cfg = _cfg(**{"data.num_clients": u, "server.selection": selection_name,
                "server.clients_per_round": k, "server.aggregation": "fixed",
                "privacy.placement": "central", "client.clip_mode": "update_l2",
                "privacy.mechanism": mechanism, "rounds": rounds})
  plan = plan_from_config(cfg, np.full(u, N))
  c = getattr(correlated, mechanism).matrix(plan.correlated)
  s_sq = plan.correlated_sens_sq()
  rng = np.random.default_rng(0)
  for i in range(u):
    rows = plan.patterns[i]
    starts = [np.ones((rounds, 3)), np.where(np.arange(rounds)[:, None] % 2, -1.0, 1.0)
              * np.ones((rounds, 3))] + [rng.normal(size=(rounds, 3)) for _ in range(TRIALS)]
    worst = 0.0
    for x in starts:
      for _ in range(20):  # projected gradient ascent on ||C U||_F^2
        x = np.where(rows[:, None], x, 0.0)
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        worst = max(worst, float(np.sum(np.square(c @ x))))
        x = x + 0.5 * c.T @ (c @ x)
    assert worst <= s_sq[i] * (1 + 1e-9), (i, worst, s_sq[i])
    assert worst >= s_sq[i] * (1 - 1e-6), (i, worst, s_sq[i])  # attained: bound is exact


# Every (clip mode, placement) the registry proves a sensitivity for, and the harness
# test that searches it; a mode added to clip_modes.CLIP_MODES fails here until the
# harness covers it.
SEARCHED = {
    **{(c[0], "upload", c[1]): "test_upload_release_within_plan_sensitivity"
       for c in UPLOAD_CASES},
    **{(c[0], "upload", c[1]): "test_step_grad_upload_within_client_level_sensitivity"
       for c in STEP_GRAD_CASES},
    **{(c[0], "step", c[1]): "test_step_release_within_plan_sensitivity" for c in STEP_CASES},
    **{(m, "central", "gaussian"): "test_central_release_within_plan_sensitivity"
       for m in CENTRAL_MODES},
    # Correlated noise: the per-round aggregate as above, the matrix across rounds here.
    ("update_l2", "central", "tree"): "test_correlated_release_within_plan_matrix_sensitivity",
    ("update_l2", "central", "bandmf"): "test_correlated_release_within_plan_matrix_sensitivity",
}


def test_every_registered_clip_mode_and_placement_is_searched():
  """Each proof is searched for every mechanism it bounds: the Gaussian (L2) case at
  every placement, and the Laplace (L1) case where the mode's sensitivity is an L1 one."""
  want = {(name, p, "gaussian") for name, mode in clip_modes.CLIP_MODES.items()
          for p in mode.proof.placements}
  want |= {(name, p, "laplace") for name, mode in clip_modes.CLIP_MODES.items()
           for p in mode.proof.laplace}
  assert want <= set(SEARCHED), sorted(want - set(SEARCHED))


def _upload_moves(cfg, steps, lr, clip, ord, seed, model=MODEL):
  """``[TRIALS]`` how far the noiseless upload moves between neighbouring datasets
  (:func:`_pairs`), computed by the client (of ``model``) as the engine configures it."""
  ccfg = dataclasses.replace(experiment.round_config(cfg).client,
                             noise_placement="none")
  hp = client_lib.ClientHParams(jnp.full((steps,), lr, jnp.float32), jnp.float32(clip),
                                jnp.float32(0), jnp.float32(0))
  mask = jnp.ones(N, jnp.float32)

  @jax.jit
  @jax.vmap
  def moved(params, x, y, x2, y2, key):
    a = client_lib.client_update(model, ccfg, params, x, y, mask, key, hp).params
    b = client_lib.client_update(model, ccfg, params, x2, y2, mask, key, hp).params
    return _dist(a, b, ord)

  keys = jax.random.split(jax.random.PRNGKey(3), TRIALS)
  return np.asarray(moved(*_pairs(seed, lr, clip), keys))


@pytest.mark.parametrize("clip_mode,steps,batch", [
    ("per_example_l2", 3, 0), ("per_example_l2", 2, 4), ("update_l2", 3, 0),
    ("param_l2", 2, 0)])
def test_a_global_model_term_in_the_loss_stays_within_plan_sensitivity(clip_mode, steps,
                                                                       batch):
  """FedProx from Python (fedjax_dp.models.adapters): the proximal term is part of every
  example's loss, so clipping bounds it with the rest and the plan's sensitivity holds
  unchanged, even with a strong pull (mu = 5, lr mu > 1)."""
  from fedjax_dp.models.adapters import UserSpec, fedprox
  prox = UserSpec(MODEL.module, "hinge", fedprox(5.0), "svm_prox")((2,), 2)
  lr, clip = 0.5, 1.0
  cfg = _cfg(**{"client.clip_mode": clip_mode, "client.local_steps": steps,
                "client.batch_size": batch, "client.lr": lr, "client.clip": clip,
                "data.num_clients": 1, "server.clients_per_round": 1})
  plan = plan_from_config(cfg, np.array([N]), num_params=prox.num_params())
  d = _upload_moves(cfg, steps, lr, clip, 2, 7 + steps, model=prox)
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  assert d.max() > 0.0


def _half_update_mode() -> clip_modes.ClipMode:
  """A clip mode written by the recipe (docs/architecture.md): the update clipped to
  L2 norm C / 2, so the upload lies in a ball of radius C / 2 around the shared
  global model and two neighbours' uploads differ by at most C."""

  def clip_half(params, global_params, clip):
    return update_l2.clip_update(params, global_params, clip / 2)

  def sensitivity(placement, inputs):
    """Two points of a ball of radius C / 2: ``C`` (replace-one, any data)."""
    return np.full(inputs.num_clients, inputs.clip)

  return clip_modes.ClipMode(
      name="half_update_l2", summary="the update clipped to L2 norm C / 2 (a test)",
      client=clip_modes.ClientHooks(clip_base.plain_grad, after_local=clip_half),
      proof=clip_modes.Proof(sensitivity, placements=("upload",)),
      canary=clip_base.Canary(example_scale=1e4))


def test_a_clip_mode_added_by_the_recipe_runs_through_plan_client_and_audit(monkeypatch):
  mode = _half_update_mode()
  monkeypatch.setitem(clip_modes.CLIP_MODES, mode.name, mode)
  lr, clip, steps = 0.5, 1.0, 2
  sets = {"client.clip_mode": mode.name, "client.local_steps": steps, "client.lr": lr,
          "client.clip": clip, "data.num_clients": 1, "server.clients_per_round": 1}
  cfg = _cfg(**sets)
  config_lib.validate(cfg)  # the config's choices read the live registry
  plan = plan_from_config(cfg, np.array([N]))
  assert plan.sensitivity[0] == clip and plan.level == "example"
  d = _upload_moves(cfg, steps, lr, clip, 2, seed=11)
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  assert d.max() > 0.5 * clip  # the bound is nearly reached, not vacuous
  # A placement the mode has no proof for is refused, naming the field.
  with pytest.raises(ValueError, match="client.clip_mode"):
    plan_from_config(_cfg(**sets, **{"privacy.placement": "step"}), np.array([N]))
  with pytest.raises(ValueError, match="privacy.mechanism='laplace'"):
    plan_from_config(_cfg(**sets, **{"privacy.mechanism": "laplace"}), np.array([N]))
  # The audit enumerates it from the registry, with its canary.
  base = _cfg(**{"data.num_clients": 4, "server.clients_per_round": 2})
  assert audit_mechanisms.accepted(base, {"client.clip_mode": mode.name,
                                          "privacy.placement": "upload"})
  assert not audit_mechanisms.accepted(base, {"client.clip_mode": mode.name,
                                              "privacy.placement": "central"})
