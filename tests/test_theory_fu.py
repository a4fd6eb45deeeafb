"""Fu et al.'s Theorem 3 bound, the optimal E of Theorems 4-5, and the (T, E) predictor."""

import math

import numpy as np
import pytest
from scipy import optimize

from fedjax_dp.privacy import formulas
from fedjax_dp.theory import fu

HESS = np.array([0.5, 1.0, 2.0])   # f_l(theta) = 0.5 (theta - c_l)^T diag(HESS) (theta - c_l)
N, B, P = 10, 5, 3


def _problem(seed=0):
  centers = np.random.default_rng(seed).normal(size=(N, P))
  c_bar = centers.mean(0)
  gamma_het = float(np.mean(0.5 * np.sum(HESS * (c_bar - centers) ** 2, axis=1)))
  return centers, c_bar, gamma_het


def _consts(g=3.0, het=0.2, y0=4.0):
  return fu.FuConstants(smoothness=2.0, strong_convexity=0.5, grad_bound=g, heterogeneity=het,
                        initial_distance=y0)


def test_mechanism_constant_closed_forms_and_noise_variance():
  eps, xi, delta = 3.0, 1.5, 1e-4
  lap = fu.mechanism_constant("laplace", dim=P, num_clients=N, clients_per_round=B,
                              epsilon=eps, sensitivity=xi)
  assert lap == pytest.approx(8 * P * B * xi ** 2 / (N ** 2 * eps ** 2))
  gau = fu.mechanism_constant("gaussian", dim=P, num_clients=N, clients_per_round=B,
                              epsilon=eps, sensitivity=xi, delta=delta)
  assert gau == pytest.approx(8 * P * 2 * math.log(1 / delta) * xi ** 2 / (N * eps ** 2))
  gau_c = fu.mechanism_constant("gaussian", dim=P, num_clients=N, clients_per_round=B,
                                epsilon=eps, sensitivity=xi, delta=delta, version="corrected")
  assert gau_c == pytest.approx(gau / 2)
  same = fu.mechanism_constant("laplace", dim=P, num_clients=N, clients_per_round=B,
                               epsilon=eps, sensitivity=xi, client_sizes=np.full(N, 80))
  assert same == pytest.approx(lap)
  # C_M ties to the mechanisms of formulas.py: the aggregated noise item of one GI
  # has E||w^b||^2 = eta~^2 omega1 / 4 (the proof's eta~^2 <= 4 eta_k^2 step)
  eta, e, t_g = 0.1, 3, 20
  t_l = formulas.fu_participations(B, t_g, N)
  beta = formulas.fu_laplace_scale_thm1(eps, t_l, formulas.fu_sensitivity(eta, e, xi))
  assert 2 * P * beta ** 2 / B == pytest.approx(eta ** 2 * fu.omega1(lap, e, t_g, 2.0) / 4)
  sigma = formulas.fu_sigma_thm2(eps, delta, t_l) * formulas.fu_sensitivity(eta, e, xi)
  assert P * sigma ** 2 / B == pytest.approx(eta ** 2 * fu.omega1(gau_c, e, t_g, 1.0) / 4)
  assert fu.mechanism_constant("laplace", dim=P, num_clients=N, clients_per_round=B,
                               epsilon=math.inf, sensitivity=xi) == 0.0


