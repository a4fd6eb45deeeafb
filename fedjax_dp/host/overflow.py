"""Derived values a float32 round cannot hold, refused before anything compiles.

A field may be finite and in range and still make the run meaningless: with
``client.clip=1e308`` the sensitivity ``2 C eta E / B`` overflows to inf, the noise
scale is ``inf``, the noise multiplier ``inf / inf = nan``, and the run would train
(compiling its round first) only to fail at the accountant. Once the privacy plan is
built (:func:`fedjax_dp.host.building.build`) every value the round is handed is
known: the sensitivity of each release, the noise scale of every planned round of
the schedule (its first and last: the schedules move the noise monotonically until
a trigger, which only shrinks it), the noise multiplier, the local step sizes
``eta_s``, the server's step and the weight decay. Each must be a finite float32
(``|x| <= 3.4e38``), and a noise multiplier must not be nan; so must the std of
A-DPFL's released validation score and, for ``server.clip_rule='private_median'``,
its count noise and the largest factor one update of its clip bound applies.

A value that fails is traced to the field that feeds it (:data:`DERIVED` lists the
fields of each): the first whose reset to its default (:func:`fedjax_dp.config.
base_config`) makes every value representable again is named, with its value, in
one :class:`fedjax_dp.config.ConfigError` line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp.host.round_inputs import count_std, noise_context
from fedjax_dp.privacy import schedules
from fedjax_dp.privacy.plan import (
    PrivacyPlan,
    local_learning_rates,
    make_privacy_plan,
    validation_sensitivity,
)

F32_MAX = float(np.finfo(np.float32).max)

_SENSITIVITY = ("client.clip", "client.lr", "client.lr_decay", "client.local_steps",
                "client.batch_size", "data.samples_per_client")
_NOISE = ("privacy.epsilon", "privacy.client_epsilons", "privacy.delta",
          "privacy.noise_multiplier", "schedule.theta", "schedule.decay_fraction",
          "schedule.decay_floor", *_SENSITIVITY)
_STEPS = ("client.lr", "client.lr_decay", "client.local_steps")


class Inputs(NamedTuple):
  """What the derived values are computed from."""

  cfg: Any
  plan: PrivacyPlan
  planned: Sequence[Any]  # the schedule's round plans (first and last round)
  counts: np.ndarray      # [U] the clients' example counts


class Derived(NamedTuple):
  """A value the round is handed.

  Attributes:
    what: its name in a message.
    value: ``Inputs -> array`` (every entry must be a finite float32).
    fields: the config fields that feed it, searched in this order for the culprit.
  """

  what: str
  value: Callable[[Inputs], Any]
  fields: tuple[str, ...]


def _noise(x: Inputs) -> np.ndarray:
  """Every planned round's noise scales ``[U]`` and central noise."""
  if x.plan.noiseless:
    return np.zeros(1)
  return np.concatenate([np.append(np.asarray(p.noise, np.float64), p.central_noise)
                         for p in x.planned])


def _multipliers(x: Inputs) -> np.ndarray:
  """nan where a planned multiplier is nan (inf / inf), else 0: a multiplier lives on the
  host (the accountant), where inf is its value for a client that releases no noise."""
  if x.plan.noiseless:
    return np.zeros(1)
  z = np.concatenate([x.plan.multipliers(*x.plan.device_noise(p.noise, p.central_noise))
                      for p in x.planned])
  return np.where(np.isnan(z), np.nan, 0.0)


def _steps(x: Inputs) -> np.ndarray:
  return np.concatenate([local_learning_rates(x.cfg) * p.lr_scale for p in x.planned])


def _validation_std(x: Inputs) -> float:
  """The std of A-DPFL's released validation score (a float32 on the device)."""
  if x.plan.validation != "clients" or x.plan.noiseless:
    return 0.0
  return x.plan.val_noise_multiplier * validation_sensitivity(x.counts)


def _private_median(x: Inputs) -> np.ndarray:
  """private_median's noisy-count std and the largest factor one update of its clip
  bound can apply, ``exp(server.clip_lr * max(gamma, 1 - gamma))`` (noise-free)."""
  if x.cfg.server.clip_rule != "private_median":
    return np.zeros(1)
  gamma = float(x.cfg.server.clip_quantile)
  return np.array([count_std(x.cfg, x.plan.q, x.plan.num_clients),
                   np.exp(abs(float(x.cfg.server.clip_lr)) * max(gamma, 1.0 - gamma))])


