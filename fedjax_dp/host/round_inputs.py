"""What a run's host loop derives from its config and privacy plan before round 0.

The schedule's :class:`fedjax_dp.privacy.schedules.NoiseContext` and the noise of
``private_median``'s count: the run loop (:mod:`fedjax_dp.host.run_loop`) starts from
them, and the build's overflow check (:mod:`fedjax_dp.host.overflow`) judges the
values they lead to before anything compiles.
"""

from __future__ import annotations

from fedjax_dp.privacy.plan import PrivacyPlan
from fedjax_dp.privacy.schedules import NoiseContext


def noise_context(cfg, privacy: PrivacyPlan) -> NoiseContext:
  """The :class:`NoiseContext` a run's schedule is initialised with."""
  return NoiseContext(privacy.epsilon, privacy.delta, privacy.q, privacy.sensitivity,
                      int(cfg.rounds), privacy.noise_scale, float(cfg.client.lr),
                      params=dict(cfg.schedule))


def count_std(cfg, q: float, num_clients: int) -> float:
  """sigma_b of ``server.clip_rule='private_median'``'s noisy count
  (``server.clip_count_std``; < 0: Andrew et al.'s default m / 20, m = max(q U, 1))."""
  std = float(cfg.server.get("clip_count_std", -1.0))
  return max(q * num_clients, 1.0) / 20.0 if std < 0 else std
