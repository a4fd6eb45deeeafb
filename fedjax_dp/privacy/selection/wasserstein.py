"""A-DPFL's rules: the K clients closest to the global label marginal, or K drawn in
proportion to their scores (spec adpfl.md sections 2.3 and 7 items 6-8; the
accounting and its public-histogram assumption: :mod:`fedjax_dp.privacy.selection`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_dp.data import heterogeneity
from fedjax_dp.privacy.selection.base import SelectionRule, check_cohort, full_sampling


def _wasserstein_topk(u, k, q, seed, t, weights=None):
  """The K clients with the highest scores ``weights [U]`` (SC_i): the same set every
  round. Ties are broken at random, by a permutation fixed by the seed alone (not by
  t), so the set stays the same (spec section 2.3)."""
  scores = _check_weights(weights, u, "wasserstein_topk")
  tie = np.random.default_rng([seed, 0, 2]).random(u)  # [seed, 0, 2]: not a round's stream
  order = np.lexsort((tie, -scores))  # last key is primary: highest score first
  return np.sort(order[:k])


def _wasserstein_sample(u, k, q, seed, t, weights=None):
  """K clients without replacement with probability proportional to ``weights [U]``
  (p_i): successive sampling, numpy's ``choice(replace=False, p=p)``."""
  p = _check_weights(weights, u, "wasserstein_sample")
  p = p / p.sum()
  return np.sort(np.random.default_rng([seed, t]).choice(u, k, replace=False, p=p))


def _check_weights(weights, u, name):
  if weights is None:
    raise ValueError(f"server.selection={name!r} needs the per-client weights of its rule "
                     "(SelectionRule.weights), computed from the partition at build time")
  w = np.asarray(weights, np.float64)
  if w.shape != (u,) or not np.all(np.isfinite(w)):
    raise ValueError(f"server.selection={name!r}: weights must be finite [U={u}], got "
                     f"shape {w.shape}")
  return w



def adpfl_heterogeneity(labels, client_indices, num_classes, server) -> dict[str, Any]:
  """:func:`heterogeneity.client_heterogeneity` of a partition with the ground metric
  ``server.wasserstein_metric`` (:class:`fedjax_dp.privacy.inputs.ServerInputs`).

  Raises:
    ValueError: float (regression) targets, or an unknown metric, naming the field.
  """
  metric = server.wasserstein_metric
  if metric not in heterogeneity.GROUND_METRICS:
    raise ValueError(f"server.wasserstein_metric: unknown {metric!r}; known: "
                     f"{heterogeneity.GROUND_METRICS}")
  labels = np.asarray(labels)
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"server.selection={server.selection!r} ranks clients by their "
                     "label histograms and needs class labels, got targets of dtype "
                     f"{labels.dtype}")
  return heterogeneity.client_heterogeneity(labels, client_indices, num_classes, metric)


def _adpfl_weights(field: str):
  def weights(labels, client_indices, num_classes, server):
    return np.asarray(adpfl_heterogeneity(labels, client_indices, num_classes,
                                          server)[field], np.float64)
  return weights


PUBLIC_HISTOGRAMS = (
    "the clients' label histograms (which the selection is computed from) are public "
    "side information: the guarantee holds for adjacent datasets with equal label "
    "histograms and counts (replace one example by one of the same label; adding or "
    "removing one changes both, so it is not a neighbour); selection is not amplified "
    "and a client is charged the rounds it was selected in")


def _wasserstein_rule(sample, field: str, summary: str) -> SelectionRule:
  """An A-DPFL rule: K clients a round from the partition's ``field`` (public
  histograms), charged per client for the rounds it was selected in."""
  return SelectionRule(
      sample=sample, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
      deterministic=True, sampling=full_sampling,
      max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k,
      weights=_adpfl_weights(field), assumption=PUBLIC_HISTOGRAMS,
      relation="replace_one", check=check_cohort, summary=summary,
      reads=("server.wasserstein_metric",))


WASSERSTEIN_TOPK = _wasserstein_rule(
    _wasserstein_topk, "scores",
    "the K clients with the highest A-DPFL scores (same set each round)")
WASSERSTEIN_SAMPLE = _wasserstein_rule(
    _wasserstein_sample, "probabilities",
    "K clients sampled in proportion to A-DPFL probabilities")