DERIVED = (
    Derived("the sensitivity of a client's release", lambda x: x.plan.sensitivity,
            _SENSITIVITY),
    Derived("the noise scale", _noise, _NOISE),
    Derived("the noise multiplier (noise scale / sensitivity)", _multipliers, _NOISE),
    Derived("a local step size (client.lr * client.lr_decay^s)", _steps, _STEPS),
    Derived("the server's step times a local step (server.lr * client.lr)",
            lambda x: float(x.cfg.server.lr) * _steps(x), ("server.lr", *_STEPS)),
    Derived("the weight decay of a local step (client.l2_reg * client.lr)",
            lambda x: float(x.cfg.client.l2_reg) * _steps(x), ("client.l2_reg", *_STEPS)),
    Derived("the noise in the model's units (noise scale * step size)",
            lambda x: np.max(_noise(x)) * np.max(np.append(_steps(x), float(x.cfg.server.lr))),
            ("server.lr", *_NOISE)),
    Derived("the noise of the released validation score", _validation_std,
            ("schedule.val_noise_multiplier",)),
    Derived("private_median's count noise or one step of its clip bound", _private_median,
            ("server.clip_count_std", "server.clip_lr", "server.clip_quantile")),
)


def _planned(cfg, plan: PrivacyPlan) -> list[Any]:
  """The schedule's plans of its first and last round (no metrics observed)."""
  name = "constant" if config_lib.is_optimal_t(cfg) else cfg.schedule.name
  schedule = schedules.get_schedule(name)
  rounds = int(cfg.rounds)
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    try:
      state = schedule.init(noise_context(cfg, plan))
      return [schedule.plan(state, t) for t in sorted({0, rounds - 1})]
    except ValueError:  # a schedule refusing a non-finite noise: the formula's own is judged
      return [schedules.RoundPlan(plan.noise_scale(rounds), 0.0, 1.0, False, rounds)]


def _first_bad(cfg, plan: PrivacyPlan, counts: np.ndarray) -> tuple[Derived, float] | None:
  """The first derived value that is not a finite float32 (and that value)."""
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    inputs = Inputs(cfg, plan, _planned(cfg, plan), counts)
    for d in DERIVED:
      x = np.asarray(d.value(inputs), np.float64).reshape(-1)
      bad = x[~(np.abs(x) <= F32_MAX)]  # nan and inf included
      if bad.size:
        return d, float(bad[0])
  return None


def _reset(cfg, field: str):
  """``cfg`` with ``field`` at its default."""
  out = config_lib.ConfigDict(cfg.to_dict(), type_safe=False)
  *parents, leaf = field.split(".")
  node, default = out, config_lib.base_config()
  for p in parents:
    node, default = node[p], default[p]
  node[leaf] = default[leaf]
  return out


def _value(cfg, field: str) -> Any:
  node = cfg
  for part in field.split("."):
    node = node[part]
  return node


def check(cfg, plan: PrivacyPlan, counts: np.ndarray, num_params: int | None) -> None:
  """Refuses a config whose derived values (:data:`DERIVED`) a float32 round cannot hold.

  Args:
    cfg: the run's config (validated).
    plan: its privacy plan.
    counts: ``[U]`` the clients' example counts (to rebuild the plan in the search).
    num_params: the model's size (likewise).

  Raises:
    config_lib.ConfigError: names the field that feeds the failing value, its value,
      the value and float32's largest.
  """
  found = _first_bad(cfg, plan, counts)
  if found is None:
    return
  derived, x = found
  culprit = None
  for field in derived.fields:
    if _value(cfg, field) == _value(config_lib.base_config(), field):
      continue
    other = _reset(cfg, field)
    try:
      fixed = _first_bad(other, make_privacy_plan(other, counts, num_params), counts) is None
    except ValueError:  # the reset breaks another check: not this field's doing
      fixed = False
    if fixed:
      culprit = field
      break
  if culprit is None:  # several fields together: name the first that was set
    culprit = next((f for f in derived.fields
                    if _value(cfg, f) != _value(config_lib.base_config(), f)),
                   derived.fields[0])
  raise config_lib.ConfigError(
      f"{culprit}={_value(cfg, culprit)!r}: {derived.what} would be {x:.3g}, which the "
      f"float32 round cannot hold (largest {F32_MAX:.3g}); choose another {culprit}")
