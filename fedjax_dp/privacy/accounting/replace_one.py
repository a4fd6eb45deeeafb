"""Replace-one subsampling bounds: the Poisson-sampled Gaussian sum under replace-one
(a quadrature with a proved error term) and the Gaussian on a fixed-size sample
without replacement (Wang, Balle & Kasiviswanathan 2019, Thm. 27; as dp_accounting).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from fedjax_dp.privacy.accounting.rdp_curves import (
  _binomial_layout,
  _gaussian_rdp,
  _row_chunks,
  _segment_logsumexp,
  _selection_rdp,
  _subsampled_rdp,
)

# Above this integer order the WBK19 bound uses its O(alpha) simplification.
_WOR_MAX_EXACT_ORDER = 256


def _replace_sgm_log_moment(q: float, s: float, alpha: np.ndarray, cells: int) -> np.ndarray:
  """Upper bound on ``log E_Q[(P/Q)^alpha]`` for the replace-one Poisson pair
  ``P = (1-q) N(0, s^2) + q N(-1, s^2)``, ``Q = (1-q) N(0, s^2) + q N(1, s^2)``, for
  orders ``alpha [A] > 1``.

  Trapezoid rule on ``[L, R]`` with ``cells`` cells plus its error bound
  ``h^3 / 12 max|g''|`` per cell, where ``g = e^f``, ``f = alpha log P + (1-alpha) log Q``
  and ``|g''| <= g (|f''| + f'^2)``: a mixture's score is ``-(x - m(x)) / s^2`` with
  ``m`` the posterior mean of its two component means (in ``[-1, 0]`` for P, ``[0, 1]``
  for Q) and ``(log P)'' = -1/s^2 + Var(m)/s^4`` with ``Var(m) <= 1/4``, so on a cell
  ``[a, b]`` ``|f'| <= max(|x|, |x + 2 alpha - 1|) / s^2`` at its ends,
  ``|f''| <= 1/s^2 + alpha/(4 s^4)`` and ``f <= max(f(a), f(b)) + h max|f'| / 2``.
  Tails: for ``x <= L <= -1/2`` ``P <= N(-1)`` and ``Q >= (1-q) N(0)``, so their part is
  at most ``(1-q)^(1-alpha) e^(alpha (alpha-1) / (2 s^2)) Phi((L + alpha) / s)``; for
  ``x >= R >= 0`` ``P <= Q``, so at most ``Q([R, inf))``.
  """
  a = np.asarray(alpha, np.float64)[:, None]
  log_keep = math.log1p(-q)
  growth = (a - 1.0) * (a / (2 * s * s) - log_keep)  # log of the left tail's prefactor
  left = np.minimum(-0.5, -a - s * np.sqrt(2.0 * (growth + 40.0)))  # tail <= e^-40
  right = 1.0 + 10.0 * s
  x = left + (right - left) * np.linspace(0.0, 1.0, cells + 1)[None, :]
  h = (right - left) / cells

  def log_mix(mean):
    return np.logaddexp(log_keep + _log_normal(x, 0.0, s), math.log(q) + _log_normal(x, mean, s))

  f = a * log_mix(-1.0) + (1.0 - a) * log_mix(1.0)
  trap = special.logsumexp(np.concatenate([f[:, 1:-1], f[:, [0, -1]] - math.log(2.0)], 1),
                           axis=1, keepdims=True) + np.log(h)
  ends = np.maximum(np.abs(x), np.abs(x + 2 * a - 1)) / (s * s)
  f1 = np.maximum(ends[:, :-1], ends[:, 1:])
  f2 = 1.0 / (s * s) + a / (4 * s ** 4)
  log_err = (np.maximum(f[:, :-1], f[:, 1:]) + h * f1 / 2 + np.log(f2 + f1 ** 2)
             + 3 * np.log(h) - math.log(12.0))
  left_tail = growth + special.log_ndtr((left + a) / s)
  right_tail = np.full_like(a, np.logaddexp(log_keep + special.log_ndtr(-right / s),
                                            math.log(q) + special.log_ndtr(-(right - 1.0) / s)))
  return special.logsumexp(np.concatenate([trap, left_tail, right_tail, log_err], 1), axis=1)


def _log_normal(x: np.ndarray, mean: float, s: float) -> np.ndarray:
  return -0.5 * np.square((x - mean) / s) - math.log(s * math.sqrt(2 * math.pi))


# Cells of the quadrature of _replace_sgm_log_moment (its bound is within ~1e-4
# relative of the divergence at A-DPFL's setting), and the largest order it is worth
# its cost at (above it the revealed-membership bound is as good).
_REPLACE_SGM_CELLS = 8_000
_REPLACE_SGM_MAX_ORDER = 64.0


def _replace_sgm_rdp(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """RDP ``[n, A]`` of the Poisson-subsampled Gaussian sum under REPLACE-ONE, ``z``
  measured against the replace-one sensitivity ``2 C`` (each term of norm <= C).

  Replacing x by x' (both sampled with probability q, as the same slot) gives, for
  fixed other batch members, ``(1-q) N(S, sigma^2) + q N(S + v)`` against
  ``(1-q) N(S) + q N(S + v')`` with ``||v||, ||v'|| <= C``; the worst case is
  ``v' = -v`` on one axis, the pair ``P = (1-q) N(0) + q N(-1)``,
  ``Q = (1-q) N(0) + q N(1)`` in units of C with std ``s = 2 z`` (the REPLACE
  adjacency of dp_accounting's PLD for Poisson-sampled Gaussians; Zhu, Dong & Wang
  2022; Lebeda et al. 2024), and the mixture over the other members only lowers the
  divergence (joint convexity). Its Renyi divergence has no closed form: each order is
  bounded by a quadrature with a proved error term (:func:`_replace_sgm_log_moment`;
  the pair is symmetric, so ``D(P||Q) = D(Q||P)``), and the result is the smaller of
  that and the revealed-membership bound (both valid), which is also used at orders
  above ``_REPLACE_SGM_MAX_ORDER``. ``q, z [n]``.
  """
  out = _selection_rdp(q, _gaussian_rdp(z, orders), orders)
  cols = np.flatnonzero((orders > 1) & (orders <= _REPLACE_SGM_MAX_ORDER))
  for i in np.flatnonzero((q < 1) & np.isfinite(z)):
    log_m = _replace_sgm_log_moment(float(q[i]), 2.0 * float(z[i]), orders[cols],
                                    _REPLACE_SGM_CELLS)
    out[i, cols] = np.minimum(out[i, cols], log_m / (orders[cols] - 1.0))
  return out


def _wor_forward_diffs(z: np.ndarray, n_max: int) -> np.ndarray:
  """Log-magnitudes of forward differences of ``exp(x(x+1)/(2 z^2))`` at ``x = -1``.

  Vectorised port of dp_accounting's ``_get_forward_diffs`` (WBK19, Thm. 27):
  column ``p`` holds ``log|Delta^(p+1) f(-1)|``. ``z [n]`` -> ``[n, n_max + 2]``.
  """
  x = np.arange(-1, n_max + 2, dtype=np.float64)
  mag = x[None, :] * (x[None, :] + 1) / (2.0 * z[:, None] ** 2)
  sign = np.ones_like(mag, dtype=bool)
  deltas = np.empty((z.size, n_max + 2))
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    for p in range(n_max + 2):
      m = n_max + 2 - p
      a_mag, a_sign = mag[:, :m], sign[:, :m]
      b_mag, b_sign = mag[:, 1:m + 1], sign[:, 1:m + 1]
      # new = b - a, in sign/log-magnitude form.
      same = a_sign == b_sign
      b_gt = b_mag > a_mag
      hi = np.maximum(a_mag, b_mag)
      lo = np.minimum(a_mag, b_mag)
      sub_mag = np.where(a_mag == b_mag, -np.inf, hi + np.log1p(-np.exp(lo - hi)))
      sub_sign = np.where(a_mag == b_mag, True, b_gt)
      sub_sign = np.where(b_sign, sub_sign, ~sub_sign)
      add_mag = np.logaddexp(a_mag, b_mag)
      new_mag = np.where(same, sub_mag, add_mag)
      new_sign = np.where(same, sub_sign, b_sign)
      mag[:, :m] = new_mag
      sign[:, :m] = new_sign
      deltas[:, p] = mag[:, 0]
  return deltas


def _wor_log_a_int(q: np.ndarray, z: np.ndarray, alphas: np.ndarray) -> np.ndarray:
  """``log A_alpha`` (WBK19 bound) of the Gaussian sampled without replacement.

  Port of dp_accounting's ``_compute_rdp_sample_wor_gaussian_int``: exact Thm. 27
  terms up to order 256, the ``log 2 + cgf(i-1)`` simplification beyond.
  ``q, z [n]`` with ``0 < q < 1``; integer ``alphas [I]`` -> ``[n, I]``.
  """
  alphas_i = tuple(int(a) for a in alphas)
  out = np.zeros((q.size, len(alphas_i)))
  valid = [i for i, a in enumerate(alphas_i) if a >= 2]
  if not valid:
    return out
  sel = tuple(alphas_i[i] for i in valid)
  # Layout: k = 1 is a placeholder for the constant term (log 1 = 0), k >= 2 real terms.
  k, a, logc, starts, lengths = _binomial_layout(sel, 1)
  n_exact = min(max(sel), _WOR_MAX_EXACT_ORDER)
  k_int = k.astype(np.int64)
  lo_idx = np.clip(2 * (k_int // 2) - 1, 0, n_exact + 1)
  hi_idx = np.clip(2 * ((k_int + 1) // 2) - 1, 0, n_exact + 1)
  exact = a <= _WOR_MAX_EXACT_ORDER
  vals = np.empty((q.size, len(sel)))
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    for sl in _row_chunks(q.size, k.size):
      zs = z[sl][:, None]
      logq = np.log(q[sl])[:, None]
      deltas = _wor_forward_diffs(z[sl], n_exact)
      cgf_km1 = (k - 1) * k / (2.0 * zs ** 2)
      f2 = 1.0 / zs ** 2  # func(2) = 2 / (2 z^2)
      log_f2m1 = f2 + np.log1p(-np.exp(-f2))
      two = 2 * logq + np.minimum(math.log(4) + log_f2m1, f2 + math.log(2))
      diff_bound = math.log(4) + 0.5 * (deltas[:, lo_idx] + deltas[:, hi_idx])
      general = np.where(exact[None, :], np.minimum(diff_bound, math.log(2) + cgf_km1),
                         math.log(2) + cgf_km1) + k * logq
      terms = np.where(k == 2, two, general) + logc
      terms = np.where(k == 1, 0.0, terms)  # the constant 1
      vals[sl] = _segment_logsumexp(terms, starts, lengths)
  out[:, valid] = vals
  return out


def _wor_rdp(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """RDP (WBK19) of the Gaussian on a fixed-size sample without replacement.

  Replace-one adjacency; ``q = K/U``; fractional orders by the chord (WBK19
  Cor. 10), as in dp_accounting. ``q, z [n]`` -> ``[n, A]``.
  """
  return _subsampled_rdp(q, z, orders, _wor_log_a_int)
