"""Noise and round-count calibration against the certified accountants.

Epsilon is non-increasing in the noise multiplier and non-decreasing in the
number of rounds, so both are found by a safeguarded root search that always
returns the conservative end of its bracket: ``epsilon(calibrated) <= target``,
within ``eps_tol`` of it. Everything is vectorised over targets (e.g. one target
per client or per sweep point).

* :func:`calibrate` -- generic: any history builder ``x -> history``.
* :func:`calibrate_noise_multiplier` -- constant or geometric schedule
  ``z_t = z_0 r^t`` (Yuan et al.'s amplitude-varying noise is ``r = sqrt(theta)``),
  optionally after an already spent ``prefix`` (Wei et al.'s CRD re-calibration).
* :func:`calibrate_rounds` -- the largest number of rounds within budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedjax_dp.privacy import accounting

_MAX_NOISE = 1e12
_MIN_NOISE = 1e-6


def _as_targets(target_epsilon) -> np.ndarray:
  t = np.asarray(target_epsilon, dtype=np.float64)
  if np.any(~(t > 0)) or np.any(~np.isfinite(t)):
    raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
  return t


def _out(x):
  x = np.asarray(x, dtype=np.float64)
  return float(x) if x.ndim == 0 else x


def solve_decreasing(eps_fn: Callable[[np.ndarray], np.ndarray], target: np.ndarray, *,
                     x0: float = 1.0, eps_tol: float = 1e-5, x_rtol: float = 1e-12,
                     max_iter: int = 200, lower: float = _MIN_NOISE,
                     upper: float = _MAX_NOISE) -> np.ndarray:
  """Smallest ``x`` with ``eps_fn(x) <= target`` for a non-increasing ``eps_fn``.

  Illinois regula falsi on ``log x`` with bisection safeguards. The returned
  ``x`` always satisfies ``eps_fn(x) <= target`` and either
  ``target - eps_fn(x) <= eps_tol`` or the bracket is narrower than ``x_rtol``.
  Elements whose target is unreachable within ``[lower, upper]`` give ``inf``
  (too little noise can never reach it) -- or ``lower`` when even the smallest
  noise is within budget.

  Args:
    eps_fn: ``x [n] -> epsilon [n]``, vectorised.
    target: target epsilons ``[n]`` (or any shape, flattened internally).

  Returns:
    ``x`` with the shape of ``target``.
  """
  shape = target.shape
  tgt = target.reshape(-1).astype(np.float64)
  n = tgt.size

  def x_of(u):
    # exp(log(lower)) may round one ulp below ``lower`` (the libm differs between CPUs),
    # and an eps_fn may refuse anything below it (accountant='pld''s smallest PLD).
    return np.clip(np.exp(u), lower, upper)

  def f(u):
    return np.asarray(eps_fn(x_of(u)), dtype=np.float64).reshape(-1) - tgt

  u_lo_lim, u_hi_lim = math.log(lower), math.log(upper)
  u0 = np.full(n, math.log(x0))
  f0 = f(u0)
  lo = np.where(f0 > 0, u0, -np.inf)
  flo = np.where(f0 > 0, f0, np.nan)
  hi = np.where(f0 <= 0, u0, np.inf)
  fhi = np.where(f0 <= 0, f0, np.nan)
  # Expand the bracket geometrically (in log space, doubling the step).
  step = math.log(2.0)
  for _ in range(80):
    need_up = ~np.isfinite(hi) & (lo < u_hi_lim)
    need_down = ~np.isfinite(lo) & (hi > u_lo_lim)
    active = need_up | need_down
    if not active.any():
      break
    cand = np.where(need_up, np.minimum(lo + step, u_hi_lim), np.maximum(hi - step, u_lo_lim))
    fc = np.full(n, np.nan)
    fc[active] = f(cand)[active]
    within = fc <= 0
    new_hi = active & within
    new_lo = active & ~within
    # Moving up past a failing point keeps it as the new lower end (and vice versa).
    hi = np.where(new_hi, cand, hi)
    fhi = np.where(new_hi, fc, fhi)
    lo = np.where(new_lo, cand, lo)
    flo = np.where(new_lo, fc, flo)
    step *= 2.0
  unreachable = ~np.isfinite(hi)
  free = ~np.isfinite(lo) & np.isfinite(hi)  # even the smallest noise is within budget
  # Illinois weights on the residuals used by the secant step (the true residuals
  # flo/fhi stay untouched: the stopping rule must see the real gap).
  wlo = np.ones(n)
  whi = np.ones(n)
  side = np.zeros(n, dtype=np.int8)  # which end was replaced last: 1 = hi, -1 = lo
  for it in range(max_iter):
    live = np.isfinite(lo) & np.isfinite(hi)
    done = ~live | (-fhi <= eps_tol) | (hi - lo <= x_rtol)
    if np.all(done):
      break
    width = hi - lo
    a_lo, a_hi = flo * wlo, fhi * whi
    use_secant = live & np.isfinite(a_lo) & np.isfinite(a_hi) & (it % 4 != 3)
    with np.errstate(divide="ignore", invalid="ignore"):
      sec = lo + a_lo * width / (a_lo - a_hi)
    mid = lo + 0.5 * width
    u = np.where(use_secant, np.clip(sec, lo + 0.02 * width, hi - 0.02 * width), mid)
    u = np.where(done, hi, u)
    fu = f(u)
    go_hi = ~done & (fu <= 0)
    go_lo = ~done & ~(fu <= 0)
    # Illinois: an end that survives twice in a row gets its residual weight halved.
    wlo = np.where(go_hi & (side == 1), wlo * 0.5, np.where(go_lo, 1.0, wlo))
    whi = np.where(go_lo & (side == -1), whi * 0.5, np.where(go_hi, 1.0, whi))
    hi = np.where(go_hi, u, hi)
    fhi = np.where(go_hi, fu, fhi)
    lo = np.where(go_lo, u, lo)
    flo = np.where(go_lo, fu, flo)
    side = np.where(go_hi, 1, np.where(go_lo, -1, side)).astype(np.int8)
  x = x_of(hi)
  x = np.where(unreachable, np.inf, x)
  x = np.where(free, lower, x)
  return x.reshape(shape)


def calibrate(history_fn: Callable[[np.ndarray], Sequence[accounting.Event]], target_epsilon,
              delta: float, *, accountant: str = "rdp", x0: float = 1.0,
              eps_tol: float = 1e-5, **accountant_options) -> float | np.ndarray:
  """Smallest noise parameter ``x`` with ``epsilon(history_fn(x), delta) <= target``.

  Args:
    history_fn: ``x [n] -> history`` whose batch shape is ``[n]`` (broadcasting
      ``x`` into the events' noise multipliers), with epsilon non-increasing in ``x``.
    target_epsilon: scalar or array ``[n]``.
    delta: target delta.
    accountant: ``"rdp"``, ``"exact"`` or ``"pld"``.
    x0: starting guess.
    eps_tol: absolute tolerance on epsilon (from below).

  Returns:
    A float (scalar target) or an array like ``target_epsilon``.
  """
  tgt = _as_targets(target_epsilon)
  flat = tgt.reshape(-1)

  def eps_fn(x):
    e = accounting.epsilon(history_fn(x), delta, accountant, **accountant_options)
    return np.broadcast_to(np.asarray(e, dtype=np.float64), x.shape)

  return _out(solve_decreasing(eps_fn, flat, x0=x0, eps_tol=eps_tol).reshape(tgt.shape))


def _default_sampling(q, population) -> str:
  if population is not None:
    return "fixed_size"
  return "full" if np.all(np.asarray(q) == 1) else "poisson"


def _event_factory(mechanism, q, sampling, relation, level, population, sample_size,
                   fixed_size_method):
  sampling = sampling or _default_sampling(q, population)
  kw = {"mechanism": mechanism, "sampling": sampling, "relation": relation, "level": level,
        "fixed_size_method": fixed_size_method}
  if sampling == "fixed_size":
    kw.update(population=population, sample_size=sample_size)
    if population is None:
      kw.update(q=q)
  elif sampling not in ("full", "round_robin"):
    kw.update(q=q)
  # Validate once, with a dummy multiplier, so errors name the bad field early.
  accounting.Event(noise_multiplier=1.0, **kw)
  return lambda z, count=1: accounting.Event(noise_multiplier=z, count=count, **kw)


def schedule_multipliers(z0, rounds: int, ratio: float = 1.0) -> np.ndarray:
  """Geometric schedule ``z_t = z0 r^t``, ``t = 0..rounds-1``: ``[*z0.shape, rounds]``."""
  if rounds < 1 or int(rounds) != rounds:
    raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
  if not ratio > 0:
    raise ValueError(f"ratio must be > 0, got {ratio!r}")
  return np.asarray(z0, dtype=np.float64)[..., None] * ratio ** np.arange(int(rounds))


def _prefix_state(prefix, orders):
  if prefix is None:
    return None
  if isinstance(prefix, accounting.RdpState):
    return prefix
  return accounting.history_rdp(list(prefix), orders)


def calibrate_noise_multiplier(target_epsilon, delta: float, rounds: int, *, q=1.0,
                               mechanism: str = "gaussian", sampling: str | None = None,
                               relation: str = "add_remove", level: str = "example",
                               population: int | None = None, sample_size: int | None = None,
                               fixed_size_method: str = "wor", ratio: float = 1.0,
                               prefix=None, accountant: str = "rdp", orders=None,
                               eps_tol: float = 1e-5, pld_discretization: float = 1e-4
                               ) -> float | np.ndarray:
  """Noise multiplier ``z0`` such that ``rounds`` rounds of ``z_t = z0 ratio^t`` spend the target.

  ``ratio = 1`` is a constant schedule. Gaussian ``z`` is std / L2 sensitivity;
  Laplace ``z`` is scale / L1 sensitivity. ``sampling`` defaults to ``"full"``
  for ``q = 1``, ``"poisson"`` for ``q < 1`` and ``"fixed_size"`` when
  ``population`` is given (then ``relation`` must be ``"replace_one"``).

  Args:
    target_epsilon: scalar or array of targets.
    delta: target delta.
    rounds: number of rounds to calibrate for (after the prefix).
    prefix: already spent history (sequence of events, or an ``RdpState`` for
      ``accountant="rdp"``), e.g. Wei et al.'s CRD re-solves the remaining
      rounds' noise from the spent state.
    accountant: ``"rdp"`` (certified, default), ``"exact"`` or ``"pld"``.

  Returns:
    ``z0`` (float or array like ``target_epsilon``); ``inf`` where the prefix
    alone already exceeds the target.
  """
  tgt = _as_targets(target_epsilon)
  make = _event_factory(mechanism, q, sampling, relation, level, population, sample_size,
                        fixed_size_method)
  rounds = int(rounds)
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  flat = tgt.reshape(-1)

  if accountant == "rdp":
    orders_arr = accounting._orders_array(orders)  # pylint: disable=protected-access
    pre = _prefix_state(prefix, orders_arr)
    pre_rdp = 0.0 if pre is None else pre.rdp
    if pre is not None and not np.array_equal(pre.orders, orders_arr):
      raise ValueError("prefix RdpState orders differ from the calibration orders")

    def eps_fn(x):
      if ratio == 1.0:
        curves = accounting.event_rdp(make(x, rounds), orders_arr)  # [n, A]
      else:
        # One event with a [n, rounds] batch: all rounds' curves in one vectorised call.
        curves = accounting.event_rdp(make(schedule_multipliers(x, rounds, ratio)),
                                      orders_arr).sum(axis=-2)
      state = accounting.RdpState(orders_arr, curves + pre_rdp)
      return accounting.rdp_epsilon(state, delta)
  else:
    pre_hist = list(prefix) if prefix is not None else []
    if isinstance(prefix, accounting.RdpState):
      raise ValueError("an RdpState prefix only works with accountant='rdp'")

    def eps_fn(x):
      out = np.empty(x.shape)
      for i, xi in enumerate(x):
        if ratio == 1.0:
          hist = pre_hist + [make(float(xi), rounds)]
        else:
          hist = pre_hist + [make(float(z)) for z in schedule_multipliers(float(xi), rounds, ratio)]
        out[i] = accounting.epsilon(hist, delta, accountant,
                                    pld_discretization=pld_discretization)
      return out

  # The PLD of a smaller multiplier does not fit (accounting.pld_min_multiplier): a
  # target reached only below it gets that multiplier (its epsilon is within the target).
  lower = _MIN_NOISE
  if accountant == "pld":  # (the schedule's last multiplier is z0 ratio^(rounds - 1))
    with np.errstate(over="ignore", under="ignore"):
      last = max(min(1.0, float(ratio) ** (rounds - 1)), 1e-300)
    lower = min(_MAX_NOISE, max(_MIN_NOISE, accounting.pld_min_multiplier(
        mechanism, pld_discretization) / last))
  return _out(solve_decreasing(eps_fn, flat, eps_tol=eps_tol, lower=lower).reshape(tgt.shape))


def calibrate_rounds(noise_multiplier, target_epsilon: float, delta: float, *, q=1.0,
                     mechanism: str = "gaussian", sampling: str | None = None,
                     relation: str = "add_remove", level: str = "example",
                     population: int | None = None, sample_size: int | None = None,
                     fixed_size_method: str = "wor", prefix=None, orders=None,
                     max_rounds: int = 10 ** 9) -> int | np.ndarray:
  """Largest number of rounds ``T`` at a constant noise multiplier within the budget.

  Certified (RDP) epsilon after ``T`` rounds is ``<= target_epsilon``.

  Args:
    noise_multiplier: scalar or array (one answer per element).
    target_epsilon: the budget.
    delta: target delta.
    prefix: already spent history / ``RdpState`` (e.g. Yuan et al.'s online
      refinement asks how many rounds remain).
    max_rounds: cap on the answer.

  Returns:
    ``T`` (int, or int array like ``noise_multiplier``); 0 when not even one round fits.
  """
  tgt = float(_as_targets(target_epsilon))
  accounting._check_delta(delta)  # pylint: disable=protected-access
  make = _event_factory(mechanism, q, sampling, relation, level, population, sample_size,
                        fixed_size_method)
  z = np.asarray(noise_multiplier, dtype=np.float64)
  orders_arr = accounting._orders_array(orders)  # pylint: disable=protected-access
  pre = _prefix_state(prefix, orders_arr)
  per_round = accounting.event_rdp(make(z.reshape(-1)), orders_arr)  # [n, A]
  base = np.zeros_like(per_round) if pre is None else np.broadcast_to(pre.rdp, per_round.shape)

  def eps_at(t):
    st = accounting.RdpState(orders_arr, base + t[:, None] * per_round)
    return accounting.rdp_epsilon(st, delta)

  n = per_round.shape[0]
  lo = np.zeros(n, dtype=np.int64)  # eps(lo) <= target (lo = 0 checked below)
  ok0 = eps_at(np.zeros(n)) <= tgt
  hi = np.ones(n, dtype=np.int64)
  # Exponential search for the first failing T.
  while True:
    fails = eps_at(hi.astype(np.float64)) > tgt
    grow = ~fails & (hi < max_rounds)
    if not grow.any():
      break
    lo = np.where(grow, hi, lo)
    hi = np.where(grow, np.minimum(hi * 2, max_rounds), hi)
  capped = ~(eps_at(hi.astype(np.float64)) > tgt)  # still fine at max_rounds
  while np.any(hi - lo > 1):
    mid = (lo + hi) // 2
    fails = eps_at(mid.astype(np.float64)) > tgt
    lo = np.where(~fails & (hi - lo > 1), mid, lo)
    hi = np.where(fails & (hi - lo > 1), mid, hi)
  out = np.where(capped, hi, lo)
  out = np.where(ok0, out, 0)
  return int(out[0]) if z.ndim == 0 else out.reshape(z.shape)
