"""Privacy accountants as pure functions over event histories.

A run's privacy history is a sequence of :class:`Event` s. Each event describes
what ONE round released about ONE privacy unit (a client, or an example inside a
client): the mechanism and its noise multiplier, how the unit was sampled, and the
neighbouring relation. ``noise_multiplier``, ``q``, ``participated`` and ``count``
may be numpy arrays; they broadcast to a batch shape (clients, sweep points, ...)
and every accountant is vectorised over it.

Accountants (``accountant=`` argument of :func:`epsilon` and :func:`delta`):

* ``"rdp"`` (default, certified): Renyi DP summed over rounds (Mironov 2017) and
  converted with the tight bound of Canonne, Kamath & Steinke 2020 (Prop. 12 of
  arXiv:2004.00010; Balle et al. 2020), identical to ``dp_accounting`` 0.6.0.
  Per-round RDP:

  - Gaussian, no sampling: ``alpha / (2 z^2)``.
  - Poisson-subsampled Gaussian, add/remove (Mironov, Talwar & Zhang 2019,
    arXiv:1908.10530): exact binomial sum at integer orders, the two-sided
    series of their Sec. 3.3 at fractional orders.
  - ``"selection"`` (see below): ``log(1 - q + q exp((alpha-1) eps_M(alpha))) / (alpha-1)``.
  - Fixed-size sampling without replacement under replace-one: the bound of
    Wang, Balle & Kasiviswanathan 2019 (Thm. 27 of arXiv:1808.00087), as in
    ``dp_accounting``.
  - Laplace: the exact Laplace RDP (Mironov 2017, Prop. 6); subsampled Laplace
    uses the amplified pure epsilon with the tight pure-DP -> RDP conversion.
* ``"exact"``: tight closed forms where they exist. Non-subsampled Gaussians
  compose exactly (the rounds' ``z^-2`` add up: one Gaussian with
  ``mu^2 = sum z^-2``), converted with the analytic Gaussian mechanism (Balle &
  Wang 2018, Thm. 8). Laplace composes as pure epsilon (basic composition of the
  per-round, possibly amplified, epsilons); its delta is 0.
* ``"pld"``: privacy-loss distributions through the optional ``dp_accounting``
  package (imported lazily), a numerical second opinion.

Sampling kinds (``Event.sampling``):

* ``"full"``: every unit releases every round (q = 1).
* ``"round_robin"``: deterministic participation; ``participated`` says which
  units released in this round (others are charged nothing).
* ``"poisson"``: each unit is included independently with probability ``q``,
  and the random draw is secret. Under add/remove this is the classic
  subsampled Gaussian; under replace-one we charge the (valid, revealed-membership)
  ``"selection"`` bound instead, unless the event says that the release is a noised
  sum of per-unit terms (``sum_of_terms``, the DP-SGD step): then the tight pair of
  the replace-one Poisson-subsampled Gaussian is charged (:func:`_replace_sgm_rdp`).
* ``"fixed_size"``: exactly ``K = sample_size`` of ``U = population`` units,
  uniformly without replacement. Accounted under replace-one only, with the WBK19
  bound (default ``fixed_size_method="wor"``). ``"poisson_reduction"`` is the
  convention of jax_privacy (analyse as Poisson with rate K/U, with the noise
  multiplier measured against the replace-one sensitivity, i.e. twice the
  add/remove one for clipped sums); it is a heuristic, not a proven bound, and is
  never applied silently.
* ``"selection"``: client selection with example-level adjacency. Client ``i``
  is chosen with marginal probability ``q`` (e.g. ``K`` of ``U`` drawn uniformly
  each round, independently of the data); the neighbouring datasets differ in one
  example inside client ``i`` (add/remove or replace-one; the noise multiplier is
  measured against that relation's sensitivity, e.g. Wei et al.'s
  ``Delta_l = 2 eta C / |D_i|`` for replace-one). The server sees whether client
  ``i`` uploaded, so the per-round pair of output distributions is
  ``P = (1-q) bot + q M(D)``, ``P' = (1-q) bot + q M(D')`` with ``bot`` disjoint
  from the mechanism's outputs, and its Renyi divergence is exactly
  ``log(1 - q + q exp((alpha-1) eps_M(alpha))) / (alpha-1)``. Revealing the
  selection only adds information, so this also bounds the case where it is
  secret, and it holds whatever the joint law of the other clients' selection
  (fixed-size K-of-U included). It is NOT the Poisson subsampled Gaussian: the
  adjacent datasets both contain the differing example's client, so selection
  does not hide *whether* the example exists.

Never account a fixed-size (or any other) scheme as Poisson unless the event
says so: the sampling kind is part of the event, and combinations without a
valid analysis raise ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import special

MECHANISMS = ("gaussian", "laplace")
SAMPLINGS = ("full", "round_robin", "poisson", "fixed_size", "selection")
RELATIONS = ("add_remove", "replace_one")
LEVELS = ("example", "client")
FIXED_SIZE_METHODS = ("wor", "poisson_reduction")
ACCOUNTANTS = ("rdp", "pld", "exact")

# The orders of dp_accounting 0.6.0 (``DEFAULT_RDP_ORDERS``): fractional orders
# matter when epsilon is large, the big ones when epsilon is small.
DEFAULT_ORDERS = np.array(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024],
    dtype=np.float64)
DEFAULT_ORDERS.setflags(write=False)

# Iteration cap of the fractional-order series; the neglected tail is bounded.
_MAX_STEPS_LOG_A_FRAC_FAST = 200
# Above this integer order the WBK19 bound uses its O(alpha) simplification.
_WOR_MAX_EXACT_ORDER = 256
# Rows x terms per chunk of the vectorised binomial sums (bounds memory).
_CHUNK_ELEMENTS = 1 << 22


# ----------------------------------------------------------------------------
# Events
# ----------------------------------------------------------------------------


def _frozen_array(name: str, value: Any, dtype=np.float64) -> np.ndarray:
  try:
    arr = np.array(value, dtype=dtype)
  except (TypeError, ValueError) as err:
    raise ValueError(f"Event.{name}: expected a number or an array of numbers, "
                     f"got {value!r}") from err
  arr.setflags(write=False)
  return arr


@dataclasses.dataclass(frozen=True, eq=False)
class Event:
  """What one round released about one privacy unit (immutable).

  Array-valued fields broadcast together to the event's ``batch_shape`` (e.g.
  ``[U]`` clients, or ``[S, U]`` sweep points x clients), so one event describes
  a round for every client at once; sigma may differ per client and per round.

  Attributes:
    mechanism: ``"gaussian"`` or ``"laplace"``.
    noise_multiplier: Gaussian: noise std / L2 sensitivity (``z``). Laplace:
      scale ``b`` / L1 sensitivity (the round is ``1/z``-DP). The sensitivity is
      the one of ``relation`` (replace-one sensitivities are typically twice the
      add/remove ones). ``inf`` means nothing was released. Array ``[*batch]``.
    sampling: one of ``SAMPLINGS`` (see the module docstring).
    q: inclusion probability of the unit in this round: the Poisson rate, the
      client-selection probability (``K/U``) for ``"selection"``, or ``K/U`` for
      ``"fixed_size"`` (derived from ``population``/``sample_size`` when given).
      Must be 1 (or omitted) for ``"full"``/``"round_robin"``. Array ``[*batch]``.
    relation: ``"add_remove"`` or ``"replace_one"`` (of one unit).
    level: ``"example"`` (one record inside a client) or ``"client"`` (a whole
      client). ``"selection"`` requires ``"example"``.
    participated: bool ``[*batch]``; False means the unit released nothing this
      round, known in advance or revealed (round-robin turns, deterministic top-K
      selection). Never pass the realised outcome of the random draw that
      ``sampling``/``q`` already accounts for: that double counts the
      amplification and under-reports epsilon.
    population: ``U`` (or ``N``) for ``"fixed_size"``.
    sample_size: ``K`` (or the batch size) for ``"fixed_size"``.
    fixed_size_method: ``"wor"`` (WBK19, default) or ``"poisson_reduction"``.
    count: how many identical repetitions this event stands for (e.g. local
      steps, or rounds of a constant schedule); int or int array ``[*batch]``.
    sum_of_terms: the release is a noised sum over the sampled units of terms of
      norm at most half the relation's sensitivity (per-example clipped gradients:
      norm C, replace-one sensitivity 2 C). Only read by Gaussian
      ``sampling='poisson'`` under ``relation='replace_one'``, where it allows the
      tight replace-one amplification (:func:`_replace_sgm_rdp`) instead of the
      revealed-membership bound that holds for any mechanism.
  """

  mechanism: str = "gaussian"
  noise_multiplier: Any = 1.0
  sampling: str = "full"
  q: Any = None
  relation: str = "add_remove"
  level: str = "example"
  participated: Any = True
  population: int | None = None
  sample_size: int | None = None
  fixed_size_method: str = "wor"
  count: Any = 1
  sum_of_terms: bool = False

  def __post_init__(self):
    for name, choices in (("mechanism", MECHANISMS), ("sampling", SAMPLINGS),
                          ("relation", RELATIONS), ("level", LEVELS),
                          ("fixed_size_method", FIXED_SIZE_METHODS)):
      if getattr(self, name) not in choices:
        raise ValueError(f"Event.{name} must be one of {choices}, got "
                         f"{getattr(self, name)!r}")
    z = _frozen_array("noise_multiplier", self.noise_multiplier)
    if z.size and (np.any(np.isnan(z)) or np.any(z <= 0)):
      raise ValueError("Event.noise_multiplier must be > 0 (sigma <= 0 gives no privacy; "
                       f"use inf for 'no release'); got min {np.nanmin(z) if z.size else z}")
    q = _event_q(self)
    qa = _frozen_array("q", q)
    if qa.size and (np.any(np.isnan(qa)) or np.any(qa <= 0) or np.any(qa > 1)):
      raise ValueError(f"Event.q must be in (0, 1], got {q}")
    if self.sampling == "selection" and self.level != "example":
      raise ValueError("Event: sampling='selection' models client selection with "
                       "example-level adjacency; use level='example' (for client-level DP "
                       "use sampling='poisson' or 'fixed_size')")
    part = _frozen_array("participated", self.participated, dtype=bool)
    count = _event_count(self.count)
    try:
      np.broadcast_shapes(z.shape, qa.shape, part.shape, count.shape)
    except ValueError as err:
      raise ValueError("Event: noise_multiplier, q, participated and count must broadcast "
                       f"together; got shapes {z.shape}, {qa.shape}, {part.shape}, "
                       f"{count.shape}") from err
    object.__setattr__(self, "noise_multiplier", z)
    object.__setattr__(self, "q", qa)
    object.__setattr__(self, "participated", part)
    object.__setattr__(self, "count", count)

  @property
  def batch_shape(self) -> tuple[int, ...]:
    """The broadcast shape of the array-valued fields."""
    return np.broadcast_shapes(self.noise_multiplier.shape, self.q.shape,
                               self.participated.shape, self.count.shape)

  def replace(self, **changes) -> Event:
    """Returns a copy with ``changes`` applied (re-validated)."""
    return dataclasses.replace(self, **changes)

  @property
  def is_subsampled(self) -> bool:
    """True when some unit's inclusion in the round is random (q < 1)."""
    return self.sampling in ("poisson", "fixed_size", "selection") and bool(np.any(self.q < 1))


