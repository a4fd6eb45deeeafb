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
the registry :data:`FORMULAS` (``privacy.formula``); the default, ``calibrated``,
is the smallest noise whose certified epsilon meets the target.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import accounting, calibration, clip_modes, correlated, formulas, mechanisms
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.clip_modes import param_l2, per_example_l2, step_grad_l2, update_l2


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


class Formula(NamedTuple):
  """How ``privacy.formula`` sets the noise and what it claims.

  Attributes:
    noise_scale: ``(plan, eps [U], rounds) -> [U]`` noise scale (std, or Laplace b)
      of a constant schedule of ``rounds`` rounds for finite targets ``eps``.
    claimed: ``(plan, state) -> float`` the epsilon the formula claims after
      ``state.rounds`` rounds (worst client); ``None``: the certified epsilon.
    reads: the config fields the formula reads that not every formula reads
      (``privacy.noise_multiplier``): a config that sets one away from its default
      while picking a formula that does not read it is refused
      (:func:`fedjax_dp.config.unread_fields`).
  """

  noise_scale: Callable[..., np.ndarray]
  claimed: Callable[..., float] | None = None
  reads: tuple[str, ...] = ()


def _wei_eq10_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  return formulas.wei_sigma_eq10(eps, plan.delta, plan.q, rounds, plan.sensitivity)


def _wei_eq10_claimed(plan: PrivacyPlan, state: AccountantState) -> float:
  """Inverts eq. (10)/(25): ``eps_i(t) = Delta_i sqrt(2 q ln(1/delta) sum sigma^-2)``
  (spec section 3.6)."""
  if np.any(np.isinf(state.inv_var_sum)) or np.any(np.isinf(state.rdp.rdp)):
    return math.inf
  # inv_var_sum holds sum (Delta_i / sigma_tau)^2, i.e. sum sigma^-2 in units of Delta_i.
  return float(np.max(formulas.wei_epsilon_claimed(state.inv_var_sum, plan.delta, plan.q,
                                                   1.0)))


def _fu_participations(plan: PrivacyPlan, rounds: int) -> int:
  """``T_l``: the most rounds one client takes part in over ``rounds`` rounds
  (round robin reshuffled every pass: ``ceil(T K / U)`` when K divides U)."""
  return int(plan.rule.max_participations(plan.num_clients, plan.clients_per_round, plan.q,
                                          rounds))


def _fu_thm1_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """Fu et al. Theorem 1: Laplace ``beta = T_l eta~ E zeta / eps`` (paper's Xi_1)."""
  return formulas.fu_laplace_scale_thm1(eps, max(_fu_participations(plan, rounds), 1),
                                        plan.claimed_sensitivity)


def _fu_thm2_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """Fu et al. Theorem 2 with the spec's c_2 (A6: the zCDP calibration of T_l Gaussian
  releases at q = 1, ``sigma = sqrt(T_l / (2 rho*))``); std ``sigma Xi_2`` (paper's Xi_2)."""
  sigma = formulas.fu_sigma_zcdp(eps, plan.delta, max(_fu_participations(plan, rounds), 1))
  return np.asarray(sigma) * plan.claimed_sensitivity


def _fu_claimed(plan: PrivacyPlan, state: AccountantState) -> float:
  """The paper's epsilon after ``state.rounds`` rounds for the worst client, from its
  participations so far ``t`` and the constant schedule's scale: Theorem 1 inverted
  (``t Xi_1 / beta``, basic composition) or Theorem 2 inverted (zCDP, spec A6), with
  the paper's sensitivity ``Xi = eta~ E zeta`` (half the replace-one one, spec A7)."""
  if state.rounds == 0:
    return 0.0
  if np.any(np.isinf(state.rdp.rdp)):
    return math.inf
  t = _fu_participations(plan, state.rounds)
  scale = plan.noise_scale(plan.rounds)
  xi = plan.claimed_sensitivity
  if plan.formula == "fu_thm1":
    eps = formulas.fu_epsilon_thm1(scale, t, xi)
  else:
    eps = formulas.fu_epsilon_zcdp(scale / xi, plan.delta, t)
  return float(np.max(eps))


def _multiplier_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  return plan.noise_multiplier * plan.sensitivity


def _calibrated_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """The smallest z whose ``rounds`` rounds our certified accountant meets at
  ``(eps, delta)``, times the sensitivity."""
  z = calibration.calibrate(lambda x: [plan.horizon_event(x, rounds)], eps, plan.delta)
  return np.broadcast_to(z, eps.shape) * plan.sensitivity


def _paper_inv_var_sum(plan: PrivacyPlan, state: AccountantState) -> np.ndarray:
  """``[U]`` ``sum_m (Delta_s / scale_m)^2`` in the paper's sensitivity ``Delta_s``
  (``plan.claimed_sensitivity``): ``inv_var_sum`` is kept in the true sensitivity."""
  ratio = plan.claimed_sensitivity / plan.sensitivity
  return state.inv_var_sum * np.square(ratio)


def _infinite(state: AccountantState) -> bool:
  return bool(np.any(np.isinf(state.inv_var_sum)) or np.any(np.isinf(state.rdp.rdp)))


def _yuan_eq8_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """Remark 3 (eq. (8) at ``theta = 1``) with the paper's ``Delta_s = 2 C / |D_k|``:
  ``sigma = (Delta_s / eps) sqrt(2 q M ln(1/delta))``. The ``geometric`` schedule turns
  this constant noise into eq. (8)'s base ``sigma sqrt(S_M / M)`` (same budget)."""
  return formulas.yuan_sigma_eq8(eps, plan.delta, plan.q, rounds, 1.0, plan.claimed_sensitivity)


def _yuan_eq8_corrected_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """The corrected eq. (8) (spec E4) at ``theta = 1``, paper's ``Delta_s``."""
  return formulas.yuan_sigma_eq8_corrected(eps, plan.delta, plan.q, rounds, 1.0,
                                           plan.claimed_sensitivity)


def _yuan_eq8_claimed(plan: PrivacyPlan, state: AccountantState) -> float:
  """Eq. (16)/(8) inverted on the realised amplitudes with the paper's ``Delta_s``:
  ``Delta_s sqrt(2 q ln(1/delta) sum_m sigma_m^-2)``; the target at ``m = M``."""
  if _infinite(state):
    return math.inf
  return float(np.max(formulas.yuan_epsilon_claimed(_paper_inv_var_sum(plan, state),
                                                    plan.delta, plan.q, 1.0)))


