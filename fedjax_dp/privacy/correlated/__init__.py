"""Correlated-noise mechanisms (``privacy.mechanism``): tree aggregation and BandMF.

Each is a :class:`~fedjax_dp.privacy.correlated.base.CorrelatedNoise` (strategy, Gram
matrix, carried state, in-round sampler) registered in :data:`CORRELATED`; the privacy
plan (:mod:`fedjax_dp.privacy.plan`) reads the Gram matrix for its accounting, the
compiled round (:mod:`fedjax_dp.training.rounds`) the sampler. ``base`` has the argument.
"""

from __future__ import annotations

import functools

import numpy as np

from fedjax_dp.privacy.correlated import bandmf, tree
from fedjax_dp.privacy.correlated.base import (
  CorrelatedNoise,
  Strategy,
  pattern_sensitivity_sq,
  prefix_increments,
  realised_patterns,
)

CORRELATED: dict[str, CorrelatedNoise] = {
    "tree": tree.MECHANISM,
    "bandmf": bandmf.MECHANISM,
}


def get(name: str) -> CorrelatedNoise:
  if name not in CORRELATED:
    raise ValueError(f"privacy.mechanism: {name!r} is not a correlated mechanism; known: "
                     f"{sorted(CORRELATED)}")
  return CORRELATED[name]


@functools.lru_cache(maxsize=8)
def gram(strategy: Strategy) -> np.ndarray:
  """``C^T C [T, T]`` of a strategy (cached, read-only)."""
  out = np.asarray(get(strategy.name).gram(strategy), np.float64)
  out.setflags(write=False)
  return out


__all__ = ["CORRELATED", "CorrelatedNoise", "Strategy", "bandmf", "get", "gram",
           "pattern_sensitivity_sq", "prefix_increments", "realised_patterns", "tree"]
