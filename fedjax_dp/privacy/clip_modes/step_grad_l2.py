"""``client.clip_mode='step_grad_l2'``: each local step's mean gradient clipped to L2 norm C.

Fu et al. 2023, Sec. VI-B, eq. (Clip) in the L2 norm (the option for their Gaussian
Theorem 2): at every local step the step's (full-batch or minibatch) mean gradient
``g`` becomes ``g min(1, C / ||g||)``; examples are not clipped one by one, so the
bound holds for a client's WHOLE dataset: the privacy unit is the client.

Placement ``upload``, client-level replace-one, :func:`upload_sensitivity`
(``2 C sum_s eta_s``). Fu et al.'s formulas (``privacy.formula=fu_thm1/fu_thm2``)
admit it (:mod:`fedjax_dp.privacy.formulas.registry`: a mode whose upload is a
client-level release).

References:
  Fu et al. 2023, "On the Practicality of Differential Privacy in Federated Learning
  by Tuning Iteration Times", https://arxiv.org/abs/2101.04163.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.clip_modes import base


def step_grad_sensitivity(clip: float, lrs: np.ndarray, num_clients: int) -> np.ndarray:
  """``[U]`` replace-one CLIENT-level sensitivity of the model a client uploads after E
  local steps that each clip the step's mean gradient to norm C (``step_grad_l1`` /
  ``step_grad_l2``; Fu et al. Alg. 1 with eq. (Clip)): ``Delta = 2 C sum_s eta_s``.

  Proof (in the clip's norm; L1 for Laplace, L2 for Gaussian; an L1 bound is also an
  L2 bound). Neighbours replace client i's whole dataset D_i by any D'_i (the unit is
  the client). Step s is ``w_{s+1} = w_s - eta_s (g_s + kappa w_s)`` with
  ``||g_s|| <= C`` whatever the data and the parameters (the clip rescales the
  step's gradient into the ball of radius C), and the minibatch indices (if any)
  come from a key that does not depend on the data. Both runs start at the
  broadcast global model, so with ``|1 - eta_s kappa| <= 1`` (checked by
  :func:`base.check_decay`) ``||w_{s+1} - w'_{s+1}|| <= ||w_s - w'_s||
  + eta_s ||g_s - g'_s|| <= ||w_s - w'_s|| + 2 eta_s C``; summing over the E steps
  gives the bound. With a constant rate it is ``2 eta E C``: twice the paper's
  ``Xi = eta~ E zeta`` (Theorems 1/2), whose proof compares gradients at different
  points and drops the factor 2 (spec ``fu_practicality.md`` section 6, A7); the
  certified epsilon uses this corrected value.

  With heavy-ball momentum (``client.optimizer='momentum'``) the upload is
  ``w_1 - sum_j A_j G_j`` with ``A_j = sum_{s>=j} eta_s beta^(s-j) >= 0``
  (:func:`base.step_weights`), so with ``kappa = 0`` the uploads differ by at most
  ``sum_j A_j ||g_j - g'_j|| <= 2 C sum_j A_j``: ``lrs`` are then the ``A_j``.

  Args:
    clip: C (``zeta``).
    lrs: ``[E]`` the local step sizes (the step weights ``A_j`` of a linear optimizer).
    num_clients: U.
  """
  return np.full(num_clients, 2.0 * clip * float(np.sum(np.asarray(lrs, np.float64))))


def sensitivity(placement: str, inputs: base.SensitivityInputs) -> np.ndarray:
  """The upload's client-level sensitivity (placement ``upload``)."""
  return step_grad_sensitivity(inputs.clip, base.step_weights(placement, inputs),
                               inputs.num_clients)


MODE = base.ClipMode(
    name="step_grad_l2",
    summary="each local step's mean gradient clipped to L2 norm C (Fu et al., Gaussian)",
    client=base.ClientHooks(base.step_grad(2)),
    proof=base.Proof(sensitivity, placements=("upload",), client_level=("upload",),
                     step_weighted=("upload",)),
)
