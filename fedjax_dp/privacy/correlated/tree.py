"""Tree aggregation with restarts (DP-FTRL; Kairouz, McMahan, Song, Thakkar, Thakurta &
Xu, "Practical and Private (Deep) Learning without Sampling or Shuffling", ICML 2021).

Strategy. The rounds are cut into trees of R rounds (``restart``; the last one may be
shorter). Within a tree of m rounds, ``C`` has one row per dyadic interval
``[k 2^l, (k+1) 2^l)`` that lies inside ``[0, m)`` (a node at level l), with ones on
the rounds it covers. The prefix ``[0, n)`` is the disjoint union of the nodes
``(l, (n >> l) - 1)`` for the bits l set in n, so the noisy prefix sums are
``S_n = sum_{s<n} g_s + N(n)``, ``N(n) = sum_{l: bit l of n} eta_{l, (n >> l) - 1}``, a
post-processing of ``C G + Z`` (Kairouz et al. 2021, Alg. 1 without Honaker's
estimator). A round belongs to one node per level l with ``2^l <= m`` covering it, so
the single-participation sensitivity is ``sqrt(floor(log2 m) + 1)``
(``sqrt(ceil(log2 T) + 1)`` for T a power of two, Kairouz et al. Sec. 3); several
participations in one tree interact through the nodes they share (the Gram entry
``(C^T C)_{ab}`` counts them), participations in different trees do not (restarts,
Kairouz et al. Sec. 4 and App. D).

Noise in the round. The server applies ``g_hat_t = S_{n} - S_{n-1}`` with ``n`` the
round's position in its tree plus one, i.e. adds ``N(n) - N(n-1)``. With ``s`` the
lowest set bit of n, the nodes above s are shared and cancel:

  ``N(n) - N(n-1) = eta_{s, (n >> s) - 1} - sum_{l < s} eta_{l, ((n-1) >> l) - 1}``.

Each node's noise is regenerated from ``fold_in(key, tree, level, index)``, so
nothing is carried between rounds (at most ``floor(log2 R) + 1`` draws a round).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy.correlated.base import CorrelatedNoise, PyTree, Strategy, normal_like


def levels(restart: int) -> int:
  """Levels of a tree of ``restart`` leaves: ``floor(log2 R) + 1``."""
  return int(restart).bit_length()


def strategy(rounds: int, bands: int = 0, restart: int = 0) -> Strategy:
  """Trees of ``restart`` rounds (``restart <= 0``: one tree for the run)."""
  del bands
  rounds = int(rounds)
  restart = int(restart) if int(restart) > 0 else rounds
  return Strategy("tree", rounds, (), min(restart, rounds))


def _tree_sizes(s: Strategy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  idx = np.arange(s.rounds)
  tree = idx // s.restart
  return tree, idx % s.restart, np.minimum(s.restart, s.rounds - tree * s.restart)


def matrix(s: Strategy) -> np.ndarray:
  """``C [nodes, T]``: one row per node of every tree (host reference)."""
  tree, _, size = _tree_sizes(s)
  rows = []
  for j in np.unique(tree):
    m = int(size[tree == j][0])
    for lvl in range(levels(m)):
      for k in range(m >> lvl):
        row = np.zeros(s.rounds)
        row[j * s.restart + k * 2 ** lvl: j * s.restart + (k + 1) * 2 ** lvl] = 1.0
        rows.append(row)
  return np.stack(rows)


def _node_rows(s: Strategy) -> dict[tuple[int, int, int], int]:
  """``(tree, level, index) -> row of C`` in :func:`matrix`'s order."""
  tree, _, size = _tree_sizes(s)
  rows = {}
  for j in np.unique(tree):
    m = int(size[tree == j][0])
    for lvl in range(levels(m)):
      for k in range(m >> lvl):
        rows[(int(j), lvl, k)] = len(rows)
  return rows


def decoder(s: Strategy) -> np.ndarray:
  """``L [T, nodes]``: round t's noise ``N(n) - N(n-1)`` (:func:`sample`) as a
  combination of the nodes' noise, ``+1`` on node ``(s, (n >> s) - 1)`` and ``-1`` on
  ``(l, ((n - 1) >> l) - 1)`` for ``l < s`` (s the lowest set bit of n, n the round's
  position in its tree plus one). ``L C = I``: the prefix estimator without Honaker's
  averaging is a left inverse, not the pseudo-inverse."""
  rows = _node_rows(s)
  out = np.zeros((s.rounds, len(rows)))
  for t in range(s.rounds):
    j, n = t // s.restart, t % s.restart + 1
    low = (n & -n).bit_length() - 1
    out[t, rows[(j, low, (n >> low) - 1)]] = 1.0
    for lvl in range(low):
      out[t, rows[(j, lvl, ((n - 1) >> lvl) - 1)]] = -1.0
  return out


def gram(s: Strategy) -> np.ndarray:
  """``C^T C [T, T]``: the number of nodes covering both rounds (0 across trees)."""
  tree, loc, size = _tree_sizes(s)
  same = tree[:, None] == tree[None, :]
  out = np.zeros((s.rounds, s.rounds))
  for lvl in range(levels(s.restart)):
    node = loc >> lvl
    fits = ((node + 1) << lvl) <= size  # the node lies inside its tree
    out += same & (node[:, None] == node[None, :]) & fits[:, None]
  return out


def init(s: Strategy, like: PyTree) -> PyTree:
  """Nothing is carried."""
  del s, like
  return None


def sample(s: Strategy, key: jax.Array, t: jax.Array, state: PyTree, like: PyTree):
  """``(N(n) - N(n-1), state)`` for round t (module docstring), in standard units."""
  t = jnp.asarray(t, jnp.int32)
  j, n = t // s.restart, t % s.restart + 1
  low = jax.lax.population_count((n & -n) - 1)  # s: the lowest set bit of n
  base = jax.random.fold_in(key, j)
  out = jax.tree_util.tree_map(jnp.zeros_like, like)
  for lvl in range(levels(s.restart)):
    coef = jnp.where(lvl == low, 1.0, jnp.where(lvl < low, -1.0, 0.0))
    k = jnp.where(lvl == low, (n >> lvl) - 1, ((n - 1) >> lvl) - 1)
    eta = normal_like(jax.random.fold_in(jax.random.fold_in(base, lvl), k), like)
    out = jax.tree_util.tree_map(lambda o, e, c=coef: o + c.astype(e.dtype) * e, out, eta)
  return out, state


def node_noise(s: Strategy, key: jax.Array, like: PyTree):
  """Host reference: ``(prefix noise [T] of trees, per node)`` -- ``N(n)`` of every
  round's prefix, built from the same keys as :func:`sample` (tests)."""
  tree, loc, _ = _tree_sizes(s)
  out = []
  for t in range(s.rounds):
    n = int(loc[t]) + 1
    base = jax.random.fold_in(key, int(tree[t]))
    acc = jax.tree_util.tree_map(jnp.zeros_like, like)
    for lvl in range(levels(s.restart)):
      if (n >> lvl) & 1:
        eta = normal_like(jax.random.fold_in(jax.random.fold_in(base, lvl), (n >> lvl) - 1),
                          like)
        acc = jax.tree_util.tree_map(jnp.add, acc, eta)
    out.append(acc)
  return out


MECHANISM = CorrelatedNoise(name="tree", strategy=strategy, gram=gram, init=init,
                            sample=sample, reads=("privacy.tree_restart",),
                            decoder=decoder)
