""""Utility Optimization of FL with DP" (A-DPFL), Discrete Dynamics in Nature and
Society 2021: Sec. 3.1 and eq. (15)."""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.formulas.core import (
  _arr,
  _log_inv,
  _out,
  _pos,
)


def adpfl_next_sigma(sigma, k, accuracy_gain, alpha) -> np.ndarray | float:
  """Eq. (15): ``sigma' = k sigma`` if ``S_t - S_{t-1} <= alpha`` else ``sigma``, 0 < k < 1."""
  k = _arr(k)
  if np.any((k <= 0) | (k >= 1)):
    raise ValueError(f"k must be in (0, 1), got {k}")
  return _out(np.where(_arr(accuracy_gain) <= _arr(alpha), k * _pos("sigma", sigma), _arr(sigma)))


def adpfl_sigma_schedule(sigma0, k, num_reductions) -> np.ndarray | float:
  """Closed form of eq. (15): the per-step noise multiplier ``sigma_t = sigma_0 k^m(t)``.

  ``m(t)`` = number of triggered reductions so far; the noise added to the
  summed clipped batch gradient at every local step is ``N(0, sigma_t^2 C^2 I)`` (eq. 17).
  """
  return _out(_pos("sigma0", sigma0) * _pos("k", k) ** _arr(num_reductions))


def adpfl_gaussian_sigma_printed(epsilon, delta, sensitivity=1.0) -> np.ndarray | float:
  """Sec. 3.1, as printed: ``sigma >= (Delta Q / eps) sqrt(ln(1.25/delta))`` (the 2 is missing)."""
  d = _arr(delta)
  _log_inv(d)
  return _out(_pos("sensitivity", sensitivity) / _pos("epsilon", epsilon)
              * np.sqrt(np.log(1.25 / d)))


def adpfl_gaussian_sigma_dwork_roth(epsilon, delta, sensitivity=1.0) -> np.ndarray | float:
  """Corrected (Dwork & Roth Thm. A.1): ``(Delta Q / eps) sqrt(2 ln(1.25/delta))``, for eps < 1."""
  return _out(np.sqrt(2.0) * _arr(adpfl_gaussian_sigma_printed(epsilon, delta, sensitivity)))


def adpfl_epsilon_step(noise_multiplier, delta, printed: bool = True) -> np.ndarray | float:
  """Per-step epsilon implied by the Sec. 3.1 calibration for a noise multiplier ``sigma_t``.

  ``sqrt(ln(1.25/delta)) / sigma_t`` (printed) or ``sqrt(2 ln(1.25/delta)) / sigma_t``
  (corrected); 3.43 / 4.84 at ``sigma_t = 1``, ``delta = 1e-5``, outside the
  ``eps < 1`` range where the formula is valid.
  """
  d = _arr(delta)
  _log_inv(d)
  c = 1.0 if printed else 2.0
  return _out(np.sqrt(c * np.log(1.25 / d)) / _pos("noise_multiplier", noise_multiplier))


def adpfl_epsilon_claimed(noise_multipliers_steps, delta, printed: bool = True) -> float:
  """NOT IN PAPER: basic composition of :func:`adpfl_epsilon_step` over the steps taken so far.

  The paper states only "(eps, delta)-DP" and no composition or number; this sum
  is the naive reading of its per-step calibration (at ``k * delta`` overall),
  recorded so a run still has an ``epsilon_claimed`` column.
  """
  s = np.asarray(noise_multipliers_steps, dtype=np.float64).reshape(-1)
  if s.size == 0:
    return 0.0
  return float(np.sum(adpfl_epsilon_step(s, delta, printed)))
