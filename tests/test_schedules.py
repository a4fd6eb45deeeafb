"""Schedules as state machines, driven by hand-made loss sequences (no engine)."""

import math

import numpy as np
import pytest

from fedjax_dp.privacy import formulas
from fedjax_dp.privacy.schedules import (
  SCHEDULES,
  NoiseContext,
  config_fields,
  constant,
  crd,
  get_schedule,
  linear_decay,
)

DELTA = 1e-3
Q = 0.6


def _ctx(rounds=20, eps=(4.0, 8.0, 20.0), sizes=(400, 800, 1200), params=None):
  eps = np.asarray(eps, np.float64)
  sens = np.asarray(formulas.wei_sensitivity(0.1, 1.0, np.asarray(sizes, np.float64)))

  def noise_fn(t):
    finite = np.isfinite(eps)
    sigma = formulas.wei_sigma_eq10(np.where(finite, eps, 1.0), DELTA, Q, t, sens)
    return np.where(finite, sigma, 0.0)

  return NoiseContext(eps, DELTA, Q, sens, rounds, noise_fn, 0.1, params or {})


def _drive(schedule, ctx, losses):
  """A minimal run loop: plan, 'train', observe. Returns (plans, final state)."""
  state = schedule.init(ctx)
  plans = []
  for t, loss in enumerate(losses):
    p = schedule.plan(state, t)
    if p.stop:
      break
    plans.append(p)
    state = schedule.observe(state, t, {"round": t + 1, "test_loss": loss, "train_loss": 1.0})
  return plans, state


def _decreasing(n, start=2.0, step=0.01):
  return [start - step * (i + 1) for i in range(n)]


def _wei_budget(ctx):
  return np.asarray(formulas.wei_budget(ctx.epsilon, ctx.delta, ctx.q, ctx.sensitivity))


# ----------------------------------------------------------------------------- registry


def test_registry_and_config_fields():
  assert {"constant", "crd", "linear_decay"} <= set(SCHEDULES)
  assert get_schedule("crd") is crd.SCHEDULE
  with pytest.raises(ValueError, match="schedule.name"):
    get_schedule("nope")
  # the union over all schedules (other schedules add their own fields)
  assert {"schedule.beta": 0.9, "schedule.zeta": 0.001, "schedule.decay_fraction": 0.5,
          "schedule.decay_floor": 0.1}.items() <= config_fields().items()
  assert config_fields("constant") == {}
  assert config_fields("crd") == {"schedule.beta": 0.9, "schedule.zeta": 0.001}


def test_noise_context_params_default_is_empty_and_immutable():
  ctx = NoiseContext(np.ones(1), DELTA, 1.0, np.ones(1), 5, lambda t: np.ones(1))
  assert dict(ctx.params) == {}
  with pytest.raises(TypeError):
    ctx.params["beta"] = 0.5  # type: ignore[index]


# ----------------------------------------------------------------------------- CRD


def test_crd_without_trigger_is_the_constant_schedule_and_spends_the_budget():
  ctx = _ctx(rounds=20)
  plans, state = _drive(crd.SCHEDULE, ctx, _decreasing(40))
  const = constant.SCHEDULE.plan(constant.SCHEDULE.init(ctx), 0)
  assert len(plans) == 20 and state.triggers == 0
  for p in plans:  # eqs. (30)-(31): sigma unchanged while T is unchanged
    np.testing.assert_allclose(p.noise, const.noise, rtol=1e-12)
    assert p.horizon == 20
  np.testing.assert_allclose(state.budget, _wei_budget(ctx), rtol=1e-12)
  np.testing.assert_allclose(state.spent, state.budget, rtol=1e-12)
  np.testing.assert_allclose(
      formulas.wei_epsilon_claimed(state.spent, DELTA, Q, ctx.sensitivity), ctx.epsilon,
      rtol=1e-12)
  assert crd.SCHEDULE.plan(state, 20).stop


