"""Yuan's geometric schedule (with Theorem 2's refinement) and A-DPFL's decay, driven by hand."""

import math

import numpy as np
import pytest

from fedjax_dp import config as config_lib
from fedjax_dp.privacy import formulas
from fedjax_dp.privacy.schedules import (
  SCHEDULES,
  NoiseContext,
  adpfl,
  config_fields,
  constant,
  geometric,
  get_schedule,
)

DELTA, Q = 1e-3, 0.1
THETAS = (0.9, 0.95, 1.0, 1.05, 1.1)
EPS = np.array([10.0, 5.0, math.inf])


def _sens(sizes=(600, 300, 600)):
  return np.asarray(formulas.yuan_sensitivity(5.0, np.asarray(sizes, np.float64)))


def _ctx(rounds=30, params=None, corrected=False, eps=EPS):
  sens = _sens()
  fn = formulas.wei_sigma_eq10_corrected if corrected else formulas.wei_sigma_eq10

  def noise_fn(t):  # Yuan's Remark 3 (= Wei's eq. (10)): the constant-schedule noise
    finite = np.isfinite(eps)
    return np.where(finite, fn(np.where(finite, eps, 1.0), DELTA, Q, t, sens), 0.0)

  return NoiseContext(eps, DELTA, Q, sens, rounds, noise_fn, 0.1, params or {})


def _drive(schedule, ctx, metrics_seq):
  """A minimal run loop: plan, 'train', observe. Returns (plans, final state)."""
  state = schedule.init(ctx)
  plans = []
  for t, metrics in enumerate(metrics_seq):
    p = schedule.plan(state, t)
    if p.stop:
      break
    plans.append(p)
    state = schedule.observe(state, t, {"round": t + 1, **metrics})
  return plans, state


def _losses(seq):
  return [{"test_loss": v} for v in seq]


def _claimed(plans, ctx):
  inv = sum(np.where(p.noise > 0, 1.0 / np.square(np.where(p.noise > 0, p.noise, 1.0)), 0.0)
            for p in plans)
  return np.asarray(formulas.yuan_epsilon_claimed(inv, DELTA, Q, ctx.sensitivity))


# ----------------------------------------------------------------------------- registry


def test_registry_config_fields_and_base_config():
  assert get_schedule("geometric") is geometric.SCHEDULE
  assert get_schedule("adpfl") is adpfl.SCHEDULE
  assert config_fields("geometric") == {f"schedule.{k}": v for k, v in geometric.PARAMS.items()}
  assert config_fields("adpfl") == {"schedule.k": 0.7, "schedule.alpha": 0.005,
                                    "schedule.adjust_every": 1.0}
  # every registered schedule parameter is a config field with the same default
  cfg = config_lib.base_config()
  for key, default in config_fields().items():
    assert cfg.schedule[key.split(".", 1)[1]] == default, key
  assert {"geometric", "adpfl"} <= set(SCHEDULES)


@pytest.mark.parametrize("sets,match", [
    ({"schedule.name": "geometric", "privacy.mechanism": "laplace"}, "privacy.mechanism"),
    ({"schedule.name": "geometric", "schedule.refine": "1", "eval.every": "2"}, "eval.every"),
    ({"schedule.name": "adpfl", "schedule.validation": "server", "schedule.adjust_every": "3",
      "eval.every": "2"}, "eval.every"),
])
def test_config_refuses_unbounded_or_unobservable_combinations(sets, match):
  cfg = config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in sets.items()])
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(cfg)


# ----------------------------------------------------------------------------- geometric


@pytest.mark.parametrize("theta", THETAS)
def test_geometric_base_is_eq8_printed_and_corrected(theta):
  for corrected in (False, True):
    ctx = _ctx(params={"theta": theta}, corrected=corrected)
    state = geometric.init(ctx)
    expect = geometric.yuan_base_sigma(EPS, DELTA, Q, 30, theta, ctx.sensitivity, corrected)
    np.testing.assert_allclose(state.base, expect, rtol=1e-12)
    fn = formulas.yuan_sigma_eq8_corrected if corrected else formulas.yuan_sigma_eq8
    np.testing.assert_allclose(state.base[:2], fn(EPS[:2], DELTA, Q, 30, theta,
                                                  ctx.sensitivity[:2]), rtol=1e-12)
    assert state.base[2] == 0.0


def test_geometric_base_matches_certified_calibration_without_subsampling():
  """With full participation the certified RDP accountant composes Gaussians as
  sum sigma^-2, so rescaling the calibrated constant noise by sqrt(S_M / M) is the
  certified geometric calibration (calibration.calibrate_noise_multiplier, ratio
  sqrt(theta) on the std)."""
  from fedjax_dp.privacy import calibration
  z_const = calibration.calibrate_noise_multiplier(8.0, DELTA, 30)
  for theta in (0.9, 1.05):
    z_geo = calibration.calibrate_noise_multiplier(8.0, DELTA, 30, ratio=math.sqrt(theta))
    assert geometric.base_from_constant(z_const, 30, theta) == pytest.approx(z_geo, rel=1e-5)


