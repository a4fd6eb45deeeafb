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

from typing import NamedTuple

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp.config import privacy_inputs
from fedjax_dp.host.server import count_std, noise_context
from fedjax_dp.privacy import schedules
from fedjax_dp.privacy.inputs import local_learning_rates
from fedjax_dp.privacy.plan import PrivacyPlan, validation_sensitivity

F32_MAX = float(np.finfo(np.float32).max)

# (server.q: central noise with server.aggregation='fixed' divides by the expected
# share q, so its sensitivity is 2 C max|D_i| / (q sum |D_i|).)
_SENSITIVITY = ("client.clip", "client.lr", "client.lr_decay", "client.local_steps",
                "client.batch_size", "data.samples_per_client", "server.q")
_NOISE = ("privacy.epsilon", "privacy.client_epsilons", "privacy.delta",
          "privacy.noise_multiplier", "schedule.theta", "schedule.decay_fraction",
          "schedule.decay_floor", *_SENSITIVITY)
_STEPS = ("client.lr", "client.lr_decay", "client.local_steps")


class Derived(NamedTuple):
  """A value the round is handed (every entry must be a finite float32).

  Attributes:
    what: its name in a message.
    key: its entry in :func:`_values`.
    fields: the config fields that feed it, searched in this order for the culprit.
  """

  what: str
  key: str
  fields: tuple[str, ...]


DERIVED = (
    Derived("the sensitivity of a client's release", "sensitivity", _SENSITIVITY),
    Derived("the noise scale", "noise", _NOISE),
    Derived("the noise multiplier (noise scale / sensitivity)", "multiplier", _NOISE),
    Derived("a local step size (client.lr * client.lr_decay^s)", "steps", _STEPS),
    Derived("the server's step times a local step (server.lr * client.lr)", "server_steps",
            ("server.lr", *_STEPS)),
    Derived("the weight decay of a local step (client.l2_reg * client.lr)", "decay",
            ("client.l2_reg", *_STEPS)),
    Derived("the noise in the model's units (noise scale * step size)", "noise_steps",
            ("server.lr", *_NOISE)),
    Derived("the noise of the released validation score", "validation",
            ("schedule.val_noise_multiplier",)),
    Derived("private_median's count noise or one step of its clip bound", "private_median",
            ("server.clip_count_std", "server.clip_lr", "server.clip_quantile")),
)


def _values(cfg, plan: PrivacyPlan, counts: np.ndarray) -> dict[str, np.ndarray]:
  """Every :data:`DERIVED` value, from the plan and the schedule's plans of its first
  and last round (no metrics observed)."""
  rounds, ctx = int(cfg.rounds), noise_context(cfg, plan)
  schedule = schedules.get_schedule("constant" if config_lib.is_optimal_t(cfg)
                                    else cfg.schedule.name)
  # (Plain loops: the plans are computed in one pass through the privacy floor.)
  planned = []
  try:
    state = schedule.init(ctx)
    for t in sorted({0, rounds - 1}):
      planned.append(schedule.plan(state, t))
  except ValueError:  # a schedule refusing a non-finite noise: the formula's own is judged
    planned = [schedules.RoundPlan(plan.noise_scale(rounds), 0.0, 1.0, False, rounds)]
  c = cfg.client
  lrs = np.asarray(local_learning_rates(c.lr, c.lr_decay, int(c.local_steps)), np.float64)
  z, noise, steps = [], [], []
  for p in planned:
    z.append(plan.multipliers(*plan.device_noise(p.noise, p.central_noise)))
    noise.append(np.append(np.asarray(p.noise, np.float64), p.central_noise))
    steps.append(lrs * p.lr_scale)
  val = (0.0 if plan.validation != "clients" or plan.noiseless
         else plan.val_noise_multiplier * validation_sensitivity(counts))
  # nan where a multiplier is nan (inf / inf); inf is a multiplier's value for a client
  # that releases no noise, and the multipliers stay on the host (the accountant).
  z = np.concatenate(z)
  noise = np.zeros(1) if plan.noiseless else np.concatenate(noise)
  steps = np.concatenate(steps)
  median = np.zeros(1)
  if cfg.server.clip_rule == "private_median":  # its count std, and exp(eta max(g, 1 - g)):
    gamma = float(cfg.server.clip_quantile)     # the largest factor of one update of S
    median = np.array([count_std(cfg, plan.q, plan.num_clients),
                       np.exp(abs(float(cfg.server.clip_lr)) * max(gamma, 1.0 - gamma))])
  return {"sensitivity": plan.sensitivity, "noise": noise,
          "multiplier": np.where(np.isnan(z), np.nan, 0.0) if not plan.noiseless else noise,
          "steps": steps, "server_steps": float(cfg.server.lr) * steps,
          "decay": float(cfg.client.l2_reg) * steps,
          "noise_steps": np.max(noise) * np.max(np.append(steps, float(cfg.server.lr))),
          "validation": val, "private_median": median}


def _first_bad(cfg, plan: PrivacyPlan, counts: np.ndarray) -> tuple[Derived, float] | None:
  """The first derived value that is not a finite float32 (and that value)."""
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    values = _values(cfg, plan, counts)
  for d in DERIVED:
    x = np.asarray(values[d.key], np.float64).reshape(-1)
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
  culprit, untried = None, []
  for field in derived.fields:
    if config_lib.get_field(cfg, field) == config_lib.get_field(config_lib.base_config(), field):
      continue
    other = _reset(cfg, field)
    try:  # (a default may divide by zero: the plan says so by an inf, judged below)
      with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        plan = privacy_inputs.plan_from_config(other, counts, num_params)
      fixed = _first_bad(other, plan, counts) is None
    except (ValueError, ArithmeticError):  # its default does not fit the rest (server.q=0
      untried.append(field)                # with poisson): this reset cannot tell
      continue
    if fixed:
      culprit = field
      break
  if culprit is None:  # a field whose reset could not be judged, else the first one set
    culprit = next(iter(untried), None) or next(
        (f for f in derived.fields if config_lib.get_field(cfg, f) != config_lib.get_field(config_lib.base_config(), f)),
        derived.fields[0])
  raise config_lib.ConfigError(
      f"{culprit}={config_lib.get_field(cfg, culprit)!r}: {derived.what} would be {x:.3g}, which the "
      f"float32 round cannot hold (largest {F32_MAX:.3g}); choose another {culprit}")