def test_bound_thm3_by_hand():
  c = _consts()
  k, e, t_g, cm = 40, 4, 10, 0.01
  gam = max(8 * 2.0 / 0.5, e)
  w0 = 6 * 2.0 * 0.2 + 8 * (e - 1) ** 2 * 9 + 4 * e ** 2 * 9 * (N - B) / ((N - 1) * B)
  w1 = cm * e ** 2 * t_g ** 2
  expect = (4 * w0 / 0.25 + gam * 4.0) / (k + gam) + 4 * (k // e) * w1 / (0.25 * (k + gam - 1) ** 2)
  got = fu.bound_thm3(k, c, local_steps=e, rounds=t_g, mech_constant=cm, z=2.0,
                      num_clients=N, clients_per_round=B)
  assert got == pytest.approx(expect, rel=1e-12)
  assert fu.learning_rate(0, c, e) == pytest.approx(2 / (0.5 * gam))


@pytest.mark.parametrize("z", [1.5, 2.0])
def test_asymptotic_optimum_matches_numeric_argmin(z):
  for t in (100.0, 1e4, 1e6):
    res = optimize.minimize_scalar(lambda e, t=t: fu.asymptotic_objective(e, t, z),
                                   bounds=(1.0, t), method="bounded",
                                   options={"xatol": 1e-10 * t})
    assert fu.optimal_local_steps_asymptotic(t, z) == pytest.approx(res.x, rel=1e-4)
  # E* / T^(z/(z+1)) is constant: T^(2/3) for Laplace (checklist item 6)
  ts = np.array([1e3, 1e5, 1e7])
  r = fu.optimal_local_steps_asymptotic(ts, z) / ts ** (z / (z + 1))
  np.testing.assert_allclose(r, r[0], rtol=1e-12)
  np.testing.assert_allclose(fu.optimal_local_steps_asymptotic(ts, z, "printed"),
                             ts ** (z / (z + 1)), rtol=1e-12)


def test_theorem4_optimum_is_wrong_below_z_one():
  """Spec E7: for z <= 1 both terms grow with E, so E* = 1, not T^(z/(z+1))."""
  t = 1e4
  for z in (0.5, 1.0):
    es = np.arange(1, 200)
    assert int(es[np.argmin(fu.asymptotic_objective(es, t, z))]) == 1
    assert fu.optimal_local_steps_asymptotic(t, z) == 1.0
    printed = fu.optimal_local_steps_asymptotic(t, z, "printed")
    assert printed > 1
    assert fu.asymptotic_objective(printed, t, z) > fu.asymptotic_objective(1.0, t, z)


@pytest.mark.parametrize("z", [0.0, 0.5, 1.0, 1.5, 2.0])
def test_rate_exponent_matches_the_slope_of_the_optimised_objective(z):
  ts = np.array([1e4, 1e6])
  best = [min(fu.asymptotic_objective(fu.optimal_local_steps_asymptotic(t, z), t, z),
              fu.asymptotic_objective(1.0, t, z)) for t in ts]
  slope = math.log(best[1] / best[0]) / math.log(ts[1] / ts[0])
  assert slope == pytest.approx(fu.rate_exponent(z), abs=0.02)
  assert fu.rate_exponent(2.0, "printed") == pytest.approx(1 / 3)
  if 0 < z < 1:  # Theorem 4 as printed claims a slower rate than E = 1 achieves
    assert fu.rate_exponent(z, "printed") > fu.rate_exponent(z)


def test_closed_form_e_star_tracks_the_exhaustive_optimum_of_the_bound():
  """The derived E* ~ T^(2/3) (Laplace) vs brute force over integer E of Theorem 3's bound."""
  c = _consts(het=0.0)
  cm = fu.mechanism_constant("laplace", dim=P, num_clients=N, clients_per_round=B,
                             epsilon=1.0, sensitivity=1.0)
  kw = {"mech_constant": cm, "z": 2.0, "num_clients": N, "clients_per_round": B}
  for t in (10_000, 100_000):
    closed = fu.optimal_local_steps(t, c, **kw)
    e_exh, _ = fu.best_local_steps(t, c, divisors_only=False, **kw)
    assert 1 < e_exh < t
    assert e_exh == pytest.approx(closed, rel=0.15), (t, e_exh, closed)
  # the exhaustive optimum scales as T^(2/3)
  e1, _ = fu.best_local_steps(20_000, c, divisors_only=False, **kw)
  e2, _ = fu.best_local_steps(160_000, c, divisors_only=False, **kw)
  assert e2 / e1 == pytest.approx(8 ** (2 / 3), rel=0.1)
  # Gaussian (z = 1): E* = 1 in closed form, and the bound agrees
  cg = fu.mechanism_constant("gaussian", dim=P, num_clients=N, clients_per_round=B,
                             epsilon=1.0, sensitivity=1.0)
  assert fu.optimal_local_steps(10_000, c, mech_constant=cg, z=1.0, num_clients=N,
                                clients_per_round=B) == 1.0
  assert fu.best_local_steps(1000, c, mech_constant=cg, z=1.0, num_clients=N,
                             clients_per_round=B)[0] == 1


def test_predict_is_the_exhaustive_minimum_and_follows_the_rule_of_thumb():
  c = _consts(g=1.0, het=0.2, y0=100.0)
  kw = {"dim": P, "num_clients": N, "clients_per_round": B, "sensitivity": 1.0}
  pred = fu.predict(c, mechanism="laplace", epsilon=3.0, max_total_steps=120, **kw)
  assert pred.total_steps > 1 and pred.local_steps > 1  # a non-trivial optimum
  cm = fu.mechanism_constant("laplace", epsilon=3.0, **kw)
  brute = min(((t, e) for t in range(1, 121) for e in range(1, t + 1) if t % e == 0),
              key=lambda te: fu.final_bound(te[0], te[1], c, mech_constant=cm, z=2.0,
                                            num_clients=N, clients_per_round=B))
  assert (pred.total_steps, pred.local_steps) == brute
  assert pred.rounds * pred.local_steps == pred.total_steps
  # Laplace diverges in T (Theorem 5): T* is interior and grows with eps
  far = _consts(g=1.0, het=0.0, y0=100.0)
  ts = [fu.predict(far, mechanism="laplace", epsilon=eps, max_total_steps=400, **kw).total_steps
        for eps in (1.0, 5.0, 20.0)]
  assert ts[0] <= ts[1] < 400 and ts[1] <= ts[2], ts
  # the rule of thumb: the smaller eps, the larger E (Tables III-IV)
  es = [fu.predict(_consts(g=0.3, het=0.0, y0=1000.0), mechanism="laplace", epsilon=eps,
                   max_total_steps=400, **kw).local_steps for eps in (5.0, 20.0, 80.0)]
  assert es[0] > es[1] > es[2], es


def _simulate(e, t_g, eps, xi, seeds=400, seed=0):
  """Fu's Algorithm 1 on the quadratic clients, Laplace noise of Theorem 1, the LR of Theorem 3."""
  centers, c_bar, het = _problem()
  c = _consts(het=het)
  rng = np.random.default_rng(seed)
  theta = np.full((seeds, P), 2.0)
  y0 = float(np.sum((theta[0] - c_bar) ** 2))
  t_l = formulas.fu_participations(B, t_g, N)
  ys, g2max, k = [], 0.0, 0
  for _ in range(t_g):
    sel = np.argsort(rng.random((seeds, N)), axis=1)[:, :B]   # uniform b-subsets (Lemma 1)
    phi = np.repeat(theta[:, None], B, axis=1)                  # [S, b, P]
    eta_tilde = fu.learning_rate(k, c, e)                       # eta is decreasing
    for _ in range(e):
      g = HESS * (phi - centers[sel])
      g2max = max(g2max, float(np.max(np.sum(g ** 2, -1))))
      phi = phi - fu.learning_rate(k, c, e) * g
      k += 1
    beta = formulas.fu_laplace_scale_thm1(eps, t_l, formulas.fu_sensitivity(eta_tilde, e, xi))
    theta = (phi + rng.laplace(0.0, beta, phi.shape)).mean(1)
    ys.append(float(np.mean(np.sum((theta - c_bar) ** 2, -1))))
  return np.array(ys), c._replace(initial_distance=y0), g2max


@pytest.mark.parametrize("e", [1, 4])
def test_measured_distance_stays_below_theorem3(e):
  """Checklist item 7: on a strongly convex quadratic with known lambda, mu, G the
  measured Y_k (at every aggregation) is below Theorem 3's bound."""
  t_g, eps, xi = 12, 2.0, 1.0
  ys, c, g2 = _simulate(e, t_g, eps, xi)
  c = c._replace(grad_bound=math.sqrt(g2))
  cm = fu.mechanism_constant("laplace", dim=P, num_clients=N, clients_per_round=B,
                             epsilon=eps, sensitivity=xi)
  ks = e * np.arange(1, t_g + 1)
  bnd = fu.bound_thm3(ks, c, local_steps=e, rounds=t_g, mech_constant=cm, z=2.0,
                      num_clients=N, clients_per_round=B)
  assert np.all(ys <= bnd), (ys, bnd)
  # the noise does show: Y with noise is above the noise-free run
  ys0, _, _ = _simulate(e, t_g, math.inf, xi, seeds=4)
  assert ys[-1] > ys0[-1]


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="mechanism"):
    fu.mechanism_constant("cauchy", dim=1, num_clients=2, clients_per_round=1, epsilon=1.0,
                          sensitivity=1.0)
  with pytest.raises(ValueError, match="b <= N"):
    fu.mechanism_constant("laplace", dim=1, num_clients=2, clients_per_round=3, epsilon=1.0,
                          sensitivity=1.0)
  with pytest.raises(ValueError, match="mu <= lambda"):
    fu.bound_thm3(1, fu.FuConstants(1.0, 2.0, 1.0, 0.0, 1.0), local_steps=1, rounds=1,
                  mech_constant=0.0, z=2.0, num_clients=2, clients_per_round=1)
  with pytest.raises(ValueError, match="version"):
    fu.optimal_local_steps_asymptotic(10, 2.0, "typo")
