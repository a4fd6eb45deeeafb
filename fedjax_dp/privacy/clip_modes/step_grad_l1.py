"""``client.clip_mode='step_grad_l1'``: each local step's mean gradient clipped to L1 norm C.

Fu et al. 2023, Sec. VI-B, eq. (Clip) as printed (L1, for their Laplace Theorem 1):
:mod:`step_grad_l2`'s clip in the L1 norm. Its proof holds in the clip's norm, so
:func:`step_grad_l2.step_grad_sensitivity` is here an L1 sensitivity and bounds
Laplace noise on the upload (client level). The audit's canary is sparse (the L1
ball's vertices).
"""

from __future__ import annotations

from fedjax_dp.privacy.clip_modes import base, step_grad_l2

MODE = base.ClipMode(
    name="step_grad_l1",
    summary="each local step's mean gradient clipped to L1 norm C (Fu et al., Laplace)",
    client=base.ClientHooks(base.step_grad(1)),
    proof=base.Proof(step_grad_l2.sensitivity, placements=("upload",), laplace=("upload",),
                     client_level=("upload",), step_weighted=("upload",)),
    canary=base.Canary(input=base.sparse_input),
)
