"""Theorem 2's bound, the Lambert-W optimal T, and the constant estimators."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

from fedjax_dp.theory import wei

EPSILONS = (2.0, 4.0, 8.0, 12.0, 16.0, 20.0)


def _consts(divergence=0.5):
  return wei.ProblemConstants(smoothness=1.0, pl=0.1, initial_gap=2.0, divergence=divergence)


def _coeffs(eps, version="consistent", k=50, eta=0.5, dim=10_000, consts=None):
  return wei.coefficients(consts or _consts(), eta=eta, epsilon=eps, delta=1e-3,
                          sensitivity=2 * eta * 1.0 / 800, num_clients=50,
                          clients_per_round=k, dim=dim, version=version)


def _numeric_argmin(coeffs):
  res = optimize.minimize_scalar(lambda t: wei.bound(t, coeffs), bounds=(1e-3, 1e6),
                                 method="bounded", options={"xatol": 1e-9, "maxiter": 2000})
  return res.x


@pytest.mark.parametrize("version,k", [("consistent", 50), ("consistent", 30),
                                       ("printed", 50)])
@pytest.mark.parametrize("eps", EPSILONS)
def test_optimal_rounds_matches_numerical_minimum(version, k, eps):
  co = _coeffs(eps, version, k)
  t_star = wei.optimal_rounds(co)
  assert t_star == pytest.approx(_numeric_argmin(co), rel=1e-6)
  assert abs(wei.bound_derivative(t_star, co)) < 1e-12
  assert wei.bound_second_derivative(t_star, co) > 0  # a minimum


@pytest.mark.parametrize("version", wei.VERSIONS)
def test_optimal_rounds_increases_with_epsilon(version):
  cos = [_coeffs(e, version) for e in EPSILONS]
  t = np.array([wei.optimal_rounds(c) for c in cos])
  h = np.array([wei.bound(ti, c) for ti, c in zip(t, cos)])
  assert np.all(np.diff(t) > 0)       # Fig. 4: the optimum shifts right with eps
  assert np.all(np.diff(h) < 0)       # weaker privacy, smaller bound
  grid = np.arange(1, 400)            # h decreases with eps at every T
  assert np.all(np.diff([wei.bound(grid, c) for c in cos], axis=0) < 0)


def test_bound_derivatives_match_finite_differences():
  co = _coeffs(8.0)
  t, h = np.linspace(2, 100, 25), 1e-3
  fd1 = (wei.bound(t + h, co) - wei.bound(t - h, co)) / (2 * h)
  fd2 = (wei.bound(t + h, co) - 2 * wei.bound(t, co) + wei.bound(t - h, co)) / h ** 2
  np.testing.assert_allclose(wei.bound_derivative(t, co), fd1, rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(wei.bound_second_derivative(t, co), fd2, rtol=1e-4, atol=1e-7)
  # the printed eq. (23) is not h'' (spec section 10 item 12)
  printed = wei.bound_second_derivative_eq23(t, co, 50)
  assert not np.allclose(printed, fd2, rtol=1e-2)


def test_closed_form_survives_huge_lambert_argument():
  # c0 tiny: exp(1 - (D0 - c1) ln A / c0) overflows a float; wrightomega does not.
  co = wei.BoundCoefficients(0.9, 2.0, 1e-12, 0.0)
  t = wei.optimal_rounds(co)
  assert math.isfinite(t) and t > 100
  assert wei.bound_derivative(t, co) == pytest.approx(0.0, abs=1e-15)
  assert wei.optimal_rounds(co._replace(c0=0.0)) == math.inf


def test_optimal_rounds_int_is_the_best_integer():
  co = _coeffs(8.0)
  n = wei.optimal_rounds_int(co)
  grid = np.arange(1, 500)
  assert n == grid[np.argmin(wei.bound(grid, co))]


def test_printed_coefficients_by_hand():
  c = wei.ProblemConstants(smoothness=2.0, pl=0.5, initial_gap=3.0, divergence=0.4)
  eta, u, k, sens = 0.25, 10, 4, 0.01
  eps, delta = np.array([4.0] * 5 + [8.0] * 5), 1e-3
  co = wei.coefficients(c, eta=eta, epsilon=eps, delta=delta, sensitivity=sens,
                        num_clients=u, clients_per_round=k, version="printed")
  s = np.sum(np.log(1 / delta) / eps ** 2)
  kappa0 = 2.0 ** 2 * sens ** 2 / 0.5
  kappa1 = eta ** 2 * 2.0 ** 2 * 0.4 / (2 * 0.5)
  assert co.contraction == pytest.approx(1 - 2 * 0.5 * eta + 0.5 * eta ** 2 * 2.0)
  assert co.c0 == pytest.approx(kappa0 * k / u ** 2 * s, rel=1e-12)
  assert co.c1 == pytest.approx(kappa1 * u * (u - k) / (k * (u - 1)), rel=1e-12)  # extra U
  assert co.initial_gap == 3.0


def test_consistent_equals_printed_up_to_errata_at_eta_one_over_l():
  # At eta = 1/L, 1/(1-A) = L/mu (the printed factor): the versions differ only by the
  # model dimension / K in c0 (erratum 11c) and the extra U in c1 (erratum 11a).
  c = wei.ProblemConstants(smoothness=4.0, pl=0.3, initial_gap=1.0, divergence=0.7)
  kw = {"eta": 0.25, "epsilon": 6.0, "delta": 1e-4, "sensitivity": 0.02, "num_clients": 20,
        "clients_per_round": 5, "dim": 1000}
  pr = wei.coefficients(c, version="printed", **kw)
  co = wei.coefficients(c, version="consistent", **kw)
  assert co.contraction == pr.contraction
  assert co.c0 == pytest.approx(pr.c0 * 1000 / 5, rel=1e-12)
  assert co.c1 == pytest.approx(pr.c1 / 20, rel=1e-12)


def test_full_participation_has_no_sampling_floor():
  for v in wei.VERSIONS:
    assert _coeffs(4.0, v, k=50).c1 == 0.0
    assert _coeffs(4.0, v, k=30).c1 > 0.0


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="not in \\(0, 1\\)"):
    wei.contraction(pl=1.0, smoothness=1.0, eta=2.0)
  with pytest.raises(ValueError, match="version"):
    _coeffs(4.0, "nope")
  with pytest.raises(ValueError, match="K <= U"):
    _coeffs(4.0, k=60)


# ----------------------------------------------------------------------------- estimators


def _quadratic_problem():
  """F_i(w) = 0.5 (w - b_i)^T H (w - b_i): every constant is known in closed form."""
  eig = np.array([4.0, 2.0, 1.0, 0.5, 0.25])
  rng = np.random.default_rng(0)
  rot, _ = np.linalg.qr(rng.normal(size=(5, 5)))
  hess = rot @ np.diag(eig) @ rot.T
  b = rng.normal(size=(6, 5))
  b_bar = b.mean(0)
  hj, bj = jnp.asarray(hess, jnp.float32), jnp.asarray(b, jnp.float32)

  def client_loss(w, bi):
    e = w["w"] - bi
    return 0.5 * e @ hj @ e

  def loss_fn(w):
    return jnp.mean(jax.vmap(client_loss, in_axes=(None, 0))(w, bj))

  def client_grads_fn(w):
    return jax.vmap(jax.grad(client_loss), in_axes=(None, 0))(w, bj)

  f_star = float(np.mean([0.5 * (b_bar - bi) @ hess @ (b_bar - bi) for bi in b]))
  divergence = float(np.mean([np.sum((hess @ (bi - b_bar)) ** 2) for bi in b]))
  return eig, hess, b_bar, loss_fn, client_grads_fn, f_star, divergence


def test_estimate_constants_on_a_quadratic():
  eig, hess, b_bar, loss_fn, client_grads_fn, f_star, divergence = _quadratic_problem()
  w = np.ones(5) * 3.0
  traj, eta = [], 0.2
  for _ in range(60):  # gradient descent on F
    traj.append({"w": jnp.asarray(w, jnp.float32)})
    w = w - eta * hess @ (w - b_bar)
  c = wei.estimate_constants(loss_fn, traj, client_grads_fn=client_grads_fn, f_star=f_star,
                             num_points=3, power_iters=40, pl_quantile=0.0)
  assert c.smoothness == pytest.approx(eig.max(), rel=1e-3)
  e0 = np.ones(5) * 3.0 - b_bar
  assert c.initial_gap == pytest.approx(0.5 * e0 @ hess @ e0, rel=1e-4)
  assert c.divergence == pytest.approx(divergence, rel=1e-4)
  # the PL ratio ||H e||^2 / (e^T H e) lies in [lambda_min, lambda_max]; GD drives the
  # error to the slowest eigen-direction, so the minimum approaches lambda_min
  assert eig.min() * (1 - 1e-3) <= c.pl <= 1.5 * eig.min()
  assert c.f_star == f_star


def test_hessian_eigenvalue_and_divergence_helpers():
  _, _, _, loss_fn, client_grads_fn, _, divergence = _quadratic_problem()
  top = wei.hessian_top_eigenvalue(loss_fn, {"w": jnp.zeros(5)}, num_iters=40)
  assert top == pytest.approx(4.0, rel=1e-3)
  g = np.asarray(client_grads_fn({"w": jnp.zeros(5)})["w"])
  assert wei.gradient_divergence(g) == pytest.approx(divergence, rel=1e-4)
  # weights: identical clients have no divergence whatever the weights
  assert wei.gradient_divergence(np.ones((4, 3)), weights=[1, 2, 3, 4]) == 0.0
  ratios = wei.pl_ratios([3.0, 2.0, 1.0], [8.0, 4.0, 0.0], f_star=1.0)
  np.testing.assert_allclose(ratios, [2.0, 2.0])  # the point at F* is dropped
