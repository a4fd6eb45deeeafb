"""CRD: communication rounds discounting (Wei et al., Algorithm 2, Sec. 4.2-4.3).

The server watches the test loss ``V`` of the global model. After round ``t`` it
compares ``V(w^t)`` with ``V(w^{t+1})``; when the decrease is below ``zeta``
(Alg. 2 line 11) it shortens the horizon (line 12)::

  T <- floor(beta (T - t)) + t

and every client's noise for the next round follows Theorem 4, eq. (25)::

  sigma_i^t = sqrt((T - t) / (B_i - sum_{tau<t} (sigma_i^tau)^-2)),
  B_i = eps_i^2 / (2 q Delta_i^2 ln(1/delta_i)),

i.e. the budget left is spread evenly over the rounds left. Training stops when
``t`` reaches ``T``. Properties (spec ``wei_udp_crd.md`` sections 3.6 and 5):

* never triggered, CRD is Algorithm 1 (the constant schedule) with ``T = T0``;
* while ``T`` is unchanged ``sigma^{t+1} = sigma^t`` (eqs. (30)-(31));
* a discount after round ``t`` lowers the next sigma by
  ``sqrt((T_new - t - 1) / (T_old - t - 1))``;
* ``sum_tau (sigma_i^tau)^-2`` reaches exactly ``B_i`` when training ends at a
  ``T`` that the last round did not cut.

Resolutions of the paper's open points (spec section 5 pseudo-code and section
10 items 9, 10, 15, 16):

* Rounds are 0-based and the sum in (25) runs over the ``t`` completed rounds
  ``0..t-1`` (item 9).
* Every round is charged to every client, selected or not (item 10): the
  q-subsampled accountant charges every round, so ``sigma_i^t`` is the same
  whether or not client ``i`` is picked and the server computes it centrally.
* ``V(w^0)`` is taken as ``+inf``: the run loop does not evaluate the initial
  model, so the trigger cannot fire after round 0; the first comparison is
  ``V(w^1)`` vs ``V(w^2)`` after round 1 (item 15). From a random initialisation
  the first round lowers the loss by far more than ``zeta``, so the paper's
  trigger would (almost surely) not fire there either.
* ``V`` is the ``test_loss`` metric of the run loop (its test set stands in for
  the mean of the clients' local test splits, item 15). CRD therefore needs an
  evaluation after EVERY round (``eval.every = 1``); :func:`observe` raises a
  ``ValueError`` naming that field when a round's metrics carry no test loss.
  Reading the test loss leaks information that no accountant charges; the paper
  does the same.
* A discount after round ``t`` never sets ``T`` below ``t + 1`` (round ``t`` has
  already run). If ``floor(beta (T - t)) + t <= t + 1``, training ends after this
  round and returns the latest model (item 16); the recorded horizon is then the
  number of rounds actually run.

Where ``B_i`` comes from: ``B_i = T0 / sigma_i(T0)^2`` with ``sigma_i(T0) =
ctx.noise_fn(T0)``, the configured formula's constant-schedule noise. For
``privacy.formula = 'wei_eq10'`` this is exactly eq. (25)'s
``eps_i^2 / (2 q Delta_i^2 ln(1/delta_i))`` (eq. (10) inverted), and CRD's first
round equals the constant schedule's for every formula. For other formulas the
same even-spreading rule applies to the budget ``sum sigma^-2`` they imply,
which is exact for accountants that compose as ``sum sigma^-2`` (Gaussian, no
subsampling) and an approximation otherwise; the certified epsilon is recorded
either way. Eq. (25) is a Gaussian rule: it does not apply to Laplace noise.
Clients without noise (``eps = inf``) keep ``sigma = 0``; their ``B`` is ``inf``.

Parameters (``ctx.params``, from the ``schedule.*`` fields): ``beta`` (discount factor in
(0, 1), default 0.9) and ``zeta`` (trigger threshold, default 0.001).

The authors' code differs (spec section 10 item 15, Appendix A): it monitors the
mean training loss, fires on "loss did not decrease" (``zeta = 0``) and uses
``T <- ceil(beta T)``; not implemented here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy.schedules.base import NoiseContext, RoundPlan, Schedule, constant_budget

# Defaults of the schedule's config fields (``schedule.<name>``); spec section 7.1
# and Figs. 8-13: zeta = 0.001, beta = 0.9.
PARAMS: Mapping[str, float] = {"beta": 0.9, "zeta": 0.001}

# floor() guard: beta (T - t) is an integer in exact arithmetic for some betas
# (0.7 * 30 = 21) but may land just below it in floating point.
_FLOOR_SLACK = 1e-9


class CrdState(NamedTuple):
  """CRD's host-side state.

  Attributes:
    budget: ``[U]`` ``B_i``, the total ``sum_tau (sigma_i^tau)^-2`` allowed
      (``inf`` for clients without noise).
    spent: ``[U]`` ``S_i = sum_{tau<t} (sigma_i^tau)^-2`` over completed rounds.
    horizon: the current ``T``.
    last_loss: ``V(w^t)``, the test loss after the last completed round
      (``+inf`` before the first one: ``V(w^0)`` is not observed).
    triggers: how many times the discount fired.
    rounds: completed rounds (the ``t`` that :func:`observe` expects next).
    beta: discount factor.
    zeta: trigger threshold.
  """

  budget: np.ndarray
  spent: np.ndarray
  horizon: int
  last_loss: float
  triggers: int
  rounds: int
  beta: float
  zeta: float


def _param(ctx: NoiseContext, name: str) -> float:
  return float(ctx.params.get(name, PARAMS[name]))


def eq25_sigma(budget: np.ndarray, spent: np.ndarray, horizon: int, t: int) -> np.ndarray:
  """Eq. (25): ``sigma_i^t = sqrt((T - t) / (B_i - S_i))``, 0-based ``t``.

  Args:
    budget: ``[U]`` ``B_i`` (``inf`` means no noise: sigma is 0).
    spent: ``[U]`` ``S_i = sum_{tau<t} (sigma_i^tau)^-2``.
    horizon: ``T``.
    t: the round about to run.

  Returns:
    ``[U]`` noise std; ``inf`` where ``t >= T`` or the budget is exhausted.
  """
  budget = np.asarray(budget, np.float64)
  left = float(horizon - t)
  room = budget - np.asarray(spent, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    sigma = np.sqrt(left / room)
  sigma = np.where((room > 0) & (left > 0), sigma, np.inf)
  return np.where(np.isinf(budget) & (left > 0), 0.0, sigma)


def discount_horizon(horizon: int, t: int, beta: float) -> int:
  """Alg. 2 line 12: ``T <- floor(beta (T - t)) + t``, never below ``t + 1``.

  ``t`` is the round just finished (before the increment, spec item 16); it has
  run, so the horizon cannot drop below ``t + 1`` (which ends training now).
  """
  cut = math.floor(beta * (horizon - t) + _FLOOR_SLACK) + t
  return max(cut, t + 1)


def init(ctx: NoiseContext) -> CrdState:
  """Starts at ``T = T0`` with eq. (25)'s budget (module docstring).

  Raises:
    ValueError: ``beta`` outside (0, 1) or ``zeta`` not finite, naming the field.
  """
  beta, zeta = _param(ctx, "beta"), _param(ctx, "zeta")
  if not 0.0 < beta < 1.0:
    raise ValueError(f"schedule.beta must be in (0, 1) for CRD, got {beta}")
  if not math.isfinite(zeta):
    raise ValueError(f"schedule.zeta must be finite, got {zeta}")
  rounds, _, budget = constant_budget(ctx)
  return CrdState(budget, np.zeros_like(budget), rounds, math.inf, 0, 0, beta, zeta)


def plan(state: CrdState, t: int) -> RoundPlan:
  """Round ``t``'s noise from eq. (25); stops once ``t`` reaches ``T``."""
  sigma = eq25_sigma(state.budget, state.spent, state.horizon, t)
  stop = t >= state.horizon or not bool(np.all(np.isfinite(sigma)))
  noise = np.zeros_like(state.budget) if stop else sigma
  return RoundPlan(noise, 0.0, 1.0, stop, state.horizon)


