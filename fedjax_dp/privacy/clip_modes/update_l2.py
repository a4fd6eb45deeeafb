"""``client.clip_mode='update_l2'``: the client's update clipped to L2 norm C.

DP-FedAvg (McMahan et al. 2018): after the E local steps the update
``Delta_i = w_local - w_global`` is scaled to ``Delta_i min(1, C / ||Delta_i||_2)``
and the client uploads ``w_global + Delta_i``; its unclipped norm is reported (the
server's adaptive clip rules count it, ``server.clip_rule``).

Placements:

* ``upload``: the upload lies in the L2 ball of radius C around the shared global
  model, :func:`fedjax_dp.privacy.clip_modes.param_l2.upload_sensitivity`
  (``2 C``; L1 ``2 C sqrt(d)`` for Laplace);
* ``central``: the server noises the weighted aggregate, client-level replace-one,
  :func:`central_sensitivity`.

References:
  McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models",
  https://arxiv.org/abs/1710.06963.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy import clipping, fused
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.clip_modes import base, param_l2


def central_sensitivity(clip: float, counts: np.ndarray, aggregation: str, rule_name: str,
                        clients_per_round: int, q: float) -> float:
  """Replace-one (client level) sensitivity of the aggregate that the server noises.

  Each client uploads ``w_i`` with ``||w_i - w|| <= C`` (``update_l2`` clipping), so
  replacing client i's data moves its upload by at most 2 C and the aggregate by
  ``2 C p_i``, where ``p_i`` is its weight; the bound is ``2 C max p_i`` over every
  cohort the rule can draw:

  * ``'unnormalized'``: ``p_i = |D_i| / |D|``;
  * ``'fixed'``: ``p_i = |D_i| / (f |D|)`` (f the expected share; DP-FedAvg);
  * ``'normalized'``: ``p_i = |D_i| / sum_{j in S} |D_j|``, largest for the largest
    client among the smallest cohort the rule can draw (its ``min_cohort`` size).
    A rule that can draw a cohort of one (Poisson) gives ``p_i = 1``: such a run
    would need the noise of one client per round, so it is refused instead.

  Assumption: the client sizes ``|D_i|`` (hence every ``p_i``) are public and equal
  between neighbours, as replace-one of a client's data with a dataset of the same
  size gives; a neighbour that changes ``|D_i|`` moves every weight and is not covered.

  Raises:
    ValueError: ``'normalized'`` with a rule whose cohort size is random.
  """
  counts = np.asarray(counts, np.float64)
  u = counts.size
  if aggregation == "unnormalized":
    return 2.0 * clip * float(np.max(counts) / np.sum(counts))
  if aggregation == "fixed":
    return 2.0 * clip * float(np.max(counts) / (q * np.sum(counts)))
  rule = selection_lib.get_rule(rule_name)
  k = rule.min_cohort(u, clients_per_round, q)
  if k < 1:
    raise ValueError(
        f"privacy.placement='central' with server.selection={rule_name!r} and "
        "server.aggregation='normalized' has no useful sensitivity: the aggregate is "
        "divided by the realised cohort's total, so a small draw makes one client's "
        "weight up to 1 while the noise is sized for K clients. Use "
        "server.aggregation='fixed' (divide by the expected total q sum |D_i|, as "
        "DP-FedAvg) or server.selection='uniform'")
  smallest = np.sort(counts)[:k]
  return 2.0 * clip * float(np.max(counts) / (np.sum(smallest) - smallest[-1]
                                              + np.max(counts)))


def sensitivity(placement: str, inputs: base.SensitivityInputs) -> np.ndarray:
  """Update clipping's sensitivity at ``placement`` (``upload`` or ``central``)."""
  if placement == "upload":
    return param_l2.upload_sensitivity(placement, inputs)
  server = inputs.server
  return np.full(inputs.num_clients, central_sensitivity(
      inputs.clip, inputs.counts, server.aggregation, server.selection,
      int(server.clients_per_round), inputs.q))


def clip_update(params, global_params, clip):
  """``(w_global + clip_C(w_local - w_global), ||w_local - w_global||_2)``."""
  delta = jax.tree_util.tree_map(jnp.subtract, params, global_params)
  delta, update_norm = clipping.clip_by_norm(delta, clip)
  return jax.tree_util.tree_map(jnp.add, global_params, delta), update_norm


MODE = base.ClipMode(
    name="update_l2",
    summary="the client's update clipped to L2 norm C (DP-FedAvg)",
    client=base.ClientHooks(base.plain_grad, after_local=clip_update, fused=fused.UPDATE_L2),
    proof=base.Proof(sensitivity, placements=("upload", "central"), laplace=("upload",),
                     client_level=("central",), server_clip=True, upload_ball=True),
    canary=base.Canary(example_scale=1e4, l1_geometry=True),
)
