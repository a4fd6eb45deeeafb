"""The registry of ``privacy.formula``: how each formula sets a constant schedule's noise,
the epsilon it claims, and the setting it is written for.

A :class:`Formula` is a peer in :data:`FORMULAS`: its noise scale for ``rounds``
rounds at per-client targets eps, the epsilon its paper claims after the rounds run
so far (``None``: the certified one), and -- for a paper's formula -- the mechanism
and clip modes it is written for (:attr:`Formula.check`, which reads the clip mode's
own fields, never its name) and the sensitivity its paper sizes the noise with
(:attr:`Formula.paper_sensitivity`). The closed forms themselves live in the
paper modules of :mod:`fedjax_dp.privacy.formulas`. The certified epsilon is the
accountant's whatever a formula claims; ``summary.json`` shows both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import calibration, clip_modes, formulas
from fedjax_dp.privacy import selection as selection_lib

if TYPE_CHECKING:  # annotations only: the plan and its ledger read this registry
  from fedjax_dp.privacy.ledger import AccountantState
  from fedjax_dp.privacy.plan import PrivacyPlan


def _no_check(inputs: Any, mode: Any) -> None:
  """A formula written for every mechanism, clip mode and selection."""


class Formula(NamedTuple):
  """How ``privacy.formula`` sets the noise and what it claims.

  Attributes:
    noise_scale: ``(plan, eps [U], rounds) -> [U]`` noise scale (std, or Laplace b)
      of a constant schedule of ``rounds`` rounds for finite targets ``eps``.
    claimed: ``(plan, state) -> float`` the epsilon the formula claims after
      ``state.rounds`` rounds (worst client); ``None``: the certified epsilon.
    summary: one line for the catalog (``fedjax-dp list``).
    mechanism: the noise the paper writes the formula for (None: any).
    accountant_sized: the noise is sized by the certified accountant (or a given
      multiplier), not by a paper's closed form for one sampling: correlated noise
      and Poisson minibatches admit it.
    check: ``(inputs, mode) -> None`` refuses a run
      (:class:`fedjax_dp.privacy.inputs.PrivacyInputs`, its
      :class:`~fedjax_dp.privacy.clip_modes.ClipMode`) outside the setting the
      formula is written for, naming the fields.
    paper_sensitivity: None, or ``(inputs, counts [U]) -> [U] | None`` the
      sensitivity the paper sizes its noise and its claim with, when it differs from
      the true one (the plan's ``claimed_sensitivity``).
    reads: the config fields the formula reads that not every formula reads
      (``privacy.noise_multiplier``): a config that sets one away from its default
      while picking a formula that does not read it is refused
      (:func:`fedjax_dp.config.unread_fields`).
    meets_target: the formula promises that the run certifies at most
      ``privacy.epsilon``: the run loop fits an open-loop schedule's noise to the
      certified accountant and stops any run before a round that would pass the
      target (:mod:`fedjax_dp.host.schedule_fit`).
  """

  noise_scale: Callable[..., np.ndarray]
  claimed: Callable[..., float] | None = None
  summary: str = ""
  mechanism: str | None = None
  accountant_sized: bool = False
  check: Callable[[Any, Any], None] = _no_check
  paper_sensitivity: Callable[..., np.ndarray | None] | None = None
  reads: tuple[str, ...] = ()
  meets_target: bool = False


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


def _modes_with(has: Callable[[clip_modes.ClipMode], bool]) -> tuple[str, ...]:
  """The registered clip modes with a property (named in a refusal)."""
  return tuple(n for n, m in clip_modes.CLIP_MODES.items() if has(m))




def _yuan_check(inputs, mode: clip_modes.ClipMode) -> None:
  """Yuan et al.'s formulas size the noise from the paper's ``Delta_s = 2 C / |D_k|``
  and need Algorithm 1: noise on the upload of a mode whose upload lies in a ball of
  radius C whatever the data (``Proof.upload_ball`` of the clip mode: ``param_l2`` projects the
  parameters, ``update_l2`` the update around the shared global model -- the other
  reading of Algorithm 1's C-ball, spec 7.3 item 12 -- both of true sensitivity 2 C,
  which the certified column uses)."""
  placement = inputs.privacy.placement
  if placement == "none":
    return
  if placement != "upload" or not mode.proof.upload_ball:
    raise ValueError(f"privacy.formula={inputs.privacy.formula!r} is Yuan et al.'s "
                     "Algorithm 1: it needs privacy.placement='upload' and client.clip_mode "
                     f"in {', '.join(_modes_with(lambda m: m.proof.upload_ball))} (got "
                     f"{placement!r}, {mode.name!r})")
  want, formula = FORMULAS[inputs.privacy.formula].mechanism, inputs.privacy.formula
  if inputs.privacy.mechanism != want:
    raise ValueError(f"privacy.formula={formula!r} calibrates {want} noise: set "
                     f"privacy.mechanism={want!r} (got {inputs.privacy.mechanism!r})")


def _yuan_sensitivity(inputs, counts: np.ndarray) -> np.ndarray | None:
  """The paper's ``Delta_s = 2 C / |D_k|`` (Sec. III)."""
  if inputs.privacy.placement == "none":
    return None
  return np.asarray(formulas.yuan_sensitivity(float(inputs.client.clip), counts), np.float64)


def _fu_check(inputs, mode: clip_modes.ClipMode) -> None:
  """Fu et al.'s formulas size the noise for ``T_l`` releases of the update of E
  clipped steps, each release noised once on upload, with a client taking a known
  number of turns: a mode whose upload is a CLIENT-level release (the step's mean
  gradient clipped, not its examples: ``step_grad_*``), upload noise of the paper's
  mechanism, a deterministic selection, a constant schedule. Anything else has no
  bound here.

  Raises:
    ConfigError: naming the field.
  """
  p, formula = inputs.privacy, inputs.privacy.formula
  if mode.level("upload") != "client":
    raise ConfigError(f"privacy.formula={formula!r} needs client.clip_mode in "
                      f"{_modes_with(lambda m: m.level('upload') == 'client')} "
                      f"(got {mode.name!r})")
  if p.placement != "upload":
    raise ConfigError(f"privacy.formula={formula!r} needs privacy.placement='upload' "
                      f"(got {p.placement!r})")
  want = FORMULAS[formula].mechanism
  if p.mechanism != want:
    raise ConfigError(f"privacy.formula={formula!r} is written for privacy.mechanism="
                      f"{want!r} (got {p.mechanism!r})")
  if not selection_lib.get_rule(inputs.server.selection).deterministic:
    raise ConfigError(f"privacy.formula={formula!r} counts each client's T_l turns: "
                      "server.selection must be deterministic ('round_robin', 'cyclic'), got "
                      f"{inputs.server.selection!r}")
  if p.schedule != "constant":
    raise ConfigError(f"privacy.formula={formula!r} fixes one noise scale for the run: "
                      f"schedule.name must be 'constant' (got {p.schedule!r})")


def _fu_sensitivity(inputs, counts: np.ndarray) -> np.ndarray:
  """The paper's ``Xi = eta~ E zeta`` (Theorems 1/2; half the replace-one one, spec A7)."""
  c = inputs.client
  return np.full(counts.size, float(formulas.fu_sensitivity(
      float(np.max(c.lr_array)), int(c.local_steps), float(c.clip))))


def _yuan(scale, claimed, mechanism: str, summary: str) -> Formula:
  return Formula(scale, claimed, summary, mechanism, check=_yuan_check,
                 paper_sensitivity=_yuan_sensitivity)


def _fu(scale, mechanism: str, summary: str) -> Formula:
  return Formula(scale, _fu_claimed, summary, mechanism, check=_fu_check,
                 paper_sensitivity=_fu_sensitivity)


# privacy.formula -> Formula. Wei eq. (10) is the paper's formula as printed (it
# overspends above epsilon ~4.6, specs/wei_udp_crd.md errata): an explicit choice,
# never the default. Yuan et al.'s formulas: the noise from the paper's
# Delta_s = 2 C / |D_k|, the claim in it too; the certified epsilon uses the plan's
# true sensitivity (param_l2: 2 C, L1 2 C sqrt(d)).
FORMULAS: dict[str, Formula] = {
    "calibrated": Formula(
        _calibrated_scale, summary="the smallest noise whose certified epsilon meets "
        "(eps, delta) (default)", accountant_sized=True, meets_target=True),
    "wei_eq10": Formula(_wei_eq10_scale, _wei_eq10_claimed,
                        "Wei et al. eq. (10) as printed (overspends above eps ~4.6)"),
    "noise_multiplier": Formula(
        _multiplier_scale, summary="a fixed multiplier, privacy.noise_multiplier (epsilon "
        "is reported, not requested)", accountant_sized=True,
        reads=("privacy.noise_multiplier",)),
    "yuan_eq8": _yuan(_yuan_eq8_scale, _yuan_eq8_claimed, "gaussian",
                      "Yuan et al. Remark 3 (eq. (8), theta = 1) with the paper's "
                      "Delta_s = 2C/|D_k|"),
    "yuan_eq8_corrected": _yuan(_yuan_eq8_corrected_scale, _yuan_eq8_corrected_claimed,
                                "gaussian", "Yuan et al. eq. (8) corrected, paper's Delta_s"),
    "yuan_laplace": _yuan(_yuan_laplace_scale, _yuan_laplace_claimed, "laplace",
                          "Laplace b = M Delta_s / eps (basic composition of eps / M per "
                          "round)"),
    "yuan_laplace_matched": _yuan(_yuan_laplace_matched_scale, _yuan_laplace_claimed,
                                  "laplace", "Laplace with the variance of Yuan's Remark 3 "
                                  "Gaussian"),
    "fu_thm1": _fu(_fu_thm1_scale, "laplace",
                   "Fu et al. Theorem 1: Laplace beta = T_l eta E zeta / eps"),
    "fu_thm2": _fu(_fu_thm2_scale, "gaussian",
                   "Fu et al. Theorem 2: Gaussian by the zCDP calibration"),
}
DEFAULT_FORMULA = "calibrated"


def accountant_sized() -> tuple[str, ...]:
  """The formulas that size the noise by our accountant or a multiplier."""
  return tuple(n for n, f in FORMULAS.items() if f.accountant_sized)


def get_formula(name: str) -> Formula:
  """The formula called ``name``.

  Raises:
    ValueError: an unknown name, naming ``privacy.formula``.
  """
  if name not in FORMULAS:
    raise ValueError(f"privacy.formula: unknown {name!r}; known: {tuple(FORMULAS)}")
  return FORMULAS[name]
