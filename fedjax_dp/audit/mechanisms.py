"""Every mechanism the config validation accepts, enumerated from the registries.

A mechanism is one value per axis of :func:`axes` (clip mode, noise placement, noise
distribution, minibatch sampling, selection rule, server clip rule, validation
release, client optimizer), each axis read from the registry that defines it, so a
new clip mode, placement, rule, schedule validation or client optimizer is
enumerated (and audited) without editing this file. A combination is accepted when :func:`fedjax_dp.config.validate`,
:func:`fedjax_dp.privacy.plan.make_privacy_plan` (with the config's typed inputs,
:mod:`fedjax_dp.config.privacy_inputs`) and
:func:`fedjax_dp.privacy.validation.check_validation` all accept it; the refused ones are
the combinations the plan cannot bound, which no run can configure.

Some axis values need companion settings to be configurable at all (:data:`COMPANIONS`:
Poisson selection (poisson, cyclic_poisson) needs a rate, Poisson minibatches an
expected batch size,
``private_median`` a count noise above the round's multiplier, the ``clients``
validation a schedule that reads a score). They are set with the value, never to
make a refused combination pass.

Two values are not audited, and :func:`excluded` says why: ``placement='none'`` (no
noise, no certificate) and ``server.clip_rule='median'`` (certified epsilon inf: there
is no finite claim for an audit to test).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp import optimizers
from fedjax_dp.config import privacy_inputs
from fedjax_dp.privacy import clip_modes
from fedjax_dp.privacy import mechanisms as mechanisms_lib
from fedjax_dp.privacy import plan as plan_lib
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine


def axes() -> dict[str, tuple[str, ...]]:
  """Axis (config key) -> its values, each read now from the registry that defines it."""
  return {
      "client.clip_mode": tuple(clip_modes.CLIP_MODES),
      "privacy.placement": tuple(mechanisms_lib.PLACEMENTS),
      "privacy.mechanism": tuple(mechanisms_lib.MECHANISMS),
      "client.minibatch": tuple(client_lib.MINIBATCHES),
      "server.selection": tuple(selection_lib.RULES),
      "server.clip_rule": tuple(engine.CLIP_RULES),
      "schedule.validation": tuple(plan_lib.VALIDATIONS),
      OPTIMIZER_AXIS: tuple(optimizers.CLIENT_OPTIMIZERS),
  }


# The client optimizer's axis. It is enumerated on the mechanisms the registry's first
# (default) optimizer, plain SGD, makes acceptable (:func:`enumerate_mechanisms`): the
# privacy layer reads the client optimizer in one place,
# :func:`fedjax_dp.privacy.clip_modes.base.check_optimizer` and the step weights it
# guards, which refuse an optimizer (no step weights, no contraction under
# ``client.l2_reg``) or scale a bound (``A_j`` for ``eta_j``), never admit what SGD's
# bound refuses; so every combination another optimizer makes acceptable is one SGD's
# does, and the enumeration stays exact at a third of the product's checks.
OPTIMIZER_AXIS = "client.optimizer"


# (axis, value) -> settings that value needs to be configurable (module docstring).
COMPANIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("server.selection", "poisson"): {"server.q": 0.5, "server.aggregation": "fixed"},
    ("server.selection", "cyclic_poisson"): {"server.q": 0.5, "server.aggregation": "fixed"},
    ("client.minibatch", "poisson"): {"client.batch_size": 20},
    ("server.clip_rule", "private_median"): {"server.clip_count_std": 100.0},
    ("schedule.validation", "clients"): {"schedule.name": plan_lib.VALIDATING_SCHEDULES[0]},
}


def excluded(axis: str, value: str) -> str | None:
  """Why an axis value is not audited (None: it is)."""
  if axis == "privacy.placement" and value == "none":
    return "no noise: nothing is certified"
  if axis == "server.clip_rule" and value == "median":
    return "certified epsilon inf (plan.MEDIAN_REASON): no finite claim to test"
  return None


def settings(mechanism: dict[str, str]) -> dict[str, Any]:
  """The ``--set`` assignments of a mechanism: its axis values and their companions."""
  out: dict[str, Any] = {}
  for axis, value in mechanism.items():
    out.update(COMPANIONS.get((axis, value), {}))
  out.update(mechanism)
  return out


def _set(cfg, key: str, value: Any) -> None:
  *parents, leaf = key.split(".")
  node = cfg
  for p in parents:
    node = node[p]
  node[leaf] = value


def _get(cfg, key: str) -> Any:
  node = cfg
  for p in key.split("."):
    node = node[p]
  return node


def accepted(base, mechanism: dict[str, str], num_params: int = 650, *,
             work=None) -> bool:
  """Whether the run's validation accepts ``mechanism`` on top of the config ``base``
  (no data is loaded: the plan is built for equal clients of the base's size).
  ``work``: a scratch copy of ``base`` to set the fields on (saves a copy per call)."""
  cfg = config_lib.override(base, []) if work is None else work
  keys = {k for k in axes()} | {k for sets in COMPANIONS.values() for k in sets}
  wanted = settings(mechanism)
  for k in keys:
    _set(cfg, k, wanted.get(k, _get(base, k)))
  counts = np.full(int(cfg.data.num_clients), int(cfg.data.samples_per_client))
  try:
    config_lib.validate(cfg)
    inputs = privacy_inputs.from_config(cfg, counts, num_params)
    plan_lib.check_validation(inputs, plan_lib.make_privacy_plan(inputs))
  except ValueError:  # ConfigError is a ValueError
    return False
  return True


def enumerate_mechanisms(base) -> Iterator[dict[str, str]]:
  """Every accepted mechanism (a dict axis -> value) on top of ``base``, in the
  registries' order, without the :func:`excluded` values. The client optimizers are
  tried on each combination of the other axes that the first one (SGD) makes
  acceptable (:data:`OPTIMIZER_AXIS`)."""
  table = axes()
  opts = table.pop(OPTIMIZER_AXIS)
  values = [[v for v in vals if excluded(axis, v) is None] for axis, vals in table.items()]
  work = config_lib.override(base, [])
  for combo in itertools.product(*values):
    mechanism = dict(zip(table, combo))
    if not accepted(base, {**mechanism, OPTIMIZER_AXIS: opts[0]}, work=work):
      continue
    for opt in opts:
      if opt == opts[0] or accepted(base, {**mechanism, OPTIMIZER_AXIS: opt}, work=work):
        yield {**mechanism, OPTIMIZER_AXIS: opt}


def covering(mechanisms: list[dict[str, str]], core: tuple[str, ...]) -> list[dict[str, str]]:
  """A reduction of ``mechanisms``: every combination of the ``core`` axes' values that
  occurs, once each, then more mechanisms until every value of every axis occurs at
  least once. Deterministic (the registries' order): the first mechanism of each core
  combination is kept, then greedily the one covering most uncovered values."""
  chosen, seen = [], set()
  for m in mechanisms:
    key = tuple(m[a] for a in core)
    if key not in seen:
      seen.add(key)
      chosen.append(m)
  covered = {(a, m[a]) for m in chosen for a in m}
  needed = {(a, m[a]) for m in mechanisms for a in m} - covered
  while needed:
    best = max(mechanisms, key=lambda m: len({(a, m[a]) for a in m} & needed))
    chosen.append(best)
    needed -= {(a, best[a]) for a in best}
  return chosen