def test_crd_trigger_discounts_horizon_and_lowers_sigma():
  ctx = _ctx(rounds=20)
  # After round 2 the loss falls by 5e-4 < zeta: T <- floor(0.9 (20 - 2)) + 2 = 18.
  losses = [1.0, 0.5, 0.4995] + _decreasing(30, start=0.4)
  schedule = crd.SCHEDULE
  state = schedule.init(ctx)
  sigmas, horizons = [], []
  for t, loss in enumerate(losses):
    p = schedule.plan(state, t)
    if p.stop:
      break
    # eq. (25) with the 0..t-1 history, as in the formulas module
    np.testing.assert_allclose(p.noise, formulas.wei_sigma_eq25(
        ctx.epsilon, DELTA, Q, ctx.sensitivity, state.horizon, t, state.spent), rtol=1e-12)
    sigmas.append(p.noise)
    horizons.append(p.horizon)
    state = schedule.observe(state, t, {"test_loss": loss})
  assert horizons == [20, 20, 20] + [18] * 15
  assert state.triggers == 1 and len(sigmas) == 18
  ratio = math.sqrt((18 - 2 - 1) / (20 - 2 - 1))  # spec section 3.6
  np.testing.assert_allclose(sigmas[3] / sigmas[2], ratio, rtol=1e-12)
  for s in sigmas[4:]:  # unchanged again after the discount
    np.testing.assert_allclose(s, sigmas[3], rtol=1e-12)
  np.testing.assert_allclose(state.spent, _wei_budget(ctx), rtol=1e-12)


def test_crd_budget_exact_after_several_discounts():
  ctx = _ctx(rounds=50, params={"beta": 0.8, "zeta": 0.001, "name": "crd"})
  rng = np.random.default_rng(0)
  # Plateaus (fire) alternating with clear progress (no fire). The seed is such that
  # no trigger lands at T - t == 2 (which would end the run with budget left).
  losses, v = [], 3.0
  for t in range(60):
    v -= 0.05 if rng.random() < 0.7 else 0.0
    losses.append(v)
  plans, state = _drive(crd.SCHEDULE, ctx, losses)
  hs = [p.horizon for p in plans]
  assert state.triggers >= 2 and all(np.diff(hs) <= 0)
  assert len(plans) == state.horizon < 50
  np.testing.assert_allclose(state.spent / state.budget, 1.0, rtol=1e-12)
  # every discount strictly lowered the noise (spec section 3.6)
  noise = np.array([p.noise[0] for p in plans])
  assert np.all(np.diff(noise) <= 1e-12 * noise[0])
  cuts = int(np.sum(np.diff(hs) < 0))
  assert np.sum(np.diff(noise) < 0) == cuts >= 2
  assert state.triggers >= cuts  # a trigger in the last round cuts nothing


def test_crd_loss_increase_fires_and_round_zero_never_fires():
  ctx = _ctx(rounds=10)
  state = crd.init(ctx)
  state = crd.observe(state, 0, {"test_loss": 5.0})  # V(w^0) = +inf: no trigger
  assert state.horizon == 10 and state.triggers == 0
  state = crd.observe(state, 1, {"test_loss": 6.0})  # loss went up: fires
  assert state.horizon == math.floor(0.9 * 9) + 1 == 9 and state.triggers == 1


def test_crd_discount_near_the_end():
  assert crd.discount_horizon(10, 9, 0.9) == 10    # T - t = 1: nothing to cut
  assert crd.discount_horizon(10, 8, 0.9) == 9     # floor(1.8) + 8: ends after round 8
  assert crd.discount_horizon(10, 8, 0.4) == 9     # never below t + 1
  assert crd.discount_horizon(200, 0, 0.9) == 180
  assert crd.discount_horizon(30, 0, 0.7) == 21    # 0.7 * 30 is 20.999... in floats


@pytest.mark.parametrize("beta,rounds", [(0.5, 7), (0.6, 8), (0.7, 11), (0.8, 15), (0.9, 26)])
def test_crd_trigger_every_round_lengths(beta, rounds):
  # spec section 5: firing every round from t = 0 with T0 = 200
  horizon, t = 200, 0
  while t < horizon:
    horizon = crd.discount_horizon(horizon, t, beta)
    t += 1
  assert t == rounds


def test_crd_stop_after_cut_to_next_round():
  ctx = _ctx(rounds=10)
  losses = _decreasing(8) + [1.92, 1.0]
  plans, state = _drive(crd.SCHEDULE, ctx, losses)
  # Round 8 (T - t = 2) fires: T = floor(1.8) + 8 = 9, the run ends after 9 rounds.
  assert len(plans) == 9 and state.horizon == 9
  assert np.all(state.spent < state.budget)  # the unused last round's budget is left


