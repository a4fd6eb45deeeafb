"""Geometric (amplitude-varying) noise, Yuan et al., with the online refinement of Theorem 2.

Round ``m = t + 1`` (1-based aggregation index; ``t`` is the 0-based round)
adds noise of variance ``Theta(m) = theta^(m-1) sigma^2`` (eq. (6)), i.e. the
amplitude (std) ``sigma_m = theta^((m-1)/2) sigma``: ``theta`` multiplies the
VARIANCE, so the std changes by ``sqrt(theta)`` per round. ``theta = 1`` is the
constant schedule.

Base amplitude (Theorem 1, eq. (8)): ``sigma^2 = 2 q Delta_s^2 S_M ln(1/delta) / eps^2``
with ``S_M = sum_{m=1}^M theta^-(m-1)``. The schedule derives it from the run's
formula through the NoiseContext: with ``sigma_c(M) = ctx.noise_fn(M)`` the
configured constant-schedule noise over ``M`` rounds, the budget is
``B_i = M / sigma_c,i(M)^2`` and ``sigma_i^2 = S_M / B_i`` (the geometric series
spends exactly the ``sum_m sigma_m^-2`` of the constant schedule). Eq. (8) is
``S_M / B`` with ``B = eps^2 / (2 q Delta_s^2 ln(1/delta))``, so for
``privacy.formula = 'yuan_eq8'`` (Remark 3 with the paper's ``Delta_s = 2 C / |D_k|``)
the base is eq. (8) as printed exactly, and for ``'yuan_eq8_corrected'`` it is the
corrected eq. (8) of spec E4; a refinement's ``F / B`` is then eq. (9) with the same
``Delta_s`` (``wei_eq10``, whose eq. (10) is Remark 3 in the plan's sensitivity,
likewise). :func:`yuan_base_sigma` computes either directly from the privacy
targets (``formulas.yuan_sigma_eq8`` / ``yuan_sigma_eq8_corrected``) so that the
engine wiring can choose. The ``sum sigma^-2`` view is the paper's accountant
(eqs. (16)-(17)); it is exact for Gaussian noise without subsampling and a
heuristic for ``q < 1`` (spec E6). With full participation the certified RDP
accountant composes the same way, so for ``privacy.formula = 'calibrated'`` the
base is the certified geometric calibration
(``calibration.calibrate_noise_multiplier(..., ratio=sqrt(theta))``, a test);
with subsampling it is not, and the run's certified epsilon is what counts. It
does not apply to Laplace noise (the config refuses the combination).

Online refinement (Section III-D, Theorem 2; ``schedule.refine = 1``). The
server watches the test loss of the global model. The rule, which the paper
leaves open and the spec (section 4, E13) recommends:

* "stops decreasing" after round ``m`` means ``loss_m >= loss_{m-1} - refine_tol``,
  compared with the PREVIOUS round (not the best so far), for
  ``refine_patience`` consecutive rounds (defaults 0 and 1: the spec's "loss did
  not decrease"). The initial model is not evaluated, so round 1 never fires
  (``loss_0 = +inf``); a NaN loss never fires.
* On a trigger after aggregation ``m`` the horizon shrinks ITERATIVELY,
  ``M' = ceil(alpha_d M_cur)`` (Fig. 5's staircase; not the original ``M``), and
  always by at least one round (``M' <= M_cur - 1``): Theorem 2 needs ``M' < M``
  and ``ceil(0.9 M) = M`` for ``M <= 10``.
* If ``M' <= m`` training ends after round ``m`` (the budget horizon is
  reached); the recorded horizon is then ``m``.
* Otherwise the base amplitude is re-solved and applies from round ``m + 1``
  on (the proof of Theorem 2 splits the sum as rounds ``1..m`` old, ``m+1..M'``
  new), with the absolute exponent: ``sigma_n^2 = theta^(n-1) (sigma')^2``.
  ``refine_exact = 0`` uses eq. (9) as printed (:func:`eq9_factor`):
  ``(sigma')^2 = F(theta, m, M') / B`` with ``F = S_m + M' - m`` (``theta > 1``),
  ``M'`` (``theta = 1``) and ``(theta^(1-m) - theta + theta^(m-M')) / (1 - theta)``
  (``theta < 1``). The ``theta < 1`` branch UNDER-COUNTS the spend (spec E9: the
  realised ``sum sigma_n^-2`` exceeds ``B``, by up to 1.76x at ``theta = 0.9``), so a
  refined ``theta < 1`` run is not private at the target under the paper's own
  accountant; :func:`projected_spend` shows it and a test pins it. For
  ``theta >= 1`` eq. (9) stays within the budget for one trigger (spec E11); for
  repeated triggers that is not proven (the state's ``spent`` is exact either
  way). ``refine_exact = 1`` is the spec's budget-exact rule:
  ``(sigma')^2 = sum_{n=m+1}^{M'} theta^-(n-1) / (B - P_m)`` with ``P_m`` the
  realised spend, which always ends exactly on the budget.
* Reading the test loss leaks information that no accountant charges; the paper
  does the same. Refinement needs ``eval.every = 1``; :func:`observe` raises a
  ``ValueError`` naming that field when a round carries no test loss.

Every round is charged to every client (as in CRD), so the noise is the same
for selected and idle clients and the server computes it centrally. Clients
without noise (``eps = inf``) keep ``sigma = 0`` and ``B = inf``.

Not implemented: the ``table_mode`` schedule ``Theta(m) = theta^m sigma_const^2``
that may explain the paper's Table II (spec E27); it is not calibrated for
``theta < 1``.

Parameters (``ctx.params``, from the ``schedule.*`` fields): ``theta`` (> 0, default 1),
``refine`` (0/1, default 0), ``alpha_d`` (in (0, 1), default 0.9; the paper uses
0.8 and 0.9), ``refine_patience`` (integer >= 1, default 1), ``refine_tol``
(>= 0, default 0) and ``refine_exact`` (0/1, default 0 = eq. (9) as printed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import formulas
from fedjax_dp.privacy.schedules.base import NoiseContext, RoundPlan, Schedule, constant_budget

PARAMS: Mapping[str, float] = {"theta": 1.0, "refine": 0.0, "alpha_d": 0.9,
                               "refine_patience": 1.0, "refine_tol": 0.0, "refine_exact": 0.0}

# ceil() guard: alpha_d M is an integer in exact arithmetic for some alpha_d (0.8 * 30 = 24)
# but may land just above it in floating point.
_CEIL_SLACK = 1e-9


class GeometricState(NamedTuple):
  """The geometric schedule's host-side state.

  Attributes:
    base: ``[U]`` the current base amplitude ``sigma`` (``sigma'`` after a refinement);
      round ``t`` uses ``base * theta^(t/2)``.
    budget: ``[U]`` ``B_i`` (``inf`` for clients without noise).
    spent: ``[U]`` realised ``sum_{n<=m} sigma_n^-2`` over completed rounds.
    horizon: the current ``M`` (``M'`` after refinements).
    horizons: the horizon recorded after every completed round.
    last_loss: the previous round's test loss (``+inf`` before the first).
    stall: consecutive rounds whose loss did not decrease.
    triggers: refinements so far.
    rounds: completed rounds.
    theta, refine, alpha_d, patience, tol, exact: the parameters.
  """

  base: np.ndarray
  budget: np.ndarray
  spent: np.ndarray
  horizon: int
  horizons: tuple[int, ...]
  last_loss: float
  stall: int
  triggers: int
  rounds: int
  theta: float
  refine: bool
  alpha_d: float
  patience: int
  tol: float
  exact: bool


def _param(ctx: NoiseContext, name: str) -> float:
  return float(ctx.params.get(name, PARAMS[name]))


def _flag(ctx: NoiseContext, name: str) -> bool:
  v = _param(ctx, name)
  if v not in (0.0, 1.0):
    raise ValueError(f"schedule.{name} must be 0 or 1, got {v}")
  return v == 1.0


def _number(x) -> float | None:
  """``float(x)`` for a real number (not a bool), else ``None``."""
  if isinstance(x, bool) or not isinstance(x, (int, float, np.floating)):
    return None
  return float(x)


def yuan_base_sigma(epsilon, delta: float, q: float, rounds: int, theta: float, sensitivity,
                    corrected: bool = False) -> np.ndarray:
  """``[U]`` eq. (8)'s base amplitude from the privacy targets (0 where ``eps = inf``).

  ``corrected=False`` is eq. (8) as printed (``formulas.yuan_sigma_eq8``);
  ``corrected=True`` the zCDP-exact variant of spec E4
  (``formulas.yuan_sigma_eq8_corrected``, 1.282x at eps = 10, delta = 1e-3).
  """
  eps = np.asarray(epsilon, np.float64)
  finite = np.isfinite(eps)
  e = np.where(finite, eps, 1.0)
  fn = formulas.yuan_sigma_eq8_corrected if corrected else formulas.yuan_sigma_eq8
  sigma = np.asarray(fn(e, delta, q, rounds, theta, sensitivity), np.float64)
  return np.where(finite, sigma, 0.0)


def base_from_constant(noise, rounds: int, theta: float) -> np.ndarray:
  """``sigma = sigma_c(M) sqrt(S_M / M)``: the geometric base that spends the constant
  schedule's ``sum sigma^-2 = M / sigma_c^2`` over the same ``M`` rounds."""
  s_m = float(formulas.yuan_geometric_sum(theta, rounds))
  return np.asarray(noise, np.float64) * math.sqrt(s_m / rounds)


def eq9_factor(theta: float, m: int, new_rounds: int) -> float:
  """Eq. (9) as printed: ``F`` with ``(sigma')^2 = F / B`` (all three branches).

  ``theta > 1``: ``(theta - theta^(1-m)) / (theta - 1) + M' - m``;
  ``theta = 1``: ``M'``; ``theta < 1``: ``(theta^(1-m) - theta + theta^(m-M')) / (1 - theta)``
  (wrong, spec E9: it is ``S_m + 1/(1-theta)`` at ``M' = m = M`` instead of ``S_M``).
  """
  if theta > 1:  # S_m + M' - m, with S_m evaluated stably near theta = 1
    return float(formulas.yuan_geometric_sum(theta, m)) + new_rounds - m
  if theta == 1:
    return float(new_rounds)
  return (theta ** (1 - m) - theta + theta ** (m - new_rounds)) / (1 - theta)


def exact_tail(theta: float, m: int, new_rounds: int) -> float:
  """``sum_{n=m+1}^{M'} theta^-(n-1) = theta^-m S_{M'-m}`` (0 if ``M' <= m``)."""
  if new_rounds <= m:
    return 0.0
  return theta ** (-m) * float(formulas.yuan_geometric_sum(theta, new_rounds - m))


def shrink_horizon(horizon: int, alpha_d: float) -> int:
  """``M' = ceil(alpha_d M)``, at least one round shorter (Theorem 2 needs ``M' < M``)."""
  return min(math.ceil(alpha_d * horizon - _CEIL_SLACK), horizon - 1)


def round_noise(state: GeometricState, t: int) -> np.ndarray:
  """``[U]`` round ``t``'s std ``base theta^(t/2)`` (eq. (6) with ``m = t + 1``)."""
  return state.base * state.theta ** (t / 2)


def projected_spend(state: GeometricState) -> np.ndarray:
  """``[U]`` realised spend plus what the rounds left up to the horizon will spend."""
  ts = np.arange(state.rounds, state.horizon)
  if ts.size == 0:
    return state.spent.copy()
  with np.errstate(divide="ignore"):
    inv_base = np.where(state.base > 0, 1.0 / np.square(state.base), 0.0)
  return state.spent + inv_base * float(np.sum(state.theta ** (-ts.astype(np.float64))))


def init(ctx: NoiseContext) -> GeometricState:
  """Base amplitude from the constant-schedule noise of ``M = ctx.rounds`` (module docstring).

  Raises:
    ValueError: a parameter out of range, naming the field.
  """
  theta = _param(ctx, "theta")
  if not (math.isfinite(theta) and theta > 0):
    raise ValueError(f"schedule.theta must be > 0, got {theta}")
  refine, exact = _flag(ctx, "refine"), _flag(ctx, "refine_exact")
  alpha_d = _param(ctx, "alpha_d")
  if not 0.0 < alpha_d < 1.0:
    raise ValueError(f"schedule.alpha_d must be in (0, 1), got {alpha_d}")
  patience = _param(ctx, "refine_patience")
  if not (patience >= 1 and patience == int(patience)):
    raise ValueError(f"schedule.refine_patience must be an integer >= 1, got {patience}")
  tol = _param(ctx, "refine_tol")
  if not (math.isfinite(tol) and tol >= 0):
    raise ValueError(f"schedule.refine_tol must be >= 0, got {tol}")
  rounds, noise, budget = constant_budget(ctx)
  return GeometricState(base_from_constant(noise, rounds, theta), budget, np.zeros_like(noise),
                        rounds, (), math.inf, 0, 0, 0, theta, refine, alpha_d, int(patience),
                        tol, exact)


def plan(state: GeometricState, t: int) -> RoundPlan:
  """Round ``t``'s noise ``base theta^(t/2)``; stops once ``t`` reaches the horizon."""
  stop = t >= state.horizon
  noise = np.zeros_like(state.base) if stop else round_noise(state, t)
  return RoundPlan(noise, 0.0, 1.0, stop, state.horizon)


def _refined_base(state: GeometricState, m: int, new_rounds: int, spent: np.ndarray):
  """``[U]`` ``sigma'`` by eq. (9) or the exact rule; ``None`` if the budget is spent."""
  if state.exact:
    room = state.budget - spent
    if np.any(room[np.isfinite(state.budget)] <= 0):
      return None
    with np.errstate(divide="ignore", invalid="ignore"):
      var = exact_tail(state.theta, m, new_rounds) / room
  else:
    with np.errstate(divide="ignore"):
      var = eq9_factor(state.theta, m, new_rounds) / state.budget
  return np.where(np.isfinite(state.budget), np.sqrt(var), 0.0)


def observe(state: GeometricState, t: int, metrics: Mapping[str, float]) -> GeometricState:
  """Charges round ``t`` and, with refinement on, applies the trigger of Theorem 2.

  Args:
    state: the state :func:`plan` used for round ``t``.
    t: the round just finished (0-based; aggregation ``m = t + 1``).
    metrics: that round's metrics; refinement reads ``test_loss``.

  Raises:
    ValueError: rounds observed out of order, or refinement on and the round has
      no numeric ``test_loss`` (set ``eval.every = 1``).
  """
  if t != state.rounds:
    raise ValueError(f"geometric observed round {t}, expected round {state.rounds}")
  sigma = round_noise(state, t)
  with np.errstate(divide="ignore"):
    spent = state.spent + np.where(sigma > 0, 1.0 / np.square(sigma), 0.0)
  state = state._replace(spent=spent, rounds=t + 1)
  if not state.refine:
    return state._replace(horizons=(*state.horizons, state.horizon))
  loss = _number(metrics.get("test_loss"))
  if loss is None:
    raise ValueError(
        f"schedule 'geometric' with schedule.refine=1 watches the test loss after every round "
        f"(Yuan et al. Sec. III-D) but round {t + 1} has no test loss (got "
        f"{metrics.get('test_loss')!r}); set eval.every=1")
  stalled = bool(loss >= state.last_loss - state.tol)   # NaN compares False
  stall = state.stall + 1 if stalled else 0
  horizon, base, triggers = state.horizon, state.base, state.triggers
  m = t + 1
  if stall >= state.patience:
    stall, triggers = 0, triggers + 1
    new = shrink_horizon(horizon, state.alpha_d)
    refined = None if new <= m else _refined_base(state, m, new, spent)
    if refined is None:
      horizon = m   # budget horizon reached: training ends after this round
    else:
      horizon, base = new, refined
  return state._replace(base=base, horizon=horizon, horizons=(*state.horizons, horizon),
                        last_loss=loss, stall=stall, triggers=triggers)


def check(inputs) -> None:
  """The budget is a Gaussian one; ``refine=1`` reads the test loss every round
  (:class:`fedjax_dp.privacy.inputs.PrivacyInputs`).

  Raises:
    ConfigError: a Laplace mechanism, or ``refine=1`` with ``eval.every != 1``.
  """
  p = inputs.privacy
  if p.mechanism != "gaussian":
    raise ConfigError("schedule.name='geometric' spreads a Gaussian budget (sum of "
                      "sigma^-2, Yuan eq. (16)): privacy.mechanism="
                      f"{p.mechanism!r} is not bounded by it")
  refine = float(p.schedule_params.get("refine", PARAMS["refine"]))
  if refine == 1.0 and int(p.eval_every) != 1:
    raise ConfigError("schedule.refine=1 watches the test loss every round: set eval.every=1 "
                      f"(got eval.every={p.eval_every})")


SCHEDULE = Schedule(init, plan, observe, check,
                    # refinement reads the test loss; without it the sequence is fixed
                    open_loop=lambda params: float(params.get("refine", PARAMS["refine"])) == 0.0)
