"""Banded matrix factorisation (BandMF; Choquette-Choo, Ganesh, McKenna, McMahan,
Rush, Thakurta & Xu, "(Amplified) Banded Matrix Factorization", NeurIPS 2023).

Strategy. ``C [T, T]`` is lower-triangular Toeplitz with b bands: ``C_{ts} = c_{t-s}``
for ``0 <= t - s < b``, else 0, with ``||c||_2 = 1``. The coefficients minimise the
mean squared error of the prefix sums, ``mean_t ||(A C^{-1})_{t,:}||^2 ||c||^2``
(Choquette-Choo et al. 2023, Sec. 3 and eq. (3); the banded Toeplitz
parametrisation of McKenna et al. 2024, "Scaling up the banded matrix factorization
mechanism", whose ``jax_privacy.matrix_factorization.toeplitz.loss`` is this loss;
tests compare with it). For patterns whose participations are at least b rounds
apart the columns they touch are orthogonal, so ``s_pi^2 = k ||c||^2 = k``
(Choquette-Choo et al. 2023, Thm. 2); closer participations (round robin's pass
boundaries) are charged their overlap ``2 |(C^T C)_{ab}|`` by the plan.

Noise in the round. The released aggregate of round t carries ``sigma Delta w_t``
with ``w = C^{-1} Z``: ``C w = Z`` row t reads ``sum_{j<b} c_j w_{t-j} = Z_t``, so

  ``w_t = (Z_t - sum_{j=1}^{b-1} c_j w_{t-j}) / c_0``,

``Z_t`` drawn from the round's key, and the state carried between rounds is
``[w_{t-1}, ..., w_{t-b+1}]`` (b-1 model-sized vectors; zeros before round 0, the
rows of ``C`` above the first b-1 having fewer terms). Nothing of size ``T x d``
exists anywhere.

Amplification by b-min-sep Poisson sampling (``server.selection='cyclic_poisson'``).
Choquette-Choo et al. 2023, Sec. 4 ("b-min-sep sampling") prove that a b-banded
lower-triangular ``C`` whose columns have norm at most 1, run on batches drawn by
splitting the data into fixed groups and Poisson-sampling, in step t, from group
``t mod b`` only, satisfies every guarantee of DP-SGD with the same noise multiplier,
the same Poisson rate and ``ceil(T / b)`` steps. jax_privacy implements the same
reduction for "BandMF with cyclic Poisson sampling" with ``cycle_length >= bands``
(``DpsgdTrainingAccountant``: ``ceil(T / cycle_length)`` Poisson-subsampled
Gaussians at the group's rate; it takes Poisson to mean add/remove or zero-out
neighbours). The paper's text was not available to this project; its theorem number is
not checked here. The argument, written out for our setting (P groups with P >= b,
per-round sensitivity Delta, ``m = max_j ||C_{:, j}||``), is:

Fix client i; its group g (a function of the seed alone, public) makes it eligible in
the rounds ``j_k = g + k P`` only, and in each of them it is drawn by an independent
Bernoulli(q) ``B_k``, independent of the data and of every other draw. Release
``Y = C G + sigma Delta Z`` row by row. Row r is ``sum_{r-b < s <= r} c_{r-s} G_s +
sigma Delta Z_r``. Client i enters ``G_s`` only at ``s = j_k`` and only if ``B_k = 1``,
so its data enter row r only through column ``j_k`` with ``j_k <= r < j_k + b``:
block k, the rows ``[j_k, j_k + b)``. Since ``P >= b`` the blocks are disjoint, and
block k holds no column of another eligible round of i. Every other term of a row is
either another client's update in a round where i is not drawn, or a function of the
earlier rows (the models are post-processing of the rows released before). So given
the rows before r, row r is ``f_r(rows < r) + B_k c_{r-j_k} u_k + sigma Delta Z_r``
with ``f_r`` the same for neighbouring datasets and ``u_k`` i's contribution
(``||u_k|| <= Delta``, or ``||u_k - u'_k|| <= Delta`` under replace-one). Subtracting
``f_r`` row by row is a bijection of the block that does not depend on i's data,
so block k, given the earlier blocks, is equivalent to
``B_k C_{[j_k, j_k+b), j_k} u_k + sigma Delta Z_block``: with probability q a Gaussian
of sensitivity ``||C_{:, j_k}|| Delta <= m Delta``, else nothing of i's. That is one
Poisson-subsampled Gaussian of multiplier ``sigma / m`` (the same pair of mixtures
as the ``poisson`` rule's round at client level, under the run's relation: add/remove
the classic subsampled Gaussian, replace-one the revealed-membership bound of
:mod:`fedjax_dp.privacy.accounting`, both valid for this pair). The blocks compose
adaptively, one per eligible round up to the current one: at most ``ceil(T / P)``.
The rows outside i's blocks do not depend on i's data. The noisy aggregates the
server applies, ``C^{-1} Y``, are post-processing (lower-triangular: row t needs
rows <= t only). With our normalisation ``||c|| = 1``, so ``m = 1`` (the last b - 1
columns are truncated and shorter); the plan reads ``m`` from ``C^T C`` all the same.

What it does not cover, hence refused (``plan.check_correlated``): ``b > P`` (one
client's columns overlap, no block structure), the tree (not banded), selections in
which a client may be drawn in rounds fewer than b apart (``uniform``, ``poisson``),
and, as for every correlated mechanism, a noise multiplier that changes between rounds.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from fedjax_dp.privacy.correlated.base import CorrelatedNoise, PyTree, Strategy, normal_like


def inverse_coefs(coefs: jax.Array, n: int) -> jax.Array:
  """``[n]`` the Toeplitz coefficients of ``C^{-1}`` (lower-triangular Toeplitz too):
  ``r_0 = 1 / c_0``, ``r_t = -sum_{j=1}^{min(t, b-1)} c_j r_{t-j} / c_0``."""
  b = coefs.shape[0]
  rest = coefs[1:]

  def step(window, t):  # window: [r_{t-1}, ..., r_{t-b+1}]
    r = (jnp.where(t == 0, 1.0, 0.0) - jnp.dot(rest, window)) / coefs[0]
    return jnp.concatenate([r[None], window[:-1]]) if b > 1 else window, r

  _, r = jax.lax.scan(step, jnp.zeros(b - 1, coefs.dtype), jnp.arange(n))
  return r


def prefix_loss(coefs: jax.Array, n: int) -> jax.Array:
  """Mean squared prefix-sum error times sensitivity^2 (single participation):
  ``mean_t sum_{s<=t} (cumsum r)_s^2 * ||c||^2`` (McKenna et al. 2024, eq. (5))."""
  b_coef = jnp.cumsum(inverse_coefs(coefs, n))
  return jnp.mean(jnp.cumsum(b_coef ** 2)) * jnp.sum(coefs ** 2)


def _sqrt_prefix_coefs(bands: int) -> np.ndarray:
  """The first ``bands`` coefficients of ``A^{1/2}`` (``binom(2j, j) / 4^j``; Fichtenberger,
  Henzinger & Upadhyay 2023): the optimiser's start, as jax_privacy's."""
  out = np.ones(bands)
  for j in range(1, bands):
    out[j] = out[j - 1] * (2 * j - 1) / (2 * j)
  return out


@functools.lru_cache(maxsize=16)
def optimal_coefs(rounds: int, bands: int) -> tuple[float, ...]:
  """Unit-norm banded Toeplitz coefficients minimising :func:`prefix_loss` for T rounds
  (L-BFGS from the square root of the prefix matrix; deterministic)."""
  bands = max(1, min(int(bands), int(rounds)))
  if bands == 1:
    return (1.0,)
  with jax.enable_x64(True):
    fn = jax.jit(jax.value_and_grad(lambda c: prefix_loss(c, rounds)))

    def fun(x):
      v, g = fn(jnp.asarray(x, jnp.float64))
      return float(v), np.asarray(g, np.float64)

    x0 = _sqrt_prefix_coefs(bands)
    res = optimize.minimize(fun, x0, jac=True, method="L-BFGS-B",
                            options={"maxiter": 500, "gtol": 1e-10})
    x = res.x if res.fun <= fun(x0)[0] else x0
  x = np.asarray(x, np.float64)
  x = x * (1.0 if x[0] > 0 else -1.0)
  return tuple(float(v) for v in x / np.linalg.norm(x))


def strategy(rounds: int, bands: int, restart: int = 0) -> Strategy:
  """The BandMF strategy of ``bands`` bands for ``rounds`` rounds."""
  del restart
  return Strategy("bandmf", int(rounds), optimal_coefs(int(rounds), int(bands)), 0)


def matrix(s: Strategy) -> np.ndarray:
  """``C [T, T]`` (host reference; tests and the Gram matrix)."""
  t = s.rounds
  c = np.zeros((t, t))
  for j, v in enumerate(s.coefs[:t]):
    c += v * np.eye(t, k=-j)
  return c


def gram(s: Strategy) -> np.ndarray:
  """``C^T C [T, T]``."""
  c = matrix(s)
  return c.T @ c


def decoder(s: Strategy) -> np.ndarray:
  """``C^{-1} [T, T]``: round t's noise is ``(C^{-1} Z)_t`` (:func:`sample`)."""
  return np.linalg.inv(matrix(s))


