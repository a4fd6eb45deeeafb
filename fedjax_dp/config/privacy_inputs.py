"""A run config's privacy inputs: the typed records the privacy layer reads, built once.

The privacy layer (:mod:`fedjax_dp.privacy`) never reads a run config: it takes
:class:`fedjax_dp.privacy.inputs.PrivacyInputs`. This module, on the config's floor
(above the privacy layer), builds them from a config's ``client``, ``server``,
``privacy``, ``schedule``, ``eval``, ``data.num_clients`` and ``seed`` fields
(:func:`from_config`), runs the owners' checks on them (:func:`check_owners`, called
by :func:`fedjax_dp.config.validate`), and builds a config's privacy plan
(:func:`plan_from_config`). The Python API builds the same records directly.
"""

from __future__ import annotations

import importlib
import numbers

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp import optimizers
from fedjax_dp.privacy.inputs import (
  ClientInputs,
  FederationSizes,
  PrivacyInputs,
  PrivacySettings,
  ServerInputs,
  local_learning_rates,
)
from fedjax_dp.privacy.plan import PrivacyPlan, make_privacy_plan


def _client_fields(cfg) -> dict:
  """The :class:`ClientInputs` fields of the config's ``client`` section (but ``lrs``):
  the optimizer is the one ``client.optimizer`` names, with its hyperparameters."""
  c = cfg.client
  return {"clip_mode": c.clip_mode, "clip": float(c.clip), "batch_size": int(c.batch_size),
          "minibatch": c.get("minibatch", "shuffle"), "l2_reg": float(c.l2_reg),
          "optimizer": optimizers.client_optimizer(c)}


def _server_fields(cfg) -> dict:
  """The :class:`ServerInputs` fields of the config's ``server`` section."""
  s = cfg.server
  return {"selection": s.selection, "clients_per_round": int(s.clients_per_round),
          "q": float(s.q), "aggregation": s.aggregation,
          "clip_rule": s.get("clip_rule", "fixed"),
          "clip_quantile": float(s.get("clip_quantile", 0.5)),
          "clip_lr": float(s.get("clip_lr", 0.2)),
          "clip_count_std": float(s.get("clip_count_std", -1.0)),
          "wasserstein_metric": s.get("wasserstein_metric", "zero_one")}


def _privacy_fields(cfg) -> dict:
  """The :class:`PrivacySettings` fields of the config's ``privacy``, ``schedule`` and
  ``eval`` sections and its ``rounds``."""
  p, sched = cfg.privacy, cfg.schedule
  params = {k: v for k, v in sched.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool)}
  return {"mechanism": p.mechanism, "placement": p.placement, "formula": p.formula,
          "epsilon": float(p.epsilon), "client_epsilons": tuple(p.client_epsilons),
          "delta": float(p.delta), "noise_multiplier": float(p.noise_multiplier),
          "rounds": int(cfg.rounds), "bands": int(p.get("bands", 0)),
          "tree_restart": int(p.get("tree_restart", 0)),
          "enforce_budget": bool(p.get("enforce_budget", False)), "schedule": sched.name,
          "schedule_params": params, "validation": sched.get("validation", "server"),
          "val_noise_multiplier": float(sched.get("val_noise_multiplier", 1.0)),
          "eval_every": int(cfg.eval.every)}


def from_config(cfg, counts=None, num_params: int | None = None,
                client_optimizer: optimizers.Optimizer | None = None) -> PrivacyInputs:
  """The :class:`PrivacyInputs` of a run config: its fields read here, the records
  built in one go.

  Args:
    cfg: a run config (:func:`fedjax_dp.config.base_config` fields).
    counts: ``[U]`` the clients' example counts, once the data are read (None for
      the checks that need no data).
    num_params: the model's parameter count d, if known.
    client_optimizer: the local steps' optimizer given from Python
      (:func:`fedjax_dp.optimizers.from_transformation`) in place of the config's
      ``client.optimizer``.
  """
  client, server, privacy = _client_fields(cfg), _server_fields(cfg), _privacy_fields(cfg)
  if client_optimizer is not None:
    client["optimizer"] = client_optimizer
  c = cfg.client
  federation = {"num_clients": int(cfg.data.num_clients), "num_params": num_params,
                "counts": None if counts is None else np.asarray(counts, np.float64),
                "seed": int(cfg.seed)}
  return PrivacyInputs(
      client=ClientInputs(lrs=local_learning_rates(c.lr, c.lr_decay, int(c.local_steps)),
                          **client),
      server=ServerInputs(**server), federation=FederationSizes(**federation),
      privacy=PrivacySettings(**privacy))


def plan_from_config(cfg, counts, num_params: int | None = None,
                     client_optimizer: optimizers.Optimizer | None = None) -> PrivacyPlan:
  """The :class:`fedjax_dp.privacy.plan.PrivacyPlan` of a run config for clients with
  ``counts [U]`` examples (``num_params``: d, needed for Laplace on an L2 ball;
  ``client_optimizer``: one given from Python, :func:`from_config`)."""
  return make_privacy_plan(from_config(cfg, counts, num_params, client_optimizer))


def check_owners(cfg) -> None:
  """The picked selection rule's, schedule's and clip mode's own checks, in that order
  (each owner's ``check_config`` on the config's :class:`PrivacyInputs`).

  Raises:
    ConfigError: naming the field.
  """
  inputs = from_config(cfg)
  for module in (config_lib.SELECTION_CHECKS, *config_lib.OWNER_CHECKS):
    importlib.import_module(module).check_config(inputs)
