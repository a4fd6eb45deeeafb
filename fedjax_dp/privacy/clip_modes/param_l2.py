"""``client.clip_mode='param_l2'``: the parameters projected onto the L2 ball of radius C.

Yuan et al. 2023, Alg. 1: after every local step the model is projected onto
``{w : ||w||_2 <= C}``, so the upload itself lies in that ball whatever the data.

Placement ``upload`` only (the release is the model):

* Gaussian: L2 sensitivity ``2 C`` (:func:`upload_sensitivity`);
* Laplace: L1 sensitivity ``2 C sqrt(d)`` (:func:`ball_l1_sensitivity`).

The audit's example-level canary needs a large input (``1e4``) to push the model to
the ball's boundary, and Laplace on the ball is audited on a small model (the L1
geometry, :data:`fedjax_dp.audit.table.L1_GEOMETRY_SETS`).

References:
  Yuan et al. 2023, "Amplitude-Varying Perturbation for Balancing Privacy and Utility
  in Federated Learning", https://arxiv.org/abs/2303.04274.
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.privacy import clipping
from fedjax_dp.privacy.clip_modes import base


def ball_l1_sensitivity(clip: float, num_params: int) -> float:
  """Replace-one L1 sensitivity of a ``param_l2`` or ``update_l2`` upload: ``2 C sqrt(d)``.

  Proof. Whatever the data, the upload ``w`` (``param_l2``: projected onto the L2 ball
  of radius C after every local step, so also after the last) or the update ``w - w_0``
  (``update_l2``, with ``w_0`` the global model both runs share) lies in the L2 ball of
  radius C, so two runs on neighbouring datasets differ by ``||x||_2 <= 2 C``. For
  ``x`` in R^d, Cauchy-Schwarz with the all-ones vector gives
  ``||x||_1 = <|x|, 1> <= ||x||_2 sqrt(d)``, hence ``||x||_1 <= 2 C sqrt(d)`` for every
  local step count, batch and learning rate. (Tight up to the ball: ``x = 2 C 1 / sqrt(d)``.)

  Args:
    clip: C.
    num_params: d, the number of model parameters (every leaf is noised).
  """
  if num_params < 1:
    raise ValueError(f"num_params must be >= 1, got {num_params}")
  return 2.0 * clip * math.sqrt(num_params)


def upload_sensitivity(placement: str, inputs: base.SensitivityInputs) -> np.ndarray:
  """``[U]`` sensitivity of an upload that lies in the L2 ball of radius C (around
  the shared global model for ``update_l2``): ``2 C`` in L2 (two points of the ball,
  whatever the data: replace-one of one example or of the whole dataset), and
  :func:`ball_l1_sensitivity` in L1 for Laplace.

  Raises:
    ValueError: Laplace without ``num_params``.
  """
  u = inputs.num_clients
  if inputs.mechanism != "laplace":
    return np.full(u, 2.0 * inputs.clip)
  if inputs.num_params is None:
    raise ValueError(f"privacy.mechanism='laplace' with client.clip_mode="
                     f"{inputs.client.clip_mode!r}: the L1 sensitivity 2 C sqrt(d) needs "
                     "the model's parameter count (make_privacy_plan(..., num_params=d))")
  return np.full(u, ball_l1_sensitivity(inputs.clip, int(inputs.num_params)))


def project(params, clip):
  """Projects the parameters onto the L2 ball of radius C."""
  params, _ = clipping.clip_by_norm(params, clip)
  return params


MODE = base.ClipMode(
    name="param_l2",
    summary="parameters projected onto the L2 ball of radius C after each step (Yuan et al.)",
    client=base.ClientHooks(base.plain_grad, after_step=project),
    proof=base.Proof(upload_sensitivity, placements=("upload",), laplace=("upload",),
                     upload_ball=True),
    canary=base.Canary(example_scale=1e4, l1_geometry=True),
)
