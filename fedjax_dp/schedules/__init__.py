"""Noise and round-count schedules as pure host-side state machines."""

from collections.abc import Mapping

from fedjax_dp.schedules import adpfl, constant, crd, geometric, linear_decay
from fedjax_dp.schedules.base import NoiseContext, RoundPlan, Schedule

SCHEDULES: dict[str, Schedule] = {
    "constant": constant.SCHEDULE,
    "crd": crd.SCHEDULE,
    "linear_decay": linear_decay.SCHEDULE,
    "geometric": geometric.SCHEDULE,
    "adpfl": adpfl.SCHEDULE,
}

# Each schedule's parameters and their defaults, read from ``NoiseContext.params``
# (the run loop fills it from ``cfg.schedule``).
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
           "config_fields", "get_schedule"]
