"""Label heterogeneity of a partition: histograms, 1-Wasserstein distances, A-DPFL scores.

A-DPFL (spec adpfl.md sections 2.3 and 3.2) measures how far each client's data is from
the global distribution with the 1-Wasserstein distance ``W(p_i, p)`` (eq. (10)) and
summarises the federation by ``c_1`` (eq. (12)). Heterogeneity there is label skew
(eq. (5)), so, as the spec resolves (section 7 item 7), the distributions compared are
*label marginals*: client i's normalised label histogram ``h_i`` against the global
marginal ``p = sum_i |D_i| h_i / sum_i |D_i|`` (the union of the clients' data).

Two ground metrics on the label set:

* ``'zero_one'`` (default): ``d(y, y') = 1[y != y']``. Then ``W_1 = TV = 1/2 sum_y |h(y) -
  p(y)|``: the optimal coupling keeps the common mass ``sum_y min(h(y), p(y))`` in place
  and moves the rest at cost 1. It ignores the arbitrary order of class ids.
* ``'ordinal'``: ``d(y, y') = |y - y'|`` on the class ids. On the real line
  ``W_1 = int |F_h - F_p| = sum_{c=0}^{C-2} |F_h(c) - F_p(c)|`` with CDFs ``F``, which is
  what ``scipy.stats.wasserstein_distance`` computes on label values.

Pure numpy, host side. The server needs every client's label histogram to compute
these; that release is outside the DP accounting (spec section 7 item 8).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GROUND_METRICS = ("zero_one", "ordinal")


def label_histograms(labels, client_indices: Sequence[np.ndarray],
                     num_classes: int | None = None) -> np.ndarray:
  """Per-client label counts.

  Args:
    labels: integer training labels ``[N]`` in ``[0, num_classes)``.
    client_indices: one index array into ``labels`` per client (a partition).
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    int64 counts ``[U, C]``; row i is client i's histogram (all zero for an empty client).
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} and "
                     f"dtype {labels.dtype}.")
  if num_classes is None:
    num_classes = int(labels.max()) + 1 if labels.size else 1
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f"labels must lie in [0, {num_classes}), got values in "
                     f"[{labels.min()}, {labels.max()}].")
  return np.stack([np.bincount(labels[np.asarray(i, np.int64)], minlength=num_classes)
                   for i in client_indices]).astype(np.int64)


def _normalise(hist: np.ndarray) -> np.ndarray:
  totals = hist.sum(axis=-1, keepdims=True)
  if np.any(totals <= 0):
    raise ValueError("every client needs at least one example to have a label distribution.")
  return hist / totals


def global_distribution(hists) -> np.ndarray:
  """The global label marginal ``p [C]`` of the union of the clients' data."""
  hists = np.asarray(hists, np.float64)
  return hists.sum(axis=0) / hists.sum()


def wasserstein_distances(hists, reference=None, metric: str = "zero_one") -> np.ndarray:
  """``W_1(h_i, p)`` for every client i, on the label space.

  Args:
    hists: per-client label counts (or distributions) ``[U, C]``; rows are normalised.
    reference: the distribution ``p [C]`` to compare with; default
      :func:`global_distribution` of ``hists`` (count-weighted, spec section 2.3).
    metric: ground metric, ``'zero_one'`` (total variation) or ``'ordinal'``
      (``|y - y'|``, the distance of ``scipy.stats.wasserstein_distance``).

  Returns:
    float64 ``[U]``; ``0 <= W_i <= 1`` for ``zero_one``, ``<= C - 1`` for ``ordinal``.
  """
  if metric not in GROUND_METRICS:
    raise ValueError(f"metric must be one of {GROUND_METRICS}, got {metric!r}.")
  hists = np.asarray(hists, np.float64)
  if hists.ndim != 2 or np.any(hists < 0):
    raise ValueError(f"hists must be non-negative [U, C], got shape {hists.shape}.")
  h = _normalise(hists)
  p = global_distribution(hists) if reference is None else _normalise(
      np.asarray(reference, np.float64))
  if p.shape != (h.shape[1],):
    raise ValueError(f"reference must have shape ({h.shape[1]},), got {p.shape}.")
  if metric == "zero_one":
    return 0.5 * np.abs(h - p).sum(axis=1)
  # Unit spacing between consecutive class ids: W_1 = sum of |CDF differences|.
  return np.abs(np.cumsum(h - p, axis=1)[:, :-1]).sum(axis=1)


def heterogeneity_c1(distances, lipschitz: float = 1.0) -> float:
  """A-DPFL eq. (12): ``c_1 = L_Z sqrt((1/N) sum_i W(p_i, p)^2)``.

  By eq. (11) and Kantorovich-Rubinstein duality ``||grad f_i - grad f|| <= L_Z W(p_i,
  p)``, so ``c_1^2`` bounds the mean squared gradient dissimilarity (spec section 3.2).
  ``L_Z`` is unknown in the paper; it cancels in every ranking, default 1.
  """
  w = np.asarray(distances, np.float64)
  if w.ndim != 1 or not w.size or np.any(w < 0):
    raise ValueError(f"distances must be a non-empty, non-negative [N], got {w!r}.")
  return float(lipschitz * np.sqrt(np.mean(w ** 2)))


def selection_scores(distances, lipschitz: float = 1.0) -> np.ndarray:
  """A-DPFL scores ``SC_i = 1 - L_Z W_i / c_1`` (spec section 2.3; not in the paper).

  Higher is more representative; ``SC_i > 0`` means client i is closer to the global
  distribution than the RMS client. When every ``W_i = 0`` (IID), all scores are 1.
  """
  w = np.asarray(distances, np.float64)
  c1 = heterogeneity_c1(w, lipschitz)
  if c1 == 0.0:
    return np.ones_like(w)
  return 1.0 - lipschitz * w / c1


def selection_probabilities(scores) -> np.ndarray:
  """``p_i = softmax(SC)_i`` (spec section 2.3; not in the paper); sums to 1, eq. (13)."""
  sc = np.asarray(scores, np.float64)
  e = np.exp(sc - sc.max())
  return e / e.sum()


def client_heterogeneity(labels, client_indices: Sequence[np.ndarray],
                         num_classes: int | None = None, metric: str = "zero_one",
                         lipschitz: float = 1.0) -> dict[str, np.ndarray | float]:
  """All of the above for one partition.

  Returns:
    dict with ``hists [U, C]``, ``global [C]``, ``distances [U]``, ``c1``,
    ``scores [U]`` and ``probabilities [U]``.
  """
  hists = label_histograms(labels, client_indices, num_classes)
  w = wasserstein_distances(hists, metric=metric)
  scores = selection_scores(w, lipschitz)
  return {"hists": hists, "global": global_distribution(hists), "distances": w,
          "c1": heterogeneity_c1(w, lipschitz), "scores": scores,
          "probabilities": selection_probabilities(scores)}
