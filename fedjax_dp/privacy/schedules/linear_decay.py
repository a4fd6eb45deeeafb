"""Linear noise decay: "Lei's approach", the baseline of Wei et al. Sec. 5.4.

Wei et al. describe it in one sentence: "the STD of added noise will be reduced
linearly until the privacy loss is larger than a preset eps_p" (their ref. [29],
Yu, Liu, Pu, Gursoy, Truex, "Differentially private model publishing for deep
learning", IEEE S&P 2019). Nothing else is given (spec ``wei_udp_crd.md``
section 6, section 7.3 item 13). We implement the spec's recommendation; each
point below is an ASSUMPTION, not the paper:

* ``sigma_i^0`` is the configured formula's constant-schedule noise for
  ``T0`` = the configured ``rounds`` rounds (eq. (10) for ``privacy.formula = 'wei_eq10'``).
* ``sigma_i^t = max(sigma_i^0 - k_i t, sigma_i^min)`` with slope
  ``k_i = decay_fraction * sigma_i^0 / T0`` (the spec's example
  ``k = sigma^0 / (2 T0)`` is ``decay_fraction = 0.5``) and floor
  ``sigma_i^min = decay_floor * sigma_i^0``: the noise never reaches zero.
* The privacy loss is the same accountant as UDP's: the claimed
  ``eps_i(t) = Delta_i sqrt(2 q ln(1/delta_i) sum_{tau<t} (sigma_i^tau)^-2)``,
  i.e. the budget ``B_i = T0 / (sigma_i^0)^2`` of eq. (25) (``eps_i^2 / (2 q
  Delta_i^2 ln(1/delta_i))`` for eq. (10)). Every round is charged to every
  client, as in CRD.
* Training stops BEFORE the first round whose charge would take the privacy
  loss past the target: round ``t`` runs only if
  ``sum_{tau<=t} (sigma_i^tau)^-2 <= B_i`` for every client.

Since every round's sigma is at most ``sigma^0``, each round costs at least
``B / T0`` and the run never lasts longer than ``T0`` rounds; with the defaults
(``decay_fraction = 0.5``, floor not reached) it stops after about ``2 T0 / 3``
rounds (the continuous solution of ``int_0^n (1 - x / (2 T0))^-2 dx = T0``).
``decay_fraction = 0`` recovers the constant schedule exactly.

With ``sigma_i^0``, ``k_i`` and the floor all proportional to ``sigma_i^0``, every
client spends the same fraction of its budget each round, so the stopping round
is common to all clients and known in advance (the schedule ignores feedback);
it is the recorded horizon. If ``privacy.enforce_budget`` is on, the run loop
additionally stops on the certified epsilon.

Yu et al. themselves use zCDP accounting and several decay shapes (time-based
``sigma_0 / (1 + k t)``, exponential, step, validation-based); only the linear
one that Wei et al. name is implemented here.

Parameters (``ctx.params``, from the ``schedule.*`` fields): ``decay_fraction`` (>= 0,
default 0.5) and ``decay_floor`` (in (0, 1], default 0.1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fedjax_dp.privacy.schedules.base import NoiseContext, RoundPlan, Schedule, constant_budget

PARAMS: Mapping[str, float] = {"decay_fraction": 0.5, "decay_floor": 0.1}

# Relative slack on the budget test: with decay_fraction = 0 the T0 equal charges
# sum to B only up to rounding, and the last round must still run.
_BUDGET_RTOL = 1e-9


class LinearDecayState(NamedTuple):
  """Linear decay's host-side state.

  Attributes:
    sigma0: ``[U]`` initial noise std ``sigma_i^0`` (0 for clients without noise).
    decay_fraction: fraction of ``sigma^0`` removed over ``T0`` rounds.
    decay_floor: ``sigma^min / sigma^0``.
    rounds0: ``T0``, the configured horizon the decay is measured against.
    budget: ``[U]`` ``B_i = T0 / (sigma_i^0)^2`` (``inf`` without noise).
    spent: ``[U]`` ``sum_{tau<t} (sigma_i^tau)^-2`` over completed rounds.
    horizon: the round before which the budget stops training.
    rounds: completed rounds.
  """

  sigma0: np.ndarray
  decay_fraction: float
  decay_floor: float
  rounds0: int
  budget: np.ndarray
  spent: np.ndarray
  horizon: int
  rounds: int


def _param(ctx: NoiseContext, name: str) -> float:
  return float(ctx.params.get(name, PARAMS[name]))


def decay_factor(t, decay_fraction: float, decay_floor: float, rounds0: int) -> np.ndarray:
  """``sigma^t / sigma^0 = max(1 - decay_fraction t / T0, decay_floor)`` (vectorised in ``t``)."""
  t = np.asarray(t, np.float64)
  return np.maximum(1.0 - decay_fraction * t / rounds0, decay_floor)


def stopping_round(decay_fraction: float, decay_floor: float, rounds0: int) -> int:
  """Number of rounds that fit the budget: the largest ``n`` with
  ``sum_{t<n} (sigma^t / sigma^0)^-2 <= T0`` (i.e. ``sum sigma^-2 <= B``).

  It is at most ``T0`` (each factor is <= 1) and the same for every client.
  """
  r = decay_factor(np.arange(rounds0), decay_fraction, decay_floor, rounds0)
  cost = np.cumsum(1.0 / np.square(r))
  return int(np.searchsorted(cost, rounds0 * (1 + _BUDGET_RTOL), side="right"))


def init(ctx: NoiseContext) -> LinearDecayState:
  """``sigma^0`` from the configured formula for ``T0`` rounds; precomputes the stop.

  Raises:
    ValueError: ``decay_fraction < 0`` or ``decay_floor`` outside (0, 1], naming
      the field.
  """
  frac, floor = _param(ctx, "decay_fraction"), _param(ctx, "decay_floor")
  if not (math.isfinite(frac) and frac >= 0):
    raise ValueError(f"schedule.decay_fraction must be >= 0, got {frac}")
  if not 0.0 < floor <= 1.0:
    raise ValueError(f"schedule.decay_floor must be in (0, 1], got {floor}")
  rounds0, sigma0, budget = constant_budget(ctx)
  horizon = stopping_round(frac, floor, rounds0)
  return LinearDecayState(sigma0, frac, floor, rounds0, budget, np.zeros_like(sigma0),
                          horizon, 0)


def round_noise(state: LinearDecayState, t: int) -> np.ndarray:
  """``[U]`` ``sigma_i^t = sigma_i^0 max(1 - decay_fraction t / T0, decay_floor)``."""
  return state.sigma0 * float(decay_factor(t, state.decay_fraction, state.decay_floor,
                                           state.rounds0))


def plan(state: LinearDecayState, t: int) -> RoundPlan:
  """Round ``t``'s linearly decayed noise; stops before the round that would pass the budget."""
  return RoundPlan(round_noise(state, t), 0.0, 1.0, t >= state.horizon, state.horizon)


def observe(state: LinearDecayState, t: int,
            metrics: Mapping[str, float]) -> LinearDecayState:
  """Charges round ``t`` to every client (the decay itself ignores ``metrics``)."""
  del metrics  # time-based decay: no feedback
  if t != state.rounds:
    raise ValueError(f"linear_decay observed round {t}, expected round {state.rounds}")
  sigma = round_noise(state, t)
  with np.errstate(divide="ignore"):
    charge = np.where(sigma > 0, 1.0 / np.square(sigma), 0.0)
  return state._replace(spent=state.spent + charge, rounds=t + 1)


SCHEDULE = Schedule(init, plan, observe, open_loop=lambda params: True)
