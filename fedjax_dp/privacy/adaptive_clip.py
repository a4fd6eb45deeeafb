"""The server's clip rules (``server.clip_rule``): which runs may re-clip the uploads at
the server, what the ``median`` rule certifies (nothing), and how ``private_median``
splits the round's budget between the clipped sum and its noisy count.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import clip_modes


class ClipRule(NamedTuple):
  """One ``server.clip_rule``.

  Attributes:
    summary: what sets the server's clip bound S.
    reads: the config fields the rule reads that not every rule reads: a config
      that sets one away from its default while picking a rule that does not read
      it is refused (:func:`fedjax_dp.config.unread_fields`).
  """

  summary: str
  reads: tuple[str, ...] = ()


CLIP_RULES: dict[str, ClipRule] = {
    "fixed": ClipRule("S = client.clip"),
    "median": ClipRule("Geyer et al. 2017: the cohort's median update norm (data "
                       "dependent: certified epsilon inf)"),
    "private_median": ClipRule(
        "Andrew et al. 2021: S_t from a noisy count of unclipped updates, updated by "
        "the host", reads=("server.clip_quantile", "server.clip_lr",
                           "server.clip_count_std")),
}

MEDIAN_REASON = (
    "server.clip_rule='median' (Geyer et al. 2017 as printed): the clip bound S is the "
    "median of the cohort's update norms, a function of the clients' data, and the noise "
    "is scaled by S, so no sensitivity bound holds for the release (one client can move "
    "S and with it the scale of every clipped update and of the noise): certified "
    "epsilon = inf; the claimed epsilon is the RDP accountant's for a fixed S. Use "
    "server.clip_rule='private_median' (Andrew et al. 2021) for a certified adaptive clip")


def private_median_split(z: float, count_std: float) -> float:
  """Noise multiplier ``z_sum`` of the clipped sum when the count of unclipped updates
  gets ``N(0, count_std^2)``, such that the round's joint release is a Gaussian
  mechanism of multiplier ``z`` (Andrew et al. 2021, Thm. 1, in our replace-one units):

  ``z_sum = (z^-2 - count_std^-2)^(-1/2)``.

  Proof. Replacing one client's data moves the noised aggregate by at most its
  sensitivity ``Delta`` (``update_l2.central_sensitivity`` at the round's clip bound
  ``S_t``, which is a function of earlier releases only) and the count
  ``sum_i 1[||Delta_i|| <= S_t]`` by at most 1. Divide each part by its noise std
  (``z_sum Delta`` and ``count_std``): the pair becomes an isotropic unit Gaussian
  around a mean that moves by at most ``sqrt(z_sum^-2 + count_std^-2) = 1 / z``, i.e.
  one Gaussian mechanism of multiplier z, which the selection rule's event then
  amplifies as for a fixed bound (both parts are computed from the same cohort).

  Raises:
    ConfigError: ``count_std <= z`` (the count alone would spend more than the whole
      round's budget).
  """
  if not math.isfinite(z):
    return math.inf
  if not count_std > z:
    raise ConfigError(
        f"server.clip_count_std={count_std:g} must exceed the round's noise multiplier "
        f"z={z:g} for server.clip_rule='private_median': the noisy count takes "
        "count_std^-2 of the round's z^-2 (Andrew et al. 2021); raise it (their default "
        "is K/20) or the noise")
  return float((z ** -2 - count_std ** -2) ** -0.5)


def check_clip_rule(inputs, mode: clip_modes.ClipMode) -> None:
  """``server.clip_rule`` other than ``'fixed'`` re-clips the uploads at the server: it
  needs central noise on a mode whose uploads are updates clipped to a bound
  (the clip mode's ``Proof.server_clip``), and ``'median'`` cannot meet a budget.

  Args:
    inputs: :class:`fedjax_dp.privacy.inputs.PrivacyInputs`.
    mode: the run's clip mode.

  Raises:
    ConfigError: naming the field.
  """
  clip_rule, p = inputs.server.clip_rule, inputs.privacy
  if clip_rule not in CLIP_RULES:
    raise ConfigError(f"server.clip_rule: unknown {clip_rule!r}; known: {list(CLIP_RULES)}")
  if clip_rule == "fixed":
    return
  if not server_clip_ok(mode, p.placement):
    modes = [n for n, m in clip_modes.CLIP_MODES.items() if m.proof.server_clip]
    raise ConfigError(f"server.clip_rule={clip_rule!r} clips the clients' updates at the "
                      "server: it needs privacy.placement='central' and "
                      f"client.clip_mode in {', '.join(modes)} (got "
                      f"{p.placement!r}, {mode.name!r})")
  if p.mechanism != "gaussian":
    raise ConfigError(f"server.clip_rule={clip_rule!r} is written for Gaussian noise "
                      f"(got privacy.mechanism={p.mechanism!r})")
  if clip_rule == "median" and p.enforce_budget:
    raise ConfigError("server.clip_rule='median' has certified epsilon inf (no sensitivity "
                      "bound): privacy.enforce_budget would stop it before the first round")


def server_clip_ok(mode: clip_modes.ClipMode, placement: str) -> bool:
  """Whether the server may re-clip the uploads of ``mode`` at ``placement``: updates
  clipped to a bound (the clip mode's ``Proof.server_clip``), noised by the server (``'central'``,
  or no noise). The one rule the plan and the compiled round both ask."""
  return bool(mode.proof.server_clip) and placement in ("central", "none")
