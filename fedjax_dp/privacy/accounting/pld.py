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


def _pld_single(event: Event, z: float, q: float, dvi: float):
  """dp_accounting PLD of one repetition of ``event`` for one unit."""
  pld = _import_pld()
  s, rel = event.sampling, event.relation
  if s == "fixed_size" and event.fixed_size_method == "wor":
    raise ValueError("accountant='pld' does not support fixed-size sampling without "
                     "replacement (dp_accounting has no PLD for it); use accountant='rdp'")
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