def _yuan_eq8_corrected_claimed(plan: PrivacyPlan, state: AccountantState) -> float:
  """The paper's accountant (16)-(17) minimised over real lambda (spec section 3.3),
  ``a + 2 sqrt(a ln(1/delta))``, which the corrected eq. (8) brings to the target."""
  if _infinite(state):
    return math.inf
  return float(np.max(formulas.yuan_epsilon_achieved(_paper_inv_var_sum(plan, state),
                                                     plan.delta, plan.q, 1.0)))


def _yuan_laplace_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """Spec section 6: ``b = M Delta_s / eps`` per coordinate (basic composition of
  ``eps / M`` per round, the paper's ``Delta_s`` read as an L1 sensitivity)."""
  return rounds * plan.claimed_sensitivity / eps


def _yuan_laplace_matched_scale(plan: PrivacyPlan, eps: np.ndarray, rounds: int) -> np.ndarray:
  """Laplace with the variance of Remark 3's Gaussian: ``2 b^2 = sigma^2``."""
  return _yuan_eq8_scale(plan, eps, rounds) / math.sqrt(2.0)


def _yuan_laplace_claimed(plan: PrivacyPlan, state: AccountantState) -> float:
  """Basic composition with the paper's ``Delta_s``: ``sum_m Delta_s / b_m``, computed as
  ``sqrt(M sum_m (Delta_s / b_m)^2)``: equal for a constant ``b`` (the only schedule
  Laplace runs with), an upper bound otherwise (Cauchy-Schwarz)."""
  if _infinite(state):
    return math.inf
  return float(np.max(np.sqrt(state.rounds * _paper_inv_var_sum(plan, state))))


# Yuan et al.'s formulas: the noise from the paper's Delta_s = 2 C / |D_k|, the claim in
# it too; the certified epsilon uses the plan's true sensitivity (param_l2: 2 C, L1
# 2 C sqrt(d)). They need Algorithm 1 (upload, param_l2; make_privacy_plan checks).
# update_l2 is the other reading of Algorithm 1's C-ball (spec 7.3 item 12: whether the
# CNN's parameters are projected is open): the upload lies in the ball of radius C
# around the shared global model instead of around 0, the same true sensitivity 2 C
# (update_l2's docstring proves it), so the certified column holds for it too.
YUAN_FORMULAS = {"yuan_eq8": "gaussian", "yuan_eq8_corrected": "gaussian",
                 "yuan_laplace": "laplace", "yuan_laplace_matched": "laplace"}

# privacy.formula -> Formula. Wei eq. (10) is the paper's formula as printed (it
# overspends above epsilon ~4.6, specs/wei_udp_crd.md errata): an explicit choice,
# never the default. New formulas (Yuan eq. (8)/(9), Fu Thm. 1/2) are peers here.
FORMULAS: dict[str, Formula] = {
    "calibrated": Formula(_calibrated_scale),
    "wei_eq10": Formula(_wei_eq10_scale, _wei_eq10_claimed),
    "noise_multiplier": Formula(_multiplier_scale, reads=("privacy.noise_multiplier",)),
    "yuan_eq8": Formula(_yuan_eq8_scale, _yuan_eq8_claimed),
    "yuan_eq8_corrected": Formula(_yuan_eq8_corrected_scale, _yuan_eq8_corrected_claimed),
    "yuan_laplace": Formula(_yuan_laplace_scale, _yuan_laplace_claimed),
    "yuan_laplace_matched": Formula(_yuan_laplace_matched_scale, _yuan_laplace_claimed),
    "fu_thm1": Formula(_fu_thm1_scale, _fu_claimed),
    "fu_thm2": Formula(_fu_thm2_scale, _fu_claimed),
}
# Fu et al.'s formulas: the mechanism each is written for (spec section 2.3).
FU_FORMULAS = {"fu_thm1": "laplace", "fu_thm2": "gaussian"}
# The clip modes each paper's formulas are written for (their sensitivity Delta_s / Xi).
FU_CLIP_MODES = ("step_grad_l1", "step_grad_l2")
YUAN_CLIP_MODES = ("param_l2", "update_l2")
DEFAULT_FORMULA = "calibrated"


