"""What the papers' formulas share: argument checks and the zCDP conversion.

``zcdp_rho``/``zcdp_epsilon`` (Bun & Steinke 2016, Prop. 1.3) are also the exact
minimiser of the papers' own moment bound over real orders, so they are the shared
core of the corrected variants (:mod:`fedjax_dp.privacy.formulas`).
"""

from __future__ import annotations

import numpy as np


def _arr(x) -> np.ndarray:
  return np.asarray(x, dtype=np.float64)


def _out(x):
  x = np.asarray(x, dtype=np.float64)
  return float(x) if x.ndim == 0 else x


def _log_inv(delta) -> np.ndarray:
  d = _arr(delta)
  if np.any((d <= 0) | (d >= 1)):
    raise ValueError(f"delta must be in (0, 1), got {delta}")
  return -np.log(d)


def _pos(name, x) -> np.ndarray:
  a = _arr(x)
  if np.any(~(a > 0)):
    raise ValueError(f"{name} must be > 0, got {x}")
  return a


def _prob(name, x) -> np.ndarray:
  a = _arr(x)
  if np.any(~((a > 0) & (a <= 1))):
    raise ValueError(f"{name} must be in (0, 1], got {x}")
  return a


def zcdp_rho(epsilon, delta) -> np.ndarray | float:
  """Largest ``rho`` whose zCDP conversion ``rho + 2 sqrt(rho ln(1/delta))`` is ``epsilon``.

  ``rho* = (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))^2`` (Bun & Steinke
  2016, Prop. 1.3). This is also the exact minimiser of the papers' own moment
  bound over real orders, so it is the shared core of the corrected variants.
  """
  li = _log_inv(delta)
  e = _pos("epsilon", epsilon)
  return _out((np.sqrt(li + e) - np.sqrt(li)) ** 2)


def zcdp_epsilon(rho, delta) -> np.ndarray | float:
  """``rho + 2 sqrt(rho ln(1/delta))``: epsilon of ``rho``-zCDP at ``delta``.

  The inverse of :func:`zcdp_rho`.
  """
  r = _arr(rho)
  return _out(r + 2 * np.sqrt(r * _log_inv(delta)))
