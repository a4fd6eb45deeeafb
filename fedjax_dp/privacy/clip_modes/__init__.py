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
from fedjax_dp.privacy.clip_modes.base import (
  Canary,
  ClientHooks,
  ClipMode,
  Proof,
  SensitivityInputs,
)

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


def check_config(inputs) -> None:
  """The configured mode's own checks (:attr:`Proof.check`) of
  :class:`fedjax_dp.privacy.inputs.PrivacyInputs`, and the client optimizer where the
  mode's bound at the placement counts the local steps (:attr:`Proof.step_weighted`,
  :func:`base.check_step_weighted`); an unknown mode is left to the config's field
  rules.

  Raises:
    ConfigError: naming the field.
  """
  mode = CLIP_MODES.get(inputs.client.clip_mode)
  if mode is not None:
    mode.proof.check(inputs)
    base.check_step_weighted(mode, inputs)


def supporting(placement: str, laplace: bool = False) -> tuple[str, ...]:
  """The modes with a proven (L1, when ``laplace``) sensitivity at ``placement``."""
  return tuple(n for n, m in CLIP_MODES.items()
               if placement in (m.proof.laplace if laplace else m.proof.placements))


__all__ = ["CLIP_MODES", "Canary", "ClientHooks", "ClipMode", "Proof", "SensitivityInputs",
           "check_config", "get", "register", "supporting"]
