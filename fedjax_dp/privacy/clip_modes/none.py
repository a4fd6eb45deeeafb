"""``client.clip_mode='none'``: no clipping, hence no sensitivity and no noise.

The client takes plain (full-batch or minibatch) gradient steps. Nothing bounds what
one example or one client moves the upload by, so the mode supports only
``privacy.placement='none'``: a run that adds noise to unclipped releases is
refused by :func:`fedjax_dp.privacy.plan.make_privacy_plan` (no finite sensitivity
exists to size the noise with).
"""

from __future__ import annotations

from fedjax_dp.privacy import fused
from fedjax_dp.privacy.clip_modes import base

MODE = base.ClipMode(
    name="none",
    summary="no clipping (non-private training only)",
    client=base.ClientHooks(base.plain_grad, fused=fused.UNCLIPPED),
    proof=base.Proof(base.no_sensitivity),
    reads=(),
)