def init(s: Strategy, like: PyTree) -> PyTree:
  """Zeros ``[b-1, *leaf.shape]`` per leaf: ``w_{-1}, ..., w_{-b+1}``."""
  b = len(s.coefs)
  return jax.tree_util.tree_map(lambda x: jnp.zeros((b - 1,) + jnp.shape(x), x.dtype), like)


def sample(s: Strategy, key: jax.Array, t: jax.Array, state: PyTree, like: PyTree):
  """``(w_t, state')``: round t's noise ``(C^{-1} Z)_t`` in standard units, ``Z_t`` from
  ``fold_in(key, t)``, and the state shifted by one round (module docstring)."""
  b = len(s.coefs)
  z = normal_like(jax.random.fold_in(key, t), like)
  c0, rest = s.coefs[0], jnp.asarray(s.coefs[1:], jnp.float32)

  def one(zl, sl):
    w = (zl - jnp.tensordot(rest.astype(zl.dtype), sl, axes=1)) / c0
    return w, (jnp.concatenate([w[None], sl[:-1]]) if b > 1 else sl)

  pairs = jax.tree_util.tree_map(one, z, state)
  w = jax.tree_util.tree_map(lambda _, p: p[0], z, pairs)
  new = jax.tree_util.tree_map(lambda _, p: p[1], z, pairs)
  return w, new


MECHANISM = CorrelatedNoise(name="bandmf", strategy=strategy, gram=gram, init=init,
                            sample=sample, banded=True, reads=("privacy.bands",),
                            decoder=decoder)
