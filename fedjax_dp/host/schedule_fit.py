"""Fitting an open-loop schedule's noise to the certified accountant.

``privacy.formula='calibrated'`` promises that a run certifies at most
``privacy.epsilon``. The formula sizes a CONSTANT schedule of ``rounds`` rounds
with the certified accountant; the budget-spreading schedules (``linear_decay``,
``geometric``, ``crd``) then respend that budget in Wei et al.'s eq. (25) view,
``sum_t sigma_t^-2 = T / sigma^2``, which assumes the accountant is linear in
``sigma^-2``. Without subsampling it nearly is; under subsampling (Poisson
minibatches, random or cyclic-Poisson selection) the RDP of a smaller sigma costs
more than linearly, so the decayed sequence overspends what the constant one met
(issue 47, Q4: ``linear_decay`` under ``cyclic_poisson`` with Poisson minibatches
certified 1.056 for a request of 1.0).

:func:`fit` closes the gap for a schedule whose whole sequence is known before round
1 (:attr:`fedjax_dp.privacy.schedules.Schedule.open_loop`): it plays the schedule's
plan through the run's own accountant (the run's cohorts, which depend on the seed
and the round only) and, if the planned run would pass a client's target, scales
the formula's noise by the smallest factor ``s >= 1`` whose planned run does not.
The schedule's shape and horizon are its own (a common factor on ``sigma`` leaves
``linear_decay``'s and ``geometric``'s stopping rounds unchanged). A schedule that
reads metrics (``crd``, ``adpfl``, ``geometric`` with ``refine=1``) cannot be played
ahead: the run loop stops it before a round whose certified epsilon would pass the
target instead (``stop_reason='budget_exhausted'``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedjax_dp.privacy.schedules import NoiseContext, Schedule

# Relative width of the final bracket on the noise factor.
_SCALE_RTOL = 1e-4


def planned_state(schedule: Schedule, ctx: NoiseContext, privacy, cohort: Callable,
                  max_rounds: int, validate: Callable[[int], bool] = lambda t: False
                  ) -> tuple[Any, int]:
  """``(accountant state, rounds)`` after the schedule's planned run: every round it
  plans before it stops (or ``max_rounds``), charged as the run loop charges it.

  Args:
    schedule: an open-loop schedule (it observes empty metrics).
    ctx: its :class:`NoiseContext`.
    privacy: the run's :class:`fedjax_dp.privacy.plan.PrivacyPlan`.
    cohort: ``t -> (idx [K], mask [K])`` the run's selection of round ``t``.
    max_rounds: the run loop's cap on the number of rounds.
    validate: ``t -> bool`` whether round ``t`` also releases the validation score.
  """
  state = schedule.init(ctx)
  acct = privacy.accountant_init()
  t = 0
  while t < max_rounds:
    plan = schedule.plan(state, t)
    if plan.stop:
      break
    client_noise, central_noise = privacy.device_noise(plan.noise, plan.central_noise)
    idx, sel = cohort(t)
    acct = privacy.accountant_step(acct, client_noise, central_noise,
                                   selected=idx[sel > 0], validate=validate(t))
    state = schedule.observe(state, t, {})
    t += 1
  return acct, t


def fitted_context(schedule: Schedule, ctx: NoiseContext, privacy, cohort: Callable,
                   max_rounds: int, validate: Callable[[int], bool] = lambda t: False
                   ) -> tuple[NoiseContext, float]:
  """``(context, noise factor s)``: ``ctx`` with the formula's noise times the smallest
  ``s >= 1`` (to :data:`_SCALE_RTOL`, from the safe side) whose planned run stays
  within every client's target. ``s = 1`` (the planned run already fits, e.g. the
  constant schedule the formula calibrated) returns ``ctx`` itself, so the schedule
  starts bit for bit as without the fit.

  Raises:
    ValueError: no finite factor fits (a first round alone passes the target).
  """
  base = functools.lru_cache(maxsize=None)(lambda rounds: np.asarray(ctx.noise_fn(rounds),
                                                                     np.float64))

  def scaled(s: float) -> NoiseContext:
    return ctx._replace(noise_fn=lambda rounds: s * base(rounds))

  def over(s: float) -> bool:
    acct, _ = planned_state(schedule, scaled(s), privacy, cohort, max_rounds, validate)
    return privacy.over_budget(acct)

  if not over(1.0):
    return ctx, 1.0
  lo, hi = 1.0, 2.0
  while over(hi):
    lo, hi = hi, hi * 2.0
    if hi > 1e6:
      raise ValueError("privacy.formula='calibrated': no noise level fits the schedule's "
                       "planned rounds within privacy.epsilon")
  while hi - lo > _SCALE_RTOL * hi:
    mid = math.sqrt(lo * hi)
    lo, hi = (mid, hi) if over(mid) else (lo, mid)
  return scaled(hi), hi


def fit(schedule: Schedule, ctx: NoiseContext, privacy, cohort: Callable, max_rounds: int,
        validate: Callable[[int], bool] = lambda t: False) -> tuple[Any, float]:
  """``(initial schedule state, noise factor s)`` of :func:`fitted_context`."""
  fitted, factor = fitted_context(schedule, ctx, privacy, cohort, max_rounds, validate)
  return schedule.init(fitted), factor
