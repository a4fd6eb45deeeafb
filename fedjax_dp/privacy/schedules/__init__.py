"""Noise and round-count schedules as pure host-side state machines.

Owns the registry :data:`SCHEDULES` (``schedule.name`` -> :class:`Schedule`, one file
per schedule), each schedule's parameters and defaults, and :func:`check_config`,
which runs the picked schedule's own checks of the config.
"""

from collections.abc import Mapping

from fedjax_dp.privacy.schedules import adpfl, constant, crd, geometric, linear_decay
from fedjax_dp.privacy.schedules.base import NoiseContext, RoundPlan, Schedule

SCHEDULES: dict[str, Schedule] = {
    "constant": constant.SCHEDULE,
    "crd": crd.SCHEDULE,
    "linear_decay": linear_decay.SCHEDULE,
    "geometric": geometric.SCHEDULE,
    "adpfl": adpfl.SCHEDULE,
}

# Each schedule's parameters and their defaults, read from ``NoiseContext.params``
# (the run loop fills it from the config's ``schedule`` section).
SCHEDULE_PARAMS: dict[str, Mapping[str, float]] = {
    "constant": {},
    "crd": crd.PARAMS,
    "linear_decay": linear_decay.PARAMS,
    "geometric": geometric.PARAMS,
    "adpfl": adpfl.PARAMS,
}


def get_schedule(name: str) -> Schedule:
  """Returns a registered schedule; unknown names raise a ValueError naming the field."""
  if name not in SCHEDULES:
    raise ValueError(f"schedule.name: unknown {name!r}; known: {sorted(SCHEDULES)}")
  return SCHEDULES[name]


def check_config(inputs) -> None:
  """The picked schedule's own checks (:attr:`Schedule.check`) of
  :class:`fedjax_dp.privacy.inputs.PrivacyInputs`.

  ``schedule.name='optimal_t'`` runs a grid of constant schedules (its
  ``schedule.t_grid`` is checked by the config's field rules and by
  :func:`fedjax_dp.optimal_t.t_grid`); an unknown name is left to the field rules.

  Raises:
    ConfigError: naming the field.
  """
  schedule = SCHEDULES.get(inputs.privacy.schedule)
  if schedule is not None:
    schedule.check(inputs)


def config_fields(name: str | None = None) -> dict[str, float]:
  """The ``schedule.*`` config fields a schedule reads, with their defaults.

  Args:
    name: a registered schedule, or None for the union over all schedules (what
      a base config must define so that any schedule can be picked by name).

  Returns:
    ``{'schedule.beta': 0.9, ...}``; the run loop passes the values to the
    schedule as ``NoiseContext.params`` under the bare names (``'beta'``).
  """
  if name is not None:
    get_schedule(name)  # unknown names raise, naming the field
  names = sorted(SCHEDULE_PARAMS) if name is None else [name]
  fields: dict[str, float] = {}
  for n in names:
    fields.update({f"schedule.{k}": float(v) for k, v in SCHEDULE_PARAMS[n].items()})
  return fields


__all__ = ["SCHEDULES", "SCHEDULE_PARAMS", "NoiseContext", "RoundPlan", "Schedule",
           "check_config", "config_fields", "get_schedule"]
