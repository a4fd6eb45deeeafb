"""Wei et al., "User-Level Privacy-Preserving FL: Analysis and Performance
Optimization", IEEE TMC 2021 (UDP + CRD): eqs. (10), (13)-(17), (25), as printed and
corrected (spec ``wei_udp_crd.md``)."""

from __future__ import annotations

import numpy as np
from scipy import special

from fedjax_dp.privacy.formulas.core import (
  _arr,
  _log_inv,
  _out,
  _pos,
  _prob,
  zcdp_epsilon,
  zcdp_rho,
)


def wei_sensitivity(eta, clip, n) -> np.ndarray | float:
  """Eq. (13): ``Delta_l = 2 eta C / |D_i|``.

  L2 sensitivity of one full-batch clipped gradient step of client ``i`` under
  replace-one adjacency of an example (the 2 is the replace-one factor).
  """
  return _out(2 * _pos("eta", eta) * _pos("clip", clip) / _pos("n", n))


def wei_sigma_eq10(epsilon, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """Theorem 1, eq. (10), as printed: ``sigma_i = Delta_l sqrt(2 q T ln(1/delta_i)) / eps_i``.

  Returns the std of the Gaussian noise added to every model coordinate. The
  spec (section 3.5) shows the stated ``(eps, delta)`` is NOT met, even by the
  paper's own accountant (16)-(17); see :func:`wei_sigma_eq10_corrected`.
  """
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      2 * _prob("q", q) * _pos("rounds", rounds) * _log_inv(delta)) / _pos("epsilon", epsilon))


def wei_epsilon_eq10(sigma, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """Inverse of eq. (10): the epsilon the paper claims after ``rounds`` rounds at ``sigma``.

  ``eps = Delta_l sqrt(2 q T ln(1/delta)) / sigma``.
  """
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      2 * _prob("q", q) * _pos("rounds", rounds) * _log_inv(delta)) / _pos("sigma", sigma))


def wei_budget(epsilon, delta, q, sensitivity) -> np.ndarray | float:
  """The budget behind eqs. (10) and (25): ``B = eps^2 / (2 q Delta_l^2 ln(1/delta))``.

  The paper's guarantee is exactly ``sum over rounds of sigma_tau^-2 <= B``
  (spec section 3.6).
  """
  return _out(_pos("epsilon", epsilon) ** 2 / (
      2 * _prob("q", q) * _pos("sensitivity", sensitivity) ** 2 * _log_inv(delta)))


def wei_sigma_eq25(epsilon, delta, q, sensitivity, rounds, t,
                   past_inv_var_sum) -> np.ndarray | float:
  """Theorem 4, eq. (25): noise std for round ``t`` when the horizon becomes ``T = rounds``.

  ``sigma_i^t = sqrt((T - t) / (eps^2 / (2 q Delta^2 ln(1/delta))
  - sum_{tau<t} (sigma_i^tau)^-2))``,
  with 0-based rounds and ``past_inv_var_sum = sum_{tau=0}^{t-1} (sigma_i^tau)^-2``
  (spec section 10 item 9). At ``t = 0`` it equals eq. (10). Returns ``inf`` where
  the budget is already exhausted or ``t >= T`` (training must stop).
  """
  return _spread_budget(wei_budget(epsilon, delta, q, sensitivity), rounds, t, past_inv_var_sum)


def _spread_budget(budget, rounds, t, past_inv_var_sum):
  """``sqrt((T - t) / (B - S))``: the budget left spread evenly over the rounds left
  (eq. (25)'s form); ``inf`` where the budget is exhausted or ``t >= T``."""
  left = _arr(rounds) - _arr(t)
  room = _arr(budget) - _arr(past_inv_var_sum)
  with np.errstate(divide="ignore", invalid="ignore"):
    s = np.sqrt(left / room)
  return _out(np.where((room > 0) & (left > 0), s, np.inf))


