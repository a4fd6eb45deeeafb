"""The papers' formulas as printed (spec reproduction checklists), their inverses,
corrected variants, and the gap between claimed and certified epsilon."""

import math

import numpy as np
import pytest
from scipy import integrate

from fedjax_dp.privacy import accounting as acc
from fedjax_dp.privacy import formulas as F

EPS = np.array([4.0, 8.0, 12.0, 16.0, 20.0])
LN1000 = math.log(1000.0)


# ---------------------------------------------------------------------------
# Wei et al.
# ---------------------------------------------------------------------------


def test_wei_eq10_table():
  """Spec section 3.5: sigma / Delta_l at T = 200, delta = 1e-3."""
  np.testing.assert_allclose(F.wei_sigma_eq10(EPS, 1e-3, 1.0, 200, 1.0),
                             [13.14, 6.57, 4.38, 3.29, 2.63], atol=6e-3)
  np.testing.assert_allclose(F.wei_sigma_eq10(EPS, 1e-3, 0.6, 200, 1.0),
                             [10.18, 5.09, 3.39, 2.55, 2.04], atol=6e-3)
  np.testing.assert_allclose(F.wei_sigma_eq10(EPS, 1e-3, 0.6, 200, 1.0)
                             / F.wei_sigma_eq10(EPS, 1e-3, 1.0, 200, 1.0), math.sqrt(0.6))
  # Proportional to sqrt(T), sqrt(q), 1/eps, 1/|D_i| (Theorem 1).
  defaults = {"epsilon": 4, "delta": 1e-3, "q": 0.5, "rounds": 100,
              "sensitivity": F.wei_sensitivity(0.1, 1.0, 800)}
  s = lambda **kw: F.wei_sigma_eq10(**{**defaults, **kw})
  assert s(rounds=400) == pytest.approx(2 * s())
  assert s(q=0.125) == pytest.approx(s() / 2)
  assert s(epsilon=8) == pytest.approx(s() / 2)
  assert s(sensitivity=F.wei_sensitivity(0.1, 1.0, 1600)) == pytest.approx(s() / 2)
  assert F.wei_sensitivity(0.02, 1.8, 800) == pytest.approx(9e-5)


def test_wei_eq10_inverse():
  sig = F.wei_sigma_eq10(EPS, 1e-3, 0.6, 200, 0.01)
  np.testing.assert_allclose(F.wei_epsilon_eq10(sig, 1e-3, 0.6, 200, 0.01), EPS)
  np.testing.assert_allclose(F.wei_epsilon_claimed(200 / sig ** 2, 1e-3, 0.6, 0.01), EPS)
  assert F.wei_epsilon_claimed(0.0, 1e-3, 0.6, 0.01) == 0.0


def test_wei_eq25_crd():
  """Spec checklist item 2."""
  kw = {"epsilon": 8.0, "delta": 1e-3, "q": 1.0, "sensitivity": 0.01}
  s0 = F.wei_sigma_eq25(rounds=200, t=0, past_inv_var_sum=0.0, **kw)
  assert s0 == pytest.approx(F.wei_sigma_eq10(8.0, 1e-3, 1.0, 200, 0.01))
  # T unchanged: sigma^{t+1} = sigma^t (eqs. 30-31).
  spent, sig, t_total = 0.0, [], 200
  for t in range(200):
    if t == 120:
      t_total = math.floor(0.9 * (t_total - t)) + t  # a CRD discount (Alg. 2 line 12)
    s = F.wei_sigma_eq25(rounds=t_total, t=t, past_inv_var_sum=spent, **kw)
    if t >= t_total:
      assert math.isinf(s)
      break
    sig.append(s)
    spent += s ** -2
  assert sig[50] == pytest.approx(sig[0]) and sig[119] == pytest.approx(sig[0])
  # After a discount sigma drops by sqrt((T_new - t) / (T_old - t)) at t = 120.
  assert sig[120] == pytest.approx(sig[119] * math.sqrt((t_total - 120) / (200 - 120)))
  # The budget is spent exactly when training ends.
  assert spent == pytest.approx(F.wei_budget(**kw), rel=1e-12)
  assert F.wei_epsilon_claimed(spent, 1e-3, 1.0, 0.01) == pytest.approx(8.0)


