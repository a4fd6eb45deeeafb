"""Rules that draw each round's cohort afresh from ``rng[seed, t]``: uniform, poisson, all.

``uniform`` (Wei et al.'s K-user random scheduling) and ``poisson`` are amplified by
their marginal q (example level: the selection bound; client level: fixed-size WBK19
and Poisson subsampling); ``all`` takes every client every round.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.selection.base import (
  SelectionRule,
  check_cohort,
  check_rate,
  full_sampling,
  poisson_cap,
  random_sampling,
)


def _uniform(u, k, q, seed, t, weights=None):
  return np.sort(np.random.default_rng([seed, t]).choice(u, k, replace=False))


def _poisson(u, k, q, seed, t, weights=None):
  ids = np.flatnonzero(np.random.default_rng([seed, t]).random(u) < q)
  cap = poisson_cap(u, q)
  if ids.size > cap:
    raise RuntimeError(f"Poisson draw of {ids.size} clients exceeds the cap {cap}")
  return ids



def _all(u, k, q, seed, t, weights=None):
  return np.arange(u)



UNIFORM = SelectionRule(
    sample=_uniform, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
    deterministic=False, sampling=random_sampling("fixed_size"),
    max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k,
    check=check_cohort,
    summary="K of U clients uniformly without replacement each round")
POISSON = SelectionRule(
    sample=_poisson, slots=lambda u, k, q: poisson_cap(u, q), q=lambda u, k, q: float(q),
    deterministic=False, sampling=random_sampling("poisson"),
    max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: 0,
    check=check_rate, summary="each client independently with probability server.q",
    reads=("server.q",))
ALL = SelectionRule(
    sample=_all, slots=lambda u, k, q: u, q=lambda u, k, q: 1.0,
    deterministic=False, sampling=full_sampling,
    max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: u,
    public_pattern=True, summary="every client every round")