def _fixed_size_q(event: Event) -> Any:
  """``q`` of a ``'fixed_size'`` event: ``K / U`` from its sizes (which must agree with a
  given ``q``), or the given ``q``; refused outside replace-one."""
  q = event.q
  if (event.population is None) != (event.sample_size is None):
    raise ValueError("Event.population and Event.sample_size must be given together")
  if event.population is not None:
    u, k = event.population, event.sample_size
    if int(u) != u or int(k) != k or not 1 <= k <= u:
      raise ValueError("Event.sample_size/population must be integers with "
                       f"1 <= sample_size <= population, got {k}/{u}")
    q_sizes = k / u
    if q is not None and not np.allclose(q, q_sizes, rtol=1e-12, atol=0):
      raise ValueError(f"Event.q={q} disagrees with sample_size/population={q_sizes}")
    q = q_sizes
  elif q is None:
    raise ValueError("Event: sampling='fixed_size' needs population and sample_size "
                     "(or q = K/U)")
  if event.relation != "replace_one":
    raise ValueError(
        "Event: sampling='fixed_size' is accounted only under relation='replace_one' "
        "(the population size stays public); express noise_multiplier against the "
        "replace-one sensitivity (twice the add/remove one for clipped sums)")
  return q


def _event_q(event: Event) -> Any:
  """The event's inclusion probability as given or implied by its sampling (unchecked
  range); refuses fields that do not belong to the sampling."""
  if event.sampling == "fixed_size":
    return _fixed_size_q(event)
  q = event.q
  if event.population is not None or event.sample_size is not None:
    raise ValueError("Event.population/sample_size are only used with sampling='fixed_size'")
  if event.sampling in ("poisson", "selection"):
    if q is None:
      raise ValueError(f"Event.q is required for sampling={event.sampling!r}")
    return q
  if q is None:  # full, round_robin
    return 1.0
  if np.any(np.asarray(q) != 1):
    raise ValueError(
        f"Event.q must be 1 for sampling={event.sampling!r} (participation is "
        "deterministic); use sampling='poisson'/'selection'/'fixed_size' for random "
        "sampling, or 'participated' for round-robin turns")
  return q