def test_geometric_reference_values_and_monotonicity():
  """Spec section 3 table and checklist item 3 (Delta_s = 1/60, q = 0.1, eps = 10)."""
  sig = [float(geometric.yuan_base_sigma(10.0, DELTA, Q, 30, th, 1 / 60)) for th in THETAS]
  assert sig[2] == pytest.approx(0.010730, abs=5e-7)
  assert sig[3] == pytest.approx(0.007870, abs=5e-7)
  last = [s * th ** (29 / 2) for s, th in zip(sig, THETAS, strict=True)]
  assert np.all(np.diff(sig) < 0) and np.all(np.diff(last) > 0)


@pytest.mark.parametrize("theta", THETAS)
def test_geometric_without_refinement_spends_exactly_the_target(theta):
  """Checklist item 1: the per-round sigmas fed to eq. (8)'s epsilon give eps back."""
  ctx = _ctx(params={"theta": theta})
  plans, state = _drive(geometric.SCHEDULE, ctx, _losses([1.0] * 40))  # flat loss: no refine
  assert len(plans) == 30 and state.horizons == (30,) * 30
  for t, p in enumerate(plans):
    np.testing.assert_allclose(p.noise, state.base * theta ** (t / 2), rtol=1e-12)
    assert p.horizon == 30
  np.testing.assert_allclose(_claimed(plans, ctx)[:2], EPS[:2], rtol=1e-10)
  np.testing.assert_allclose(state.spent[:2], state.budget[:2], rtol=1e-10)
  assert state.spent[2] == 0 and np.all(plans[-1].noise[2] == 0)
  if theta == 1.0:  # the constant schedule
    cplans, _ = _drive(constant.SCHEDULE, ctx, _losses([1.0] * 40))
    for a, b in zip(plans, cplans, strict=True):
      np.testing.assert_allclose(a.noise, b.noise, rtol=1e-12)


def test_eq9_branches_and_the_theta_below_one_discrepancy():
  """Checklist item 4."""
  def s30(th):
    return float(formulas.yuan_geometric_sum(th, 30))

  assert geometric.eq9_factor(1.05, 30, 30) == pytest.approx(s30(1.05), rel=1e-12)
  assert geometric.eq9_factor(1.0, 10, 24) == 24
  assert geometric.eq9_factor(0.9, 30, 30) == pytest.approx(213.308, abs=1e-3)
  assert s30(0.9) == pytest.approx(203.308, abs=1e-3)
  assert geometric.eq9_factor(0.9, 30, 30) == pytest.approx(s30(0.9) + 1 / (1 - 0.9), rel=1e-12)
  # sqrt(F / B) is formulas.yuan_sigma_eq9, all branches
  budget = float(formulas.wei_budget(10.0, DELTA, Q, 1 / 60))
  for th in (0.9, 1.0, 1.05):
    assert math.sqrt(geometric.eq9_factor(th, 10, 27) / budget) == pytest.approx(
        float(formulas.yuan_sigma_eq9(10.0, DELTA, Q, 1 / 60, th, 10, 27)), rel=1e-12)
  # theta = 1: sigma' = sigma sqrt(M'/M)
  ctx = _ctx(params={"theta": 1.0, "refine": 1, "alpha_d": 0.8})
  plans, state = _drive(geometric.SCHEDULE, ctx, _losses([3, 2, 2.5, 1, 0.5]))
  np.testing.assert_allclose(state.base[:2], geometric.init(ctx).base[:2] * math.sqrt(24 / 30),
                             rtol=1e-12)
  np.testing.assert_allclose(plans[3].noise, state.base, rtol=1e-12)


