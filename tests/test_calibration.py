"""Noise / rounds calibration: round trips, golden values, schedules, prefixes."""

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedjax_dp.privacy import accounting as acc
from fedjax_dp.privacy import calibration as cal
from fedjax_dp.privacy.accounting import Event


def _eps(z, rounds, q=1.0, delta=1e-5, ratio=1.0, accountant="rdp", **kw):
  zs = cal.schedule_multipliers(z, rounds, ratio)
  samp = kw.pop("sampling", "full" if q == 1 else "poisson")
  extra = {} if samp == "full" else {"q": q}
  return acc.epsilon([Event(noise_multiplier=float(x), sampling=samp, **extra, **kw) for x in zs],
                     delta, accountant)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eps=st.floats(0.2, 30.0), q=st.sampled_from([1.0, 0.5, 0.05, 0.004]),
       rounds=st.integers(1, 3000), log_delta=st.floats(-9 * math.log(10), -3 * math.log(10)))
def test_round_trip_constant(eps, q, rounds, log_delta):
  delta = math.exp(log_delta)
  z = cal.calibrate_noise_multiplier(eps, delta, rounds, q=q)
  kw = {} if q == 1 else {"sampling": "poisson", "q": q}
  got = acc.epsilon([Event(noise_multiplier=z, count=rounds, **kw)], delta)
  assert eps - 1e-3 <= got <= eps


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eps=st.floats(0.5, 20.0), ratio=st.floats(0.9, 1.1), rounds=st.integers(2, 60),
       q=st.sampled_from([1.0, 0.1]))
def test_round_trip_geometric(eps, ratio, rounds, q):
  z0 = cal.calibrate_noise_multiplier(eps, 1e-5, rounds, q=q, ratio=ratio)
  got = _eps(z0, rounds, q=q, ratio=ratio)
  assert eps - 1e-3 <= got <= eps


def test_round_trip_vectorised_and_selection():
  targets = np.array([0.5, 2.0, 8.0, 30.0])
  z = cal.calibrate_noise_multiplier(targets, 1e-3, 200, q=0.6, sampling="selection",
                                     relation="replace_one")
  assert z.shape == (4,) and np.all(np.diff(z) < 0)
  got = acc.epsilon([Event(noise_multiplier=z, sampling="selection", q=0.6,
                           relation="replace_one", count=200)], 1e-3)
  assert np.all(got <= targets) and np.all(got >= targets - 1e-3)


def test_golden_calibrations():
  # Row 24: MNIST 60 epochs, eps = 3.
  z = cal.calibrate_noise_multiplier(3.0, 1e-5, 14063, q=256 / 60000)
  assert z == pytest.approx(1.01402, abs=2e-5)
  zp = cal.calibrate_noise_multiplier(3.0, 1e-5, 14063, q=256 / 60000, accountant="pld",
                                      pld_discretization=1e-3)
  assert zp == pytest.approx(0.96975, abs=5e-4)
  # Row 8: opacus/dp_accounting, eps = 8 at q = 0.04 over 2249 steps.
  assert cal.calibrate_noise_multiplier(8.0, 1e-5, 2249, q=0.04) == pytest.approx(1.41564,
                                                                                  abs=2e-5)
  # Row 17: single Gaussian for (1, 1e-5), analytic.
  assert cal.calibrate_noise_multiplier(1.0, 1e-5, 1, accountant="exact") == pytest.approx(
      3.730632, rel=1e-6)
  # Row 21: Laplace, 100 queries: basic composition needs b = 10; PLD 4.7372.
  assert cal.calibrate_noise_multiplier(10.0, 1e-5, 100, mechanism="laplace",
                                        accountant="exact") == pytest.approx(10.0, rel=1e-5)
  assert cal.calibrate_noise_multiplier(10.0, 1e-5, 100, mechanism="laplace",
                                        accountant="pld") == pytest.approx(4.7372, rel=2e-3)


def test_matches_dp_accounting_calibrate():
  from dp_accounting import mechanism_calibration  # pylint: disable=import-outside-toplevel
  ref = mechanism_calibration.calibrate_dp_mechanism(
      dp_accounting.rdp.RdpAccountant,
      lambda z: dp_accounting.SelfComposedDpEvent(
          dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(z)), 1000),
      2.0, 1e-6)
  ours = cal.calibrate_noise_multiplier(2.0, 1e-6, 1000, q=0.01)
  assert ours == pytest.approx(ref, rel=1e-4)


