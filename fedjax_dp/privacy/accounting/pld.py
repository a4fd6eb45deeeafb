"""The PLD accountant: privacy-loss distributions through the optional ``dp_accounting``
package (imported lazily), a numerical second opinion."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedjax_dp.privacy.accounting.events import Event, history_batch_shape


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
