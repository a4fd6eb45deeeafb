"""The constant schedule: original UDP (Wei et al. Alg. 1).

Every round uses the same per-client noise, from the configured formula for the
fixed horizon T (for ``privacy.formula='wei_eq10'`` that is eq. (10),
``sigma_i = Delta_l sqrt(2 q T ln(1/delta_i)) / eps_i``); the run stops at T.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fedjax_dp.privacy.schedules.base import NoiseContext, RoundPlan, Schedule


class ConstantState(NamedTuple):
  noise: np.ndarray   # [U]
  horizon: int


def init(ctx: NoiseContext) -> ConstantState:
  return ConstantState(np.asarray(ctx.noise_fn(ctx.rounds), np.float64), int(ctx.rounds))


def plan(state: ConstantState, t: int) -> RoundPlan:
  return RoundPlan(state.noise, 0.0, 1.0, t >= state.horizon, state.horizon)


def observe(state: ConstantState, t: int, metrics: Mapping[str, float]) -> ConstantState:
  del t, metrics  # the constant schedule ignores feedback
  return state


SCHEDULE = Schedule(init, plan, observe, open_loop=lambda params: True)
