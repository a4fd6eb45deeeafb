"""A-DPFL's validation-driven noise decay (Algorithm 4, eq. (15)).

On every dynamic-adjustment round the server scores the new global model on a
validation set, ``S_t``, and shrinks the noise when the score stalled::

  sigma_{t+1} = k sigma_t   if S_t - S_{t-1} <= alpha,   else sigma_t,      k in (0, 1),

with ``S_0 = 0`` (``formulas.adpfl_next_sigma``). Closed form:
``sigma_t = sigma_0 k^m(t)`` with ``m(t)`` the reductions so far
(``formulas.adpfl_sigma_schedule``). The noise is never increased. Resolutions of
what the paper leaves open (spec ``adpfl.md`` section 7):

* Alg. 4 line 8 prints ``S_t = S_0`` (which resets the reference and makes the
  test "accuracy <= alpha"); we keep the reference across calls,
  ``S_prev <- S_t`` after every check, starting from ``S_prev = S_0 = 0``
  (item 3). The first check therefore compares the first score with 0.
* "dynamic_adjust_round" is undefined: we check every ``adjust_every`` rounds
  (default 1, every round; item 5), after rounds ``t`` with
  ``(t + 1) % adjust_every == 0``. The reduced sigma is broadcast with the next
  round (Sec. 5.4 step 6), i.e. it applies from round ``t + 1``.
* Where ``S_t`` comes from is ``schedule.validation``. ``'clients'`` (the default,
  the spec's reading of the paper): the accuracy of the new global model on the
  union of the round's selected clients' local data, computed by the run loop
  (:func:`fedjax_dp.training.engine.selected_accuracy`) and released with Gaussian noise
  ``N(0, (z_val / N_sel)^2)`` (``z_val = schedule.val_noise_multiplier``, ``1 / N_sel``
  its sensitivity, :func:`fedjax_dp.privacy.plan.validation_sensitivity`); the
  accountant charges that release in the same round (so the schedule's dependence
  on the data is certified), and the metrics carry it as ``val_accuracy``.
  ``'server'``: the run loop's held-out evaluation (``test_accuracy``) stands in for
  the paper's validation set; it reads no client data and costs no privacy.
  :func:`observe` reads ``val_accuracy`` if the round carries it, else
  ``test_accuracy`` (with ``'clients'`` the run loop passes no ``test_accuracy``). An
  adjustment round without either key raises a ``ValueError``.
* ``sigma_0`` is the configured formula's constant-schedule noise for
  ``T = ctx.rounds`` rounds (``ctx.noise_fn``); the paper's ``sigma_0 = 1.0`` is
  a noise multiplier, i.e. ``privacy.formula = 'noise_multiplier'`` with
  ``privacy.noise_multiplier = 1``.
* No floor: the paper reduces sigma "until the total privacy budget is
  exhausted" and quantifies no budget. The run lasts ``ctx.rounds`` rounds (the
  paper's fixed 50); with ``privacy.enforce_budget`` the run loop stops on the
  certified epsilon. Every reduction RAISES the privacy loss per round, so
  A-DPFL spends more than the constant schedule over the same rounds (spec 3.5).
* ``alpha`` is not given in the paper; the default 0.005 (a half-point of
  accuracy) is a placeholder to calibrate so that the first reduction falls
  near round 20 on MNIST (spec section 5.4 item 3, checklist item 11).

Parameters (``ctx.params``, from the ``schedule.*`` fields): ``k`` (in (0, 1), default
0.7 as in the paper's Fig. 5), ``alpha`` (finite, default 0.005) and
``adjust_every`` (integer >= 1, default 1); ``validation`` and
``val_noise_multiplier`` are read by the run loop and the privacy plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import formulas
from fedjax_dp.privacy.schedules.base import NoiseContext, RoundPlan, Schedule

PARAMS: Mapping[str, float] = {"k": 0.7, "alpha": 0.005, "adjust_every": 1.0}

# The metrics keys read as the validation score S_t, in order of preference.
SCORE_KEYS = ("val_accuracy", "test_accuracy")


class AdpflState(NamedTuple):
  """A-DPFL's host-side state.

  Attributes:
    sigma0: ``[U]`` initial noise scale.
    reductions: ``m(t)``, reductions so far (``sigma = sigma0 k^m``).
    prev_score: ``S_{t-1}``, the last validation score (``S_0 = 0``).
    horizon: the number of rounds ``T``.
    rounds: completed rounds.
    k, alpha, adjust_every: the parameters.
  """

  sigma0: np.ndarray
  reductions: int
  prev_score: float
  horizon: int
  rounds: int
  k: float
  alpha: float
  adjust_every: int


def _param(ctx: NoiseContext, name: str) -> float:
  return float(ctx.params.get(name, PARAMS[name]))


def score(metrics: Mapping[str, float]) -> float | None:
  """The validation score ``S_t``: ``val_accuracy``, else ``test_accuracy``, else ``None``."""
  for key in SCORE_KEYS:
    v = metrics.get(key)
    if not isinstance(v, bool) and isinstance(v, (int, float, np.floating)):
      return float(v)
  return None


def init(ctx: NoiseContext) -> AdpflState:
  """``sigma_0`` from the configured formula over ``T = ctx.rounds`` rounds.

  Raises:
    ValueError: a parameter out of range, naming the field.
  """
  k, alpha, every = _param(ctx, "k"), _param(ctx, "alpha"), _param(ctx, "adjust_every")
  if not 0.0 < k < 1.0:
    raise ValueError(f"schedule.k must be in (0, 1), got {k}")
  if not math.isfinite(alpha):
    raise ValueError(f"schedule.alpha must be finite, got {alpha}")
  if not (every >= 1 and every == int(every)):
    raise ValueError(f"schedule.adjust_every must be an integer >= 1, got {every}")
  rounds = int(ctx.rounds)
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  sigma0 = np.asarray(ctx.noise_fn(rounds), np.float64)
  if np.any(sigma0 < 0) or np.any(np.isnan(sigma0)):
    raise ValueError(f"noise scales must be >= 0, got {sigma0}")
  return AdpflState(sigma0, 0, 0.0, rounds, 0, k, alpha, int(every))


def current_noise(state: AdpflState) -> np.ndarray:
  """``[U]`` ``sigma_0 k^m(t)`` (eq. (15) closed form; 0 stays 0)."""
  return state.sigma0 * state.k ** state.reductions


def plan(state: AdpflState, t: int) -> RoundPlan:
  """Round ``t``'s noise; the run lasts ``T`` rounds."""
  stop = t >= state.horizon
  noise = np.zeros_like(state.sigma0) if stop else current_noise(state)
  return RoundPlan(noise, 0.0, 1.0, stop, state.horizon)