def test_wei_own_accountant_gap_and_correction():
  """Spec section 3.5: eq. (10) fails the paper's own accountant (16)-(17)."""
  sig = F.wei_sigma_eq10(EPS, 1e-3, 1.0, 200, 1.0)
  np.testing.assert_allclose(F.wei_delta_eq17(EPS, 1.0, 200, 1.0, sig),
                             [6.4e-3, 3.4e-2, 0.21, 12.6, 7.7e3], rtol=0.05)
  np.testing.assert_allclose(F.wei_epsilon_eq17(sig, 1e-3, 1.0, 200, 1.0),
                             EPS + EPS ** 2 / (4 * LN1000), rtol=1e-12)
  corr = F.wei_sigma_eq10_corrected(EPS, 1e-3, 1.0, 200, 1.0)
  ratio = corr / sig
  assert ratio[0] == pytest.approx(1.13, abs=5e-3) and ratio[-1] == pytest.approx(1.49, abs=5e-3)
  np.testing.assert_allclose(F.wei_epsilon_eq17(corr, 1e-3, 1.0, 200, 1.0), EPS, rtol=1e-12)
  np.testing.assert_allclose(
      F.wei_delta_eq17(EPS, 1.0, 200, 1.0, corr, integer_orders=False), 1e-3, rtol=1e-9)
  # Corrected CRD budget: spending it exactly gives eps under the paper's accountant.
  b = F.wei_budget_corrected(8.0, 1e-3, 0.6, 0.01)
  assert F.wei_epsilon_claimed_corrected(b, 1e-3, 0.6, 0.01) == pytest.approx(8.0)
  assert F.wei_sigma_eq25_corrected(8.0, 1e-3, 0.6, 0.01, 200, 0, 0.0) == pytest.approx(
      F.wei_sigma_eq10_corrected(8.0, 1e-3, 0.6, 200, 0.01))


def test_wei_claimed_vs_certified_gap():
  """Wei eq. (10) at q = 1, T = 200, delta = 1e-3, against the certified accountants.

  At eps = 4 eq. (10) is in fact conservative (certified RDP 3.868, exact 3.438);
  the paper's own accountant (16)-(17) already says 4.579 > 4. Certified epsilon
  exceeds the claim from eps ~ 4.63 (RDP) / 6.98 (exact) on: 9.257 / 8.353 at
  eps = 8, 32.83 / 30.32 at eps = 20.
  """
  certified = []
  for eps in EPS:
    z = F.wei_sigma_eq10(eps, 1e-3, 1.0, 200, 1.0)  # noise multiplier (Delta = 1)
    h = [acc.Event(noise_multiplier=z, count=200)]
    certified.append((acc.epsilon(h, 1e-3), acc.epsilon(h, 1e-3, "exact")))
  rdp, exact = np.array(certified).T
  np.testing.assert_allclose(rdp, [3.8677, 9.2569, 15.9029, 23.7659, 32.8329], rtol=1e-4)
  np.testing.assert_allclose(exact, [3.4377, 8.3527, 14.4914, 21.8175, 30.3174], rtol=1e-4)
  assert rdp[0] < 4 and exact[0] < 4
  assert np.all(rdp[1:] > EPS[1:]) and np.all(exact[1:] > EPS[1:])
  # q = 0.6 (K = 30 of U = 50): client selection, example-level replace-one.
  z = F.wei_sigma_eq10(8.0, 1e-3, 0.6, 200, 1.0)
  sel = acc.Event(noise_multiplier=z, sampling="selection", q=0.6, relation="replace_one",
                  count=200)
  assert acc.epsilon([sel], 1e-3) == pytest.approx(9.353, rel=1e-3)


