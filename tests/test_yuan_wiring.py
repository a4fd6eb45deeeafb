"""Yuan et al.'s formulas drive runs: eq. (8) printed and corrected, eq. (9), Laplace.

The noise and the claimed epsilon use the paper's ``Delta_s = 2 C / |D_k|``; the
certified epsilon uses the true sensitivity of a ``param_l2`` upload (2 C, L1
``2 C sqrt(d)``).
"""

import math

import numpy as np
import pytest
from _helpers import small_config

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.privacy import formulas
from fedjax_dp.privacy.plan import param_l1_sensitivity
from fedjax_dp.privacy.schedules import constant, geometric

U, K, M, N, C, EPS, DELTA = 100, 10, 30, 600, 5.0, 10.0, 1e-3
DS = 2 * C / N   # the paper's Delta_s


def _cfg(**sets):
  base = {"data.num_clients": U, "server.clients_per_round": K, "rounds": M,
          "client.clip_mode": "param_l2", "client.clip": C, "privacy.epsilon": EPS,
          "privacy.delta": DELTA, "privacy.formula": "yuan_eq8",
          "schedule.name": "geometric"}
  base.update(sets)
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in base.items()])


def _play(cfg, plan, schedule, losses=None):
  """Runs the schedule and the accountant for M rounds; returns (states, claims, noises)."""
  state = schedule.init(experiment.noise_context(cfg, plan))
  acct = plan.accountant_init()
  claims, noises = [], []
  for t in range(M):
    p = schedule.plan(state, t)
    if p.stop:
      break
    acct = plan.accountant_step(acct, p.noise)
    claims.append(plan.claimed_epsilon(acct))
    noises.append(p.noise)
    loss = 1.0 if losses is None else losses[t]
    state = schedule.observe(state, t, {"test_loss": loss})
  return state, acct, np.array(claims), np.array(noises)


@pytest.mark.parametrize("theta", [0.95, 1.0, 1.05])
def test_eq8_printed_noise_claim_and_certificate(theta):
  cfg = _cfg(**{"schedule.theta": theta})
  plan = plan_from_config(cfg, np.full(U, N))
  state, acct, claims, noises = _play(cfg, plan, geometric)
  sigma = formulas.yuan_sigma_eq8(EPS, DELTA, K / U, M, theta, DS)
  np.testing.assert_allclose(state.base, sigma, rtol=1e-12)
  np.testing.assert_allclose(noises[:, 0], sigma * theta ** (np.arange(M) / 2), rtol=1e-12)
  if theta == 1.05:   # spec section 3 table (Delta_s = 1/60)
    np.testing.assert_allclose(sigma, 0.007870, atol=5e-7)
  # The paper's claim grows to the target at m = M ...
  assert np.all(np.diff(claims) > 0)
  np.testing.assert_allclose(claims[-1], EPS, rtol=1e-9)
  # ... while the accountant charges the true sensitivity 2 C of a param_l2 upload.
  np.testing.assert_allclose(plan.sensitivity, 2 * C)
  np.testing.assert_allclose(plan.multipliers(noises[-1], 0.0), noises[-1] / (2 * C))
  assert plan.certified_epsilon(acct) > 1e3 * EPS


def test_eq8_corrected_claims_the_target_under_the_papers_accountant():
  cfg = _cfg(**{"schedule.theta": 1.05, "privacy.formula": "yuan_eq8_corrected"})
  plan = plan_from_config(cfg, np.full(U, N))
  state, _, claims, _ = _play(cfg, plan, geometric)
  np.testing.assert_allclose(
      state.base, formulas.yuan_sigma_eq8_corrected(EPS, DELTA, K / U, M, 1.05, DS), rtol=1e-12)
  printed = formulas.yuan_sigma_eq8(EPS, DELTA, K / U, M, 1.05, DS)
  np.testing.assert_allclose(state.base / printed, 1.282, atol=1e-3)
  np.testing.assert_allclose(claims[-1], EPS, rtol=1e-9)
  # The printed formula's noise, judged by the same accountant, spends 13.62 (spec 3.3).
  inv = M / float(formulas.yuan_sigma_eq8(EPS, DELTA, K / U, M, 1.0, DS)) ** 2
  np.testing.assert_allclose(formulas.yuan_epsilon_achieved(inv, DELTA, K / U, DS), 13.62,
                             atol=5e-3)


@pytest.mark.parametrize("theta", [0.9, 1.0, 1.05])
def test_refinement_is_eq9_with_the_papers_sensitivity(theta):
  cfg = _cfg(**{"schedule.theta": theta, "schedule.refine": 1, "schedule.alpha_d": 0.8})
  plan = plan_from_config(cfg, np.full(U, N))
  losses = [3.0, 2.0, 2.5] + [1.0] * M        # stalls after m = 3
  state = geometric.init(experiment.noise_context(cfg, plan))
  for t, loss in enumerate(losses[:3]):
    state = geometric.observe(state, t, {"test_loss": loss})
  assert state.horizon == 24
  np.testing.assert_allclose(
      state.base, formulas.yuan_sigma_eq9(EPS, DELTA, K / U, DS, theta, 3, 24), rtol=1e-12)


