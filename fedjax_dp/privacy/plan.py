"""A run's privacy, configured in one place: mechanism, sensitivity, sampling, events.

:func:`make_privacy_plan` reads the config once and derives, for every client,
the sensitivity of what it releases, the neighbouring relation and the sampling
that the accountant must assume. The noise the engine adds and the events the
accountant composes both come from this object, so they cannot disagree
(ARCHITECTURE.md decision 6).

What each placement releases and how it is accounted (per client i, per round):

============  =====================  ==============================  =====================
placement     clip_mode              sensitivity Delta_i             event
============  =====================  ==============================  =====================
upload        per_example_l2 / l1    2 C (eta_1 / b_i                Gaussian/Laplace,
                                     + sum_{s>=2} eta_s)             replace-one example,
                                     (Wei eq. (13), 2 eta C / |D_i|, the selection rule's
                                     for one full-batch step)        event
upload        param_l2, update_l2    2 C (the clipped vector moves   same
                                     inside a ball of radius C);
                                     L1 (Laplace): 2 C sqrt(d)
step          per_example_*          2 C per step (summed clipped    E-fold composition,
                                     gradient, replace-one)          the rule's event
step,         per_example_l2         C per step (summed clipped      Poisson-subsampled
client.mini-                         gradient, ADD/REMOVE one        Gaussian (q_i = B /
batch=poisson                        example; divided by the         |D_i|) x E steps,
                                     expected batch B)               charged in the rounds
                                                                     the client is selected
central       update_l2              2 C max_i p_i (replace-one      client-level, the
                                     client in the weighted mean)    rule's event
upload        step_grad_l1 / l2      2 C sum_s eta_s (replace-one    client-level, the
                                     client; Fu et al.)              rule's event
============  =====================  ==============================  =====================

``b_i`` is the batch size (|D_i| for full batch) and ``eta_s`` the learning rate of
local step s. Minibatch steps are accounted without example-level subsampling
amplification (conservative). The selection rule's event comes from
:mod:`fedjax_dp.privacy.selection`: random rules amplify by their marginal q, round robin is
charged per client for the rounds it took part in. Each sensitivity is proved, for
the replace-one adjacency the accountant assumes, in its clip mode's file under
:mod:`fedjax_dp.privacy.clip_modes` (``per_example_l2.upload_sensitivity``,
``param_l2.ball_l1_sensitivity``, ``update_l2.central_sensitivity``,
``step_grad_l2.step_grad_sensitivity``), which this plan looks the configured mode up
in; ``tests/test_sensitivity.py`` searches for neighbouring datasets that break them.

The noise scale of a constant schedule and the epsilon a formula claims come from
the registry :data:`FORMULAS` (``privacy.formula``,
:mod:`fedjax_dp.privacy.formulas.registry`); the default, ``calibrated``, is the
smallest noise whose certified epsilon meets the target.

The plan is built from typed inputs (:class:`fedjax_dp.privacy.inputs.PrivacyInputs`),
never a run config. One concept a module: the events a run releases
(:mod:`fedjax_dp.privacy.plan_events`), the accountant's ledger and steps
(:mod:`fedjax_dp.privacy.ledger`), the formulas (:mod:`fedjax_dp.privacy.formulas`),
the run-level refusals of the server's clip rules (:mod:`.adaptive_clip`), Poisson
minibatches (:mod:`.minibatch`), correlated noise (:mod:`.correlated_setup`) and the
validation release (:mod:`.validation`); this module holds the plan object and
:func:`make_privacy_plan`, which asks each of them in turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedjax_dp.privacy import (
  adaptive_clip,
  clip_modes,
  correlated,
  mechanisms,
  minibatch,
  reporting,
)
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.clip_modes import param_l2, per_example_l2, step_grad_l2, update_l2
from fedjax_dp.privacy.correlated_setup import (
  check_correlated,
  correlated_strategy,
  patterns,
)
from fedjax_dp.privacy.formulas import registry
from fedjax_dp.privacy.formulas.registry import DEFAULT_FORMULA, FORMULAS, Formula
from fedjax_dp.privacy.inputs import PrivacyInputs
from fedjax_dp.privacy.ledger import AccountantState, CorrelatedAccountantState, PlanAccountant
from fedjax_dp.privacy.plan_events import PlanEvents
from fedjax_dp.privacy.validation import (
  VALIDATING_SCHEDULES,
  VALIDATIONS,
  check_validation,
  validation_mode,
  validation_sensitivity,
)

# Names that stay importable from here (their homes: the modules above).
MEDIAN_REASON = adaptive_clip.MEDIAN_REASON
POISSON_ASSUMPTION = minibatch.POISSON_ASSUMPTION
private_median_split = adaptive_clip.private_median_split
run_adjacency = minibatch.run_adjacency
# The sensitivities live with their clip modes (fedjax_dp/privacy/clip_modes/).
upload_sensitivity = per_example_l2.upload_sensitivity
param_l1_sensitivity = param_l2.ball_l1_sensitivity
step_grad_sensitivity = step_grad_l2.step_grad_sensitivity
central_sensitivity = update_l2.central_sensitivity


@dataclasses.dataclass(frozen=True, eq=False)
class PrivacyPlan(PlanEvents, PlanAccountant):
  """Mechanism + sensitivity + sampling + accounting of one run.

  Attributes:
    mechanism: ``'gaussian'`` or ``'laplace'``.
    placement: ``'upload'``, ``'step'``, ``'central'`` or ``'none'``.
    formula: how the noise scale is set (a key of
      :data:`fedjax_dp.privacy.formulas.registry.FORMULAS`).
    epsilon: ``[U]`` per-client target epsilon (``inf``: no noise, and an infinite
      certified epsilon for that client as soon as it releases).
    delta: target delta.
    q: per-round marginal selection probability of a client.
    selection: a rule of :data:`fedjax_dp.privacy.selection.RULES`.
    sensitivity: ``[U]`` sensitivity of each client's noised release (of the
      aggregate, for ``'central'``).
    steps: noised releases per selected round (E for ``'step'``, else 1).
    noise_multiplier: z for ``formula='noise_multiplier'``.
    num_clients: U.
    clients_per_round: K.
    rounds: the configured horizon T.
    claimed_sensitivity: ``[U]`` the sensitivity a paper's formula sizes its noise and
      its claim with, when it differs from the true ``sensitivity`` (Yuan:
      ``2 C / |D_k|``; Fu et al.: ``Xi = eta~ E zeta``); ``None``: the true one.
    level: the privacy unit the release's sensitivity is proved for:
      ``'example'`` (one record of a client) or ``'client'`` (a client's whole
      dataset: ``'central'`` placement and the ``step_grad_*`` clip modes).
    minibatch: ``client.minibatch``; ``'poisson'`` switches the accounting to
      :meth:`poisson_step_event` (add/remove, Poisson-subsampled Gaussian per step).
    batch_q: ``[U]`` the per-step inclusion rate ``q_i = min(1, B / |D_i|)``
      (``'poisson'`` only).
    clip_rule: ``server.clip_rule`` (central placement): ``'fixed'`` and
      ``'private_median'`` are certified by the events below; ``'median'`` (Geyer et
      al. 2017 as printed) clips to a data-dependent bound, so its release has no
      provable sensitivity: the certified epsilon is ``inf`` and the accountant's
      value for a fixed bound is reported as the claimed one (:data:`MEDIAN_REASON`).
    validation: ``'clients'`` when the schedule (``adpfl``) releases a noisy accuracy
      on the selected clients' data after its adjustment rounds (charged by
      :meth:`event` with ``val_multiplier``), else ``'server'`` (nothing released).
    val_noise_multiplier: ``z_val`` of that release (noise std ``z_val / N_sel``).
    adjacency: the run's neighbour relation, decided once by :func:`run_adjacency`
      (:mod:`fedjax_dp.privacy.minibatch`) and used by every event it composes
      (``'replace_one'``, or ``'add_remove'``
      for Poisson minibatches under a selection rule that allows it).
    correlated: ``privacy.mechanism`` tree or bandmf: the strategy ``C`` of the matrix
      mechanism (:mod:`fedjax_dp.privacy.correlated`); None for i.i.d. noise.
    patterns: ``[U, T]`` bool, each client's realised participation (correlated with a
      public pattern only; those rules are deterministic functions of the seed, drawn
      without data); None otherwise (an amplified mechanism never reads the draw).
    rate: ``server.q``, the rate the rule's callables take (its ``sampling`` event
      reads it: cyclic_poisson's in-group rate, whose marginal ``q`` is ``rate K / U``);
      None: ``q``.
    groups: ``[U]`` each client's class under a rule with groups
      (:attr:`fedjax_dp.privacy.selection.SelectionRule.groups`): client i is eligible only in
      the rounds ``t % period == groups[i]`` (a function of the seed alone); None:
      every round.
    period: the rule's period P (rounds between a client's eligible rounds).
  """

  mechanism: str
  placement: str
  formula: str
  epsilon: np.ndarray
  delta: float
  q: float
  selection: str
  sensitivity: np.ndarray
  steps: int
  noise_multiplier: float
  num_clients: int
  clients_per_round: int
  rounds: int
  claimed_sensitivity: np.ndarray | None = None
  level: str = "example"
  minibatch: str = "shuffle"
  batch_q: np.ndarray | None = None
  clip_rule: str = "fixed"
  validation: str = "server"
  val_noise_multiplier: float = 1.0
  adjacency: str = "replace_one"
  correlated: correlated.Strategy | None = None
  patterns: np.ndarray | None = None
  rate: float | None = None
  groups: np.ndarray | None = None
  period: int = 1

  @property
  def rule_rate(self) -> float:
    """The rate the rule's callables take (``server.q``; :attr:`rate`)."""
    return self.q if self.rate is None else float(self.rate)

  @property
  def target_epsilon(self) -> float:
    return float(np.min(self.epsilon))

  @property
  def noiseless(self) -> bool:
    return self.placement == "none" or bool(np.all(np.isinf(self.epsilon)))

  @property
  def rule(self) -> selection_lib.SelectionRule:
    return selection_lib.get_rule(self.selection)

  # --------------------------------------------------------------- noise
  def noise_scale(self, rounds: int) -> np.ndarray:
    """``[U]`` per-client noise scale (std, or Laplace b) for a constant schedule of
    ``rounds`` rounds, from the configured formula (0 where the target is inf)."""
    if self.noiseless:
      return np.zeros(self.num_clients)
    finite = np.isfinite(self.epsilon)
    eps = np.where(finite, self.epsilon, 1.0)
    scale = registry.FORMULAS[self.formula].noise_scale(self, eps, rounds)
    return np.where(finite, scale, 0.0)

  def device_noise(self, noise: np.ndarray, central_noise: float = 0.0
                   ) -> tuple[np.ndarray, float]:
    """Maps a schedule's per-client noise to what the engine adds.

    Schedules speak in per-client scales ``[U]`` (every client's release has the same
    sensitivity under ``'central'``); with central placement the server adds that
    scale once to the aggregate and clients add nothing.

    Returns:
      ``(client_noise [U], central_noise)``.
    """
    noise = np.asarray(noise, np.float64)
    if self.placement == "central":
      return np.zeros_like(noise), float(max(central_noise, np.max(noise, initial=0.0)))
    return noise, float(central_noise)

  def multipliers(self, noise: np.ndarray, central_noise: float) -> np.ndarray:
    """``[U]`` noise multipliers of a round's plan (``inf`` where no noise)."""
    scale = np.full(self.num_clients, float(central_noise)) if self.placement == "central" \
        else np.asarray(noise, np.float64)
    with np.errstate(divide="ignore"):
      return np.where(scale > 0, scale / self.sensitivity, np.inf)

  def describe(self) -> dict[str, Any]:
    """A JSON-able summary for ``summary.json``
    (:func:`fedjax_dp.privacy.reporting.describe`)."""
    return reporting.describe(self)