def test_crd_prefix_row22():
  """Spent 50 rounds at q = 0.1, z = 1.5; the next 100 rounds for (4, 1e-5): 1.8567."""
  spent = [Event(noise_multiplier=1.5, sampling="poisson", q=0.1, count=50)]
  z = cal.calibrate_noise_multiplier(4.0, 1e-5, 100, q=0.1, prefix=spent)
  assert z == pytest.approx(1.8567, abs=1e-4)
  state = acc.history_rdp(spent)
  assert cal.calibrate_noise_multiplier(4.0, 1e-5, 100, q=0.1, prefix=state) == pytest.approx(z)
  total = acc.epsilon(spent + [Event(noise_multiplier=z, sampling="poisson", q=0.1,
                                     count=100)], 1e-5)
  assert 4.0 - 1e-3 <= total <= 4.0
  # Exhausted budget -> inf.
  assert math.isinf(cal.calibrate_noise_multiplier(2.0, 1e-5, 100, q=0.1, prefix=spent))


def test_geometric_schedule_row20():
  """sigma_t = 10 * 0.98^t over 100 rounds spends 21.80939 (exact) -> calibrating gives 10."""
  z0 = cal.calibrate_noise_multiplier(21.80939, 1e-5, 100, ratio=0.98, accountant="exact",
                                      eps_tol=1e-7)
  assert z0 == pytest.approx(10.0, rel=1e-5)
  z0 = cal.calibrate_noise_multiplier(23.2236, 1e-5, 100, ratio=0.98, eps_tol=1e-7)
  assert z0 == pytest.approx(10.0, rel=1e-4)


def test_calibrate_generic_per_client():
  """Per-client targets with the generic builder (a Wei-style selection history)."""
  targets = np.array([1.0, 4.0, 16.0])

  def history(x):
    return [Event(noise_multiplier=x, sampling="selection", q=0.6, relation="replace_one",
                  count=200)]

  z = cal.calibrate(history, targets, 1e-3)
  got = acc.epsilon(history(np.asarray(z)), 1e-3)
  assert np.all(got <= targets) and np.all(got >= targets - 1e-3)


def test_calibrate_rounds():
  t = cal.calibrate_rounds(1.1, 2.5967, 1e-5, q=256 / 60000)
  eps = lambda n: acc.epsilon([Event(noise_multiplier=1.1, sampling="poisson",
                                     q=256 / 60000, count=n)], 1e-5)
  assert eps(t) <= 2.5967 < eps(t + 1)
  assert 14000 < t < 14100
  ts = cal.calibrate_rounds(np.array([1.0, 2.0, 4.0]), 4.0, 1e-5, q=0.01)
  assert ts.shape == (3,) and np.all(np.diff(ts) > 0)
  for z, n in zip([1.0, 2.0, 4.0], ts):
    e = lambda k, z=z: acc.epsilon([Event(noise_multiplier=z, sampling="poisson", q=0.01,
                                     count=k)], 1e-5)
    assert e(int(n)) <= 4.0 < e(int(n) + 1)
  assert cal.calibrate_rounds(0.3, 0.1, 1e-5) == 0
  assert cal.calibrate_rounds(1e6, 1.0, 1e-5, max_rounds=1000) == 1000
  # With a spent prefix fewer rounds remain.
  spent = [Event(noise_multiplier=1.0, sampling="poisson", q=0.01, count=1000)]
  assert cal.calibrate_rounds(1.0, 4.0, 1e-5, q=0.01, prefix=spent) == pytest.approx(
      ts[0] - 1000, abs=2)


def test_calibration_validation():
  with pytest.raises(ValueError, match="target_epsilon"):
    cal.calibrate_noise_multiplier(0.0, 1e-5, 10)
  with pytest.raises(ValueError, match="target_epsilon"):
    cal.calibrate_noise_multiplier(-1.0, 1e-5, 10)
  with pytest.raises(ValueError, match="delta"):
    cal.calibrate_noise_multiplier(1.0, 0.0, 10)
  with pytest.raises(ValueError, match="rounds"):
    cal.calibrate_noise_multiplier(1.0, 1e-5, 0)
  with pytest.raises(ValueError, match="q"):
    cal.calibrate_noise_multiplier(1.0, 1e-5, 10, q=1.5)
  with pytest.raises(ValueError, match="replace_one"):
    cal.calibrate_noise_multiplier(1.0, 1e-5, 10, population=100, sample_size=10)
  with pytest.raises(ValueError, match="ratio"):
    cal.calibrate_noise_multiplier(1.0, 1e-5, 10, ratio=-1.0)