def test_refinement_staircase_horizon_and_sigma():
  """A stall after aggregation m shrinks M iteratively and re-solves sigma by eq. (9)."""
  theta = 1.05
  for alpha_d, first, second in ((0.9, 27, 25), (0.8, 24, 20)):
    ctx = _ctx(params={"theta": theta, "refine": 1, "alpha_d": alpha_d})
    # decreasing for 5 rounds, stall at m = 6, decrease, stall at m = 10, then decrease
    losses = [5, 4, 3, 2, 1, 1.5, 1.2, 1.1, 1.0, 1.0] + [0.9 - 0.01 * i for i in range(30)]
    plans, state = _drive(geometric.SCHEDULE, ctx, _losses(losses))
    h = state.horizons
    assert h[:5] == (30,) * 5 and h[5:9] == (first,) * 4 and h[9] == second
    assert np.all(np.diff(h) <= 0)
    assert len(plans) == second and state.triggers == 2
    # sigma after the first trigger: eq. (9) at m = 6, M' = first, from round m + 1 on
    base0 = geometric.init(ctx).base
    s6 = np.sqrt(geometric.eq9_factor(theta, 6, first) / state.budget)
    np.testing.assert_allclose(plans[5].noise[:2], base0[:2] * theta ** 2.5, rtol=1e-12)
    np.testing.assert_allclose(plans[6].noise[:2], s6[:2] * theta ** 3, rtol=1e-12)
    np.testing.assert_allclose(plans[6].noise[:2], [
        formulas.yuan_sigma_eq9(e, DELTA, Q, d, theta, 6, first) * theta ** 3
        for e, d in zip(EPS[:2], ctx.sensitivity[:2], strict=True)], rtol=1e-12)
    assert plans[6].horizon == first and plans[-1].horizon == second


def _one_trigger(theta, exact, m=10):
  ctx = _ctx(params={"theta": theta, "refine": 1, "alpha_d": 0.9, "refine_exact": exact})
  losses = [10.0 - i for i in range(m - 1)] + [100.0] + [1.0 - 0.001 * i for i in range(40)]
  return ctx, *_drive(geometric.SCHEDULE, ctx, _losses(losses))


def test_paper_refinement_overspends_below_theta_one_and_not_above():
  """Spec E9 / E11: eq. (9)'s theta < 1 branch under-counts (1.76x at theta = 0.9,
  m = 10, M' = 27); theta >= 1 stays within the budget after one trigger."""
  ctx, plans, state = _one_trigger(0.9, 0)
  assert len(plans) == 27
  ratio = state.spent[:2] / state.budget[:2]
  np.testing.assert_allclose(ratio, 1.76, atol=0.01)
  assert np.all(_claimed(plans, ctx)[:2] > EPS[:2] * 1.3)
  for theta in (1.0, 1.05, 1.1):
    ctx, plans, state = _one_trigger(theta, 0)
    assert np.all(state.spent[:2] <= state.budget[:2] * (1 + 1e-12))
    assert np.all(_claimed(plans, ctx)[:2] <= EPS[:2] * (1 + 1e-12))


@pytest.mark.parametrize("theta", THETAS)
def test_exact_refinement_ends_on_the_budget(theta):
  ctx, plans, state = _one_trigger(theta, 1)
  assert len(plans) == 27
  np.testing.assert_allclose(state.spent[:2], state.budget[:2], rtol=1e-10)
  np.testing.assert_allclose(_claimed(plans, ctx)[:2], EPS[:2], rtol=1e-10)
  # and the projection is exact right after the trigger
  st = geometric.init(ctx)
  for t, loss in enumerate([10.0 - i for i in range(9)] + [100.0]):
    st = geometric.observe(st, t, {"test_loss": loss})
  np.testing.assert_allclose(geometric.projected_spend(st)[:2], st.budget[:2], rtol=1e-10)
  # it lowers the noise when the past followed the original schedule (spec section 4)
  assert np.all(st.base[:2] <= geometric.init(ctx).base[:2] * (1 + 1e-12))


def test_refinement_stops_when_the_new_horizon_is_reached():
  ctx = _ctx(rounds=10, params={"theta": 1.05, "refine": 1, "alpha_d": 0.5})
  plans, state = _drive(geometric.SCHEDULE, ctx, _losses([5, 4, 3, 2, 1, 1.5, 1, 1, 1, 1]))
  assert len(plans) == 6 and state.horizon == 6 and state.horizons[-1] == 6
  assert geometric.plan(state, 6).stop
  # ceil(0.9 M) = M for small M: a trigger still shortens by one round
  assert geometric.shrink_horizon(8, 0.9) == 7 and geometric.shrink_horizon(30, 0.8) == 24


def test_patience_tolerance_and_nan():
  base = {"theta": 1.0, "refine": 1, "alpha_d": 0.8}
  # one bump is not enough with patience 2; two consecutive are
  _, s = _drive(geometric.SCHEDULE, _ctx(params={**base, "refine_patience": 2}),
                _losses([5, 4, 4.5, 3, 3.5, 3.6, 3.0]))
  assert s.triggers == 1 and s.horizons.index(24) == 5
  # a decrease smaller than the tolerance counts as a stall
  _, s = _drive(geometric.SCHEDULE, _ctx(params={**base, "refine_tol": 0.1}),
                _losses([5, 4, 3.95, 3.0]))
  assert s.triggers == 1 and s.horizons == (30, 30, 24, 24)
  _, s = _drive(geometric.SCHEDULE, _ctx(params=base), _losses([5, math.nan, 4, 3]))
  assert s.triggers == 0


