"""The exact accountant: analytic Gaussian (Balle & Wang 2018) and pure-epsilon Laplace."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from fedjax_dp.privacy.accounting.events import Event, _check_delta, history_batch_shape


def gaussian_delta(mu, epsilon) -> np.ndarray:
  """delta(eps) of a Gaussian with sensitivity/std ``mu`` (Balle & Wang 2018, Thm. 8).

  ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``; exact (tight). ``mu``
  broadcasts; ``mu = 0`` gives 0.
  """
  mu = np.asarray(mu, dtype=np.float64)
  eps = np.asarray(epsilon, dtype=np.float64)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    a = special.log_ndtr(-eps / mu + mu / 2)
    b = eps + special.log_ndtr(-eps / mu - mu / 2)
    d = np.exp(a) * -np.expm1(np.minimum(b - a, 0.0))
  d = np.where(mu == 0, 0.0, d)
  d = np.where(np.isinf(mu), 1.0, d)
  return np.clip(d, 0.0, 1.0)


def gaussian_epsilon(mu, delta: float) -> np.ndarray:
  """Smallest eps with ``gaussian_delta(mu, eps) <= delta`` (vectorised bisection)."""
  delta = _check_delta(delta)
  mu = np.asarray(mu, dtype=np.float64)
  infinite = np.isinf(mu)  # no noise: eps = inf (set below; searched as mu = 0)
  mu = np.where(infinite, 0.0, mu)
  # log(1 / delta), also where 1 / delta overflows (delta below ~5.6e-309)
  log_inv = math.log(1 / delta) if 1 / delta < math.inf else -math.log(delta)
  with np.errstate(over="ignore"):
    hi = np.maximum(1.0, mu * mu / 2 + mu * math.sqrt(2 * log_inv) + 1.0)
  hi = np.minimum(hi, np.finfo(np.float64).max)
  lo = np.zeros_like(mu)
  zero = gaussian_delta(mu, 0.0) <= delta
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    ok = gaussian_delta(mu, mid) <= delta
    hi = np.where(ok, mid, hi)
    lo = np.where(ok, lo, mid)
    if np.all(hi - lo <= 1e-13 * np.maximum(1.0, hi)):
      break
  out = np.where(zero, 0.0, hi)
  return np.where(infinite, np.inf, out)


def _exact_totals(history: Sequence[Event]):
  """Per-unit ``mu^2`` (Gaussian) and pure epsilon (Laplace) of a history."""
  shape = history_batch_shape(history)
  mu2 = np.zeros(shape)
  pure = np.zeros(shape)
  mechs = set()
  for e in history:
    w = np.broadcast_to(e.count * e.participated, e.batch_shape).astype(np.float64)
    z = np.broadcast_to(e.noise_multiplier, e.batch_shape)
    q = np.broadcast_to(e.q, e.batch_shape)
    if not np.any(w > 0):
      continue
    mechs.add(e.mechanism)
    with np.errstate(divide="ignore", over="ignore"):  # 1 / z, 1 / z^2 may reach inf
      inv = np.where(np.isinf(z), 0.0, 1.0 / z)
      inv2 = inv ** 2
    if e.mechanism == "gaussian":
      if e.is_subsampled and np.any(q[w > 0] < 1):
        raise ValueError(
            "accountant='exact' composes non-subsampled Gaussians only (q = 1); use "
            f"accountant='rdp' (certified) or 'pld' for sampling={e.sampling!r} with q < 1")
      mu2 = mu2 + w * inv2
    else:
      amplify = ((e.sampling == "poisson" and e.relation == "add_remove")
                 or e.sampling == "fixed_size")
      per = np.log1p(q * np.expm1(inv)) if amplify else inv
      pure = pure + w * per
  if len(mechs) > 1:
    raise ValueError("accountant='exact' cannot mix Gaussian and Laplace events; "
                     "use accountant='rdp' or 'pld'")
  return mechs, mu2, pure
