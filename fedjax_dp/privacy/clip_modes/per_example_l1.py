"""``client.clip_mode='per_example_l1'``: every example's gradient clipped to L1 norm C.

Fu et al. 2023's clipping for the Laplace mechanism: the per-example clip of
:mod:`per_example_l2` in the L1 norm. Its proofs hold in any norm whose ball the
clip projects on, so the sensitivities are :func:`per_example_l2.upload_sensitivity`
and :func:`per_example_l2.step_sensitivity` read in L1, which bounds Laplace noise at
both placements (and, since ``||x||_2 <= ||x||_1``, Gaussian noise too).

Audit canary: an L1 clip bounds the L2 norm by C only on one axis (the L1 ball's
vertices), so the canary's gradient is sparse.
"""

from __future__ import annotations

from fedjax_dp.privacy import fused
from fedjax_dp.privacy.clip_modes import base, per_example_l2

MODE = base.ClipMode(
    name="per_example_l1",
    summary="each example's gradient clipped to L1 norm C (Fu et al., for Laplace)",
    client=base.ClientHooks(base.per_example_grad(1), fused=fused.per_example(1)),
    proof=base.Proof(per_example_l2.sensitivity, placements=("upload", "step"),
                     laplace=("upload", "step"), step_weighted=("upload",)),
    canary=base.Canary(input=base.sparse_input),
)