def selection_probability(inputs: PrivacyInputs) -> float:
  """A client's per-round selection probability under the run's selection rule."""
  s = inputs.server
  return float(selection_lib.get_rule(s.selection).q(
      int(inputs.federation.num_clients), int(s.clients_per_round), float(s.q)))


def _targets(inputs: PrivacyInputs, u: int) -> np.ndarray:
  """``[U]`` per-client target epsilons (``privacy.client_epsilons`` cycled, or one)."""
  p = inputs.privacy
  if len(p.client_epsilons):
    return np.resize(np.asarray(p.client_epsilons, np.float64), u)
  return np.full(u, float(p.epsilon))


def _check_known(inputs: PrivacyInputs) -> clip_modes.ClipMode:
  """The run's clip mode, after refusing an unknown formula, rule or mode by name."""
  registry.get_formula(inputs.privacy.formula)  # an unknown name raises, naming the field
  selection_lib.get_rule(inputs.server.selection)
  mode = clip_modes.get(inputs.client.clip_mode)
  mode.proof.check(inputs)
  return mode


def _release_sensitivity(placement: str, mode: clip_modes.ClipMode,
                         inputs: clip_modes.SensitivityInputs) -> np.ndarray:
  """``[U]`` the sensitivity of what ``placement`` noises, from the clip mode.

  Raises:
    ValueError: an unknown placement, or one the mode has no proof for.
  """
  if placement == "none":
    return np.ones(inputs.num_clients)
  if placement not in mechanisms.PLACEMENTS:
    raise ValueError(f"privacy.placement: unknown {placement!r}")
  if placement not in mode.proof.placements:
    why = (": without clipping the release has no bounded sensitivity"
           if not mode.proof.placements
           else f": no sensitivity of that release is proved for {mode.name!r}")
    raise ValueError(f"privacy.placement={placement!r} needs client.clip_mode in "
                     f"{', '.join(clip_modes.supporting(placement))} (got {mode.name!r})"
                     + why)
  return np.asarray(mode.proof.sensitivity(placement, inputs), np.float64)