def _event_count(value: Any) -> np.ndarray:
  """``Event.count`` as a read-only int64 array (integral floats accepted)."""
  count = np.array(value)
  integral_floats = (count.dtype.kind == "f" and np.all(np.isfinite(count))
                     and np.all(count == np.round(count)))
  if count.dtype.kind not in "iub" and not integral_floats:
    raise ValueError(f"Event.count must be a non-negative integer (array), got {value!r}")
  count = count.astype(np.int64)
  if np.any(count < 0):
    raise ValueError(f"Event.count must be >= 0, got {value!r}")
  count.setflags(write=False)
  return count


def history_batch_shape(history: Sequence[Event]) -> tuple[int, ...]:
  """Broadcast batch shape of all events of ``history``."""
  _check_history(history)
  return np.broadcast_shapes(*(e.batch_shape for e in history)) if history else ()


def _check_history(history):
  if isinstance(history, Event):
    raise ValueError(  # noqa: TRY004  (the API reports every bad argument as ValueError)
        "history must be a sequence of Event, got a single Event (wrap it in [...])")
  for e in history:
    if not isinstance(e, Event):
      raise ValueError(  # noqa: TRY004
          f"history must contain Event objects, got {type(e).__name__}")


def _check_delta(delta, allow_zero=False):
  d = np.asarray(delta, dtype=np.float64)
  lo_ok = (d >= 0) if allow_zero else (d > 0)
  if d.ndim or not (lo_ok and d < 1):
    interval = "[0, 1)" if allow_zero else "(0, 1)"
    raise ValueError(f"delta must be a number in {interval}, got {delta!r}")
  return float(d)


