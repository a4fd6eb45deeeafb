"""Accounting events: what one round released about one privacy unit.

:class:`Event` is the accountants' input (:mod:`fedjax_dp.privacy.accounting`); this
module holds it, the checks of its fields, and the argument checks the accountants
share (delta, epsilon, RDP orders, histories).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

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