def _check_laplace(inputs: PrivacyInputs, mode: clip_modes.ClipMode, eps: np.ndarray) -> None:
  """Laplace noise needs an L1 sensitivity: refuses modes/placements without one."""
  placement = inputs.privacy.placement
  if inputs.privacy.mechanism != "laplace" or placement == "none" \
      or placement in mode.proof.laplace or not np.any(np.isfinite(eps)):
    return
  where = ", or ".join(
      f"privacy.placement={p!r} with client.clip_mode in "
      f"{', '.join(clip_modes.supporting(p, laplace=True))}"
      for p in mechanisms.PLACEMENTS if clip_modes.supporting(p, laplace=True))
  raise ValueError(f"privacy.mechanism='laplace' needs L1 sensitivity: use {where} (got "
                   f"{placement!r}, {mode.name!r})")


def make_privacy_plan(inputs: PrivacyInputs) -> PrivacyPlan:
  """Builds the :class:`PrivacyPlan` of a run from its typed inputs.

  The clip mode (:mod:`fedjax_dp.privacy.clip_modes`) gives the sensitivity of the
  release at the configured placement and the privacy unit of its events; the
  formula, the server's clip rule, Poisson minibatches, a correlated mechanism and
  the validation release each refuse what their accounting does not cover.
  ``inputs.federation.counts`` (the clients' example counts) is required;
  ``num_params`` (d) only for Laplace noise on ``param_l2``/``update_l2`` uploads,
  whose L1 sensitivity is :func:`param_l1_sensitivity`. A bound that counts learning
  rates x steps reads the local steps' optimizer, ``inputs.client.optimizer``
  (:func:`fedjax_dp.privacy.clip_modes.base.step_weights`). From a run config:
  :func:`fedjax_dp.config.privacy_inputs.plan_from_config`.

  Args:
    inputs: :class:`fedjax_dp.privacy.inputs.PrivacyInputs`.

  Raises:
    ValueError: a placement/clipping/selection/aggregation combination without a
      proven sensitivity, naming the fields.
  """
  c, s, fed, p = inputs.client, inputs.server, inputs.federation, inputs.privacy
  if fed.counts is None:
    raise ValueError("make_privacy_plan needs the clients' example counts "
                     "(FederationSizes.counts)")
  counts = fed.counts
  u = counts.size
  placement = p.placement
  mode = _check_known(inputs)
  eps = _targets(inputs, u)
  lrs = c.lr_array
  q = selection_probability(inputs)
  batch = np.minimum(counts, c.batch_size) if c.batch_size else counts
  registry.get_formula(p.formula).check(inputs, mode)
  adaptive_clip.check_clip_rule(inputs, mode)
  batch_q = None
  if c.minibatch == "poisson":
    minibatch.check_poisson(inputs, mode)
    batch_q = np.minimum(1.0, float(c.batch_size) / np.maximum(counts, 1.0))
  strategy = correlated_strategy(inputs)
  rule = selection_lib.get_rule(s.selection)
  k, rate = int(s.clients_per_round), float(s.q)
  period, groups = 1, None
  if rule.groups is not None:
    period = int(rule.period(u, k, rate))
    groups = np.asarray(rule.groups(u, k, rate, fed.seed), np.int64)
  # correlated_strategy -> check_correlated already refused b > P and unbanded strategies.
  sens = _release_sensitivity(placement, mode, clip_modes.SensitivityInputs(
      clip=float(c.clip), lrs=lrs, batch=batch, counts=counts,
      mechanism="gaussian" if strategy is not None else p.mechanism,
      minibatch=c.minibatch, num_params=fed.num_params, q=q, client=c, server=s))
  _check_laplace(inputs, mode, eps)
  paper = registry.get_formula(p.formula).paper_sensitivity
  plan = PrivacyPlan(
      mechanism=p.mechanism, placement=placement, formula=p.formula,
      epsilon=eps, delta=float(p.delta), q=q, selection=s.selection, sensitivity=sens,
      steps=c.local_steps if placement == "step" else 1,
      noise_multiplier=float(p.noise_multiplier), num_clients=u,
      clients_per_round=int(s.clients_per_round), rounds=int(p.rounds),
      claimed_sensitivity=None if paper is None else paper(inputs, counts),
      level=mode.level(placement), minibatch=c.minibatch, batch_q=batch_q,
      clip_rule=s.clip_rule, validation=validation_mode(inputs),
      val_noise_multiplier=float(p.val_noise_multiplier), adjacency=run_adjacency(inputs),
      correlated=strategy,
      patterns=None if strategy is None or rule.min_sep_poisson else patterns(inputs, u),
      rate=float(s.q), groups=groups, period=period)
  check_validation(inputs, plan)
  return plan


__all__ = ["DEFAULT_FORMULA", "FORMULAS", "MEDIAN_REASON", "POISSON_ASSUMPTION",
           "VALIDATING_SCHEDULES", "VALIDATIONS", "AccountantState",
           "CorrelatedAccountantState", "Formula", "PrivacyPlan", "central_sensitivity",
           "check_correlated", "check_validation", "correlated_strategy",
           "make_privacy_plan", "param_l1_sensitivity", "private_median_split",
           "run_adjacency", "selection_probability", "step_grad_sensitivity",
           "upload_sensitivity", "validation_mode", "validation_sensitivity"]
