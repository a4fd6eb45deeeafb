"""Schedules: pure host-side state machines for noise and the number of rounds.

A schedule is three pure functions (ARCHITECTURE.md, decision 7)::

  state = init(ctx)                      # ctx: NoiseContext (privacy targets, sensitivity)
  plan  = plan(state, t)                 # RoundPlan for round t
  state = observe(state, t, metrics)     # e.g. CRD reads the test loss

They never touch device arrays; ``metrics`` is a dict of Python floats.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

# Immutable empty default, so a shared NoiseContext default can never be mutated.
_NO_PARAMS: Mapping[str, float] = types.MappingProxyType({})


class NoiseContext(NamedTuple):
  """What a schedule needs to turn a privacy target into noise.

  Attributes:
    epsilon: ``[U]`` per-client target epsilon (inf = no noise).
    delta: target delta.
    q: per-round selection probability of a client (K/U, or the Poisson rate).
    sensitivity: ``[U]`` sensitivity of each client's noised release.
    rounds: the initial horizon T.
    noise_fn: ``noise_fn(rounds) -> [U]`` the configured formula's noise scale for a
      constant schedule over ``rounds`` rounds (e.g. Wei eq. (10)).
    lr: base local learning rate.
    params: the schedule's own parameters, keyed by the field name under
      ``schedule.`` in the config (e.g. ``{'beta': 0.9, 'zeta': 0.001}``). The run
      loop passes every ``schedule.*`` field; a schedule reads the keys it knows
      (``fedjax_dp.privacy.schedules.config_fields`` lists them) and ignores the rest.
  """

  epsilon: np.ndarray
  delta: float
  q: float
  sensitivity: np.ndarray
  rounds: int
  noise_fn: Callable[[int], np.ndarray]
  lr: float = 1.0
  params: Mapping[str, float] = _NO_PARAMS


class RoundPlan(NamedTuple):
  """What the host passes to the device for one round.

  Attributes:
    noise: ``[U]`` noise scale of every client (std, or Laplace b) for this round.
    central_noise: server-side noise scale.
    lr_scale: multiplier on the base learning rate.
    stop: True when the run must stop before this round.
    horizon: the currently planned number of rounds T.
  """

  noise: np.ndarray
  central_noise: float
  lr_scale: float
  stop: bool
  horizon: int


def no_check(inputs: Any) -> None:
  """A schedule whose fields :data:`fedjax_dp.config.FIELD_RULES` checks in full."""


class Schedule(NamedTuple):
  """A schedule's three pure functions, and the check of its config fields.

  Attributes:
    init, plan, observe: the state machine (module docstring).
    open_loop: ``(params) -> bool`` (``params``: :attr:`NoiseContext.params`): the
      schedule's noise and stop never read the metrics, so its whole planned
      sequence is known before round 1 (and the run loop can fit it to the
      certified accountant, :mod:`fedjax_dp.host.schedule_fit`).
    check: ``(inputs) -> None`` refuses, from
      :class:`fedjax_dp.privacy.inputs.PrivacyInputs`, a run this schedule cannot run
      or bound (``fedjax_dp.errors.ConfigError`` naming the field); called by
      :func:`fedjax_dp.privacy.schedules.check_config` when the schedule is picked.
    reads: the config fields the schedule reads beyond its ``PARAMS`` (which it
      reads as ``schedule.<name>``) that not every schedule reads: a config that
      sets one away from its default while picking a schedule that does not read it
      is refused (:func:`fedjax_dp.config.unread_fields`).
  """

  init: Callable[[NoiseContext], Any]
  plan: Callable[[Any, int], RoundPlan]
  observe: Callable[[Any, int, Mapping[str, float]], Any]
  check: Callable[[Any], None] = no_check
  reads: tuple[str, ...] = ()
  open_loop: Callable[[Mapping[str, float]], bool] = lambda params: False


def budget_from_noise(noise: np.ndarray, rounds: int) -> np.ndarray:
  """``B_i = T / sigma_i^2``: the budget a constant schedule of ``T`` rounds spends.

  Eq. (10) inverted: for ``sigma_i = Delta_i sqrt(2 q T ln(1/delta_i)) / eps_i``
  this is ``eps_i^2 / (2 q Delta_i^2 ln(1/delta_i))``, the ``B_i`` of Wei eq. (25).
  ``sigma_i = 0`` (no noise) gives ``inf``.
  """
  noise = np.asarray(noise, np.float64)
  if np.any(noise < 0) or np.any(np.isnan(noise)):
    raise ValueError(f"noise scales must be >= 0, got {noise}")
  with np.errstate(divide="ignore"):
    return np.where(noise > 0, rounds / np.square(noise), np.inf)


def constant_budget(ctx: NoiseContext) -> tuple[int, np.ndarray, np.ndarray]:
  """The planned horizon ``T``, the formula's constant-schedule noise ``[U]`` for it,
  and the budget ``sum sigma^-2`` that schedule spends: what the budget-spreading
  schedules (CRD, linear decay, geometric) start from.

  Raises:
    ValueError: ``rounds < 1`` or a negative / NaN noise scale.
  """
  rounds = int(ctx.rounds)
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  noise = np.asarray(ctx.noise_fn(rounds), np.float64)
  return rounds, noise, budget_from_noise(noise, rounds)
