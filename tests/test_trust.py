"""Configurations whose certified epsilon must not be lower than what they release.

One test per finding of the trust review (B1-B4), the defaults' promise, and the
per-client budget rule. Each builds the config's :class:`PrivacyPlan` and checks the
released quantity or the accountant against an independent reference.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import toy_federated

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.models import get_model
from fedjax_dp.privacy import accounting
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine


def _cfg(**sets):
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in sets.items()])


def _svm_active_set_flip(n=100, lr=0.5, clip=1.0, steps=2):
  """Wei-style linear SVM, one client of n identical examples (x = 0, label 0) whose
  margin sits just above the hinge: D trains nothing; D' replaces one label, and its
  step-1 move pushes all n - 1 others into the hinge at step 2."""
  model = get_model("linear_svm", (1,), 2)
  params = jax.tree_util.tree_map(jnp.zeros_like, model.init(jax.random.PRNGKey(0)))
  params["Dense_0"]["bias"] = jnp.asarray([0.5015, -0.5], jnp.float32)  # margin 1.0015
  x = jnp.zeros((n, 1), jnp.float32)
  y = jnp.zeros(n, jnp.int32)
  y2 = y.at[0].set(1)
  ccfg = client_lib.ClientConfig(local_steps=steps, batch_size=0, clip_mode="per_example_l2",
                                 noise_placement="none")
  hp = client_lib.ClientHParams(jnp.full((steps,), lr, jnp.float32), jnp.float32(clip),
                                jnp.float32(0), jnp.float32(0))
  key = jax.random.PRNGKey(1)
  mask = jnp.ones(n, jnp.float32)
  a = client_lib.client_update(model, ccfg, params, x, y, mask, key, hp).params
  b = client_lib.client_update(model, ccfg, params, x, y2, mask, key, hp).params
  return float(jnp.sqrt(sum(jnp.sum(jnp.square(u - v)) for u, v in
                            zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))))


def test_b1_several_local_steps_upload_sensitivity_covers_active_set_flip():
  moved = _svm_active_set_flip()
  assert moved > 0.4  # the flip happened: every example's gradient changed at step 2
  cfg = _cfg(**{"client.local_steps": 2, "client.lr": 0.5, "client.clip": 1.0,
                "data.num_clients": 1, "server.clients_per_round": 1})
  plan = plan_from_config(cfg, np.array([100]))
  assert moved <= plan.sensitivity[0]
  np.testing.assert_allclose(plan.sensitivity, 2 * 1.0 * (0.5 / 100 + 0.5))


def test_b1_one_step_keeps_wei_eq13():
  cfg = _cfg(**{"client.lr": 0.5, "data.num_clients": 2, "server.clients_per_round": 2})
  plan = plan_from_config(cfg, np.array([100, 50]))
  np.testing.assert_allclose(plan.sensitivity, [2 * 0.5 / 100, 2 * 0.5 / 50])


def test_b2_round_robin_is_charged_per_client_without_amplification():
  # U = 1000, K = 1, T = 1, target 1: the client that took part released one
  # non-subsampled Gaussian.
  cfg = _cfg(**{"data.num_clients": 1000, "server.selection": "round_robin",
                "server.clients_per_round": 1, "rounds": 1, "privacy.epsilon": 1.0,
                "privacy.formula": "calibrated"})
  plan = plan_from_config(cfg, np.full(1000, 10))
  noise = plan.noise_scale(1)
  state = plan.accountant_step(plan.accountant_init(), noise, selected=np.array([7]))
  z = noise[7] / plan.sensitivity[7]
  true = accounting.epsilon([accounting.Event(noise_multiplier=z, relation="replace_one")],
                            1e-3)
  assert true <= 1.0 + 1e-6          # calibrated for the turn it takes
  certified = plan.certified_epsilons(state)
  assert certified[7] >= true * (1 - 1e-9)
  assert plan.certified_epsilon(state) <= 1.0 + 1e-6
  others = np.delete(certified, 7)
  assert np.all(others == 0.0)       # the others released nothing


def test_b3_central_poisson_normalized_is_refused():
  cfg = _cfg(**{"data.num_clients": 1000, "server.selection": "poisson", "server.q": 0.01,
                "privacy.placement": "central", "client.clip_mode": "update_l2"})
  with pytest.raises(ValueError, match="server.aggregation"):
    plan_from_config(cfg, np.full(1000, 10))


def test_b3_central_poisson_fixed_denominator_bounds_a_small_cohort():
  """A cohort of 2 (where the realised-total weights give 1/2 each) moves the
  fixed-denominator aggregate by at most the planned sensitivity."""
  u, n = 100, 4
  data = toy_federated(u, n, (2,), 2, 0)
  model = get_model("logistic", (2,), 2)
  params = model.init(jax.random.PRNGKey(0))
  cfg = _cfg(**{"data.num_clients": u, "server.selection": "poisson", "server.q": 0.01,
                "privacy.placement": "central", "client.clip_mode": "update_l2",
                "server.aggregation": "fixed", "client.clip": 1.0, "client.lr": 50.0})
  plan = plan_from_config(cfg, np.asarray(data.counts))
  rcfg = experiment.round_config(cfg)
  rcfg = dataclasses.replace(rcfg, client=dataclasses.replace(rcfg.client,
                                                              noise_placement="none"))
  fn = engine.make_round_fn(model, rcfg)
  args = engine.RoundArgs(
      idx=jnp.asarray([3, 5], jnp.int32), sel_mask=jnp.ones(2, jnp.float32),
      lr=jnp.asarray([50.0], jnp.float32), clip=jnp.float32(1.0), noise=jnp.zeros(2),
      central_noise=jnp.float32(0), server_lr=jnp.float32(1), round=jnp.int32(0),
      seed=jnp.uint32(0))
  a, _ = fn(params, data, args)
  flipped = data._replace(y=data.y.at[3].set(1 - data.y[3]),
                          x=data.x.at[3].set(-10 * data.x[3]))
  b, _ = fn(params, flipped, args)
  moved = float(jnp.sqrt(sum(jnp.sum(jnp.square(u_ - v)) for u_, v in zip(
      jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))))
  assert moved > 0.1   # the replacement matters
  assert moved <= plan.sensitivity[0] * (1 + 1e-5)
  counts = np.asarray(data.counts, np.float64)
  np.testing.assert_allclose(plan.sensitivity, 2 * 1.0 * counts.max() / (0.01 * counts.sum()))


def test_b4_client_without_noise_is_charged_infinity():
  cfg = _cfg(**{"data.num_clients": 2, "server.clients_per_round": 2})
  cfg.privacy.client_epsilons = (1.0, math.inf)
  plan = plan_from_config(cfg, np.array([100, 100]))
  noise = plan.noise_scale(10)
  assert noise[1] == 0.0 and noise[0] > 0
  state = plan.accountant_step(plan.accountant_init(), noise, selected=np.array([0, 1]))
  assert math.isinf(plan.certified_epsilon(state))
  eps = plan.certified_epsilons(state)
  assert np.isfinite(eps[0]) and eps[0] <= 1.0 and math.isinf(eps[1])


@pytest.mark.parametrize("eps", [1.0, 8.0, 20.0])
def test_default_formula_keeps_the_target(eps):
  cfg = _cfg(**{"privacy.epsilon": eps, "rounds": 50})
  assert cfg.privacy.formula == "calibrated"
  plan = plan_from_config(cfg, np.full(10, 100))
  noise = plan.noise_scale(50)
  state = plan.accountant_init()
  for _ in range(50):
    state = plan.accountant_step(state, noise, selected=np.arange(10))
  assert plan.certified_epsilon(state) <= eps * (1 + 1e-6)
  assert plan.claimed_epsilon(state) == plan.certified_epsilon(state)


def test_quickstart_certified_epsilon_within_its_target():
  cfg = config_lib.load_config("experiments/configs/quickstart.py")
  plan = plan_from_config(cfg, np.full(cfg.data.num_clients, cfg.data.samples_per_client))
  noise = plan.noise_scale(cfg.rounds)
  state = plan.accountant_init()
  for _ in range(cfg.rounds):
    state = plan.accountant_step(state, noise, selected=np.arange(cfg.data.num_clients))
  assert plan.certified_epsilon(state) <= cfg.privacy.epsilon * (1 + 1e-6)


def test_enforce_budget_compares_each_client_with_its_own_target():
  """Targets (1, 8): after the first round client 2 is past 1 but within its own
  target; the run must not stop before it spends it (host loop only, no device)."""
  cfg = _cfg(**{"data.num_clients": 2, "server.clients_per_round": 2,
                "data.samples_per_client": 20, "model.name": "logistic", "rounds": 3,
                "privacy.client_epsilons": "(1, 8)", "privacy.enforce_budget": "true",
                "progress": "false"})
  loop = experiment.RunLoop(cfg, experiment.build(cfg))
  metrics = {"train_loss": 0.0, "grad_norm": 0.0, "update_norm": 0.0, "num_selected": 2}
  for _ in range(3):
    assert loop.plan_round() is not None
    loop.record(metrics, (0.0, 0.0), 0.0)
  assert loop.plan_round() is None and loop.status == "completed"
  eps = loop.privacy.certified_epsilons(loop.acct)
  assert eps[1] > 1.0 and np.all(eps <= np.array([1.0, 8.0]) * (1 + 1e-6))


def test_round_robin_calibration_meets_the_target_for_the_busiest_client():
  """U = 7, K = 3 (passes of 3 rounds, the last selecting 1), T = 10: clients take
  part 3 or 4 times; calibration is for the most turns and certification per client."""
  u, k, t = 7, 3, 10
  cfg = _cfg(**{"data.num_clients": u, "server.selection": "round_robin",
                "server.clients_per_round": k, "rounds": t, "privacy.epsilon": 2.0})
  plan = plan_from_config(cfg, np.full(u, 50))
  noise = plan.noise_scale(t)
  state, turns = plan.accountant_init(), np.zeros(u, int)
  for r in range(t):
    idx, sel = engine.select_clients("round_robin", u, k, 0.0, 0, r)
    state = plan.accountant_step(state, noise, selected=idx[sel > 0])
    turns[idx[sel > 0]] += 1
  assert set(turns) == {3, 4}
  eps = plan.certified_epsilons(state)
  np.testing.assert_allclose(eps.max(), 2.0, rtol=1e-3)
  assert np.all(eps[turns == 3] < eps.max())


@pytest.mark.parametrize("sets,field", [
    ({"client.clip_mode": "none"}, "client.clip_mode"),
    ({"privacy.placement": "step", "client.clip_mode": "param_l2"}, "client.clip_mode"),
    ({"privacy.placement": "central"}, "client.clip_mode"),
    ({"privacy.mechanism": "laplace"}, "per_example_l1"),
    ({"client.local_steps": 2, "client.l2_reg": 30.0}, "client.l2_reg"),
    ({"privacy.placement": "central", "client.clip_mode": "update_l2",
      "server.selection": "poisson", "server.q": 0.5}, "server.aggregation"),
])
def test_unbounded_combinations_are_refused_naming_the_field(sets, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    plan_from_config(_cfg(**sets), np.full(10, 20))
