"""Correlated noise across rounds: the matrix mechanism's shared pieces.

A correlated-noise mechanism is a factorisation ``A = B C`` of the prefix-sum
workload ``A [T, T]`` (lower-triangular ones). With ``G [T, d]`` the rounds'
aggregates of clipped updates (row t: round t's weighted mean of the clients'
clipped updates, per-round sensitivity ``Delta``), the mechanism releases

  ``C G + sigma Delta Z``  (``Z`` i.i.d. standard normal, one row per row of ``C``),

and the server, as post-processing, applies the noisy aggregates
``G_hat = G + sigma Delta C^+ Z`` round by round (``C^+ = C^{-1}`` for a square
strategy, BandMF; the tree's node-to-prefix map for tree aggregation), so the model
sequence equals ``x_0 + lr A G_hat`` for plain server steps, and every model is a
post-processing of ``C G + sigma Delta Z`` (Denisov, McMahan, Rush, Smith &
Thakurta 2022, Sec. 2; Choquette-Choo et al. 2023, Sec. 2). Lower-triangular ``C``
makes this hold for adaptively chosen rows (Denisov et al. 2022, Thm. 2.1): row t
of ``G`` may depend on the outputs of rounds before t.

Sensitivity. Client i's data moves row t of ``G`` by a vector ``u_t`` with
``||u_t|| <= Delta`` when i takes part in round t, and not at all otherwise. For a
participation pattern ``pi`` (the rounds i takes part in)

  ``||C U||_F^2 = sum_{a, b in pi} (C^T C)_{ab} <u_a, u_b>
               <= Delta^2 sum_{a, b in pi} |(C^T C)_{ab}|``,

with equality when ``C^T C >= 0`` entrywise on ``pi`` (all ``u`` equal). So the release
is a Gaussian mechanism of noise multiplier ``sigma / s_pi`` with
``s_pi^2 = sum_{a, b in pi} |(C^T C)_{ab}|`` (:func:`pattern_sensitivity_sq`), run
ONCE over the whole sequence (Choquette-Choo et al. 2023, Sec. 2 and Thm. 2;
Kairouz et al. 2021 for the tree). The schedules accepted with this accounting (round
robin, cyclic, all clients) are a deterministic function of the seed, drawn without
reading data, so each client's realised pattern is public and certifies its own
epsilon (:func:`realised_patterns`). A random b-min-sep Poisson selection
(``cyclic_poisson``) is instead accounted by amplification, for a banded strategy
only: :mod:`fedjax_dp.privacy.correlated.bandmf` has that argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

PyTree = Any


class Strategy(NamedTuple):
  """A correlated mechanism's static strategy (hashable: part of the compiled round).

  Attributes:
    name: ``'tree'`` or ``'bandmf'``.
    rounds: T, the horizon the strategy is built for.
    coefs: BandMF: the b band coefficients ``c_0 .. c_{b-1}`` of the lower-triangular
      Toeplitz ``C`` (unit norm); empty for the tree.
    restart: tree: rounds per tree (the tree restarts after each, Kairouz et al. 2021,
      Sec. 4 "restarts"); 0 for BandMF.
  """

  name: str
  rounds: int
  coefs: tuple[float, ...] = ()
  restart: int = 0


class CorrelatedNoise(NamedTuple):
  """One correlated mechanism (a peer in :data:`fedjax_dp.privacy.correlated.CORRELATED`).

  Attributes:
    name: the ``privacy.mechanism`` value.
    strategy: ``(rounds, bands, restart) -> Strategy`` (host; bands/restart already
      resolved to positive values).
    gram: ``Strategy -> [T, T]`` ``C^T C`` (host, float64).
    init: ``(Strategy, tree) -> state``: the carried state of the noise (``None``
      when nothing is carried).
    sample: ``(Strategy, key, t, state, like) -> (noise, state)``: round t's
      standard-unit noise ``(C^+ Z)_t`` shaped like ``like`` (device, traced ``t``).
    banded: ``C`` is lower-triangular with at most b nonzero bands (``C_{ts} = 0``
      unless ``0 <= t - s < b``, b = the strategy's band count): what the b-min-sep
      amplification needs (:mod:`fedjax_dp.privacy.correlated.bandmf`).
    reads: the config fields the mechanism reads that not every ``privacy.mechanism``
      reads (``privacy.bands``, ``privacy.tree_restart``): a config that sets one away
      from its default while picking a mechanism that does not read it is refused
      (:func:`fedjax_dp.config.unread_fields`).
    decoder: ``Strategy -> L [T, rows of C]`` (host, float64): the left inverse of
      ``C`` the rounds apply, round t's noise being ``(L Z)_t`` (:attr:`sample`'s
      ``(C^+ Z)_t``), so the rounds' noise has covariance ``L L^T``
      (:func:`noise_covariance`; the audit whitens with it).
  """

  name: str
  strategy: Callable[[int, int, int], Strategy]
  gram: Callable[[Strategy], np.ndarray]
  init: Callable[[Strategy, PyTree], PyTree]
  sample: Callable[..., tuple[PyTree, PyTree]]
  banded: bool = False
  reads: tuple[str, ...] = ()
  decoder: Callable[[Strategy], np.ndarray] | None = None


def pattern_sensitivity_sq(gram: np.ndarray, pattern: np.ndarray) -> np.ndarray:
  """``s_pi^2 = sum_{a, b in pi} |(C^T C)_{ab}|`` for patterns ``[..., T]`` (bool).

  An upper bound on ``sup ||C U||_F^2`` over per-round contributions of norm <= 1 on
  ``pi``, exact when ``C^T C >= 0`` on ``pi`` (module docstring).
  """
  x = np.asarray(pattern, np.float64)
  return np.einsum("...a,ab,...b->...", x, np.abs(gram), x)


def prefix_increments(gram: np.ndarray, history: np.ndarray, t: int) -> np.ndarray:
  """``[U]`` the growth of ``s_pi^2`` when the clients ``history[:, t]`` take part in
  round t, given their participations ``history [U, T]`` before t:
  ``|M_tt| + 2 sum_{a < t, a in pi} |M_at|`` (0 for clients not in round t)."""
  part = history[:, t].astype(np.float64)
  past = history[:, :t].astype(np.float64)
  row = np.abs(gram[t, :t])
  return part * (abs(gram[t, t]) + 2.0 * past @ row)


def realised_patterns(sample: Callable[[int], np.ndarray], num_clients: int,
                      rounds: int) -> np.ndarray:
  """``[U, T]`` bool: who takes part in each round, from the rule's host sampler
  ``sample(t) -> ids`` (a deterministic function of the seed and t)."""
  out = np.zeros((num_clients, rounds), bool)
  for t in range(rounds):
    out[np.asarray(sample(t), np.int64), t] = True
  return out


def normal_like(key: jax.Array, like: PyTree) -> PyTree:
  """Standard normal draws shaped like ``like``, leaf i from ``fold_in(key, i)`` (as
  :func:`fedjax_dp.privacy.mechanisms.noise_like`)."""
  leaves, treedef = jax.tree_util.tree_flatten(like)
  return jax.tree_util.tree_unflatten(treedef, [
      jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype)
      for i, x in enumerate(leaves)])
