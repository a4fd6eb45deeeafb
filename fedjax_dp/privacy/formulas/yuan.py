"""Yuan et al., "Amplitude-Varying Perturbation for Balancing Privacy and Utility in
FL": eqs. (6), (8), (9), (16)-(27), as printed and corrected (spec ``yuan2023.md``)."""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.formulas.core import (
  _arr,
  _log_inv,
  _out,
  _pos,
  _prob,
  zcdp_epsilon,
  zcdp_rho,
)
from fedjax_dp.privacy.formulas.wei import wei_budget, wei_epsilon_claimed


def yuan_sensitivity(clip, n) -> np.ndarray | float:
  """Section III: ``Delta s = 2 C / |D_k|`` (full-batch local training, from Wei et al.)."""
  return _out(2 * _pos("clip", clip) / _pos("n", n))


def yuan_geometric_sum(theta, rounds) -> np.ndarray | float:
  """``S_M = (theta - theta^(1-M)) / (theta - 1) = sum_{m=1}^M theta^-(m-1)``.

  ``S_M = M`` at ``theta = 1``.

  The factor of eq. (8)/(16); computed as ``sum theta^-(m-1)`` in closed form with
  ``expm1`` so ``theta -> 1`` is continuous (spec checklist item 2).
  """
  th = _pos("theta", theta)
  m = _pos("rounds", rounds)
  lt = np.log(th)
  with np.errstate(divide="ignore", invalid="ignore"):
    # sum_{k=0}^{M-1} e^{-k lt} = expm1(-M lt) / expm1(-lt)
    s = np.expm1(-m * lt) / np.expm1(-lt)
  return _out(np.where(np.abs(lt) < 1e-12, m, s))


def yuan_sigma_eq8(epsilon, delta, q, rounds, theta, sensitivity) -> np.ndarray | float:
  """Theorem 1, eq. (8), as printed: base amplitude
  ``sigma = (Delta s / eps) sqrt(2 q S_M ln(1/delta))`` of ``Theta(m) = theta^(m-1) sigma^2``.

  ``rounds`` is ``M`` (global aggregations); Remark 3 (``theta = 1``) is the
  limit ``S_M = M``. Under the paper's own accountant this delivers
  ``eps + eps^2/(4 ln(1/delta))``, not ``eps`` (spec E4).
  """
  return _out(_pos("sensitivity", sensitivity) / _pos("epsilon", epsilon) * np.sqrt(
      2 * _prob("q", q) * _arr(yuan_geometric_sum(theta, rounds)) * _log_inv(delta)))


def yuan_round_sigma(sigma, theta, m) -> np.ndarray | float:
  """Eq. (6): the amplitude (std) at aggregation ``m`` (1-based): ``sigma theta^((m-1)/2)``.

  ``theta`` multiplies the VARIANCE: ``Theta(m) = theta^(m-1) sigma^2``.
  """
  return _out(_pos("sigma", sigma) * _pos("theta", theta) ** ((_arr(m) - 1) / 2))


def yuan_epsilon_eq8(sigma, delta, q, rounds, theta, sensitivity) -> np.ndarray | float:
  """Inverse of eq. (8): epsilon the paper claims for base amplitude ``sigma`` over ``M`` rounds."""
  return _out(_pos("sensitivity", sensitivity) / _pos("sigma", sigma) * np.sqrt(
      2 * _prob("q", q) * _arr(yuan_geometric_sum(theta, rounds)) * _log_inv(delta)))


def yuan_epsilon_claimed(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Epsilon claimed by (8)/(16) after rounds with ``sum_m 1/Theta(m) = past_inv_var_sum``.

  ``Delta s sqrt(2 q ln(1/delta) sum_m sigma_m^-2)``; reaches the target eps at ``m = M``.
  """
  return wei_epsilon_claimed(past_inv_var_sum, delta, q, sensitivity)


def yuan_epsilon_achieved(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Epsilon of the paper's own accountant (16)-(17) minimised over real lambda.

  ``a + 2 sqrt(a ln(1/delta))`` with ``a = sum_m q Delta s^2 / (2 sigma_m^2)``
  (spec section 3.3: 13.62 at eps = 10, delta = 1e-3 with eq. (8)).
  """
  return zcdp_epsilon(_prob("q", q) * _arr(sensitivity) ** 2 * _arr(past_inv_var_sum) / 2, delta)


def yuan_sigma_eq8_corrected(epsilon, delta, q, rounds, theta, sensitivity) -> np.ndarray | float:
  """Corrected eq. (8) (spec E4): ``sigma^2 = q Delta s^2 S_M / (2 rho*)``.

  1.282x the printed sigma at eps = 10, delta = 1e-3.
  """
  rho = _arr(zcdp_rho(epsilon, delta))
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      _prob("q", q) * _arr(yuan_geometric_sum(theta, rounds)) / (2 * rho)))


def yuan_sigma_eq9(epsilon, delta, q, sensitivity, theta, m, new_rounds) -> np.ndarray | float:
  """Theorem 2, eq. (9), as printed: base amplitude after shortening the horizon to ``M'``.

  The refinement happens at round ``m``:

  ``theta > 1``: ``(Delta s/eps) sqrt(2q ((theta - theta^(1-m))/(theta-1) + M' - m) ln(1/delta))``;
  ``theta = 1``: ``(Delta s/eps) sqrt(2 q M' ln(1/delta))``;
  ``theta < 1``:
  ``(Delta s/eps) sqrt(2q (theta^(1-m) - theta + theta^(m-M'))/(1-theta) ln(1/delta))``.
  The ``theta < 1`` branch under-counts the spend (spec E9); use
  :func:`yuan_sigma_refine_exact` for a budget-exact refinement.
  """
  th = _pos("theta", theta)
  m = _arr(m)
  mp = _arr(new_rounds)
  base = _pos("sensitivity", sensitivity) / _pos("epsilon", epsilon)
  li = _log_inv(delta)
  q = _prob("q", q)
  with np.errstate(divide="ignore", invalid="ignore"):
    gt = (th - th ** (1 - m)) / (th - 1) + mp - m
    lt = (th ** (1 - m) - th + th ** (m - mp)) / (1 - th)
  factor = np.where(th > 1, gt, np.where(th < 1, lt, mp))
  return _out(base * np.sqrt(2 * q * factor * li))


def yuan_sigma_refine_exact(epsilon, delta, q, sensitivity, theta, m, new_rounds,
                            past_inv_var_sum) -> np.ndarray | float:
  """Budget-exact refinement (spec section 4, "exact alternative").

  ``(sigma')^2 = sum_{n=m+1}^{M'} theta^-(n-1) / (B - P_m)``,
  ``B = eps^2 / (2 q Delta s^2 ln(1/delta))``, ``P_m = past_inv_var_sum`` (the
  realised ``sum_{n<=m} 1/Theta(n)``). ``inf`` when the budget is spent.
  """
  th = _pos("theta", theta)
  m = _arr(m)
  mp = _arr(new_rounds)
  # sum_{n=m+1}^{M'} theta^-(n-1) = theta^-m S_{M'-m}
  tail = th ** (-m) * _arr(yuan_geometric_sum(th, np.maximum(mp - m, 1e-300)))
  tail = np.where(mp > m, tail, 0.0)
  room = _arr(wei_budget(epsilon, delta, q, sensitivity)) - _arr(past_inv_var_sum)
  with np.errstate(divide="ignore", invalid="ignore"):
    s = np.sqrt(tail / room)
  return _out(np.where((room > 0) & (tail > 0), s, np.inf))
