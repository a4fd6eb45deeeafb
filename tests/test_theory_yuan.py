"""Yuan et al.'s Corollary 1 bound and the optimal number of aggregations M*."""

import itertools
import math

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.theory import yuan

THETAS = (0.9, 0.95, 1.0, 1.05, 1.1)
U, K, DS, DELTA = 100, 10, 1.0 / 60, 1e-3


def _consts(pl=0.3, dissim=2.0, gamma=0.05, gap=2.0, lip_c=1.0):
  return yuan.YuanConstants(smoothness=1.0, lipschitz=lip_c, pl=pl, dissimilarity=dissim,
                            divergence=gamma, initial_gap=gap)


def _coeffs(theta=1.05, eps=10.0, version="corrected", consts=None, eta=0.5):
  return yuan.coefficients(consts or _consts(), eta=eta, epsilon=eps, delta=DELTA, q=K / U,
                           sensitivity=DS, theta=theta, num_clients=U, clients_per_round=K,
                           version=version)


def test_bound_closed_forms_printed_and_corrected():
  for theta in (0.9, 1.05, 1.1):
    cp, cc = _coeffs(theta, version="printed"), _coeffs(theta, version="corrected")
    a = cp.contraction
    c = 0.1 * 1.0 * DS ** 2 * math.log(1 / DELTA) / 10.0 ** 2
    assert cp.noise == pytest.approx(c, rel=1e-12)
    for m in (1, 7, 30):
      printed = (a ** m * 2.0 + c * (theta ** m - a ** m) * (theta - theta ** (1 - m))
                 / ((theta - a) * (U - 1)))
      assert yuan.bound_thm3(m, cp) == pytest.approx(printed, rel=1e-10)
      a2 = cc.contraction
      corrected = (a2 ** m * 2.0 + c * (theta ** m - a2 ** m) / (theta - a2)
                   * (theta - theta ** (1 - m)) / (theta - 1))
      assert yuan.bound_thm3(m, cc) == pytest.approx(corrected, rel=1e-10)
      # Corollary 1 adds L_c H(tau), Lemma 1
      tau = 5
      h = 0.05 / 1.0 * ((0.5 + 1) ** tau - 1) - 0.5 * 0.05 * tau
      assert yuan.bound(m, tau, cc) == pytest.approx(corrected + h, rel=1e-10)


def test_theta_one_limits():
  cc = _coeffs(1.0)
  a, c = cc.contraction, cc.noise
  m = 30
  expect = a ** m * 2.0 + c * m * (1 - a ** m) / (1 - a)
  assert yuan.bound_thm3(m, cc) == pytest.approx(expect, rel=1e-10)
  for th in (1 - 1e-9, 1 + 1e-9):
    assert yuan.bound_thm3(m, _coeffs(th)) == pytest.approx(expect, rel=1e-6)
  # as printed, the noise term vanishes at theta = 1 (spec E14): only A^M Theta0 is left
  cp = _coeffs(1.0, version="printed")
  assert yuan.bound_thm3(m, cp) == pytest.approx(cp.contraction ** m * 2.0, rel=1e-12)
  # theta = A is a removable singularity of (theta^M - A^M) / (theta - A)
  at = cc._replace(theta=a)
  near = cc._replace(theta=a * (1 + 1e-9))
  assert yuan.bound_thm3(m, at) == pytest.approx(yuan.bound_thm3(m, near), rel=1e-6)


@pytest.mark.parametrize("version", yuan.VERSIONS)
@pytest.mark.parametrize("theta", THETAS)
def test_derivative_matches_finite_differences(version, theta):
  cc = _coeffs(theta, version=version)
  ms = np.array([1.5, 4.0, 17.0, 40.0])
  h = 1e-5
  for with_h in (True, False):
    num = (yuan.objective(ms + h, 150, cc, with_h) - yuan.objective(ms - h, 150, cc, with_h)) \
        / (2 * h)
    np.testing.assert_allclose(yuan.objective_derivative(ms, 150, cc, with_h), num,
                               rtol=1e-5, atol=1e-9)
  if version == "printed" and theta != 1.0:
    np.testing.assert_allclose(yuan.eq14_printed(ms, 150, cc),
                               yuan.objective_derivative(ms, 150, cc), rtol=1e-10)


def test_sampling_coefficient_matches_enumeration():
  """E||mean of a K-subset of g||^2 = (U-K)/(UK(U-1)) sum ||g_k||^2 + s_K ||g_bar||^2 (E15)."""
  rng = np.random.default_rng(0)
  for u, k in ((5, 2), (6, 3), (4, 4), (5, 1)):
    g = rng.normal(size=(u, 3))
    subsets = list(itertools.combinations(range(u), k))
    lhs = np.mean([np.sum(np.square(g[list(s)].mean(0))) for s in subsets])
    rhs = ((u - k) / (u * k * (u - 1)) * np.sum(np.square(g))
           + yuan.sampling_coefficient(u, k, "corrected") * np.sum(np.square(g.mean(0))))
    assert lhs == pytest.approx(rhs, rel=1e-10)
  assert yuan.sampling_coefficient(10, 10, "corrected") == 1.0
  assert yuan.sampling_coefficient(100, 10, "printed") == pytest.approx(9 / (100 * 10 * 99))


def _grid():
  for pl, eps, theta, gamma in itertools.product((0.1, 0.3, 0.5), (5.0, 10.0, 20.0), THETAS,
                                                 (0.01, 0.05)):
    cc = _coeffs(theta, eps, consts=_consts(pl=pl, gamma=gamma))
    if theta >= cc.contraction:  # Corollary 2's convexity condition
      yield cc


