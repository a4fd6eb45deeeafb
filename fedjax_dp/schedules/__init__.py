"""Noise and round-count schedules as pure host-side state machines."""

from fedjax_dp.schedules import constant
from fedjax_dp.schedules.base import NoiseContext, RoundPlan, Schedule

SCHEDULES: dict[str, Schedule] = {"constant": constant.SCHEDULE}


def get_schedule(name: str) -> Schedule:
  """Returns a registered schedule; unknown names raise a ValueError naming the field."""
  if name not in SCHEDULES:
    raise ValueError(f"schedule.name: unknown {name!r}; known: {sorted(SCHEDULES)}")
  return SCHEDULES[name]


__all__ = ["NoiseContext", "RoundPlan", "SCHEDULES", "Schedule", "get_schedule"]