def test_wei_fig2_moments():
  """Spec section 8 with eta C = 0.036, sigma = 0.01 (real / bound)."""
  d800, d400 = F.wei_sensitivity(0.02, 1.8, 800), F.wei_sensitivity(0.02, 1.8, 400)
  real = lambda lam, q, d: math.exp(F.wei_log_moment_exact(lam, q, d, 0.01))
  bound = lambda lam, q, d: math.exp(F.wei_log_moment_bound(lam, q, d, 0.01))
  for lam, r, b in [(1, 1.000066, 1.000073), (10, 1.00362, 1.00402), (50, 1.0873, 1.0974),
                    (100, 1.393, 1.445)]:
    assert real(lam, 0.9, d800) == pytest.approx(r, abs=2e-4 if lam > 10 else 6e-6)
    assert bound(lam, 0.9, d800) == pytest.approx(b, abs=2e-4 if lam > 10 else 6e-6)
  assert real(100, 0.1, d800) == pytest.approx(1.0041, abs=1e-4)
  assert bound(100, 0.1, d800) == pytest.approx(1.0418, abs=1e-4)
  assert real(50, 0.9, d400) == pytest.approx(1.398, abs=1e-3)
  assert real(100, 0.9, d400) == pytest.approx(3.78, abs=5e-3)
  assert bound(100, 0.9, d400) == pytest.approx(4.36, abs=5e-3)
  # Bound >= exact for lambda = 1..100 here; with eta C = 1 it breaks first at 28.
  lam = np.arange(1, 101)
  assert np.all(F.wei_log_moment_exact(lam, 0.9, d800, 0.01)
                <= F.wei_log_moment_bound(lam, 0.9, d800, 0.01))
  big = 2 * 1.0 / 800
  bad = lam[F.wei_log_moment_exact(lam, 0.9, big, 0.01) > F.wei_log_moment_bound(lam, 0.9, big,
                                                                                  0.01)]
  assert bad[0] == 28
  # The intermediate bound of (14) is rigorous.
  assert np.all(F.wei_log_moment_exact(lam, 0.9, big, 0.01)
                <= F.wei_log_moment_intermediate(lam, 0.9, big, 0.01) + 1e-12)


@pytest.mark.parametrize("lam,q,c", [(3, 0.3, 0.5), (10, 0.9, 0.2), (25, 0.05, 0.1)])
def test_wei_eq14_matches_quadrature_and_lemma1(lam, q, c):
  """Eq. (14) binomial form == E_{nu0}[(nu1/nu0)^(lambda+1)]; Lemma 1: D10 >= D01."""
  ratio = lambda u: 1 - q + q * math.exp(c * u - c * c / 2)
  phi = lambda u: math.exp(-u * u / 2) / math.sqrt(2 * math.pi)
  d10, _ = integrate.quad(lambda u: phi(u) * ratio(u) ** (lam + 1), -40, 40 + lam * c,
                          epsrel=1e-12, limit=200)
  d01, _ = integrate.quad(lambda u: phi(u) * ratio(u) ** (-lam), -40, 40, epsrel=1e-12, limit=200)
  assert F.wei_log_moment_exact(lam, q, c, 1.0) == pytest.approx(math.log(d10), rel=1e-9)
  assert d10 >= d01


# ---------------------------------------------------------------------------
# Yuan et al.
# ---------------------------------------------------------------------------

YUAN_TABLE = [  # theta, S_30, sigma(M=30), last amplitude, S_17, sigma(M=17); Delta s = 1/60
    (0.9, 203.308, 0.027933, 0.006062, 44.966, 0.013136),
    (0.95, 69.521, 0.016334, 0.007764, 26.442, 0.010073),
    (1.0, 30.0, 0.010730, 0.010730, 17.0, 0.008077),
    (1.05, 16.141, 0.007870, 0.015968, 11.838, 0.006740),
    (1.1, 10.370, 0.006308, 0.025125, 8.824, 0.005819),
]


@pytest.mark.parametrize("theta,s30,sig30,last,s17,sig17", YUAN_TABLE)
def test_yuan_eq8_table(theta, s30, sig30, last, s17, sig17):
  ds = F.yuan_sensitivity(5.0, 600)
  assert ds == pytest.approx(1 / 60)
  assert F.yuan_geometric_sum(theta, 30) == pytest.approx(s30, abs=1e-3)
  assert F.yuan_geometric_sum(theta, 17) == pytest.approx(s17, abs=1e-3)
  s = F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, theta, ds)
  assert s == pytest.approx(sig30, abs=1e-6)
  assert F.yuan_round_sigma(s, theta, 30) == pytest.approx(last, abs=1e-6)
  assert F.yuan_sigma_eq8(10, 1e-3, 0.1, 17, theta, ds) == pytest.approx(sig17, abs=1e-6)
  # Checklist 1: sum_m q Delta^2 / (2 Theta(m)) = eps^2 / (4 ln(1/delta)).
  th = F.yuan_round_sigma(s, theta, np.arange(1, 31)) ** 2
  assert np.sum(0.1 * ds ** 2 / (2 * th)) == pytest.approx(100 / (4 * LN1000), rel=1e-12)
  assert F.yuan_epsilon_claimed(np.sum(1 / th), 1e-3, 0.1, ds) == pytest.approx(10.0)
  assert F.yuan_epsilon_eq8(s, 1e-3, 0.1, 30, theta, ds) == pytest.approx(10.0)


