"""RDP curves of single mechanisms and of the Poisson-subsampled Gaussian (add/remove).

Vectorised: rows are parameter pairs ``(q, z)``, columns RDP orders. The Gaussian and
Laplace curves are exact (Mironov 2017); the subsampled Gaussian follows Mironov,
Talwar & Zhang 2019 (exact binomial sums at integer orders, their series at
fractional ones, with a proved tail bound); :func:`_subsampled_rdp` assembles any
subsampled Gaussian from its log-moments (also the WBK19 bound of
:mod:`fedjax_dp.privacy.accounting.replace_one`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import special

# Iteration cap of the fractional-order series; the neglected tail is bounded.
_MAX_STEPS_LOG_A_FRAC_FAST = 200
# Rows x terms per chunk of the vectorised binomial sums (bounds memory).
_CHUNK_ELEMENTS = 1 << 22


def _gaussian_rdp(z: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """RDP of the Gaussian mechanism, ``alpha / (2 z^2)``. ``z [n]`` -> ``[n, A]``
  (``z^2`` overflowing to inf gives 0, its limit)."""
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    out = orders[None, :] / (2.0 * z[:, None] ** 2)
  out[np.isinf(z)] = 0.0
  return out


def _laplace_rdp(eps: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """RDP of the Laplace mechanism with pure epsilon ``eps = Delta_1 / b``.

  Mironov 2017, Prop. 6 (exact):
  ``eps + log(1 + (a-1)(exp((1-2a) eps) - 1)/(2a-1)) / (a-1)``. ``eps [n]`` ->
  ``[n, A]``; order ``inf`` gives ``eps``.
  """
  e = eps[:, None]
  a = orders[None, :]
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    out = e + np.log1p((a - 1) * np.expm1(e * (1 - 2 * a)) / (2 * a - 1)) / (a - 1)
  out = np.where(np.isinf(a), e, out)
  return np.where(e == 0, 0.0, out)


def _pure_to_rdp(eps: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """Tight RDP of any ``eps``-DP mechanism (randomized response is the worst case).

  ``eps - log((1 + e^-eps) / (1 + e^-(2a-1) eps)) / (a-1)`` (Steinke 2024, "Tight
  RDP & zCDP bounds from pure DP", Thm. 4). ``eps [n]`` -> ``[n, A]``.
  """
  e = eps[:, None]
  a = orders[None, :]
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    out = e - (np.log1p(np.exp(-e)) - np.log1p(np.exp(-(2 * a - 1) * e))) / (a - 1)
  out = np.where(np.isinf(a), e, out)
  return np.where(e == 0, 0.0, np.maximum(out, 0.0))


def _selection_rdp(q: np.ndarray, inner: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """Exact RDP of ``(1-q) bot + q M(D)`` vs ``(1-q) bot + q M(D')`` (bot disjoint).

  ``E_{P'}[(P/P')^a] = (1 - q) + q exp((a-1) eps_M(a))``, hence
  ``log(1 - q + q exp((a-1) eps_M(a))) / (a-1)``. ``q [n]``, ``inner [n, A]``.
  """
  a = orders[None, :]
  qq = q[:, None]
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    log_m = np.logaddexp(np.log1p(-qq), np.log(qq) + (a - 1) * inner)
    out = log_m / (a - 1)
  out = np.where(np.isinf(a), inner, out)
  return np.where(inner == 0, 0.0, out)


def _log_erfc(x: np.ndarray) -> np.ndarray:
  return math.log(2.0) + special.log_ndtr(-x * math.sqrt(2.0))


@functools.lru_cache(maxsize=64)
def _binomial_layout(alphas: tuple[int, ...], first_k: int):
  """Flat (alpha, k) term layout for segment sums over ``k = first_k..alpha``."""
  ks, reps, starts = [], [], []
  pos = 0
  for a in alphas:
    k = np.arange(first_k, a + 1, dtype=np.float64)
    starts.append(pos)
    pos += k.size
    ks.append(k)
    reps.append(np.full(k.size, float(a)))
  k = np.concatenate(ks)
  a = np.concatenate(reps)
  logc = special.gammaln(a + 1) - special.gammaln(k + 1) - special.gammaln(a - k + 1)
  starts = np.array(starts, dtype=np.int64)
  lengths = np.diff(np.append(starts, pos))
  return k, a, logc, starts, lengths


def _segment_logsumexp(terms: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """``logsumexp`` over contiguous column segments. ``[n, P]`` -> ``[n, S]``."""
  m = np.maximum.reduceat(terms, starts, axis=1)
  m_safe = np.where(np.isfinite(m), m, 0.0)
  with np.errstate(under="ignore"):
    s = np.add.reduceat(np.exp(terms - np.repeat(m_safe, lengths, axis=1)), starts, axis=1)
  with np.errstate(divide="ignore"):
    return np.where(np.isfinite(m), m_safe + np.log(s), m)


def _row_chunks(n_rows: int, n_cols: int):
  step = max(1, _CHUNK_ELEMENTS // max(n_cols, 1))
  for lo in range(0, n_rows, step):
    yield slice(lo, min(n_rows, lo + step))


def _sgm_log_a_int(q: np.ndarray, z: np.ndarray, alphas: np.ndarray) -> np.ndarray:
  """``log A_alpha`` of the Poisson subsampled Gaussian at integer orders.

  ``A_a = sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2 z^2))`` (Mironov et al.
  2019, Sec. 3.2). ``q, z [n]`` with ``0 < q < 1``; ``alphas [I]`` -> ``[n, I]``.
  """
  k, a, logc, starts, lengths = _binomial_layout(tuple(int(x) for x in alphas), 0)
  out = np.empty((q.size, alphas.size))
  for sl in _row_chunks(q.size, k.size):
    logq = np.log(q[sl])[:, None]
    log1mq = np.log1p(-q[sl])[:, None]
    inv = (1.0 / (2.0 * z[sl] ** 2))[:, None]
    terms = logc + k * logq + (a - k) * log1mq + (k * k - k) * inv
    out[sl] = _segment_logsumexp(terms, starts, lengths)
  return out


def _sgm_log_a_frac(q: np.ndarray, z: np.ndarray, alphas: np.ndarray) -> np.ndarray:
  """Upper bound on ``log A_alpha`` at fractional orders (Mironov et al. 2019, Sec. 3.3).

  The terms and the stopping rule are those of dp_accounting's
  ``_compute_log_a_frac`` (absolute values of the generalised binomial
  coefficients, hence an upper bound), vectorised, plus a rigorous bound on the
  neglected tail. For ``i > alpha`` each term is ``|C(alpha, i)|`` times a factor
  that is non-increasing in ``i`` (Mills-ratio inequality ``erfc'``), and
  ``sum_{k>i} |C(alpha, k)| = |C(alpha-1, i)| = |C(alpha, i)| (i-alpha)/alpha``, so
  the tail is at most ``t_i (i - alpha) / alpha``. That lets slowly converging
  low orders stop after ``_MAX_STEPS_LOG_A_FRAC_FAST`` terms with a valid bound
  (dp_accounting instead drops them after 1000 terms).
  ``q, z [n]``, ``alphas [F]`` -> ``[n, F]``.
  """
  n, f = q.size, alphas.size
  qq = np.repeat(q, f)
  ss = np.repeat(z, f)
  aa = np.tile(alphas, n)
  idx = np.arange(n * f)
  res = np.full(n * f, np.inf)
  logq, log1mq = np.log(qq), np.log1p(-qq)
  z0 = ss ** 2 * (log1mq - logq) + 0.5
  sq2s = math.sqrt(2.0) * ss
  inv = 1.0 / (2.0 * ss ** 2)
  lga = special.gammaln(aa + 1)
  log_a0 = np.full(n * f, -np.inf)
  log_a1 = np.full(n * f, -np.inf)
  last0 = np.full(n * f, -np.inf)
  last1 = np.full(n * f, -np.inf)
  log_half = math.log(0.5)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
    for i in range(_MAX_STEPS_LOG_A_FRAC_FAST + 1):
      j = aa - i
      log_coef = lga - special.gammaln(i + 1.0) - special.gammaln(j + 1)
      log_s0 = (log_coef + i * logq + j * log1mq + (i * i - i) * inv
                + log_half + _log_erfc((i - z0) / sq2s))
      log_s1 = (log_coef + j * logq + i * log1mq + (j * j - j) * inv
                + log_half + _log_erfc((z0 - j) / sq2s))
      log_a0 = np.logaddexp(log_a0, log_s0)
      log_a1 = np.logaddexp(log_a1, log_s1)
      total = np.logaddexp(log_a0, log_a1)
      past = i > aa
      done = past & (log_s0 < last0) & (log_s1 < last1) & (np.maximum(log_s0, log_s1) < total - 30)
      if i == _MAX_STEPS_LOG_A_FRAC_FAST:
        done = past | done
      if done.any():
        tail = np.logaddexp(log_s0, log_s1) + np.log((i - aa) / aa)
        res[idx[done]] = np.where(past, np.logaddexp(total, tail), np.inf)[done]
        keep = ~done
        if not keep.any():
          break
        (idx, aa, logq, log1mq, z0, sq2s, inv, lga, log_a0, log_a1, log_s0, log_s1) = (
            x[keep] for x in (idx, aa, logq, log1mq, z0, sq2s, inv, lga, log_a0, log_a1,
                              log_s0, log_s1))
      last0, last1 = log_s0, log_s1
  return res.reshape(n, f)


def _chord_from_integers(log_a_int: Callable[[np.ndarray], np.ndarray], alphas: np.ndarray,
                         n: int) -> np.ndarray:
  """Upper bound on ``log A_alpha`` at fractional ``alphas`` by convexity in alpha.

  ``log A_alpha = log E[(P/P')^alpha]`` is a cumulant generating function, hence
  convex in ``alpha``; the chord between ``floor`` and ``ceil`` bounds it from
  above (WBK19, Cor. 10). ``log_a_int(int_alphas [I]) -> [n, I]`` (``log A_1 = 0``).
  """
  lo = np.floor(alphas)
  hi = np.ceil(alphas)
  need = np.unique(np.concatenate([lo, hi]))
  need = need[need >= 2]
  table = {1.0: np.zeros(n)}
  if need.size:
    vals = log_a_int(need)
    for i, a in enumerate(need):
      table[float(a)] = vals[:, i]
  t = alphas - lo
  out = np.empty((n, alphas.size))
  for i, (l, h) in enumerate(zip(lo, hi)):
    out[:, i] = (1 - t[i]) * table[float(l)] + t[i] * table[float(h)]
  return out


def _split_orders(orders: np.ndarray):
  finite = np.isfinite(orders)
  is_int = finite & (orders == np.round(orders))
  return is_int, finite & ~is_int, ~finite


def _subsampled_rdp(q: np.ndarray, z: np.ndarray, orders: np.ndarray, log_a_int: Callable,
                    log_a_frac: Callable | None = None) -> np.ndarray:
  """RDP ``[n, A]`` of a subsampled Gaussian from its log-moments.

  ``q = 1`` rows are the plain Gaussian; integer orders use ``log_a_int(q, z, alphas)``;
  fractional orders the chord between integer orders (WBK19 Cor. 10), tightened by
  ``log_a_frac`` when a direct series exists. ``q, z [n]``.
  """
  out = np.zeros((q.size, orders.size))
  is_int, is_frac, is_inf = _split_orders(orders)
  full = (q >= 1) & np.isfinite(z)
  out[full] = _gaussian_rdp(z[full], orders)
  mid = (q < 1) & np.isfinite(z)
  if mid.any():
    qm, zm = q[mid], z[mid]
    block = np.empty((qm.size, orders.size))
    if is_int.any():
      block[:, is_int] = log_a_int(qm, zm, orders[is_int]) / (orders[is_int] - 1)
    if is_frac.any():
      fa = orders[is_frac]
      log_a = _chord_from_integers(lambda al: log_a_int(qm, zm, al), fa, qm.size)
      if log_a_frac is not None:
        log_a = np.minimum(log_a_frac(qm, zm, fa), log_a)
      block[:, is_frac] = log_a / (fa - 1)
    block[:, is_inf] = np.inf
    out[mid] = block
  return out


def _sgm_rdp(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """RDP of the Poisson-subsampled Gaussian (add/remove). ``q, z [n]`` -> ``[n, A]``."""
  return _subsampled_rdp(q, z, orders, _sgm_log_a_int, _sgm_log_a_frac)