class _PlanEvents:
  """The accounting events of a :class:`PrivacyPlan` (one round, the validation
  release, a Poisson-minibatch round, a whole constant schedule); reads the plan's
  fields."""

  def event(self, z: np.ndarray, participated: Any = True,
            val_multiplier: float | None = None) -> accounting.Event:
    """The accounting event of one round for noise multipliers ``z [U]`` (scale /
    sensitivity; ``inf``: no noise). ``participated [U]`` says who took part, for
    rules whose participation is charged as it happened (round robin).

    ``val_multiplier``: the round also releases the validation score on the selected
    clients' data with multiplier ``z_val`` (``schedule.validation='clients'``); the
    round is then one Gaussian of multiplier ``(z^-2 + z_val^-2)^(-1/2)``
    (:func:`validation_sensitivity` proves why)."""
    z = np.asarray(z, np.float64)
    if self.correlated is not None:  # the whole run: one Gaussian (horizon_event)
      return self.horizon_event(z, self.rounds)
    if self.poisson_steps:
      return self.poisson_step_event(z, participated)
    if self.placement == "step":
      # E noised steps inside one selection: the Gaussians' z^-2 add up, so the round is
      # one Gaussian with z / sqrt(E) (exact); Laplace: basic composition, z / E.
      z = z / (math.sqrt(self.steps) if self.mechanism == "gaussian" else self.steps)
    if val_multiplier is not None:
      if self.mechanism != "gaussian" or self.level != "example" \
          or self.placement == "central":
        raise ValueError("the validation release composes only with an example-level "
                         "Gaussian round (check_validation refuses the others)")
      with np.errstate(divide="ignore"):
        z = np.where(np.isinf(z), np.inf, (z ** -2.0 + float(val_multiplier) ** -2.0) ** -0.5)
    level = "client" if self.placement == "central" else self.level
    kw: dict[str, Any] = {"mechanism": self.mechanism, "noise_multiplier": z,
                          "relation": self.adjacency, "level": level}
    rule = self.rule
    kw["participated"] = participated  # a random rule: all, or its eligible clients
    if rule.deterministic:
      kw.update(sampling="round_robin")
    elif self.q >= 1:
      kw.update(sampling="full")
    else:
      kw.update(rule.sampling(level, self.num_clients, self.clients_per_round,
                              self.rule_rate))
    return accounting.Event(**kw)

  def validation_event(self, participated: Any = True) -> accounting.Event:
    """The validation release alone, charged to the clients that took part, unamplified
    (Poisson minibatches, whose rounds claim no selection amplification either; see
    :func:`validation_sensitivity`), under the run's relation (its sensitivity
    ``1 / N_sel`` holds for both)."""
    return accounting.Event(mechanism="gaussian", noise_multiplier=self.val_noise_multiplier,
                            sampling="round_robin", relation=self.adjacency, level="example",
                            participated=participated)

  @property
  def poisson_steps(self) -> bool:
    """Whether clients run DP-SGD with Poisson minibatches (``client.minibatch``)."""
    return self.minibatch == "poisson" and self.placement == "step"

  def poisson_step_event(self, z: np.ndarray, participated: Any = True) -> accounting.Event:
    """One round of client DP-SGD with Poisson minibatches, for multipliers ``z [U]``
    measured against C (``sensitivity``: the norm bound of one clipped gradient).

    The unit is one example of client i. Under ``adjacency='add_remove'`` neighbours
    ADD OR REMOVE it (the adjacency of the Poisson-subsampled Gaussian, Mironov,
    Talwar & Zhang 2019). Under ``'replace_one'`` (a selection rule that needs equal
    label histograms and counts, :attr:`SelectionRule.relation`) they replace it by
    one of the same label: the replaced example joins the batch with probability
    ``q_i`` in both runs and moves the clipped sum by at most 2 C, so the step is the
    replace-one Poisson-subsampled Gaussian, charged with multiplier ``z / 2`` against
    that 2 C (``accounting.Event.sum_of_terms``: each term has norm C). Client i's
    count |D_i|, hence ``q_i = min(1, B / |D_i|)`` and the E steps, are public
    parameters of the mechanism (as DP-SGD treats the dataset size, Abadi et al.
    2016). Each local step releases ``(sum_{x in b} clip_C(g(x)) + N(0, z^2 C^2 I))
    / B`` with b a Poisson sample of rate ``q_i``: adding or removing one example
    changes the clipped sum by at most C (its own clipped gradient, and only when
    it is sampled; the other examples' gradients are taken at the same parameters,
    which the previous steps' outputs fix), so the sum has sensitivity C, the
    release C / B, and the step is the sampled Gaussian mechanism with rate ``q_i``
    and multiplier z. The E steps of a round compose adaptively (``count = E``);
    rounds compose in the rounds client i is selected.

    Client selection is NOT used for amplification (none is claimed for any rule):
    a round in which client i is selected is charged in full, a round in which it
    is not is charged nothing. The selection never reads the clients' examples
    (random rules draw from the round's key; the Wasserstein rules read label
    histograms that the plan treats as public), so the realised selection is a
    public, data-independent schedule and the guarantee holds for it; charging
    every round instead would bound every possible selection at once.
    """
    replace = self.adjacency == "replace_one"
    return accounting.Event(mechanism="gaussian", noise_multiplier=z / 2.0 if replace else z,
                            sampling="poisson", q=self.batch_q, relation=self.adjacency,
                            level="example", participated=participated, count=self.steps,
                            sum_of_terms=replace)

  def horizon_event(self, z: np.ndarray, rounds: int) -> accounting.Event:
    """The event of a constant schedule of ``rounds`` rounds at multiplier ``z``, for
    the client charged most: the most rounds one client can be charged
    (:attr:`SelectionRule.max_participations`: a deterministic rule's most turns, a
    random rule with groups its eligible rounds ``ceil(T / P)``, every round for the
    other random rules). A correlated mechanism is one Gaussian over the run for the
    client with the largest matrix sensitivity (:meth:`correlated_event`), or, amplified
    (:attr:`amplified`), ``ceil(T / P)`` subsampled Gaussians (:meth:`amplified_event`)."""
    rule = self.rule
    count = rule.max_participations(self.num_clients, self.clients_per_round, self.rule_rate,
                                    rounds)
    if self.amplified:
      return self.amplified_event(np.asarray(z, np.float64)).replace(count=count)
    if self.correlated is not None:
      return self.correlated_event(np.asarray(z, np.float64)
                                   / np.sqrt(np.max(self.correlated_sens_sq(rounds))))
    if self.poisson_steps:  # a random rule may select one client in every eligible round
      return self.event(z).replace(count=count * self.steps)
    return self.event(z).replace(count=count)


  def correlated_event(self, z: np.ndarray) -> accounting.Event:
    """A correlated mechanism's release as ONE Gaussian of multipliers ``z = sigma / s``
    (no sampling; the run's relation; the client is the unit: central placement).

    The release ``C G + sigma Delta Z`` moves by at most ``s Delta`` in Frobenius norm
    between neighbours (:mod:`fedjax_dp.privacy.correlated.base`), so it is the Gaussian
    mechanism with multiplier ``sigma / s``, released once (Choquette-Choo et al. 2023,
    Sec. 2; Denisov et al. 2022, Thm. 2.1 for adaptive rows)."""
    return accounting.Event(mechanism="gaussian", noise_multiplier=z, sampling="full",
                            relation=self.adjacency, level="client")

  @property
  def amplified(self) -> bool:
    """Whether a correlated mechanism is accounted by amplification: BandMF under a
    b-min-sep Poisson rule (:attr:`SelectionRule.min_sep_poisson`; ``b <= P`` checked
    by :func:`check_correlated`)."""
    return self.correlated is not None and self.rule.min_sep_poisson

  @property
  def max_column_norm(self) -> float:
    """``max_j ||C_{:, j}||`` of the correlated strategy (``sqrt max diag(C^T C)``; 1 for
    BandMF's unit-norm band coefficients)."""
    return float(np.sqrt(np.max(np.diag(correlated.gram(self.correlated)))))

  def amplified_event(self, z: np.ndarray, participated: Any = True) -> accounting.Event:
    """One eligible round of BandMF under b-min-sep Poisson sampling, for the noise
    multiplier ``z = sigma`` (noise std / the per-round sensitivity Delta): the
    Poisson-subsampled Gaussian of rate ``server.q`` and multiplier
    ``sigma / max_j ||C_{:, j}||`` at client level, under the run's relation, charged
    in the rounds the client is eligible for (``participated``). Why this bounds the
    release: :mod:`fedjax_dp.privacy.correlated.bandmf` (Choquette-Choo et al. 2023,
    Sec. 4)."""
    kw = self.rule.sampling("client", self.num_clients, self.clients_per_round,
                            self.rule_rate)
    return accounting.Event(mechanism="gaussian",
                            noise_multiplier=np.asarray(z, np.float64) / self.max_column_norm,
                            relation=self.adjacency, level="client",
                            participated=participated, **kw)

  def correlated_sens_sq(self, rounds: int | None = None) -> np.ndarray:
    """``[U]`` each client's ``s_i^2`` over the first ``rounds`` rounds of its realised
    participation (:attr:`patterns`; the Gram matrix of the whole horizon, an upper
    bound for a prefix since the rows of later rounds only add)."""
    r = self.rounds if rounds is None else min(int(rounds), self.rounds)
    cache = self.__dict__.setdefault("_correlated_sens_sq", {})  # calibration asks often
    if r not in cache:
      if self.amplified:  # eligible rounds x the largest column norm^2 (informational)
        eligible = np.maximum(0, -(-(r - self.groups) // self.period))
        cache[r] = eligible * self.max_column_norm ** 2
      else:
        g = correlated.gram(self.correlated)[:r, :r]
        cache[r] = correlated.pattern_sensitivity_sq(g, self.patterns[:, :r])
      cache[r].setflags(write=False)
    return cache[r]


class _PlanAccountant:
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
    (``_check_correlated`` allows the constant schedule only)."""
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
    client once a round ran with ``clip_rule='median'`` (:data:`MEDIAN_REASON`)."""
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


@dataclasses.dataclass(frozen=True, eq=False)
class PrivacyPlan(_PlanEvents, _PlanAccountant):
  """Mechanism + sensitivity + sampling + accounting of one run.

  Attributes:
    mechanism: ``'gaussian'`` or ``'laplace'``.
    placement: ``'upload'``, ``'step'``, ``'central'`` or ``'none'``.
    formula: how the noise scale is set (a key of :data:`FORMULAS`).
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
      and used by every event it composes (``'replace_one'``, or ``'add_remove'``
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
    scale = FORMULAS[self.formula].noise_scale(self, eps, rounds)
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
    """A JSON-able summary for ``summary.json``: the accounting event, whether the
    selection is amplified, and what the certified epsilon assumes beyond the
    adjacency (a rule's :attr:`SelectionRule.assumption`)."""
    ev = None if self.noiseless else self.event(np.ones(self.num_clients))
    accounting_info = None if ev is None else {
        "sampling": ev.sampling, "relation": ev.relation, "level": ev.level,
        "accountant": "rdp (certified, worst client)",
        "certified_note": MEDIAN_REASON if self.uncertifiable else None,
        "amplification": (
            f"minibatch: poisson (q_i = B / |D_i|, {self.steps} steps per round); "
            "client selection: none, each client is charged the rounds it was selected in"
            if self.poisson_steps else
            "none: each client is charged the rounds it was selected in"
            if self.rule.deterministic else ev.sampling),
        "assumption": (self.rule.assumption if not self.poisson_steps else
                       "; ".join(filter(None, [self.rule.assumption,
                                               POISSON_ASSUMPTION[self.adjacency]])))}
    return {
        "mechanism": self.mechanism, "placement": self.placement, "formula": self.formula,
        "adjacency": self.adjacency,
        "delta": self.delta, "q": self.q, "selection": self.selection, "steps": self.steps,
        "sensitivity_min": float(np.min(self.sensitivity)),
        "sensitivity_max": float(np.max(self.sensitivity)),
        "sensitivity_claimed_max": None if self.claimed_sensitivity is None
        else float(np.max(self.claimed_sensitivity)),
        "clip_rule": self.clip_rule,
        "validation": self.validation,
        "val_noise_multiplier": self.val_noise_multiplier if self.validation == "clients"
        else None,
        "accounting": accounting_info,
        **({"correlated": self.describe_correlated()} if self.correlated is not None else {})}

  def describe_correlated(self) -> dict[str, Any]:
    """The strategy of a correlated mechanism and each client's matrix sensitivity over
    the run (``s_i``: the release is one Gaussian of multiplier ``sigma / s_i``)."""
    s, sens = self.correlated, np.sqrt(self.correlated_sens_sq())
    return {"strategy": s.name, "rounds": s.rounds, "bands": len(s.coefs) or None,
            "coefs": list(s.coefs) or None, "tree_restart": s.restart or None,
            "matrix_sensitivity_max": float(np.max(sens)),
            "matrix_sensitivity_min": float(np.min(sens)),
            "amplification": (
                f"b-min-sep Poisson (Choquette-Choo et al. 2023, Sec. 4): each eligible "
                f"round (every {self.period}-th) a Poisson-subsampled Gaussian, rate "
                f"{self.rule_rate}, multiplier sigma / {self.max_column_norm:.6g}"
                if self.amplified else
                "none: the realised (public) participation of each client")}


POISSON_ASSUMPTION = {
    "add_remove": (
        "client.minibatch='poisson': each client's example count |D_i| (hence q_i = B / "
        "|D_i| and the number of steps) is a public parameter of the mechanism, held fixed "
        "when one example is added or removed (the DP-SGD convention for the dataset size)"),
    "replace_one": (
        "client.minibatch='poisson' under replace-one (the selection rule's assumption "
        "allows no add/remove neighbour): each step is the replace-one Poisson-subsampled "
        "Gaussian (the replaced example is sampled with q_i = B / |D_i| in both runs and "
        "moves the clipped sum by 2 C)"),
}


def run_adjacency(cfg) -> str:
  """The run's one neighbour relation: ``'add_remove'`` for client DP-SGD with Poisson
  minibatches (the relation of the Poisson-subsampled Gaussian) unless the selection
  rule needs another (:attr:`SelectionRule.relation`, the A-DPFL rules:
  ``'replace_one'``); every other run is accounted under ``'replace_one'``."""
  rule = selection_lib.get_rule(cfg.server.selection)
  poisson = (cfg.client.get("minibatch", "shuffle") == "poisson"
             and cfg.privacy.placement == "step")
  if poisson and rule.relation is None:
    return "add_remove"
  return "replace_one"

MEDIAN_REASON = (
    "server.clip_rule='median' (Geyer et al. 2017 as printed): the clip bound S is the "
    "median of the cohort's update norms, a function of the clients' data, and the noise "
    "is scaled by S, so no sensitivity bound holds for the release (one client can move "
    "S and with it the scale of every clipped update and of the noise): certified "
    "epsilon = inf; the claimed epsilon is the RDP accountant's for a fixed S. Use "
    "server.clip_rule='private_median' (Andrew et al. 2021) for a certified adaptive clip")


def selection_probability(cfg) -> float:
  """A client's per-round selection probability for the configured selection."""
  return float(selection_lib.get_rule(cfg.server.selection).q(
      int(cfg.data.num_clients), int(cfg.server.clients_per_round), float(cfg.server.q)))


def local_learning_rates(cfg) -> np.ndarray:
  """``[E]`` the local step sizes ``eta_s = lr * lr_decay**s`` (schedule scale 1)."""
  steps = int(cfg.client.local_steps)
  return float(cfg.client.lr) * float(cfg.client.lr_decay) ** np.arange(steps)


# The sensitivities live with their clip modes (fedjax_dp/privacy/clip_modes/); these
# names stay importable from here.
upload_sensitivity = per_example_l2.upload_sensitivity
param_l1_sensitivity = param_l2.ball_l1_sensitivity
step_grad_sensitivity = step_grad_l2.step_grad_sensitivity
central_sensitivity = update_l2.central_sensitivity


def _targets(cfg, u: int) -> np.ndarray:
  """``[U]`` per-client target epsilons (``privacy.client_epsilons`` cycled, or one)."""
  if len(cfg.privacy.client_epsilons):
    return np.resize(np.asarray(cfg.privacy.client_epsilons, np.float64), u)
  return np.full(u, float(cfg.privacy.epsilon))


def _check_known(cfg) -> clip_modes.ClipMode:
  """The run's clip mode, after refusing an unknown formula, rule or mode by name."""
  if cfg.privacy.formula not in FORMULAS:
    raise ValueError(f"privacy.formula: unknown {cfg.privacy.formula!r}; known: "
                     f"{tuple(FORMULAS)}")
  selection_lib.get_rule(cfg.server.selection)  # an unknown rule raises, naming the field
  mode = clip_modes.get(cfg.client.clip_mode)
  mode.check(cfg)
  return mode


def _release_sensitivity(cfg, mode: clip_modes.ClipMode,
                         inputs: clip_modes.SensitivityInputs) -> np.ndarray:
  """``[U]`` the sensitivity of what ``placement`` noises, from the clip mode.

  Raises:
    ValueError: an unknown placement, or one the mode has no proof for.
  """
  placement = cfg.privacy.placement
  if placement == "none":
    return np.ones(inputs.num_clients)
  if placement not in mechanisms.PLACEMENTS:
    raise ValueError(f"privacy.placement: unknown {placement!r}")
  if placement not in mode.placements:
    why = (": without clipping the release has no bounded sensitivity" if not mode.placements
           else f": no sensitivity of that release is proved for {mode.name!r}")
    raise ValueError(f"privacy.placement={placement!r} needs client.clip_mode in "
                     f"{', '.join(clip_modes.supporting(placement))} (got {mode.name!r})"
                     + why)
  return np.asarray(mode.sensitivity(placement, inputs), np.float64)


def _check_laplace(cfg, mode: clip_modes.ClipMode, eps: np.ndarray) -> None:
  """Laplace noise needs an L1 sensitivity: refuses modes/placements without one."""
  placement = cfg.privacy.placement
  if cfg.privacy.mechanism != "laplace" or placement == "none" \
      or placement in mode.laplace or not np.any(np.isfinite(eps)):
    return
  where = ", or ".join(
      f"privacy.placement={p!r} with client.clip_mode in "
      f"{', '.join(clip_modes.supporting(p, laplace=True))}"
      for p in mechanisms.PLACEMENTS if clip_modes.supporting(p, laplace=True))
  raise ValueError(f"privacy.mechanism='laplace' needs L1 sensitivity: use {where} (got "
                   f"{placement!r}, {mode.name!r})")


def _claimed_sensitivity(cfg, counts: np.ndarray, lrs: np.ndarray) -> np.ndarray | None:
  """``[U]`` the sensitivity a paper's formula sizes its noise with (Yuan et al.:
  ``2 C / |D_k|``; Fu et al.: ``Xi = eta~ E zeta``), after refusing a Yuan formula
  outside Algorithm 1; None for the other formulas."""
  formula, placement = cfg.privacy.formula, cfg.privacy.placement
  clip = float(cfg.client.clip)
  if formula in YUAN_FORMULAS and placement != "none":
    if placement != "upload" or cfg.client.clip_mode not in YUAN_CLIP_MODES:
      raise ValueError(f"privacy.formula={formula!r} is Yuan et al.'s Algorithm 1: it needs "
                       f"privacy.placement='upload' and client.clip_mode in "
                       f"{', '.join(YUAN_CLIP_MODES)} (got "
                       f"{placement!r}, {cfg.client.clip_mode!r})")
    if cfg.privacy.mechanism != YUAN_FORMULAS[formula]:
      raise ValueError(f"privacy.formula={formula!r} calibrates "
                       f"{YUAN_FORMULAS[formula]} noise: set privacy.mechanism="
                       f"{YUAN_FORMULAS[formula]!r} (got {cfg.privacy.mechanism!r})")
    return np.asarray(formulas.yuan_sensitivity(clip, counts), np.float64)
  if formula in FU_FORMULAS:
    return np.full(counts.size, float(formulas.fu_sensitivity(
        float(np.max(lrs)), int(cfg.client.local_steps), clip)))
  return None


def make_privacy_plan(cfg, counts: np.ndarray, num_params: int | None = None) -> PrivacyPlan:
  """Builds the :class:`PrivacyPlan` of a config for clients with ``counts [U]`` examples.

  The clip mode (:mod:`fedjax_dp.privacy.clip_modes`) gives the sensitivity of the
  release at the configured placement and the privacy unit of its events.
  ``num_params`` (d) is needed only for Laplace noise on ``param_l2``/``update_l2``
  uploads, whose L1 sensitivity is :func:`param_l1_sensitivity`.

  Raises:
    ValueError: a placement/clipping/selection/aggregation combination without a
      proven sensitivity, naming the fields.
  """
  counts = np.asarray(counts, np.float64)
  u = counts.size
  placement = cfg.privacy.placement
  mode = _check_known(cfg)
  eps = _targets(cfg, u)
  steps = int(cfg.client.local_steps)
  lrs = local_learning_rates(cfg)
  q = selection_probability(cfg)
  batch = np.minimum(counts, cfg.client.batch_size) if cfg.client.batch_size else counts
  _check_fu(cfg)
  minibatch = cfg.client.get("minibatch", "shuffle")
  clip_rule = cfg.server.get("clip_rule", "fixed")
  _check_clip_rule(cfg, clip_rule)
  batch_q = None
  if minibatch == "poisson":
    _check_poisson(cfg)
    batch_q = np.minimum(1.0, float(cfg.client.batch_size) / np.maximum(counts, 1.0))
  strategy = correlated_strategy(cfg)
  rule = selection_lib.get_rule(cfg.server.selection)
  k_cfg, rate = int(cfg.server.clients_per_round), float(cfg.server.q)
  period, groups = 1, None
  if rule.groups is not None:
    period = int(rule.period(u, k_cfg, rate))
    groups = np.asarray(rule.groups(u, k_cfg, rate, int(cfg.seed)), np.int64)
  # correlated_strategy -> check_correlated already refused b > P and unbanded strategies.
  sens = _release_sensitivity(cfg, mode, clip_modes.SensitivityInputs(
      clip=float(cfg.client.clip), lrs=lrs, batch=batch, counts=counts,
      mechanism="gaussian" if strategy is not None else cfg.privacy.mechanism,
      minibatch=minibatch, num_params=num_params, q=q, cfg=cfg))
  _check_laplace(cfg, mode, eps)
  claimed_sens = _claimed_sensitivity(cfg, counts, lrs)
  plan = PrivacyPlan(
      mechanism=cfg.privacy.mechanism, placement=placement, formula=cfg.privacy.formula,
      epsilon=eps, delta=float(cfg.privacy.delta), q=q,
      selection=cfg.server.selection, sensitivity=sens,
      steps=steps if placement == "step" else 1,
      noise_multiplier=float(cfg.privacy.noise_multiplier), num_clients=u,
      clients_per_round=int(cfg.server.clients_per_round), rounds=int(cfg.rounds),
      claimed_sensitivity=claimed_sens, level=mode.level(placement),
      minibatch=minibatch, batch_q=batch_q, clip_rule=clip_rule,
      validation=validation_mode(cfg), val_noise_multiplier=float(
          cfg.schedule.get("val_noise_multiplier", 1.0)), adjacency=run_adjacency(cfg),
      correlated=strategy,
      patterns=None if strategy is None or rule.min_sep_poisson else _patterns(cfg, u),
      rate=float(cfg.server.q), groups=groups, period=period)
  check_validation(cfg, plan)
  return plan


# The selection rules a correlated mechanism is accounted for: those whose participation
# is a deterministic function of (seed, t), drawn without reading data, so each
# client's pattern is public (one Gaussian over the realised patterns), and the b-min-sep
# Poisson rules, for a banded mechanism with b <= P (amplified, Choquette-Choo et al.
# 2023, Sec. 4; :mod:`fedjax_dp.privacy.correlated.bandmf`). Other random rules (uniform,
# poisson: a client may take part in consecutive rounds, so they are not b-min-sep)
# would need an amplification analysis that is not implemented: refused, never
# certified by a heuristic.
CORRELATED_SELECTIONS = tuple(n for n, r in selection_lib.RULES.items()
                              if r.public_pattern or r.min_sep_poisson)
AMPLIFIED_SELECTIONS = tuple(n for n, r in selection_lib.RULES.items() if r.min_sep_poisson)
CORRELATED_FORMULAS = ("calibrated", "noise_multiplier")
# The host builds the T x T Gram matrix of the strategy for the accountant.
CORRELATED_MAX_ROUNDS = 4096


def _pass_length(cfg) -> int:
  """Rounds between a client's turns by design (the rule's ``period``: round robin's
  and cyclic's pass ``ceil(U / K)``, else 1, every client every round)."""
  return int(selection_lib.get_rule(cfg.server.selection).period(
      int(cfg.data.num_clients), int(cfg.server.clients_per_round), float(cfg.server.q)))


def correlated_strategy(cfg) -> correlated.Strategy | None:
  """The strategy ``C`` of a correlated ``privacy.mechanism`` (None otherwise), after
  :func:`check_correlated`: BandMF with ``privacy.bands`` bands (0: the round-robin
  pass length, so that a client's turns are about b apart, Choquette-Choo et al. 2023
  Thm. 2), the tree restarted every ``privacy.tree_restart`` rounds (0: every pass,
  Kairouz et al. 2021's restart per epoch; one tree when every client takes part
  every round), optimised for ``rounds``."""
  mech = cfg.privacy.mechanism
  if mech not in correlated.CORRELATED:
    return None
  check_correlated(cfg)
  rounds = int(cfg.rounds)
  per_pass = _pass_length(cfg)
  bands = int(cfg.privacy.get("bands", 0)) or per_pass
  restart = int(cfg.privacy.get("tree_restart", 0)) or (per_pass if per_pass > 1 else rounds)
  return correlated.get(mech).strategy(rounds, min(bands, rounds), min(restart, rounds))


def _patterns(cfg, u: int) -> np.ndarray:
  """``[U, T]`` who takes part in each round, from the rule's own sampler."""
  rule = selection_lib.get_rule(cfg.server.selection)
  k, q, seed = int(cfg.server.clients_per_round), float(cfg.server.q), int(cfg.seed)
  return correlated.realised_patterns(lambda t: rule.sample(u, k, q, seed, t), u,
                                      int(cfg.rounds))


def check_correlated(cfg) -> None:
  """Refuses a correlated mechanism (tree, bandmf) outside what its accounting covers.

  The matrix mechanism's guarantee (:mod:`fedjax_dp.privacy.correlated.base`) needs
  the noise of the server's aggregate of clipped updates (``privacy.placement=
  'central'``, a fixed clip), one noise multiplier for the whole run (the constant
  schedule; a formula that sizes it by our accountant or a multiplier), a public
  participation pattern (:data:`CORRELATED_SELECTIONS`), and a horizon the host can
  hold the Gram matrix of.

  Raises:
    ConfigError: naming the fields.
  """
  mech = cfg.privacy.mechanism
  if mech not in correlated.CORRELATED:
    return
  placement = cfg.privacy.placement
  if placement not in ("central", "none"):
    raise ConfigError(f"privacy.mechanism={mech!r} is noise correlated across rounds on the "
                      "server's aggregate: it needs privacy.placement='central' (or 'none'), "
                      f"got {placement!r}")
  if cfg.server.selection not in CORRELATED_SELECTIONS:
    raise ConfigError(
        f"privacy.mechanism={mech!r} with server.selection={cfg.server.selection!r}: a "
        "random selection in which a client can take part in rounds fewer than b apart "
        "is not b-min-sep sampling, and no amplification of the matrix mechanism under "
        "it is implemented (Choquette-Choo et al. 2023, Sec. 4 covers b-min-sep only); "
        f"use server.selection in {CORRELATED_SELECTIONS} (participation known in "
        f"advance, or b-min-sep Poisson: {AMPLIFIED_SELECTIONS}) or "
        "privacy.mechanism='gaussian' for amplified DP-FedAvg")
  if selection_lib.get_rule(cfg.server.selection).min_sep_poisson:
    _check_amplified(cfg)
  if cfg.schedule.name != "constant":
    raise ConfigError(f"privacy.mechanism={mech!r} adds one noise multiplier to the whole "
                      f"run: schedule.name must be 'constant', got {cfg.schedule.name!r}")
  if cfg.privacy.formula not in CORRELATED_FORMULAS:
    raise ConfigError(f"privacy.mechanism={mech!r} with privacy.formula="
                      f"{cfg.privacy.formula!r}: that formula is written for i.i.d. noise; "
                      f"use one of {CORRELATED_FORMULAS}")
  if cfg.server.get("clip_rule", "fixed") != "fixed":
    raise ConfigError(f"privacy.mechanism={mech!r} needs server.clip_rule='fixed' (one "
                      f"sensitivity for every round), got {cfg.server.clip_rule!r}")
  if not 1 <= int(cfg.rounds) <= CORRELATED_MAX_ROUNDS:
    raise ConfigError(f"privacy.mechanism={mech!r}: rounds must be in [1, "
                      f"{CORRELATED_MAX_ROUNDS}] (the host holds the T x T Gram matrix of "
                      f"the strategy), got {cfg.rounds}")


def _check_amplified(cfg) -> None:
  """A b-min-sep Poisson rule: only a banded strategy with ``b <= P`` bands is amplified
  (Choquette-Choo et al. 2023, Sec. 4; :mod:`fedjax_dp.privacy.correlated.bandmf`).

  Raises:
    ConfigError: a mechanism that is not banded (the tree), or ``b > P``.
  """
  mech = cfg.privacy.mechanism
  sel = cfg.server.selection
  if not correlated.get(mech).banded:
    raise ConfigError(
        f"privacy.mechanism={mech!r} with server.selection={sel!r}: the amplification "
        "of b-min-sep sampling (Choquette-Choo et al. 2023, Sec. 4) needs a b-banded "
        f"strategy C; {mech!r} is not banded (a node covers many rounds, so the columns of "
        "rounds P apart share nodes). "
        f"Use privacy.mechanism='bandmf', or a selection with a public pattern")
  period = _pass_length(cfg)
  bands = min(int(cfg.privacy.get("bands", 0)) or period, int(cfg.rounds))
  if bands > period:
    raise ConfigError(
        f"privacy.bands={bands} > the period P={period} of server.selection={sel!r}: "
        "a client's eligible rounds are P apart, so with more than P bands one client's "
        "columns of C overlap and the b-min-sep amplification (Choquette-Choo et al. "
        f"2023, Sec. 4) does not apply; use privacy.bands <= {period} (0: P)")


VALIDATIONS = ("server", "clients")
# The schedules that read a validation score (schedule.validation applies to them).
VALIDATING_SCHEDULES = ("adpfl",)


def validation_mode(cfg) -> str:
  """``'clients'`` when the run releases A-DPFL's score on the selected clients' data
  (``schedule.validation='clients'`` for a schedule that reads one), else ``'server'``."""
  mode = cfg.schedule.get("validation", "server")
  return "clients" if (mode == "clients" and cfg.schedule.name in VALIDATING_SCHEDULES
                       ) else "server"


def validation_sensitivity(counts: np.ndarray) -> float:
  """Replace-one-example sensitivity of the accuracy on the selected clients' data:
  ``1 / N_sel`` with ``N_sel = sum_{i in S} |D_i|`` (``counts`` of the selected).

  Proof. ``S_t = (1 / N_sel) sum_{i in S} sum_{x in D_i} 1[f_w(x) correct]`` where
  ``w`` is the new global model. ``w`` is the round's released output (a function of
  the noised releases), so in the adaptive composition it is fixed when the score's
  sensitivity is taken; the cohort S is drawn without reading examples, and the
  counts ``|D_i|`` are public (replace-one keeps them), so ``N_sel`` is the same on
  both neighbours. Replacing one example of one selected client changes one
  indicator by at most 1 and no other term, so ``|S_t - S'_t| <= 1 / N_sel``. A
  client that is not selected contributes nothing (``0`` change). With ``N_sel = 0``
  the score is 0 on every dataset.

  Accounting (:meth:`PrivacyPlan.event`). The round releases the model update
  (Gaussian, multiplier z at the same replace-one-example adjacency) and
  ``S_t + N(0, (z_val / N_sel)^2)``, both computed on the same cohort. For a fixed
  cohort the pair is an adaptive composition of Gaussian mechanisms, which is
  ``mu``-GDP with ``mu^2 = z^-2 + z_val^-2`` (Dong, Roth & Su 2022, Cor. 3.3), i.e.
  dominated by one Gaussian of multiplier ``(z^-2 + z_val^-2)^(-1/2)``. Subsampling
  acts on the dominating pair (Zhu, Dong & Wang 2022, Thm. 10-11), so the round is
  charged as the selection rule's event of that single Gaussian: amplified as the
  round itself for random rules, charged to the clients that took part for
  deterministic ones. Poisson minibatches (the run's :attr:`PrivacyPlan.adjacency`;
  under add/remove each client's count is public and held fixed,
  :data:`POISSON_ASSUMPTION`): ``N_sel`` is that public count, adding, removing or
  replacing one example moves the numerator by at most 1, so the sensitivity is
  again ``1 / N_sel``; those rounds claim no selection amplification
  and charge the clients that took part, so the score is one more Gaussian event
  composed for them (:meth:`PrivacyPlan.validation_event`). Not covered (refused by
  :func:`check_validation`): Laplace rounds and client-level releases (central
  placement, ``step_grad_*``).
  """
  n_sel = float(np.sum(np.asarray(counts, np.float64)))
  return 1.0 / max(n_sel, 1.0)


def check_validation(cfg, plan: PrivacyPlan | None = None) -> None:
  """Refuses a ``schedule.validation`` that is unknown, or ``'clients'`` where its
  release cannot be accounted (see :func:`validation_sensitivity`).

  Raises:
    ConfigError: naming the field.
  """
  mode = cfg.schedule.get("validation", "server")
  if mode not in VALIDATIONS:
    raise ConfigError(f"schedule.validation: unknown {mode!r}; known: {VALIDATIONS}")
  if validation_mode(cfg) != "clients":
    return
  z = float(cfg.schedule.get("val_noise_multiplier", 1.0))
  if plan is not None and plan.noiseless:
    return  # privacy off: the score is released as is, nothing is certified anyway
  if not (math.isfinite(z) and z > 0):
    raise ConfigError(f"schedule.val_noise_multiplier must be finite and > 0 with "
                      f"schedule.validation='clients' (the score reads the clients' data "
                      f"and is released with noise z_val / N_sel), got {z}")
  if cfg.privacy.mechanism != "gaussian":
    raise ConfigError("schedule.validation='clients' is accounted as a Gaussian release "
                      f"composed with the round's Gaussian: privacy.mechanism must be "
                      f"'gaussian', got {cfg.privacy.mechanism!r}; use "
                      "schedule.validation='server'")
  if clip_modes.get(cfg.client.clip_mode).level(cfg.privacy.placement) == "client":
    raise ConfigError("schedule.validation='clients' has an example-level sensitivity "
                      "(1 / N_sel) that does not compose with a client-level round "
                      f"(privacy.placement={cfg.privacy.placement!r}, client.clip_mode="
                      f"{cfg.client.clip_mode!r}); use schedule.validation='server'")


def private_median_split(z: float, count_std: float) -> float:
  """Noise multiplier ``z_sum`` of the clipped sum when the count of unclipped updates
  gets ``N(0, count_std^2)``, such that the round's joint release is a Gaussian
  mechanism of multiplier ``z`` (Andrew et al. 2021, Thm. 1, in our replace-one units):

  ``z_sum = (z^-2 - count_std^-2)^(-1/2)``.

  Proof. Replacing one client's data moves the noised aggregate by at most its
  sensitivity ``Delta`` (:func:`central_sensitivity` at the round's clip bound
  ``S_t``, which is a function of earlier releases only) and the count
  ``sum_i 1[||Delta_i|| <= S_t]`` by at most 1. Divide each part by its noise std
  (``z_sum Delta`` and ``count_std``): the pair becomes an isotropic unit Gaussian
  around a mean that moves by at most ``sqrt(z_sum^-2 + count_std^-2) = 1 / z``, i.e.
  one Gaussian mechanism of multiplier z, which the selection rule's event then
  amplifies as for a fixed bound (both parts are computed from the same cohort).

  Raises:
    ConfigError: ``count_std <= z`` (the count alone would spend more than the whole
      round's budget).
  """
  if not math.isfinite(z):
    return math.inf
  if not count_std > z:
    raise ConfigError(
        f"server.clip_count_std={count_std:g} must exceed the round's noise multiplier "
        f"z={z:g} for server.clip_rule='private_median': the noisy count takes "
        "count_std^-2 of the round's z^-2 (Andrew et al. 2021); raise it (their default "
        "is K/20) or the noise")
  return float((z ** -2 - count_std ** -2) ** -0.5)


def _check_clip_rule(cfg, clip_rule: str) -> None:
  """``server.clip_rule`` other than ``'fixed'`` needs central noise on ``update_l2``
  updates (the server clips the uploads), and ``'median'`` cannot meet a budget.

  Raises:
    ConfigError: naming the field.
  """
  if clip_rule not in ("fixed", "median", "private_median"):
    raise ConfigError(f"server.clip_rule: unknown {clip_rule!r}; known: "
                      "['fixed', 'median', 'private_median']")
  if clip_rule == "fixed":
    return
  if not clip_modes.get(cfg.client.clip_mode).server_clip or \
      cfg.privacy.placement not in ("central", "none"):
    modes = [n for n, m in clip_modes.CLIP_MODES.items() if m.server_clip]
    raise ConfigError(f"server.clip_rule={clip_rule!r} clips the clients' updates at the "
                      "server: it needs privacy.placement='central' and "
                      f"client.clip_mode in {', '.join(modes)} (got "
                      f"{cfg.privacy.placement!r}, {cfg.client.clip_mode!r})")
  if cfg.privacy.mechanism != "gaussian":
    raise ConfigError(f"server.clip_rule={clip_rule!r} is written for Gaussian noise "
                      f"(got privacy.mechanism={cfg.privacy.mechanism!r})")
  if clip_rule == "median" and cfg.privacy.enforce_budget:
    raise ConfigError("server.clip_rule='median' has certified epsilon inf (no sensitivity "
                      "bound): privacy.enforce_budget would stop it before the first round")


POISSON_FORMULAS = ("calibrated", "noise_multiplier")


def _check_poisson(cfg) -> None:
  """Refuses ``client.minibatch='poisson'`` where its accounting does not apply.

  The Poisson-subsampled Gaussian (:meth:`PrivacyPlan.poisson_step_event`) is proved
  for noise on each step's sum of L2-clipped per-example gradients: placement
  ``'step'``, ``per_example_l2``, the Gaussian mechanism, and a formula that sizes the
  noise by our accountant (``calibrated``) or by a multiplier. Elsewhere (noise on the
  upload after several Poisson steps, Laplace, papers' formulas written for other
  samplings) nothing here bounds it; ``placement='none'`` trains without noise.

  Raises:
    ConfigError: naming the field.
  """
  placement = cfg.privacy.placement
  if placement == "none":
    return
  if placement != "step":
    raise ConfigError("client.minibatch='poisson' is accounted for DP-SGD inside the "
                      "clients: it needs privacy.placement='step' (or 'none'), got "
                      f"{placement!r}")
  if not clip_modes.get(cfg.client.clip_mode).poisson_steps:
    modes = [n for n, m in clip_modes.CLIP_MODES.items() if m.poisson_steps]
    raise ConfigError(f"client.minibatch='poisson' needs client.clip_mode in {modes} "
                      f"(the subsampled Gaussian's L2 sensitivity C), got "
                      f"{cfg.client.clip_mode!r}")
  if cfg.privacy.mechanism != "gaussian":
    raise ConfigError("client.minibatch='poisson' is accounted as a subsampled Gaussian: "
                      f"privacy.mechanism must be 'gaussian', got {cfg.privacy.mechanism!r}")
  if cfg.privacy.formula not in POISSON_FORMULAS:
    raise ConfigError(f"client.minibatch='poisson' with privacy.formula="
                      f"{cfg.privacy.formula!r}: that formula is not written for Poisson "
                      f"minibatches; use one of {POISSON_FORMULAS}")


def _check_fu(cfg) -> None:
  """Refuses Fu et al.'s formulas outside the setting their bound is proved for.

  ``fu_thm1``/``fu_thm2`` size the noise for ``T_l`` releases of the update of E
  clipped full-gradient steps, each release noised once on upload, with a client
  taking a known number of turns. Anything else (another clip mode or placement, a
  random selection whose ``T_l`` is not fixed, the other mechanism) has no bound here.

  Raises:
    ConfigError: naming the field.
  """
  formula = cfg.privacy.formula
  if formula not in FU_FORMULAS:
    return
  if cfg.client.clip_mode not in FU_CLIP_MODES:
    raise ConfigError(f"privacy.formula={formula!r} needs client.clip_mode in "
                      f"{FU_CLIP_MODES} (got {cfg.client.clip_mode!r})")
  if cfg.privacy.placement != "upload":
    raise ConfigError(f"privacy.formula={formula!r} needs privacy.placement='upload' "
                      f"(got {cfg.privacy.placement!r})")
  if cfg.privacy.mechanism != FU_FORMULAS[formula]:
    raise ConfigError(f"privacy.formula={formula!r} is written for privacy.mechanism="
                      f"{FU_FORMULAS[formula]!r} (got {cfg.privacy.mechanism!r})")
  if not selection_lib.get_rule(cfg.server.selection).deterministic:
    raise ConfigError(f"privacy.formula={formula!r} counts each client's T_l turns: "
                      "server.selection must be deterministic ('round_robin', 'cyclic'), got "
                      f"{cfg.server.selection!r}")
  if cfg.schedule.name != "constant":
    raise ConfigError(f"privacy.formula={formula!r} fixes one noise scale for the run: "
                      f"schedule.name must be 'constant' (got {cfg.schedule.name!r})")