def test_yuan_limits_and_corrections():
  ds = 1 / 60
  # Remark 3: theta -> 1 is continuous.
  base = F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, 1.0, ds)
  for th in (1 + 1e-9, 1 - 1e-9):
    assert F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, th, ds) == pytest.approx(base, rel=1e-6)
  assert base == pytest.approx(ds / 10 * math.sqrt(2 * 0.1 * 30 * LN1000))
  # Sigma decreasing in theta, last amplitude increasing.
  ths = np.array([0.9, 0.95, 1.0, 1.05, 1.1])
  s = F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, ths, ds)
  assert np.all(np.diff(s) < 0) and np.all(np.diff(F.yuan_round_sigma(s, ths, 30)) > 0)
  # Achieved eps under the paper's own accountant: eps + eps^2 / (4 ln(1/delta)).
  for eps, achieved in [(5, 5.90), (10, 13.62), (20, 34.48)]:
    sig = F.yuan_sigma_eq8(eps, 1e-3, 0.1, 30, 1.0, ds)
    assert F.yuan_epsilon_achieved(30 / sig ** 2, 1e-3, 0.1, ds) == pytest.approx(achieved,
                                                                                  abs=5e-3)
  assert F.yuan_sigma_eq8_corrected(10, 1e-3, 0.1, 30, 1.0, ds) / base == pytest.approx(
      1.282, abs=1e-3)
  # Theorem 2 (eq. 9): theta = 1 -> sigma sqrt(M'/M); M' = M, m = M reproduces (8) for theta > 1;
  # theta < 1 branch gives S_M + 1/(1 - theta) (E9).
  assert F.yuan_sigma_eq9(10, 1e-3, 0.1, ds, 1.0, 10, 24) == pytest.approx(base * math.sqrt(0.8))
  assert F.yuan_sigma_eq9(10, 1e-3, 0.1, ds, 1.1, 30, 30) == pytest.approx(
      F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, 1.1, ds))
  s09 = F.yuan_sigma_eq9(10, 1e-3, 0.1, ds, 0.9, 30, 30) / F.yuan_sigma_eq8(10, 1e-3, 0.1, 30,
                                                                             0.9, ds)
  assert s09 ** 2 * 203.308 == pytest.approx(213.31, abs=0.01)
  # Exact refinement after m = 10 rounds of the theta = 1.05 schedule: smaller sigma, budget exact.
  th = 1.05
  s0 = F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, th, ds)
  spent = np.sum(1 / F.yuan_round_sigma(s0, th, np.arange(1, 11)) ** 2)
  s1 = F.yuan_sigma_refine_exact(10, 1e-3, 0.1, ds, th, 10, 24, spent)
  assert s1 < s0
  total = spent + np.sum(1 / F.yuan_round_sigma(s1, th, np.arange(11, 25)) ** 2)
  assert total == pytest.approx(F.wei_budget(10, 1e-3, 0.1, ds), rel=1e-10)


def test_yuan_claimed_vs_certified_gap():
  """Eq. (8) at the paper's setting (q = 0.1 = 10 of 100 clients, M = 30, delta = 1e-3)."""
  z = F.yuan_round_sigma(F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, 1.0, 1.0), 1.0, np.arange(1, 31))
  h = [acc.Event(noise_multiplier=zi, sampling="selection", q=0.1) for zi in z]
  assert acc.epsilon(h, 1e-3) == pytest.approx(19.6254, rel=1e-4)  # claimed: 10
  z = F.yuan_round_sigma(F.yuan_sigma_eq8(10, 1e-3, 0.1, 30, 1.05, 1.0), 1.05, np.arange(1, 31))
  h = [acc.Event(noise_multiplier=zi, sampling="selection", q=0.1) for zi in z]
  assert acc.epsilon(h, 1e-3) == pytest.approx(20.7726, rel=1e-4)
  # Same thing with the rounds as a batch axis, summed.
  one = acc.Event(noise_multiplier=z, sampling="selection", q=0.1)
  state = acc.RdpState(acc.DEFAULT_ORDERS, acc.event_rdp(one).sum(0))
  assert float(acc.rdp_epsilon(state, 1e-3)) == pytest.approx(acc.epsilon(h, 1e-3), rel=1e-12)


# ---------------------------------------------------------------------------
# Fu et al. and A-DPFL
# ---------------------------------------------------------------------------