def test_refinement_needs_the_test_loss_and_params_are_checked():
  st = geometric.init(_ctx(params={"refine": 1}))
  with pytest.raises(ValueError, match="eval.every"):
    geometric.observe(st, 0, {"round": 1, "train_loss": 1.0})
  geometric.observe(geometric.init(_ctx()), 0, {"round": 1})  # no refinement: no loss needed
  with pytest.raises(ValueError, match="expected round"):
    geometric.observe(st, 3, {"test_loss": 1.0})
  for params, field in (({"theta": 0.0}, "theta"), ({"alpha_d": 1.0}, "alpha_d"),
                        ({"refine": 0.5}, "refine"), ({"refine_patience": 1.5}, "patience"),
                        ({"refine_tol": -1.0}, "refine_tol"), ({"refine_exact": 2}, "exact")):
    with pytest.raises(ValueError, match=f"schedule.*{field}"):
      geometric.init(_ctx(params=params))


# ----------------------------------------------------------------------------- A-DPFL


def _adpfl_ctx(params=None, rounds=10, z=1.0):
  sens = np.array([2.0, 4.0])
  return NoiseContext(np.array([8.0, 8.0]), 1e-5, 0.1, sens, rounds, lambda t: z * sens, 0.05,
                      params or {})


def test_adpfl_decays_on_stalled_validation_accuracy():
  """Checklist item 10: sigma takes only the values sigma_0 0.7^m and never increases."""
  ctx = _adpfl_ctx({"k": 0.7, "alpha": 0.01})
  scores = [0.5, 0.7, 0.8, 0.805, 0.81, 0.9, 0.9, 0.95]
  plans, state = _drive(adpfl.SCHEDULE, ctx, [{"test_accuracy": s} for s in scores])
  # gains: .5 .2 .1 .005 .005 .09 0 .05 -> reductions after rounds 4, 5 and 7 (1-based)
  m = [0, 0, 0, 0, 1, 2, 2, 3]
  for p, mi in zip(plans, m, strict=True):
    np.testing.assert_allclose(p.noise, ctx.sensitivity * 0.7 ** mi, rtol=1e-12)
    assert p.horizon == 10
  assert state.reductions == 3
  noise = np.array([p.noise[0] for p in plans])
  assert np.all(np.diff(noise) <= 0)
  np.testing.assert_allclose(noise, formulas.adpfl_sigma_schedule(2.0, 0.7, m), rtol=1e-12)


def test_adpfl_score_key_period_and_errors():
  ctx = _adpfl_ctx({"alpha": 0.01, "adjust_every": 2})
  # val_accuracy is preferred over test_accuracy
  _, s = _drive(adpfl.SCHEDULE, ctx, [{"val_accuracy": 0.5, "test_accuracy": 0.9},
                                      {"val_accuracy": 0.505, "test_accuracy": 0.1}])
  assert s.reductions == 0 and s.prev_score == 0.505
  # checks only after rounds 2, 4, ...: round 1 may carry no score
  _, s = _drive(adpfl.SCHEDULE, ctx, [{}, {"test_accuracy": 0.5}, {}, {"test_accuracy": 0.505}])
  assert s.reductions == 1
  with pytest.raises(ValueError, match="eval.every"):
    _drive(adpfl.SCHEDULE, ctx, [{}, {"train_loss": 1.0}])
  assert adpfl.score({"test_accuracy": True}) is None
  for params, field in (({"k": 1.0}, "k"), ({"alpha": math.inf}, "alpha"),
                        ({"adjust_every": 0}, "adjust_every")):
    with pytest.raises(ValueError, match=f"schedule.{field}"):
      adpfl.init(_adpfl_ctx(params))


def test_adpfl_claimed_spend_grows_with_every_reduction():
  """The paper's per-step calibration composed over the steps taken (formulas.adpfl_*):
  A-DPFL spends more than the constant sigma over the same rounds (spec section 3.5)."""
  ctx = _adpfl_ctx({"k": 0.7, "alpha": 0.01}, rounds=6)
  steps = 3  # local DP-SGD steps per round
  plans, _ = _drive(adpfl.SCHEDULE, ctx, [{"test_accuracy": s}
                                          for s in (0.5, 0.6, 0.6, 0.6, 0.6, 0.6)])
  z = [p.noise[0] / ctx.sensitivity[0] for p in plans]
  np.testing.assert_allclose(z, [1, 1, 1, 0.7, 0.49, 0.343], rtol=1e-12)
  claimed = formulas.adpfl_epsilon_claimed(np.repeat(z, steps), 1e-5)
  per_step = math.sqrt(math.log(1.25 / 1e-5))
  assert claimed == pytest.approx(steps * per_step * sum(1 / x for x in z), rel=1e-12)
  assert claimed > formulas.adpfl_epsilon_claimed(np.ones(6 * steps), 1e-5)
