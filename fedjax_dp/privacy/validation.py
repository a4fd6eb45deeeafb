"""The A-DPFL validation release on the selected clients' data: its mode, its
sensitivity (with the proof) and the runs whose accounting covers it."""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import clip_modes

VALIDATIONS = ("server", "clients")
# The schedules that read a validation score (schedule.validation applies to them).
VALIDATING_SCHEDULES = ("adpfl",)


def validation_mode(inputs) -> str:
  """``'clients'`` when the run releases A-DPFL's score on the selected clients' data
  (``schedule.validation='clients'`` for a schedule that reads one), else ``'server'``
  (:class:`fedjax_dp.privacy.inputs.PrivacyInputs`)."""
  p = inputs.privacy
  return "clients" if (p.validation == "clients" and p.schedule in VALIDATING_SCHEDULES
                       ) else "server"


def validation_sensitivity(counts: np.ndarray) -> float:
  """Replace-one-example sensitivity of the accuracy on the selected clients' data:
  ``1 / N_sel`` with ``N_sel = sum_{i in S} |D_i|`` (``counts`` of the selected).

  Proof. ``S_t = (1 / N_sel) sum_{i in S} sum_{x in D_i} 1[f_w(x) correct]`` where
  ``w`` is the new global model. ``w`` is the round's released output (a function of
  the noised releases), so in the adaptive composition it is fixed when the score's
  sensitivity is taken; the cohort S is drawn without reading examples, and the
  counts ``|D_i|`` are public (replace-one keeps them), so ``N_sel`` is the same on
  both neighbours. Replacing one example of one selected client changes one
  indicator by at most 1 and no other term, so ``|S_t - S'_t| <= 1 / N_sel``. A
  client that is not selected contributes nothing (``0`` change). With ``N_sel = 0``
  the score is 0 on every dataset.

  Accounting (:meth:`fedjax_dp.privacy.plan.PrivacyPlan.event`). The round releases
  the model update (Gaussian, multiplier z at the same replace-one-example adjacency)
  and ``S_t + N(0, (z_val / N_sel)^2)``, both computed on the same cohort. For a fixed
  cohort the pair is an adaptive composition of Gaussian mechanisms, which is
  ``mu``-GDP with ``mu^2 = z^-2 + z_val^-2`` (Dong, Roth & Su 2022, Cor. 3.3), i.e.
  dominated by one Gaussian of multiplier ``(z^-2 + z_val^-2)^(-1/2)``. Subsampling
  acts on the dominating pair (Zhu, Dong & Wang 2022, Thm. 10-11), so the round is
  charged as the selection rule's event of that single Gaussian: amplified as the
  round itself for random rules, charged to the clients that took part for
  deterministic ones. Poisson minibatches (the run's ``PrivacyPlan.adjacency``;
  under add/remove each client's count is public and held fixed,
  :data:`fedjax_dp.privacy.minibatch.POISSON_ASSUMPTION`): ``N_sel`` is that public
  count, adding, removing or replacing one example moves the numerator by at most 1,
  so the sensitivity is again ``1 / N_sel``; those rounds claim no selection
  amplification and charge the clients that took part, so the score is one more
  Gaussian event composed for them (``PrivacyPlan.validation_event``). Not covered
  (refused by :func:`check_validation`): Laplace rounds and client-level releases
  (central placement, ``step_grad_*``).
  """
  n_sel = float(np.sum(np.asarray(counts, np.float64)))
  return 1.0 / max(n_sel, 1.0)


def check_validation(inputs, plan=None) -> None:
  """Refuses a ``schedule.validation`` that is unknown, or ``'clients'`` where its
  release cannot be accounted (see :func:`validation_sensitivity`).

  Args:
    inputs: :class:`fedjax_dp.privacy.inputs.PrivacyInputs`.
    plan: the run's :class:`fedjax_dp.privacy.plan.PrivacyPlan`, if built (a plan
      without noise certifies nothing, so its score needs none).

  Raises:
    ConfigError: naming the field.
  """
  p = inputs.privacy
  if p.validation not in VALIDATIONS:
    raise ConfigError(f"schedule.validation: unknown {p.validation!r}; known: {VALIDATIONS}")
  if validation_mode(inputs) != "clients":
    return
  z = float(p.val_noise_multiplier)
  if plan is not None and plan.noiseless:
    return  # privacy off: the score is released as is, nothing is certified anyway
  if not (math.isfinite(z) and z > 0):
    raise ConfigError(f"schedule.val_noise_multiplier must be finite and > 0 with "
                      f"schedule.validation='clients' (the score reads the clients' data "
                      f"and is released with noise z_val / N_sel), got {z}")
  if p.mechanism != "gaussian":
    raise ConfigError("schedule.validation='clients' is accounted as a Gaussian release "
                      f"composed with the round's Gaussian: privacy.mechanism must be "
                      f"'gaussian', got {p.mechanism!r}; use "
                      "schedule.validation='server'")
  if clip_modes.get(inputs.client.clip_mode).level(p.placement) == "client":
    raise ConfigError("schedule.validation='clients' has an example-level sensitivity "
                      "(1 / N_sel) that does not compose with a client-level round "
                      f"(privacy.placement={p.placement!r}, client.clip_mode="
                      f"{inputs.client.clip_mode!r}); use schedule.validation='server'")
