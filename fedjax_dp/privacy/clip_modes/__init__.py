"""The clip-mode registry: ``client.clip_mode`` -> :class:`ClipMode`, one file per mode.

Each mode's file holds its client-side computation, its sensitivity at each noise
placement it supports with the proof in the docstring, the privacy unit of its
accounting event, its config checks and its audit canary (:mod:`.base` says what
each field means). The client (:mod:`fedjax_dp.training.client`), the privacy plan
(:mod:`fedjax_dp.privacy.plan`), the audit and the sensitivity harness
(``tests/test_sensitivity.py``) look modes up here.

Adding a clip mode: write ``fedjax_dp/privacy/clip_modes/<name>.py`` defining
``MODE = base.ClipMode(...)`` and add it to :data:`CLIP_MODES` below (or call
:func:`register` at run time, as a test does).
"""

from __future__ import annotations

from fedjax_dp import optimizers
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy.clip_modes import (
  base,
  none,
  param_l2,
  per_example_l1,
  per_example_l2,
  step_grad_l1,
  step_grad_l2,
  update_l2,
)
from fedjax_dp.privacy.clip_modes.base import Canary, ClipMode, SensitivityInputs

CLIP_MODES: dict[str, ClipMode] = {
    "none": none.MODE,
    "per_example_l2": per_example_l2.MODE,
    "per_example_l1": per_example_l1.MODE,
    "param_l2": param_l2.MODE,
    "update_l2": update_l2.MODE,
    "step_grad_l1": step_grad_l1.MODE,
    "step_grad_l2": step_grad_l2.MODE,
}


def get(name: str) -> ClipMode:
  """The mode called ``name``.

  Raises:
    ValueError: an unknown name, naming ``client.clip_mode``.
  """
  if name not in CLIP_MODES:
    raise ValueError(f"client.clip_mode: unknown {name!r}; known: {tuple(CLIP_MODES)}")
  return CLIP_MODES[name]


def register(mode: ClipMode) -> ClipMode:
  """Adds ``mode`` to :data:`CLIP_MODES` (a new name only) and returns it."""
  if mode.name in CLIP_MODES:
    raise ValueError(f"client.clip_mode={mode.name!r} is already registered")
  CLIP_MODES[mode.name] = mode
  return mode


def check_config(cfg) -> None:
  """The configured mode's own checks (:attr:`ClipMode.check`), and the client
  optimizer where the mode's bound at the placement counts the local steps
  (:attr:`ClipMode.step_weighted`, :func:`base.check_optimizer`); an unknown mode or
  optimizer is left to the config's field rules.

  Raises:
    ConfigError: naming the field.
  """
  mode = CLIP_MODES.get(cfg.client.clip_mode)
  if mode is None:
    return
  mode.check(cfg)
  placement = cfg.privacy.placement
  # What the check reads (linear, l2_contraction) is the registered record's own,
  # whatever its hyperparameter values.
  optimizer = optimizers.CLIENT_OPTIMIZERS.get(cfg.client.get("optimizer", "sgd"))
  if placement in mode.step_weighted and optimizer is not None:
    try:
      base.check_optimizer(optimizer, mode.name, placement, float(cfg.client.l2_reg),
                           int(cfg.client.local_steps))
    except ValueError as e:
      raise ConfigError(str(e)) from e


def supporting(placement: str, laplace: bool = False) -> tuple[str, ...]:
  """The modes with a proven (L1, when ``laplace``) sensitivity at ``placement``."""
  return tuple(n for n, m in CLIP_MODES.items()
               if placement in (m.laplace if laplace else m.placements))


__all__ = ["CLIP_MODES", "Canary", "ClipMode", "SensitivityInputs", "check_config", "get",
           "register", "supporting"]
