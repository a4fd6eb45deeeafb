"""``client.clip_mode='per_example_l2'``: every example's gradient clipped to L2 norm C.

Wei et al. 2020, Alg. 1 lines 6-9 (and DP-SGD, Abadi et al. 2016): before each local
step each example's gradient is scaled to ``g min(1, C / ||g||_2)`` and the step
follows the clipped mean (ghost norms, :mod:`fedjax_dp.privacy.clipping`).

Placements (each proved for the replace-one example adjacency the accountant uses,
and for add/remove where stated):

* ``upload``: :func:`upload_sensitivity`, ``2 C (eta_1 / b_i + sum_{s>=2} eta_s)``;
* ``step``: noise on each step's clipped SUM, :func:`step_sensitivity`.

References:
  Wei et al. 2020, "Federated Learning with Differential Privacy: Algorithms and
  Performance Analysis", https://arxiv.org/abs/1911.00222.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy import fused
from fedjax_dp.privacy.clip_modes import base


def upload_sensitivity(clip: float, lrs: np.ndarray, batch: np.ndarray) -> np.ndarray:
  """``[U]`` replace-one sensitivity of a client's final model after E local steps of
  clipped-gradient descent (per-example clipping, L2 or L1, norm C), no noise inside.

  ``Delta_i = 2 C (eta_1 / b_i + sum_{s>=2} eta_s)``.

  Proof (for any norm whose ball the clipping projects on; L2 or L1). Let D, D'
  differ in one example of client i, and w_s, w'_s the two runs' parameters before
  step s (w_1 = w'_1, the global model). A step is
  ``w_{s+1} = w_s - eta_s (g_s(w_s) + kappa w_s)`` with ``g_s`` the mean over the b_i
  examples of the step's batch of per-example gradients clipped to norm C, and the
  batch drawn from a key that does not depend on the data. At step 1 only the
  replaced example's clipped gradient differs: ``||g_1 - g'_1|| <= 2 C / b_i``. At
  a later step the parameters already differ, so every example's gradient may
  differ (B1 of the trust review: a flipped hinge active set), but each clipped
  mean lies in the ball of radius C: ``||g_s(w_s) - g'_s(w'_s)|| <= 2 C``. With
  ``|1 - eta_s kappa| <= 1`` (checked by :func:`base.check_decay`),
  ``||w_{s+1} - w'_{s+1}|| <= ||w_s - w'_s|| + eta_s ||g_s - g'_s||``; summing over s
  gives the bound. For E = 1 it is Wei et al.'s eq. (13), ``2 eta C / |D_i|``.

  With an optimizer whose upload is ``w_1 - sum_j A_j G_j`` (heavy-ball momentum,
  ``client.optimizer='momentum'``, ``A_j >= 0``; :func:`base.step_weights`), the two
  runs' uploads differ by ``sum_j A_j (g_j - g'_j)`` (``kappa = 0``), and the same
  per-step bounds give ``2 C (A_1 / b_i + sum_{j>=2} A_j)``: ``lrs`` are then the
  ``A_j`` (``A_j = eta_j`` for SGD).

  Args:
    clip: C.
    lrs: ``[E]`` the local step sizes (the step weights ``A_j`` of a linear optimizer).
    batch: ``[U]`` examples per step b_i.
  """
  lrs = np.asarray(lrs, np.float64)
  return 2.0 * clip * (lrs[0] / np.asarray(batch, np.float64) + np.sum(lrs[1:]))


def step_sensitivity(inputs: base.SensitivityInputs) -> np.ndarray:
  """``[U]`` sensitivity of one local step's clipped gradient SUM (noise placement
  ``'step'``, noise drawn on the sum, the next step conditions on its noisy output).

  Proof. The step's parameters are fixed by earlier (released) outputs, so only the
  clipped gradients of the step's batch enter, each of norm at most C. Fixed-size
  batches (drawn from a data-independent key), replace-one: the replaced example's
  term moves from one point of the ball to another, ``2 C``. Poisson minibatches:
  ``C``, the unit of DP-SGD's noise multiplier; under add/remove one example's term
  appears or not (at most C), under replace-one it moves by 2 C, which
  :meth:`fedjax_dp.privacy.plan.PrivacyPlan.poisson_step_event` charges as the sum of
  two terms of norm C (``Event.sum_of_terms``).
  """
  c = inputs.clip if inputs.minibatch == "poisson" else 2.0 * inputs.clip
  return np.full(inputs.num_clients, c)


def sensitivity(placement: str, inputs: base.SensitivityInputs) -> np.ndarray:
  """Per-example clipping's sensitivity at ``placement`` (``upload`` or ``step``)."""
  if placement == "step":
    return step_sensitivity(inputs)
  return upload_sensitivity(inputs.clip, base.step_weights(placement, inputs), inputs.batch)


MODE = base.ClipMode(
    name="per_example_l2",
    summary="each example's gradient clipped to L2 norm C (Wei et al.; DP-SGD)",
    client=base.ClientHooks(base.per_example_grad(2), fused=fused.per_example(2)),
    proof=base.Proof(sensitivity, placements=("upload", "step"), step_weighted=("upload",),
                     poisson_steps=True),
)