def test_bisection_equals_exhaustive_search():
  """Checklist item 20: bisection on eq. (14) returns the exhaustive integer M*."""
  n = 0
  for cc in _grid():
    for t in (60, 150):
      for with_h in (True, False):
        assert yuan.optimal_aggregations_int(t, cc, with_h=with_h) == \
            yuan.optimal_aggregations_exhaustive(t, cc, with_h=with_h)
      assert yuan.optimal_aggregations_int(t, cc, divisors_only=True) == \
          yuan.optimal_aggregations_exhaustive(t, cc, divisors_only=True)
      n += 1
  assert n > 40
  # the grid has interior optima, not only the end points
  interior = [yuan.optimal_aggregations(150, cc) for cc in _grid()]
  assert sum(1 < m < 150 for m in interior) > 20


def test_root_is_a_stationary_point_and_bound_is_convex():
  cc = _coeffs(1.05, consts=_consts(pl=0.3))
  m = yuan.optimal_aggregations(150, cc)
  assert 1 < m < 150
  assert abs(yuan.objective_derivative(m, 150, cc)) < 1e-8
  # Corollary 2 asserts convexity for theta >= A without proof (spec E23): check
  # it numerically on the whole grid (second differences of G on a fine M grid)
  ms = np.linspace(1, 150, 600)
  for cg in _grid():
    g = np.asarray(yuan.objective(ms, 150, cg))
    assert np.all(np.diff(g, 2) >= -1e-9 * np.abs(g).max())


def test_optimal_aggregations_grow_with_epsilon():
  """More budget -> less noise -> more aggregations (Fig. 4, checklist item 12)."""
  for theta in THETAS:
    ms = [yuan.optimal_aggregations(150, _coeffs(theta, eps, consts=_consts(pl=0.5)))
          for eps in (2.0, 5.0, 10.0, 20.0, 40.0)]
    assert np.all(np.diff(ms) >= 0), (theta, ms)
    if theta >= 1:  # (for theta < 1 these constants put M* at T already)
      assert ms[-1] > ms[0], (theta, ms)


def test_h_term_monotone_and_tau_threshold():
  for eta_l in (0.1, 0.5, 1.0):
    # corrected Corollary 2 threshold < 1: every tau >= 1 satisfies it
    assert yuan.tau_threshold(eta_l, 1.0) < 1.0
    ms = np.arange(1, 151, dtype=float)
    assert np.all(yuan.lemma1_h_dm(ms, 150, 0.1, 1.0, eta_l) <= 0)
  assert yuan.lemma1_h(0, 0.1, 1.0, 0.5) == 0.0
  # printed threshold uses eta instead of eta L: differs when L != 1
  assert yuan.tau_threshold(0.1, 5.0, "printed") != yuan.tau_threshold(0.1, 5.0)


def test_noise_term_increases_and_gap_term_decreases_in_m():
  cc = _coeffs(1.05)
  ms = np.arange(1, 60, dtype=float)
  noise = np.asarray(yuan.bound_thm3(ms, cc._replace(initial_gap=0.0)))
  assert np.all(np.diff(noise) > 0)
  gap = np.asarray(yuan.bound_thm3(ms, cc._replace(noise=0.0)))
  assert np.all(np.diff(gap) < 0)


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="not in"):
    _coeffs(consts=_consts(pl=0.1), eta=5.0)  # phi > 0: no descent
  with pytest.raises(ValueError, match="version"):
    _coeffs(version="typo")
  with pytest.raises(ValueError, match="K <= U"):
    yuan.sampling_coefficient(3, 4, "corrected")
  with pytest.raises(ValueError, match="theta"):
    _coeffs(theta=0.0)
  with pytest.raises(ValueError, match="total_steps"):
    yuan.optimal_aggregations(0, _coeffs())


def test_estimate_constants_on_quadratic_clients():
  """f_k(w) = 0.5 ||w - c_k||^2: L = 1, rho = 1, gamma = mean ||c_k - c_bar||, L_c = max ||grad f_k||."""
  rng = np.random.default_rng(1)
  centers = rng.normal(size=(6, 4))
  c_bar = centers.mean(0)

  def loss_fn(p):
    return 0.5 * jnp.mean(jnp.sum((p["w"][None] - centers) ** 2, axis=1))

  def client_grads_fn(p):
    return {"w": p["w"][None] - centers}

  f_star = float(loss_fn({"w": jnp.asarray(c_bar)}))
  w, traj = np.full(4, 3.0), []
  for _ in range(30):
    traj.append({"w": jnp.asarray(w, jnp.float32)})
    w = w - 0.3 * (w - c_bar)
  c = yuan.estimate_constants(loss_fn, traj, client_grads_fn=client_grads_fn, f_star=f_star,
                              num_points=3, power_iters=30, pl_quantile=0.0)
  assert c.smoothness == pytest.approx(1.0, rel=1e-3)
  assert c.pl == pytest.approx(1.0, rel=1e-2)  # float32 trajectory near F*
  gamma = float(np.mean(np.linalg.norm(centers - c_bar, axis=1)))
  assert c.divergence == pytest.approx(gamma, rel=1e-4)
  w0 = np.full(4, 3.0)
  assert c.lipschitz == pytest.approx(np.linalg.norm(w0 - centers, axis=1).max(), rel=1e-4)
  g0 = w0 - centers
  b0 = math.sqrt(np.mean(np.sum(g0 ** 2, 1)) / np.sum(g0.mean(0) ** 2))
  assert c.dissimilarity >= b0 * (1 - 1e-5)
  assert c.initial_gap == pytest.approx(float(loss_fn({"w": jnp.asarray(w0)})) - f_star, rel=1e-4)
