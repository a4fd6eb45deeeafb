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

One concept a module: :mod:`.events` (the :class:`Event` and its checks),
:mod:`.rdp_curves` (single mechanisms and the add/remove subsampled Gaussian),
:mod:`.replace_one` (the replace-one subsampling bounds), :mod:`.rdp` (an event's
curve, the composed :class:`RdpState` and its conversion), :mod:`.exact` and
:mod:`.pld` (the other two accountants); this module is the public API.

Never account a fixed-size (or any other) scheme as Poisson unless the event
says so: the sampling kind is part of the event, and combinations without a
valid analysis raise ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedjax_dp.privacy.accounting.events import (
  ACCOUNTANTS,
  DEFAULT_ORDERS,
  FIXED_SIZE_METHODS,
  LEVELS,
  MECHANISMS,
  RELATIONS,
  SAMPLINGS,
  Event,
  _check_delta,
  _check_epsilon,
  _check_history,
  history_batch_shape,
)
from fedjax_dp.privacy.accounting.events import _orders_array as _orders_array  # calibration
from fedjax_dp.privacy.accounting.exact import _exact_totals, gaussian_delta, gaussian_epsilon
from fedjax_dp.privacy.accounting.pld import (
  PLD_MAX_POINTS,
  _pld_map,
  pld_min_multiplier,
  pld_points,
)
from fedjax_dp.privacy.accounting.rdp import (
  RdpState,
  event_rdp,
  history_rdp,
  rdp_compose,
  rdp_delta,
  rdp_epsilon,
  rdp_epsilon_and_order,
  rdp_init,
)


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


__all__ = ["ACCOUNTANTS", "DEFAULT_ORDERS", "FIXED_SIZE_METHODS", "LEVELS", "MECHANISMS",
           "PLD_MAX_POINTS", "RELATIONS", "SAMPLINGS", "Event", "RdpState", "delta", "epsilon",
           "event_rdp", "gaussian_delta", "gaussian_epsilon", "history_batch_shape",
           "history_rdp", "pld_min_multiplier", "pld_points", "rdp_compose", "rdp_delta",
           "rdp_epsilon", "rdp_epsilon_and_order", "rdp_init", "supports"]