def test_laplace_baselines():
  d = 25450   # MLP 784-32-10
  cfg = _cfg(**{"schedule.name": "constant", "privacy.mechanism": "laplace",
                "privacy.formula": "yuan_laplace"})
  plan = plan_from_config(cfg, np.full(U, N), num_params=d)
  np.testing.assert_allclose(plan.sensitivity, 2 * C * math.sqrt(d))
  _, acct, claims, noises = _play(cfg, plan, constant)
  np.testing.assert_allclose(noises, M * DS / EPS, rtol=1e-12)      # b = M Delta_s / eps
  np.testing.assert_allclose(claims, EPS * np.arange(1, M + 1) / M, rtol=1e-9)
  np.testing.assert_allclose(plan.multipliers(noises[0], 0.0), noises[0] / (2 * C * d ** 0.5))
  assert plan.certified_epsilon(acct) > 1e3 * EPS

  matched = plan_from_config(_cfg(**{"schedule.name": "constant",
                                      "privacy.mechanism": "laplace",
                                      "privacy.formula": "yuan_laplace_matched"}),
                              np.full(U, N), num_params=d)
  b = matched.noise_scale(M)
  sigma = formulas.yuan_sigma_eq8(EPS, DELTA, K / U, M, 1.0, DS)
  np.testing.assert_allclose(2 * b ** 2, sigma ** 2, rtol=1e-12)   # same variance


def test_update_l2_reads_algorithm_1_with_the_same_noise_and_certificate():
  """update_l2 (the C-ball around the global model, spec 7.3 item 12's other reading
  for the CNN) gets eq. (8)'s noise from the paper's Delta_s and is certified with
  the same true sensitivity 2 C as param_l2."""
  plans = {m: plan_from_config(_cfg(**{"client.clip_mode": m}), np.full(U, N))
           for m in ("param_l2", "update_l2")}
  runs = {m: _play(_cfg(**{"client.clip_mode": m}), p, geometric) for m, p in plans.items()}
  np.testing.assert_array_equal(runs["param_l2"][3], runs["update_l2"][3])
  np.testing.assert_allclose(plans["update_l2"].sensitivity, 2 * C)
  assert (plans["update_l2"].certified_epsilon(runs["update_l2"][1])
          == plans["param_l2"].certified_epsilon(runs["param_l2"][1]))


def test_param_l1_sensitivity_bound_is_tight_on_the_ball():
  rng = np.random.default_rng(0)
  for d in (1, 6, 1000):
    x = rng.normal(size=(2000, d))
    y = rng.normal(size=(2000, d))
    x *= C / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), C)   # inside the ball
    y *= C / np.linalg.norm(y, axis=1, keepdims=True)
    assert np.all(np.abs(x - y).sum(1) <= param_l1_sensitivity(C, d) * (1 + 1e-12))
    worst = np.full(d, C / math.sqrt(d))
    np.testing.assert_allclose(np.abs(2 * worst).sum(), param_l1_sensitivity(C, d))


@pytest.mark.parametrize("sets,match", [
    ({"client.clip_mode": "per_example_l2"}, r"client\.clip_mode in param_l2, update_l2"),
    ({"privacy.placement": "step", "client.clip_mode": "per_example_l2"},
     r"privacy\.placement='upload'"),
    ({"privacy.mechanism": "laplace", "schedule.name": "constant"},
     r"privacy\.mechanism='gaussian'"),
    ({"privacy.formula": "yuan_laplace_matched"}, r"privacy\.mechanism='laplace'"),
    ({"privacy.formula": "calibrated", "privacy.mechanism": "laplace",
      "client.clip_mode": "per_example_l2"}, r"per_example_l1"),
    ({"privacy.formula": "calibrated", "privacy.mechanism": "laplace",
      "privacy.placement": "central", "client.clip_mode": "update_l2"},
     r"privacy\.placement='upload'"),
])
def test_unbounded_yuan_combinations_are_refused(sets, match):
  with pytest.raises(ValueError, match=match):
    plan_from_config(_cfg(**sets), np.full(U, N), num_params=10)


def test_laplace_param_l2_needs_the_parameter_count():
  cfg = _cfg(**{"privacy.mechanism": "laplace", "privacy.formula": "yuan_laplace",
                "schedule.name": "constant"})
  with pytest.raises(ValueError, match="num_params"):
    plan_from_config(cfg, np.full(U, N))


def test_geometric_laplace_is_refused_by_the_config():
  cfg = _cfg(**{"privacy.mechanism": "laplace", "privacy.formula": "yuan_laplace"})
  with pytest.raises(config_lib.ConfigError, match="geometric"):
    config_lib.validate(cfg)


def test_engine_records_the_claim_beside_the_certificate():
  """End to end on digits with the Laplace baseline (the engine passes d to the plan):
  the last row claims the target, the certificate uses ``2 C sqrt(d)``. (The Gaussian
  geometric path is the same plan and schedule code, played above.)"""
  formula, mechanism, schedule = "yuan_laplace", "laplace", "constant"
  cfg = small_config({"rounds": 3, "data.num_clients": 10, "data.samples_per_client": 20,
                      "server.clients_per_round": 5, "client.local_steps": 2,
                      "client.clip_mode": "param_l2", "client.clip": C,
                      "privacy.epsilon": EPS, "privacy.mechanism": mechanism,
                      "privacy.formula": formula, "schedule.name": schedule,
                      "schedule.theta": 1.05, "model.name": "logistic"})
  res = experiment.run(cfg)
  rows = res.rows
  assert len(rows) == 3
  np.testing.assert_allclose(float(rows[-1]["epsilon_claimed"]), EPS, rtol=1e-6)
  assert float(rows[-1]["epsilon_certified"]) > EPS
  assert res.summary["privacy"]["sensitivity_claimed_max"] == pytest.approx(2 * C / 20)
