"""The host-side accountant of a run: its state and the plan's steps over it.

:class:`AccountantState` (and :class:`CorrelatedAccountantState` for noise correlated
across rounds) is the per-client ledger: each client's certified RDP, the paper
formula's bookkeeping, the pure epsilons of Laplace rounds. :class:`PlanAccountant`
is the part of :class:`fedjax_dp.privacy.plan.PrivacyPlan` that composes a round's
event into it (pure: a new state per round) and reports certified and claimed
epsilons; it reads the plan's fields and events
(:class:`fedjax_dp.privacy.plan_events.PlanEvents`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedjax_dp.privacy import accounting, correlated
from fedjax_dp.privacy.formulas.registry import FORMULAS


class AccountantState(NamedTuple):
  """Host-side accountant state: certified RDP and the paper formula's bookkeeping.

  Attributes:
    rdp: per-client RDP ``[U, A]``.
    inv_var_sum: ``[U]`` sum over past rounds of ``(scale / Delta_i)^-2``, from which
      the paper formula's claimed epsilon follows (Wei eq. (25) budget view).
    rounds: rounds composed so far.
    pure_eps: ``[U]`` basic composition of the pure epsilons of Laplace rounds with
      deterministic participation (``inf`` once a client released without noise);
      a second certified bound for Laplace runs (Fu et al. Theorem 1's accounting).
  """

  rdp: accounting.RdpState
  inv_var_sum: np.ndarray
  rounds: int
  pure_eps: np.ndarray


class CorrelatedAccountantState(NamedTuple):
  """:class:`AccountantState` of a correlated mechanism (``privacy.mechanism`` tree or
  bandmf), plus what its single Gaussian release needs (:meth:`PrivacyPlan.accountant_step`).

  Attributes:
    rdp, inv_var_sum, rounds, pure_eps: as :class:`AccountantState`; ``rdp`` holds the
      RDP of ONE Gaussian of multiplier ``sigma / s_i`` (its curve is linear in
      ``s_i^2``, so the rounds' increments add up to it exactly).
    sens_sq: ``[U]`` ``s_i^2``, each client's matrix sensitivity so far
      (:func:`fedjax_dp.privacy.correlated.pattern_sensitivity_sq` of its pattern).
    history: ``[U, T]`` bool, the rounds each client took part in.
  """

  rdp: accounting.RdpState
  inv_var_sum: np.ndarray
  rounds: int
  pure_eps: np.ndarray
  sens_sq: np.ndarray
  history: np.ndarray



class PlanAccountant:
  """The host-side accountant of a :class:`PrivacyPlan`: composes each round's event
  and reports certified and claimed epsilons; reads the plan's fields."""

  def accountant_init(self) -> AccountantState:
    u = self.num_clients
    if self.correlated is not None:
      return CorrelatedAccountantState(accounting.rdp_init((u,)), np.zeros(u), 0, np.zeros(u),
                                       np.zeros(u), np.zeros((u, self.rounds), bool))
    return AccountantState(accounting.rdp_init((u,)), np.zeros(u), 0, np.zeros(u))

  @property
  def pure_composition(self) -> bool:
    """Whether each round is a pure-DP Laplace release charged to the clients that
    took part (no sampling amplification), so basic composition certifies it."""
    return self.mechanism == "laplace" and (self.rule.deterministic or self.q >= 1)

  def participation(self, selected: np.ndarray | None, t: int = 0) -> np.ndarray:
    """``[U]`` bool: who may have released in round ``t``. ``selected`` are the ids of
    the round's cohort; only deterministic rules read it (a random rule's realised draw
    is part of its amplification and must not be passed to the accountant). A random
    rule with groups (:attr:`SelectionRule.groups`) charges the clients eligible in
    round t, known in advance (:attr:`groups`), never the draw."""
    part = np.ones(self.num_clients, bool)
    if self.groups is not None and not (self.rule.deterministic or self.poisson_steps):
      return self.groups == int(t) % self.period
    if self.rule.deterministic or self.poisson_steps:
      if selected is None:
        raise ValueError(f"server.selection={self.selection!r} is accounted per client: "
                         "accountant_step needs the round's selected client ids")
      part = np.zeros(self.num_clients, bool)
      part[np.asarray(selected, np.int64)] = True
    return part

  def accountant_step(self, state: AccountantState, noise: np.ndarray,
                      central_noise: float = 0.0,
                      selected: np.ndarray | None = None,
                      validate: bool = False) -> AccountantState:
    """Composes one round whose plan added ``noise [U]`` (or ``central_noise``) and
    selected the clients ``selected`` (ids; needed by deterministic rules).
    ``validate``: the round also releases the noisy validation score on the selected
    clients' data (``validation='clients'``, multiplier ``val_noise_multiplier``),
    composed into the same event (:meth:`event`). The paper formulas' bookkeeping
    (``inv_var_sum``) does not see it: the papers do not charge it.

    A client that may release without noise (multiplier ``inf``: a target of
    ``inf``, or a schedule's zero noise) is charged an infinite epsilon: nothing
    hides its data.
    """
    if self.correlated is not None and self.placement != "none":
      return self._correlated_step(state, noise, central_noise, selected)
    part = self.participation(selected, state.rounds)
    z = self.multipliers(noise, central_noise)
    if self.placement == "none":
      z = np.full(self.num_clients, np.inf)
    exposed = np.isinf(z) & part
    rdp = state.rdp
    pure = state.pure_eps
    if not np.all(np.isinf(z)):
      charge_val = validate and self.validation == "clients"
      event = self.event(z, part, self.val_noise_multiplier
                         if charge_val and not self.poisson_steps else None)
      rdp = accounting.rdp_compose(rdp, event)
      if charge_val and self.poisson_steps:
        rdp = accounting.rdp_compose(rdp, self.validation_event(part))
      if self.pure_composition:  # the round is 1/z-DP for each client that took part
        pure = pure + np.where(part, 1.0 / event.noise_multiplier, 0.0)
    pure = np.where(exposed, np.inf, pure)
    if np.any(exposed):
      rdp = rdp._replace(rdp=np.where(exposed[:, None], np.inf, rdp.rdp))
    with np.errstate(divide="ignore"):
      inv = np.where(np.isinf(z), np.inf, 1.0 / np.square(z))
    return AccountantState(rdp, state.inv_var_sum + inv, state.rounds + 1, pure)

  def _correlated_step(self, state: CorrelatedAccountantState, noise: np.ndarray,
                       central_noise: float, selected) -> CorrelatedAccountantState:
    """Round t of a correlated mechanism: client i's ``s_i^2`` grows by
    ``|M_tt| + 2 sum_{a < t in pi_i} |M_at|`` (``M = C^T C``,
    :func:`fedjax_dp.privacy.correlated.prefix_increments`) when it takes part, and the
    RDP grows by that of a Gaussian with ``z_t^-2 = increment / sigma^2``: the RDP of a
    Gaussian is ``alpha / (2 z^2)``, linear in ``z^-2``, so after any number of rounds
    the state is exactly the RDP of ONE Gaussian of multiplier ``sigma / s_i``
    (:meth:`correlated_event`). The noise multiplier sigma must be the same every round
    (:func:`fedjax_dp.privacy.correlated_setup.check_correlated` allows the
    constant schedule only)."""
    t = state.rounds
    if t >= self.rounds:
      raise ValueError(f"privacy.mechanism={self.mechanism!r}: the strategy is built for "
                       f"rounds={self.rounds}; round {t} is past it")
    part = self.participation(selected, t)
    history = state.history.copy()
    history[:, t] = part
    z = self.multipliers(noise, central_noise)
    exposed = np.isinf(z) & part
    if self.amplified:  # eligible rounds: subsampled Gaussians (amplified_event)
      inc = part * self.max_column_norm ** 2
      event = self.amplified_event(z, part)
    else:
      inc = correlated.prefix_increments(correlated.gram(self.correlated), history, t)
      with np.errstate(divide="ignore", invalid="ignore"):
        event = self.correlated_event(
            np.where((inc > 0) & np.isfinite(z), z / np.sqrt(inc), np.inf))
    with np.errstate(divide="ignore", invalid="ignore"):
      inv = np.where(np.isfinite(z), inc / np.square(z), np.where(part, np.inf, 0.0))
    rdp = state.rdp
    if not np.all(np.isinf(event.noise_multiplier) | ~event.participated):
      rdp = accounting.rdp_compose(rdp, event)
    if np.any(exposed):
      rdp = rdp._replace(rdp=np.where(exposed[:, None], np.inf, rdp.rdp))
    return CorrelatedAccountantState(rdp, state.inv_var_sum + inv, t + 1,
                                     np.where(exposed, np.inf, state.pure_eps),
                                     state.sens_sq + inc, history)

  @property
  def uncertifiable(self) -> bool:
    """Whether the release has no provable sensitivity (``clip_rule='median'``)."""
    return self.clip_rule == "median" and not self.noiseless

  def certified_epsilons(self, state: AccountantState) -> np.ndarray:
    """``[U]`` each client's epsilon at ``delta`` by the RDP accountant (inf where a
    client released without noise); for Laplace rounds without sampling, the smaller
    of that and the basic composition of the rounds' pure epsilons. ``inf`` for every
    client once a round ran with ``clip_rule='median'``
    (:data:`fedjax_dp.privacy.adaptive_clip.MEDIAN_REASON`)."""
    if state.rounds == 0:
      return np.zeros(self.num_clients)
    if self.uncertifiable:
      return np.full(self.num_clients, np.inf)
    return self._rdp_epsilons(state)

  def _rdp_epsilons(self, state: AccountantState) -> np.ndarray:
    if state.rounds == 0:
      return np.zeros(self.num_clients)
    rdp = state.rdp.rdp
    bad = np.any(np.isinf(rdp), axis=-1)
    safe = state.rdp._replace(rdp=np.where(bad[:, None], 0.0, rdp))
    eps = np.asarray(accounting.rdp_epsilon(safe, self.delta), np.float64)
    eps = np.where(bad, np.inf, eps)
    if self.pure_composition:
      # Laplace: basic composition's (sum eps, 0) is also certified at delta; keep the
      # smaller of the two bounds.
      eps = np.minimum(eps, state.pure_eps)
    return eps

  def certified_epsilon(self, state: AccountantState) -> float:
    """Worst client's epsilon at ``delta`` by the RDP accountant (inf if any client
    released without noise)."""
    return float(np.max(self.certified_epsilons(state)))

  def over_budget(self, state: AccountantState) -> bool:
    """Whether some client's certified epsilon passes its own target."""
    return bool(np.any(self.certified_epsilons(state) > self.epsilon * (1 + 1e-9)))

  def claimed_epsilon(self, state: AccountantState) -> float:
    """What the configured formula claims after ``state.rounds`` rounds (for
    ``wei_eq10``: eq. (10)/(25) inverted; ``yuan_*``: the paper's claim in its own
    ``Delta_s``; for the others, the certified epsilon)."""
    claimed = FORMULAS[self.formula].claimed
    if self.uncertifiable and claimed is None:
      # Geyer et al.'s claim: the moments accountant as if S were a fixed bound.
      return float(np.max(self._rdp_epsilons(state)))
    return self.certified_epsilon(state) if claimed is None else claimed(self, state)