def test_fu_theorems():
  t_l = F.fu_participations(500, 100, 5000)
  assert t_l == 10
  assert F.fu_participations(350, 50, 3500) == 5
  # Fig. 1: beta = T_l eta E zeta / eps = 1500 eta / eps.
  xi = F.fu_sensitivity(0.01, 1, 150)
  assert F.fu_laplace_scale_thm1(3.0, t_l, xi) == pytest.approx(1500 * 0.01 / 3.0)
  assert F.fu_sensitivity_corrected(0.01, 1, 150) == pytest.approx(2 * xi)
  b = F.fu_laplace_scale_thm1(3.0, t_l, xi)
  assert F.fu_epsilon_thm1(b, t_l, xi) == pytest.approx(3.0)
  assert F.fu_epsilon_thm1(b, 4, xi) == pytest.approx(1.2)
  # Certified: basic composition of the Laplace rounds gives exactly eps.
  h = [acc.Event("laplace", b / xi, count=int(t_l))]
  assert acc.epsilon(h, 1e-5, "exact") == pytest.approx(3.0)
  # Theorem 2 (c2 = sqrt 2) and its zCDP correction (spec A6 numbers).
  np.testing.assert_allclose(F.fu_sigma_zcdp(np.array([10.0, 20, 30]), 1e-4, 1),
                             [0.525, 0.298, 0.219], atol=1e-3)
  np.testing.assert_allclose(F.fu_sigma_zcdp(np.array([10.0, 20, 30]), 1e-4, 1)
                             / (math.sqrt(math.log(1e4)) / np.array([10.0, 20, 30])),
                             [1.73, 1.97, 2.17], atol=6e-3)
  s2 = F.fu_sigma_thm2(10.0, 1e-4, 5)
  assert F.fu_epsilon_thm2(s2, 1e-4, 5) == pytest.approx(10.0)
  sz = F.fu_sigma_zcdp(10.0, 1e-4, 5)
  assert F.fu_epsilon_zcdp(sz, 1e-4, 5) == pytest.approx(10.0)
  # zCDP-corrected sigma is certified (exact accountant <= 10); the literal c2 = sqrt 2 is not.
  assert acc.epsilon([acc.Event(noise_multiplier=sz, count=5)], 1e-4, "exact") <= 10.0
  assert acc.epsilon([acc.Event(noise_multiplier=s2, count=5)], 1e-4, "exact") > 10.0


def test_adpfl():
  assert F.adpfl_epsilon_step(1.0, 1e-5) == pytest.approx(3.43, abs=5e-3)
  assert F.adpfl_epsilon_step(1.0, 1e-5, printed=False) == pytest.approx(4.84, abs=5e-3)
  np.testing.assert_allclose(F.adpfl_sigma_schedule(1.0, 0.7, np.arange(4)),
                             [1.0, 0.7, 0.49, 0.343])
  assert F.adpfl_next_sigma(1.0, 0.7, 0.001, 0.005) == pytest.approx(0.7)
  assert F.adpfl_next_sigma(1.0, 0.7, 0.01, 0.005) == pytest.approx(1.0)
  assert F.adpfl_gaussian_sigma_dwork_roth(1.0, 1e-5) == pytest.approx(4.8448, abs=1e-4)
  assert F.adpfl_epsilon_claimed([1.0, 1.0, 0.7], 1e-5) == pytest.approx(
      2 * 3.4258 + 3.4258 / 0.7, rel=1e-3)
  assert F.adpfl_epsilon_claimed([], 1e-5) == 0.0


_W = {"epsilon": 1.0, "delta": 1e-3, "q": 1, "rounds": 10, "sensitivity": 1}


@pytest.mark.parametrize("fn,kwargs,name", [
    (F.wei_sigma_eq10, {**_W, "epsilon": 0.0}, "epsilon"),
    (F.wei_sigma_eq10, {**_W, "delta": 1.0}, "delta"),
    (F.wei_sigma_eq10, {**_W, "q": 1.5}, "q"),
    (F.wei_epsilon_eq10, {"sigma": 0.0, "delta": 1e-3, "q": 1, "rounds": 10, "sensitivity": 1},
     "sigma"),
    (F.yuan_sigma_eq8, {"epsilon": 1.0, "delta": 1e-3, "q": 0.1, "rounds": 30, "theta": 0.0,
                        "sensitivity": 1}, "theta"),
    (F.fu_laplace_scale_thm1, {"epsilon": -1.0, "participations": 3, "sensitivity": 1}, "epsilon"),
    (F.adpfl_next_sigma, {"sigma": 1.0, "k": 1.2, "accuracy_gain": 0.0, "alpha": 0.1}, "k"),
])
def test_formula_validation(fn, kwargs, name):
  with pytest.raises(ValueError, match=name):
    fn(**kwargs)