def _check_epsilon(eps):
  e = np.asarray(eps, dtype=np.float64)
  if e.ndim or not e >= 0 or not np.isfinite(e):
    raise ValueError(f"epsilon must be a finite number >= 0, got {eps!r}")
  return float(e)


def _orders_array(orders) -> np.ndarray:
  if orders is None:
    return DEFAULT_ORDERS
  o = np.array(orders, dtype=np.float64).reshape(-1)
  if o.size == 0 or np.any(np.isnan(o)) or np.any(o <= 1):
    raise ValueError(f"orders must be a non-empty list of numbers > 1, got {orders!r}")
  o.setflags(write=False)
  return o


# ----------------------------------------------------------------------------
# RDP of single mechanisms (vectorised: rows are parameter pairs, columns orders)
# ----------------------------------------------------------------------------


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


# Memo of the expensive curves, keyed by (kind, orders, q, z): per-round sigmas
# repeat across clients and rounds, so most rounds cost a dictionary lookup.
_CURVE_CACHE: dict[tuple, np.ndarray] = {}
_CURVE_CACHE_MAX = 100_000


@functools.lru_cache(maxsize=16)
def _orders_key(orders_bytes: bytes) -> int:
  return hash(orders_bytes)


def _cached_curves(kind: str, fn, q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """``fn(q_u, z_u, orders)`` for the unique ``(q, z)`` pairs, memoised. ``[n]`` -> ``[n, A]``."""
  okey = _orders_key(orders.tobytes())
  pairs = np.stack([q, z], axis=1)
  uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
  rows = np.empty((uniq.shape[0], orders.size))
  missing = []
  for i, (qq, zz) in enumerate(uniq):
    hit = _CURVE_CACHE.get((kind, okey, qq, zz))
    if hit is None:
      missing.append(i)
    else:
      rows[i] = hit
  if missing:
    miss = np.array(missing)
    vals = fn(uniq[miss, 0], uniq[miss, 1], orders)
    rows[miss] = vals
    if len(_CURVE_CACHE) + len(missing) > _CURVE_CACHE_MAX:
      _CURVE_CACHE.clear()
    for i, row in zip(missing, vals):
      row = row.copy()
      row.setflags(write=False)
      _CURVE_CACHE[(kind, okey, uniq[i, 0], uniq[i, 1])] = row
  return rows[inverse.reshape(-1)]


def _event_curves(event: Event, q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
  """Per-repetition RDP of ``event`` for parameter rows ``q, z [n]`` -> ``[n, A]``."""
  s, rel = event.sampling, event.relation
  if event.mechanism == "gaussian":
    if s in ("full", "round_robin"):
      return _gaussian_rdp(z, orders)
    if (s == "poisson" and rel == "add_remove") or (
        s == "fixed_size" and event.fixed_size_method == "poisson_reduction"):
      return _cached_curves("sgm", _sgm_rdp, q, z, orders)
    if s == "poisson" and event.sum_of_terms:  # replace_one: the tight pair
      return _cached_curves("sgm_replace", _replace_sgm_rdp, q, z, orders)
    if s in ("poisson", "selection"):  # poisson + replace_one: revealed-membership bound
      return _selection_rdp(q, _gaussian_rdp(z, orders), orders)
    return _cached_curves("wor", _wor_rdp, q, z, orders)  # fixed_size, WBK19
  with np.errstate(divide="ignore"):
    eps = np.where(np.isinf(z), 0.0, 1.0 / z)
  base = _laplace_rdp(eps, orders)
  if s in ("full", "round_robin"):
    return base
  if s in ("poisson", "selection") and not (s == "poisson" and rel == "add_remove"):
    return _selection_rdp(q, base, orders)
  # Poisson (add/remove) and fixed-size (replace-one, Balle et al. 2018 Thm. 9)
  # both amplify pure epsilon to log(1 + q (e^eps - 1)).
  amplified = np.log1p(q * np.expm1(eps))
  return np.minimum(base, _pure_to_rdp(amplified, orders))


def event_rdp(event: Event, orders=None) -> np.ndarray:
  """RDP curve of all ``count`` repetitions of ``event``.

  Args:
    event: the event.
    orders: RDP orders ``[A]`` (default ``DEFAULT_ORDERS``).

  Returns:
    ``[*event.batch_shape, A]``; zero where ``participated`` is False.
  """
  orders = _orders_array(orders)
  shape = event.batch_shape
  z = np.broadcast_to(event.noise_multiplier, shape).reshape(-1)
  q = np.broadcast_to(event.q, shape).reshape(-1)
  weight = (np.broadcast_to(event.count, shape) * np.broadcast_to(event.participated, shape))
  weight = weight.reshape(-1).astype(np.float64)
  curves = np.zeros((z.size, orders.size))
  live = weight > 0
  if live.any():
    # Extreme multipliers (z^2 overflowing, 1 / z^2 overflowing) reach inf and nan in
    # the bounds' intermediate terms; an RDP value that is nan is unknown, and inf
    # (no bound at that order) is the conservative value for it.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
      live_curves = _event_curves(event, q[live], z[live], orders) * weight[live, None]
    curves[live] = np.where(np.isnan(live_curves), np.inf, live_curves)
  return curves.reshape(*shape, orders.size)


# ----------------------------------------------------------------------------
# RDP state (incremental, pure-functional) and conversion
# ----------------------------------------------------------------------------


class RdpState(NamedTuple):
  """Accumulated RDP of a batch of privacy units.

  Attributes:
    orders: RDP orders ``[A]``.
    rdp: accumulated RDP ``[*batch, A]``.
  """

  orders: np.ndarray
  rdp: np.ndarray

  @property
  def batch_shape(self) -> tuple[int, ...]:
    return self.rdp.shape[:-1]


def rdp_init(batch_shape=(), orders=None) -> RdpState:
  """Zero RDP for ``batch_shape`` units at ``orders`` (default ``DEFAULT_ORDERS``)."""
  orders = _orders_array(orders)
  return RdpState(orders, np.zeros((*tuple(batch_shape), orders.size)))


def rdp_compose(state: RdpState, event: Event) -> RdpState:
  """Adds ``event``'s RDP to ``state`` (returns a new state).

  Args:
    state: current state, ``rdp [*batch, A]``.
    event: the round's event; its arrays must broadcast to ``batch``.

  Returns:
    The new state (same orders and batch shape).
  """
  if not isinstance(event, Event):
    raise ValueError(f"rdp_compose expects an Event, got {type(event).__name__}")  # noqa: TRY004
  batch = state.batch_shape
  try:
    if np.broadcast_shapes(event.batch_shape, batch) != batch:
      raise ValueError
  except ValueError:
    raise ValueError(f"Event batch shape {event.batch_shape} does not broadcast to the "
                     f"state's batch shape {batch}") from None
  return RdpState(state.orders, state.rdp + event_rdp(event, state.orders))


def _eps_from_rdp(orders: np.ndarray, rdp: np.ndarray, delta: float):
  """Tight RDP -> (eps, delta) conversion, vectorised. Returns ``(eps, order)``.

  ``eps = min_a [rdp(a) + log1p(-1/a) - (log delta + log a) / (a - 1)]``
  (Canonne, Kamath & Steinke 2020, Prop. 12; Balle et al. 2020), with
  dp_accounting's safeguards: orders <= 1.01 are skipped, and ``eps = 0`` when
  ``delta^2 + expm1(-rdp) > 0`` (KL / Pinsker-type bound).
  """
  a = orders
  with np.errstate(divide="ignore", invalid="ignore"):
    shift = np.where(a > 1.01, np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1),
                     np.inf)
  eps = rdp + shift  # [*batch, A]; inf + finite stays inf
  # delta^2 + expm1(-rdp) > 0  <=>  rdp < -log1p(-delta^2): then (0, delta)-DP.
  trivially_zero = np.any(rdp < -math.log1p(-delta * delta), axis=-1)
  idx = np.argmin(eps, axis=-1)
  best = np.take_along_axis(eps, idx[..., None], axis=-1)[..., 0]
  best = np.where(trivially_zero, 0.0, np.maximum(best, 0.0))
  return best, orders[idx]


def _delta_from_rdp(orders: np.ndarray, rdp: np.ndarray, epsilon: float):
  """Tight RDP -> delta for a given epsilon (dp_accounting's ``compute_delta``)."""
  a = orders
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    kl = np.where(rdp <= 0, -np.inf, 0.5 * np.log1p(-np.exp(-rdp)))
    bound = (a - 1) * (rdp - epsilon + np.log1p(-1.0 / a)) - np.log(a)
  logd = np.where(a > 1.01, np.minimum(kl, bound), kl)
  logd = np.where(np.isnan(logd), 0.0, logd)
  idx = np.argmin(logd, axis=-1)
  best = np.take_along_axis(logd, idx[..., None], axis=-1)[..., 0]
  return np.minimum(np.exp(best), 1.0), orders[idx]


def rdp_epsilon(state: RdpState, delta: float) -> np.ndarray:
  """Certified epsilon ``[*batch]`` at ``delta`` (tight conversion)."""
  return _eps_from_rdp(state.orders, state.rdp, _check_delta(delta))[0]


def rdp_epsilon_and_order(state: RdpState, delta: float) -> tuple[np.ndarray, np.ndarray]:
  """``(epsilon [*batch], optimal order [*batch])`` at ``delta``."""
  return _eps_from_rdp(state.orders, state.rdp, _check_delta(delta))


def rdp_delta(state: RdpState, epsilon: float) -> np.ndarray:
  """Certified delta ``[*batch]`` at ``epsilon``."""
  return _delta_from_rdp(state.orders, state.rdp, _check_epsilon(epsilon))[0]


def history_rdp(history: Sequence[Event], orders=None, batch_shape=None) -> RdpState:
  """Composes a whole history into an :class:`RdpState`."""
  _check_history(history)
  shape = history_batch_shape(history) if batch_shape is None else tuple(batch_shape)
  state = rdp_init(shape, orders)
  for e in history:
    state = rdp_compose(state, e)
  return state


# ----------------------------------------------------------------------------
# Exact accountant: analytic Gaussian and pure-epsilon Laplace
# ----------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------
# PLD accountant (optional dp_accounting)
# ----------------------------------------------------------------------------


def _import_pld():
  try:
    # pylint: disable-next=import-outside-toplevel
    from dp_accounting.pld import privacy_loss_distribution
  except ImportError as err:  # pragma: no cover - exercised only without the package
    raise ImportError("accountant='pld' needs the optional package dp-accounting "
                      "(pip install 'fedjax_dp[pld]')") from err
  return privacy_loss_distribution


# dp_accounting's PLD of one mechanism spans its privacy losses at a spacing of the
# discretization dvi: a Gaussian's (x - 1/2) / z^2 over its +-10.25 z truncation is
# (20.5 / z + 1 / z^2) / dvi points (measured: 204,911 at z = 1, dvi = 1e-4), a
# Laplace's within +-1 / z is 2 / (z dvi); the cost of building and composing one
# grows faster than that (seconds per million points on one core, minutes for ten), and
# it squares z in Python floats (OverflowError above z ~ 1e154).
PLD_MAX_POINTS = 1_000_000
# More noise is a post-processing of less (Blackwell): the PLD of a larger multiplier
# is bounded by that of a smaller one, so larger ones are accounted at this one.
_PLD_MAX_MULTIPLIER = 1e100


def pld_points(mechanism: str, z: float, pld_discretization: float) -> float:
  """About how many points dp_accounting's PLD of one mechanism of multiplier ``z`` has."""
  with np.errstate(over="ignore", divide="ignore"):
    span = 2.0 / z if mechanism == "laplace" else 20.5 / z + 1.0 / np.float64(z) ** 2
  return float(span / pld_discretization)


def pld_min_multiplier(mechanism: str, pld_discretization: float) -> float:
  """The smallest noise multiplier whose PLD stays within :data:`PLD_MAX_POINTS`."""
  budget = PLD_MAX_POINTS * pld_discretization
  if mechanism == "laplace":
    return 2.0 / budget
  return (20.5 + math.sqrt(20.5 ** 2 + 4.0 * budget)) / (2.0 * budget)


def _pld_single(event: Event, z: float, q: float, dvi: float):
  """dp_accounting PLD of one repetition of ``event`` for one unit.

  Raises:
    ValueError: a sampling dp_accounting has no PLD for, or a multiplier below
      :func:`pld_min_multiplier` (its PLD would not fit in time and memory).
  """
  pld = _import_pld()
  s, rel = event.sampling, event.relation
  if s == "fixed_size" and event.fixed_size_method == "wor":
    raise ValueError("accountant='pld' does not support fixed-size sampling without "
                     "replacement (dp_accounting has no PLD for it); use accountant='rdp'")
  if z < pld_min_multiplier(event.mechanism, dvi):
    raise ValueError(
        f"accountant='pld': noise multiplier {z:.4g} at value discretization {dvi:g} needs a "
        f"privacy loss distribution of ~{pld_points(event.mechanism, z, dvi):.2g} points (at "
        f"most {PLD_MAX_POINTS:g}); use accountant='rdp', or a coarser discretization")
  z = min(z, _PLD_MAX_MULTIPLIER)
  if event.mechanism == "gaussian":
    base = lambda p: pld.from_gaussian_mechanism(
        z, value_discretization_interval=dvi, sampling_prob=p)
  else:
    base = lambda p: pld.from_laplace_mechanism(
        z, value_discretization_interval=dvi, sampling_prob=p)
  if s in ("full", "round_robin") or q >= 1:
    return base(1.0)
  if s == "fixed_size" or (s == "poisson" and rel == "add_remove"):
    return base(q)
  if s == "poisson" and event.sum_of_terms and event.mechanism == "gaussian":
    # dp_accounting's REPLACE pair in units of one term (C): std 2 z, shifts +-1.
    from dp_accounting import NeighboringRelation  # pylint: disable=import-outside-toplevel
    return pld.from_gaussian_mechanism(2.0 * z, value_discretization_interval=dvi,
                                       sampling_prob=q,
                                       neighboring_relation=NeighboringRelation.REPLACE_ONE)
  # selection (and Poisson under replace-one): the privacy loss is 0 on the
  # disjoint "not selected" outcome, so the PLD is the q-mixture with the identity.
  return base(1.0).compute_mixture(pld.identity(dvi), q)


def _pld_plan(history: Sequence[Event], shape: tuple) -> list:
  """Per event: its parameters broadcast to the history's batch ``shape``."""
  plan = []
  for e in history:
    w = np.broadcast_to(e.count * e.participated, e.batch_shape)
    plan.append((e, np.broadcast_to(w, shape), np.broadcast_to(e.noise_multiplier, shape),
                 np.broadcast_to(e.q, shape)))
  return plan


def _pld_signature(plan: list, index: tuple) -> tuple:
  """What unit ``index`` released: runs of identical repetitions (event, z, q, count)."""
  parts = []
  for i, (e, w, z, q) in enumerate(plan):
    wi, zi, qi = int(w[index]), float(z[index]), float(q[index])
    if wi == 0 or math.isinf(zi):
      continue
    if parts and parts[-1][:3] == (i, zi, qi):
      parts[-1] = (i, zi, qi, parts[-1][3] + wi)
    else:
      parts.append((i, zi, qi, wi))
  return tuple(parts)


def _pld_from_signature(plan: list, signature: tuple, dvi: float, cache: dict):
  """Composed dp_accounting PLD of one unit (None if nothing was released)."""
  total = None
  for i, z, q, w in signature:
    e = plan[i][0]
    key = (e.mechanism, e.sampling, e.relation, e.fixed_size_method, e.sum_of_terms, z, q, w)
    p = cache.get(key)
    if p is None:
      p = _pld_single(e, z, q, dvi)
      if w > 1:
        p = p.self_compose(w)
      cache[key] = p
    total = p if total is None else total.compose(p)
  return total


def _pld_map(history: Sequence[Event], dvi: float, fn) -> np.ndarray:
  """Applies ``fn(pld or None)`` to every unit's composed PLD, sharing equal histories."""
  shape = history_batch_shape(history)
  plan = _pld_plan(history, shape)
  out = np.zeros(shape)
  cache: dict = {}
  memo: dict = {}
  for index in np.ndindex(*shape):
    sig = _pld_signature(plan, index)
    if sig not in memo:
      memo[sig] = fn(_pld_from_signature(plan, sig, dvi, cache))
    out[index] = memo[sig]
  return out


# ----------------------------------------------------------------------------
# Public accountant API
# ----------------------------------------------------------------------------


def _finish(x) -> float | np.ndarray:
  x = np.asarray(x, dtype=np.float64)
  return float(x) if x.ndim == 0 else x


def epsilon(history: Sequence[Event], delta: float, accountant: str = "rdp", *,
            orders=None, pld_discretization: float = 1e-4) -> float | np.ndarray:
  """Epsilon spent by ``history`` at ``delta``.

  Args:
    history: sequence of :class:`Event`; arrays broadcast to a common batch shape.
    delta: target delta in (0, 1) (``accountant='exact'`` also accepts 0 for
      pure-DP Laplace histories).
    accountant: ``"rdp"`` (certified, default), ``"exact"`` (analytic Gaussian /
      pure Laplace, when applicable) or ``"pld"`` (dp_accounting, optional).
    orders: RDP orders (``"rdp"`` only; default ``DEFAULT_ORDERS``).
    pld_discretization: value discretization interval of the PLDs.

  Returns:
    A float for scalar histories, else an array ``[*batch]``.
  """
  _check_history(history)
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
  if accountant == "rdp":
    return _finish(rdp_epsilon(history_rdp(history, orders), delta))
  if accountant == "exact":
    delta = _check_delta(delta, allow_zero=True)
    mechs, mu2, pure = _exact_totals(history)
    if "laplace" in mechs:
      return _finish(pure)
    if delta == 0:
      return _finish(np.where(mu2 > 0, np.inf, 0.0))
    return _finish(gaussian_epsilon(np.sqrt(mu2), delta))
  delta = _check_delta(delta)
  return _finish(_pld_map(history, pld_discretization,
                          lambda p: 0.0 if p is None else p.get_epsilon_for_delta(delta)))


# pylint: disable-next=redefined-outer-name
def delta(history: Sequence[Event], epsilon: float, accountant: str = "rdp", *,
          orders=None, pld_discretization: float = 1e-4) -> float | np.ndarray:
  """Delta of ``history`` at ``epsilon`` (see :func:`epsilon` for the arguments)."""
  _check_history(history)
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
  eps = _check_epsilon(epsilon)
  if accountant == "rdp":
    return _finish(rdp_delta(history_rdp(history, orders), eps))
  if accountant == "exact":
    mechs, mu2, pure = _exact_totals(history)
    if "laplace" in mechs:
      # Basic composition certifies (sum eps, 0) and nothing below that sum.
      return _finish(np.where(pure <= eps + 1e-12, 0.0, 1.0))
    return _finish(gaussian_delta(np.sqrt(mu2), eps))
  return _finish(_pld_map(history, pld_discretization,
                          lambda p: 0.0 if p is None else p.get_delta_for_epsilon(eps)))


def supports(event: Event, accountant: str) -> bool:
  """Whether ``accountant`` can account ``event`` (RDP always can)."""
  if accountant == "rdp":
    return True
  if accountant == "exact":
    return event.mechanism == "laplace" or not event.is_subsampled
  if accountant == "pld":
    return not (event.sampling == "fixed_size" and event.fixed_size_method == "wor")
  raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
