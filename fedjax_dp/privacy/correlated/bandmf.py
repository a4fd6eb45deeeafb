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
                            sample=sample)