def test_crd_needs_test_loss_every_round():
  ctx = _ctx()
  state = crd.init(ctx)
  with pytest.raises(ValueError, match="eval.every"):
    crd.observe(state, 0, {"round": 1, "train_loss": 0.3})
  with pytest.raises(ValueError, match="eval.every"):
    crd.observe(state, 0, {"test_loss": ""})
  with pytest.raises(ValueError, match="expected round 0"):
    crd.observe(state, 1, {"test_loss": 1.0})


@pytest.mark.parametrize("params", [{"beta": 1.0}, {"beta": 0.0}, {"zeta": math.nan}])
def test_crd_rejects_bad_params(params):
  with pytest.raises(ValueError, match="schedule."):
    crd.init(_ctx(params=params))


def test_crd_without_noise_keeps_sigma_zero():
  ctx = _ctx(rounds=5, eps=(math.inf, 4.0, math.inf))
  plans, state = _drive(crd.SCHEDULE, ctx, _decreasing(10))
  assert len(plans) == 5
  for p in plans:
    assert p.noise[0] == 0.0 and p.noise[2] == 0.0 and p.noise[1] > 0
  assert state.spent[0] == 0.0 and np.isinf(state.budget[0])
  np.testing.assert_allclose(state.spent[1], state.budget[1], rtol=1e-12)


# ----------------------------------------------------------------------------- linear decay


def test_linear_decay_defaults_stop_at_the_budget():
  ctx = _ctx(rounds=200)
  plans, state = _drive(linear_decay.SCHEDULE, ctx, [1.0] * 300)
  sigma0 = ctx.noise_fn(200)
  n = len(plans)
  assert n == state.horizon == 133  # about 2 T0 / 3 for decay_fraction = 0.5
  np.testing.assert_allclose(plans[0].noise, sigma0, rtol=1e-12)
  k = 0.5 * sigma0 / 200
  for t, p in enumerate(plans):  # linear: sigma^t = sigma^0 - k t
    np.testing.assert_allclose(p.noise, sigma0 - k * t, rtol=1e-12)
  budget = _wei_budget(ctx)
  assert np.all(state.spent <= budget)
  next_cost = 1.0 / np.square(linear_decay.round_noise(state, n))
  assert np.all(state.spent + next_cost > budget)  # one more round would pass eps
  claimed = formulas.wei_epsilon_claimed(state.spent, DELTA, Q, ctx.sensitivity)
  assert np.all(claimed <= ctx.epsilon) and np.all(claimed > 0.99 * ctx.epsilon)
  assert linear_decay.SCHEDULE.plan(state, n).stop


def test_linear_decay_zero_slope_is_constant():
  ctx = _ctx(rounds=30, params={"decay_fraction": 0.0})
  plans, state = _drive(linear_decay.SCHEDULE, ctx, [1.0] * 40)
  const = constant.SCHEDULE.plan(constant.SCHEDULE.init(ctx), 0)
  assert len(plans) == 30
  for p in plans:
    np.testing.assert_allclose(p.noise, const.noise, rtol=1e-12)
  np.testing.assert_allclose(state.spent, _wei_budget(ctx), rtol=1e-12)


def test_linear_decay_floor():
  ctx = _ctx(rounds=40, params={"decay_fraction": 2.0, "decay_floor": 0.25})
  plans, _ = _drive(linear_decay.SCHEDULE, ctx, [1.0] * 50)
  sigma0 = ctx.noise_fn(40)
  ratios = np.array([p.noise / sigma0 for p in plans])
  assert np.all(ratios >= 0.25 - 1e-15)
  np.testing.assert_allclose(ratios[:6, 0], [1.0, 0.95, 0.9, 0.85, 0.8, 0.75])
  # cost in units of B / T0: 1/r^2 summed must stay <= T0 = 40
  assert np.sum(1 / ratios[:, 0] ** 2) <= 40 * (1 + 1e-9) < np.sum(1 / ratios[:, 0] ** 2) + 16
  assert len(plans) == linear_decay.stopping_round(2.0, 0.25, 40)


@pytest.mark.parametrize("params", [{"decay_fraction": -0.1}, {"decay_floor": 0.0},
                                    {"decay_floor": 1.5}])
def test_linear_decay_rejects_bad_params(params):
  with pytest.raises(ValueError, match="schedule.decay"):
    linear_decay.init(_ctx(params=params))