def wei_epsilon_claimed(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Epsilon claimed by eqs. (10)/(25) after rounds with the given ``sum sigma^-2``.

  ``eps(t) = Delta_l sqrt(2 q ln(1/delta) sum_{tau<t} (sigma_tau)^-2)`` (spec
  section 3.6, the inverse of (10)/(25)); at constant sigma and ``t = T`` it is
  :func:`wei_epsilon_eq10`.
  """
  s = _arr(past_inv_var_sum)
  if np.any(s < 0):
    raise ValueError(f"past_inv_var_sum must be >= 0, got {past_inv_var_sum}")
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      2 * _prob("q", q) * _log_inv(delta) * s))


def wei_log_moment_bound(lam, q, sensitivity, sigma) -> np.ndarray | float:
  """Eq. (15), the paper's per-round log-moment approximation:
  ``alpha(lambda) ~= q lambda (lambda + 1) Delta^2 / (2 sigma^2)``.

  (The paper's last step is "~=", a first-order approximation; Fig. 2 checks it
  numerically.)
  """
  lam = _arr(lam)
  return _out(_prob("q", q) * lam * (lam + 1) * _arr(sensitivity) ** 2
              / (2 * _pos("sigma", sigma) ** 2))


def wei_log_moment_exact(lam, q, sensitivity, sigma) -> np.ndarray | float:
  """Eq. (14), exact: ``ln D_{nu1,nu0}(lambda)``, ``nu1 = q N(Delta, s^2) + (1-q) N(0, s^2)``.

  Against ``nu0 = N(0, s^2)``:

  ``D = sum_{l=0}^{lambda+1} C(lambda+1, l) (1-q)^(lambda+1-l) q^l exp(l (l-1) Delta^2 / (2 s^2))``,
  computed in log space. ``lambda`` must be a non-negative integer (array).
  """
  lam = np.asarray(lam)
  if np.any(lam < 0) or np.any(lam != np.round(lam)):
    raise ValueError(f"lam must be non-negative integers, got {lam}")
  q = _prob("q", q)
  r = _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  lam_b, q_b, r_b = np.broadcast_arrays(lam.astype(np.float64), q, r)
  out = np.empty(lam_b.shape)
  for idx in np.ndindex(*lam_b.shape):
    n = int(lam_b[idx]) + 1
    l = np.arange(n + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
      log_terms = (special.gammaln(n + 1) - special.gammaln(l + 1) - special.gammaln(n - l + 1)
                   + (n - l) * np.log1p(-q_b[idx]) + l * np.log(q_b[idx]) + l * (l - 1) * r_b[idx])
    out[idx] = special.logsumexp(log_terms)
  return _out(out)


def wei_log_moment_intermediate(lam, q, sensitivity, sigma) -> np.ndarray | float:
  """The rigorous intermediate bound of eq. (14).

  ``(lambda+1) ln(1 - q + q exp(lambda Delta^2 / (2 s^2)))``.
  """
  lam = _arr(lam)
  q = _prob("q", q)
  r = _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  with np.errstate(divide="ignore"):
    return _out((lam + 1) * np.logaddexp(np.log1p(-q), np.log(q) + lam * r))


def wei_delta_eq17(epsilon, q, rounds, sensitivity, sigma, max_order: int = 1000,
                   integer_orders: bool = True) -> np.ndarray | float:
  """Eq. (17), the paper's tail bound: ``delta = min_lambda exp(T alpha(lambda) - lambda eps)``
  with ``alpha`` from eq. (15)/(16).

  Args:
    integer_orders: minimise over ``lambda = 1..max_order`` (the paper's
      "positive integer"), else over real ``lambda > 0`` (closed form
      ``exp(-(eps - a)^2 / (4 a))`` for ``eps > a``, ``a = T q Delta^2 / (2 sigma^2)``).
  """
  e = _arr(epsilon)
  a = _arr(rounds) * _prob("q", q) * _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  if not integer_orders:
    return _out(np.where(e > a, np.exp(-(e - a) ** 2 / (4 * a)), 1.0))
  lam = np.arange(1, max_order + 1, dtype=np.float64)
  e_b, a_b = np.broadcast_arrays(e, a)
  logd = a_b[..., None] * lam * (lam + 1) - lam * e_b[..., None]
  return _out(np.exp(np.min(logd, axis=-1)))


def wei_epsilon_eq17(sigma, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """The epsilon that the paper's OWN accountant (16)-(17) gives for ``sigma`` (real lambda).

  ``eps = a + 2 sqrt(a ln(1/delta))``, ``a = T q Delta^2 / (2 sigma^2)``. Plugging
  eq. (10) in gives ``eps + eps^2 / (4 ln(1/delta))`` > the claimed ``eps``
  (spec section 3.5).
  """
  a = _arr(rounds) * _prob("q", q) * _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  return zcdp_epsilon(a, delta)


def wei_sigma_eq10_corrected(epsilon, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """Corrected eq. (10): solve ``(eps - a)^2 / (4 a) = ln(1/delta)`` for ``a``.

  Here ``a = T q Delta^2 / (2 sigma^2)``.

  I.e. ``a = rho*(eps, delta)`` and ``sigma = Delta sqrt(q T / (2 rho*))``; 1.13x
  (eps = 4) to 1.49x (eps = 20) the printed sigma at delta = 1e-3 (spec section
  3.5). Meets the paper's own accountant exactly; certified only for ``q = 1``
  (where (15) is the exact Gaussian moment).
  """
  rho = _arr(zcdp_rho(epsilon, delta))
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      _prob("q", q) * _pos("rounds", rounds) / (2 * rho)))


def wei_budget_corrected(epsilon, delta, q, sensitivity) -> np.ndarray | float:
  """Corrected budget: ``sum sigma_tau^-2 <= 2 rho*(eps, delta) / (q Delta^2)``."""
  return _out(2 * _arr(zcdp_rho(epsilon, delta))
              / (_prob("q", q) * _pos("sensitivity", sensitivity) ** 2))


def wei_sigma_eq25_corrected(epsilon, delta, q, sensitivity, rounds, t,
                             past_inv_var_sum) -> np.ndarray | float:
  """Eq. (25) with the corrected budget of :func:`wei_budget_corrected` (``inf`` when exhausted)."""
  return _spread_budget(wei_budget_corrected(epsilon, delta, q, sensitivity), rounds, t,
                        past_inv_var_sum)


def wei_epsilon_claimed_corrected(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Inverse of the corrected calibration: ``zcdp_epsilon(q Delta^2 S / 2, delta)``."""
  return zcdp_epsilon(_prob("q", q) * _arr(sensitivity) ** 2 * _arr(past_inv_var_sum) / 2, delta)
