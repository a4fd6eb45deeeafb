"""The RDP accountant: an event's curve, the composed state, and its conversion.

:func:`event_rdp` turns an :class:`~fedjax_dp.privacy.accounting.events.Event` into its
RDP curve (memoised per ``(q, z)``, since per-round sigmas repeat across clients and
rounds); :class:`RdpState` accumulates curves round by round (pure functions), and
:func:`rdp_epsilon` / :func:`rdp_delta` convert with the tight bound of Canonne,
Kamath & Steinke 2020 (Prop. 12), as dp_accounting 0.6.0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from fedjax_dp.privacy.accounting.events import (
  Event,
  _check_delta,
  _check_epsilon,
  _check_history,
  _orders_array,
  history_batch_shape,
)
from fedjax_dp.privacy.accounting.rdp_curves import (
  _gaussian_rdp,
  _laplace_rdp,
  _pure_to_rdp,
  _selection_rdp,
  _sgm_rdp,
)
from fedjax_dp.privacy.accounting.replace_one import _replace_sgm_rdp, _wor_rdp

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