def observe(state: CrdState, t: int, metrics: Mapping[str, float]) -> CrdState:
  """Charges round ``t`` to every client and applies the trigger (Alg. 2 lines 11-12).

  Args:
    state: the state :func:`plan` used for round ``t``.
    t: the round just finished (0-based).
    metrics: that round's metrics; reads ``test_loss`` = ``V(w^{t+1})``.

  Raises:
    ValueError: the metrics carry no numeric ``test_loss`` (evaluation skipped:
      set ``eval.every = 1``), or rounds are observed out of order.
  """
  if t != state.rounds:
    raise ValueError(f"CRD observed round {t}, expected round {state.rounds}")
  loss = metrics.get("test_loss")
  if isinstance(loss, bool) or not isinstance(loss, (int, float, np.floating)):
    raise ValueError(
        f"schedule 'crd' compares the test loss after every round (Wei et al. Alg. 2 "
        f"line 11) but round {t + 1} has no test loss (got {loss!r}); set eval.every=1")
  loss = float(loss)
  sigma = eq25_sigma(state.budget, state.spent, state.horizon, t)
  with np.errstate(divide="ignore"):
    charge = np.where(sigma > 0, 1.0 / np.square(sigma), 0.0)
  # inf - V = inf before the first observation, so round 0 never fires; a NaN
  # loss compares False and never fires either (the run loop stops on it).
  fired = bool(state.last_loss - loss < state.zeta)
  horizon = discount_horizon(state.horizon, t, state.beta) if fired else state.horizon
  return state._replace(spent=state.spent + charge, horizon=horizon, last_loss=loss,
                        triggers=state.triggers + int(fired), rounds=t + 1)


def check(inputs) -> None:
  """CRD reads the test loss after every round
  (:class:`fedjax_dp.privacy.inputs.PrivacyInputs`).

  Raises:
    ConfigError: ``eval.every != 1``.
  """
  every = inputs.privacy.eval_every
  if int(every) != 1:
    raise ConfigError("schedule.name='crd' watches the test loss every round: set eval.every=1 "
                      f"(got eval.every={every})")


SCHEDULE = Schedule(init, plan, observe, check)
