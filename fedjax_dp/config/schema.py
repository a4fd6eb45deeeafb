"""Config schemas that evolve: the version a stored config carries, and how an older
stored config is read by this release.

A run directory's ``config.json`` carries ``schema_version`` (:func:`stamped`); it
is checked before anything else of the directory is read (a checkpoint's own copy
of the config is compared after it, read as :func:`upgraded` too). When a release adds a config field, it
gives the field a default in :func:`fedjax_dp.config.base_config` that reproduces the
old behaviour, records it in :data:`ADDED_FIELDS` and bumps :data:`SCHEMA_VERSION`.
A stored config is then read with :func:`upgraded`: the fields it lacks ran with
their (old) behaviour, i.e. the current defaults, so they are filled in, and a
resume compares only the fields both configs have (:func:`fedjax_dp.host.checkpoint.config_diff`).
A config stored without a version is version 1. A field added later, at its
default, is left out of the run's noise identity
(:func:`fedjax_dp.config.noise_identity.identity`), so a run resumed across such a release
draws the same noise as before and finishes bit for bit as if never stopped.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fedjax_dp import config as config_lib

SCHEMA_VERSION = 7
# Fields added to base_config() after schema version 1: {dotted key: the version that
# added it}. Each has a default that reproduces the behaviour of the runs before it.
ADDED_FIELDS: dict[str, int] = {
    "data.placement": 2, "privacy.bands": 2, "privacy.tree_restart": 2,
    "compilation_cache": 3,
    # the optimizers (fedjax_dp.optimizers): sgd and fedavg are the steps of before
    "client.optimizer": 4, "client.momentum": 4, "client.beta1": 4, "client.beta2": 4,
    "client.eps": 4, "server.optimizer": 4, "server.momentum": 4, "server.beta1": 4,
    "server.beta2": 4, "server.tau": 4,
    # a held-out evaluation split (eval.split='unassigned'); 'test' is the split of before
    "eval.split": 5,
    # training examples no client holds (data.holdout); 0 set none aside before
    "data.holdout": 6,
    # the fold of data.holdout's permutation set aside; 0 is the set of before
    "data.holdout_fold": 7}


def stamped(config: Mapping[str, Any]) -> dict[str, Any]:
  """``config`` (a ``to_dict()``) with this release's ``schema_version``, to store."""
  return {config_lib.SCHEMA_KEY: SCHEMA_VERSION, **config}


def version(stored: Mapping[str, Any]) -> int:
  """The schema version of a stored config (1 when it carries none)."""
  return stored.get(config_lib.SCHEMA_KEY, 1)


def upgraded(stored: Mapping[str, Any], source: str = "the stored config") -> dict[str, Any]:
  """A stored config in this release's schema: the version key removed, every field
  it lacks filled with its current default (see the module docstring).

  Raises:
    config.ConfigError: it was written by a newer release (a schema this one
      cannot read), naming ``source``.
  """
  have = version(stored)
  if not isinstance(have, int) or isinstance(have, bool) or have > SCHEMA_VERSION:
    raise config_lib.ConfigError(
        f"{source} has config schema version {have!r}, newer than this release's "
        f"{SCHEMA_VERSION}; use the release that wrote it, --overwrite, or another --out")
  out = {k: copy.deepcopy(v) for k, v in stored.items() if k != config_lib.SCHEMA_KEY}
  _fill(out, config_lib.base_config().to_dict())
  return out


def _fill(node: dict[str, Any], defaults: Mapping[str, Any]) -> None:
  for k, default in defaults.items():
    if k not in node:
      node[k] = copy.deepcopy(default)
    elif isinstance(default, Mapping) and isinstance(node[k], dict):
      _fill(node[k], default)


def defaulted_added_fields(config: Mapping[str, Any]) -> tuple[str, ...]:
  """The :data:`ADDED_FIELDS` that ``config`` (a ``to_dict()``) holds at their default:
  they do not change a run, so they stay out of its noise identity."""
  if not ADDED_FIELDS:
    return ()
  defaults = config_lib.base_config().to_dict()
  return tuple(key for key in ADDED_FIELDS
               if _get(defaults, key) is not _MISSING and _get(config, key) == _get(defaults, key))


_MISSING = object()


def _get(d: Mapping[str, Any], dotted: str) -> Any:
  node: Any = d
  for part in dotted.split("."):
    if not isinstance(node, Mapping) or part not in node:
      return _MISSING
    node = node[part]
  return node