def observe(state: AdpflState, t: int, metrics: Mapping[str, float]) -> AdpflState:
  """Applies eq. (15) after an adjustment round.

  Args:
    state: the state :func:`plan` used for round ``t``.
    t: the round just finished (0-based).
    metrics: that round's metrics; reads ``val_accuracy`` (else ``test_accuracy``)
      on adjustment rounds.

  Raises:
    ValueError: rounds observed out of order, or an adjustment round without a score.
  """
  if t != state.rounds:
    raise ValueError(f"adpfl observed round {t}, expected round {state.rounds}")
  state = state._replace(rounds=t + 1)
  if (t + 1) % state.adjust_every:
    return state
  s = score(metrics)
  if s is None:
    raise ValueError(
        f"schedule 'adpfl' reads the validation accuracy after round {t + 1} "
        f"(A-DPFL Alg. 4) but the round carries none of {SCORE_KEYS}; with "
        f"schedule.validation='server' set eval.every to divide "
        f"schedule.adjust_every={state.adjust_every}")
  # eq. (15) through the formula of record; sigma = 1 stands for the relative scale
  reduce = bool(formulas.adpfl_next_sigma(1.0, state.k, s - state.prev_score, state.alpha) < 1)
  return state._replace(reductions=state.reductions + int(reduce), prev_score=s)


def check(inputs) -> None:
  """With ``schedule.validation='server'`` the schedule reads the held-out accuracy on
  its adjustment rounds, which must then be evaluated ('clients' computes its own)
  (:class:`fedjax_dp.privacy.inputs.PrivacyInputs`).

  Raises:
    ConfigError: ``eval.every`` does not divide ``schedule.adjust_every``.
  """
  p = inputs.privacy
  adjust_every = p.schedule_params.get("adjust_every", PARAMS["adjust_every"])
  if p.validation == "server" and int(adjust_every) % int(p.eval_every):
    raise ConfigError(f"schedule.name='adpfl' with schedule.validation='server' reads the "
                      f"test accuracy every schedule.adjust_every={adjust_every} "
                      f"rounds: eval.every={p.eval_every} must divide it")


SCHEDULE = Schedule(init, plan, observe, check,
                    reads=("schedule.validation", "schedule.val_noise_multiplier"))
