"""Wei et al.'s convergence bound (Theorem 2) and its optimal number of rounds (Theorem 3).

Theorem 2, eq. (22) = (59), bounds the expected optimality gap after ``T`` rounds
of UDP. Both its printed form and the self-consistent form of the spec
(``wei_udp_crd.md`` section 4.2) have the shape::

  h(T) = A^T D0 + (1 - A^T) (c0 T + c1),     A = 1 - 2 mu eta + mu eta^2 L,

with ``D0 = F(w^0) - F*``, a noise term ``c0 T`` (eq. (10): sigma^2 grows like
``T``) and a client-sampling floor ``c1``. Its minimiser over real ``T`` has the
closed form (spec section 4.3, via Lambert W)::

  T* = (D0 - c1) / c0 + (W0(exp(1 - (D0 - c1) ln A / c0)) - 1) / ln A,

which :func:`optimal_rounds` evaluates with ``scipy.special.wrightomega``
(``omega(z) = W0(e^z)``) so the exponential never overflows. ``c0`` falls like
``1 / eps^2``, so ``T*`` grows with the privacy budget (the paper's Fig. 4).

The constants (Assumption 1: ``L``-smooth, ``mu``-PL, gradient divergence
``varepsilon``) can be estimated from a short non-private run with
:func:`estimate_constants`. The theory assumes convex ``F_i``, one full-gradient
local step and no clipping; for neural networks treat it as motivation (spec
section 10 item 13).

Symbols: ``epsilon`` is the privacy budget, ``divergence`` the gradient
divergence ``varepsilon`` (the paper overloads the letter); ``U`` clients, ``K``
per round, ``eta`` the learning rate, ``Delta`` the sensitivity of eq. (13).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import special

VERSIONS = ("printed", "consistent")


class ProblemConstants(NamedTuple):
  """The constants of Assumption 1 for the global loss ``F``.

  Attributes:
    smoothness: ``L`` (Assumption 1.3).
    pl: ``mu``, the Polyak-Lojasiewicz constant (Assumption 1.2).
    initial_gap: ``D0 = F(w^0) - F*``.
    divergence: ``varepsilon``, the mean squared gradient divergence
      ``(1/U) sum_i ||grad F_i - grad F||^2`` (as the proof uses it, eq. (53)).
    f_star: the ``F*`` estimate behind ``initial_gap`` and ``pl`` (NaN if given).
  """

  smoothness: float
  pl: float
  initial_gap: float
  divergence: float
  f_star: float = math.nan


class BoundCoefficients(NamedTuple):
  """``h(T) = A^T D0 + (1 - A^T) (c0 T + c1)``.

  Attributes:
    contraction: ``A`` in (0, 1).
    initial_gap: ``D0``.
    c0: the noise term's slope in ``T``.
    c1: the client-sampling (divergence) floor.
  """

  contraction: float
  initial_gap: float
  c0: float
  c1: float


# ----------------------------------------------------------------------------
# The bound
# ----------------------------------------------------------------------------


def contraction(pl: float, smoothness: float, eta: float) -> float:
  """``A = 1 - 2 mu eta + mu eta^2 L`` (Theorem 2); in (0, 1) for ``eta < 2 / L``.

  Raises:
    ValueError: ``A`` outside (0, 1) (no contraction: the bound is void).
  """
  a = 1.0 - 2.0 * pl * eta + pl * eta ** 2 * smoothness
  if not 0.0 < a < 1.0:
    raise ValueError(f"A = 1 - 2 mu eta + mu eta^2 L = {a} is not in (0, 1) "
                     f"(mu={pl}, L={smoothness}, eta={eta}); Assumption 1.4 needs eta <= 1/L")
  return float(a)


def privacy_sum(epsilon, delta, sensitivity=1.0, num_clients: int | None = None) -> float:
  """``sum_i Delta_i^2 ln(1/delta_i) / eps_i^2`` over the ``U`` clients.

  The sum in eq. (22) times ``Delta^2`` (moved inside so that per-client
  sensitivities are allowed). Scalars are broadcast to ``num_clients`` entries.
  """
  eps, dl, sens = np.broadcast_arrays(np.asarray(epsilon, np.float64),
                                      np.asarray(delta, np.float64),
                                      np.asarray(sensitivity, np.float64))
  if num_clients is not None:
    eps, dl, sens = (np.broadcast_to(x, (num_clients,)) for x in (eps, dl, sens))
  if np.any(~(eps > 0)) or np.any((dl <= 0) | (dl >= 1)):
    raise ValueError(f"need epsilon > 0 and delta in (0, 1), got {epsilon}, {delta}")
  return float(np.sum(np.square(sens) * np.log(1.0 / dl) / np.square(eps)))


def _sampling_factor(num_clients: int, clients_per_round: int) -> float:
  """``(U - K) / (K (U - 1))``: the variance factor of K-of-U sampling, eq. (52); 0 if K = U."""
  u, k = int(num_clients), int(clients_per_round)
  if not 1 <= k <= u:
    raise ValueError(f"need 1 <= K <= U, got K={k}, U={u}")
  return 0.0 if k == u else (u - k) / (k * (u - 1))


def coefficients(constants: ProblemConstants, *, eta: float, epsilon, delta, sensitivity,
                 num_clients: int, clients_per_round: int, dim: int = 1,
                 version: str = "printed") -> BoundCoefficients:
  """The coefficients ``(A, D0, c0, c1)`` of Theorem 2's bound.

  ``version='printed'``, eq. (22)/(59) exactly as printed::

    c0 = kappa0 K / U^2 sum_i ln(1/delta_i) / eps_i^2,   kappa0 = L^2 Delta^2 / mu,
    c1 = kappa1 U (U - K) / (K (U - 1)),                 kappa1 = eta^2 L^2 varepsilon / (2 mu).

  ``version='consistent'``, the self-consistent bound of spec section 4.2, which
  repairs errata 11(a)-(c) (no extra ``U`` in ``c1``; ``1 / (1 - A) = 1 / (mu eta
  (2 - eta L))`` for any ``eta``; ``E||n||^2`` with the model dimension ``d`` and
  the ``1/K`` averaging)::

    c0 = L d sum_i Delta_i^2 ln(1/delta_i) / eps_i^2 / (U^2 mu eta (2 - eta L)),
    c1 = eta^2 L (U - K) varepsilon / (2 K (U - 1) mu eta (2 - eta L)).

  Args:
    constants: ``L``, ``mu``, ``D0``, ``varepsilon``.
    eta: local learning rate.
    epsilon, delta, sensitivity: per-client privacy targets and eq. (13)
      sensitivities (scalars or ``[U]`` arrays).
    num_clients: ``U``.
    clients_per_round: ``K``.
    dim: model dimension ``d`` (``'consistent'`` only).
    version: ``'printed'`` or ``'consistent'``.
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  lip, mu = float(constants.smoothness), float(constants.pl)
  a = contraction(mu, lip, eta)
  u, k = int(num_clients), int(clients_per_round)
  s = privacy_sum(epsilon, delta, sensitivity, u)
  samp = _sampling_factor(u, k)
  if version == "printed":
    c0 = (lip ** 2 / mu) * k / u ** 2 * s
    c1 = (eta ** 2 * lip ** 2 * constants.divergence / (2 * mu)) * u * samp
  else:
    inv_one_minus_a = 1.0 / (mu * eta * (2.0 - eta * lip))
    c0 = inv_one_minus_a * lip * dim * s / u ** 2
    c1 = inv_one_minus_a * eta ** 2 * lip * samp * constants.divergence / 2
  return BoundCoefficients(a, float(constants.initial_gap), float(c0), float(c1))


def bound(rounds, coeffs: BoundCoefficients):
  """``h(T) = A^T D0 + (1 - A^T) (c0 T + c1)`` (eq. (22)), vectorised over real ``T``."""
  t = np.asarray(rounds, np.float64)
  at = coeffs.contraction ** t
  out = at * coeffs.initial_gap + (1 - at) * (coeffs.c0 * t + coeffs.c1)
  return float(out) if out.ndim == 0 else out


def bound_derivative(rounds, coeffs: BoundCoefficients):
  """``h'(T) = A^T ln A (D0 - c0 T - c1) + (1 - A^T) c0``."""
  t = np.asarray(rounds, np.float64)
  at, la = coeffs.contraction ** t, math.log(coeffs.contraction)
  out = at * la * (coeffs.initial_gap - coeffs.c0 * t - coeffs.c1) + (1 - at) * coeffs.c0
  return float(out) if out.ndim == 0 else out


def bound_second_derivative(rounds, coeffs: BoundCoefficients):
  """``h''(T) = A^T ln^2 A (D0 - c0 T - c1 - 2 c0 / ln A)``: eq. (23) corrected (spec item 12).

  The paper's fourth term ``-kappa0 T K / (U ln A) sum(.)`` should be
  ``-2 c0 / ln A``; see :func:`bound_second_derivative_eq23` for the printed one.
  """
  t = np.asarray(rounds, np.float64)
  at, la = coeffs.contraction ** t, math.log(coeffs.contraction)
  out = at * la ** 2 * (coeffs.initial_gap - coeffs.c0 * t - coeffs.c1 - 2 * coeffs.c0 / la)
  return float(out) if out.ndim == 0 else out


def bound_second_derivative_eq23(rounds, coeffs: BoundCoefficients, num_clients: int):
  """Eq. (23) as printed (for ``version='printed'`` coefficients): the fourth term is
  ``-kappa0 T K sum(.) / (U ln A) = -c0 T U / ln A``, which is not ``h''`` (spec item 12)."""
  t = np.asarray(rounds, np.float64)
  at, la = coeffs.contraction ** t, math.log(coeffs.contraction)
  out = at * la ** 2 * (coeffs.initial_gap - coeffs.c0 * t - coeffs.c1
                        - coeffs.c0 * t * num_clients / la)
  return float(out) if out.ndim == 0 else out


def optimal_rounds(coeffs: BoundCoefficients) -> float:
  """The real minimiser ``T*`` of ``h`` (Theorem 3; closed form of spec section 4.3).

  ``T* = (D0 - c1) / c0 + (W0(exp(1 - (D0 - c1) ln A / c0)) - 1) / ln A``. It is the
  unique stationary point of ``h`` on the real line and a minimum (``h'' > 0``
  there). ``c0 = 0`` (no noise) gives ``inf``: more rounds always help. A value
  ``<= 0`` means the noise/sampling floor already exceeds ``D0`` and the bound
  prefers not to train.
  """
  a, d0, c0, c1 = coeffs
  if c0 <= 0:
    return math.inf
  la = math.log(a)
  u = d0 - c1
  w = float(np.real(special.wrightomega(1.0 - u * la / c0)))  # W0(e^z) without overflow
  return u / c0 + (w - 1.0) / la


def optimal_rounds_int(coeffs: BoundCoefficients) -> int:
  """The best integer ``T >= 1``: ``floor(T*)`` or ``ceil(T*)``, whichever has the lower ``h``."""
  t = optimal_rounds(coeffs)
  if math.isinf(t):
    raise ValueError("no finite optimum: c0 = 0 (no noise)")
  lo = max(1, math.floor(t))
  cands = [lo, max(1, math.ceil(t))]
  return min(cands, key=lambda n: bound(n, coeffs))


def predict_optimal_rounds(constants: ProblemConstants, **kwargs) -> float:
  """``T*`` from the constants: :func:`optimal_rounds` of :func:`coefficients` (same kwargs)."""
  return optimal_rounds(coefficients(constants, **kwargs))


# ----------------------------------------------------------------------------
# Estimating the constants from a non-private run
# ----------------------------------------------------------------------------


def hessian_top_eigenvalue(loss_fn: Callable[[Any], Any], params: Any, *, num_iters: int = 20,
                           seed: int = 0) -> float:
  """Largest-magnitude Hessian eigenvalue of ``loss_fn`` at ``params`` (power iteration).

  Uses Hessian-vector products (forward-over-reverse), never the Hessian itself.

  Args:
    loss_fn: ``params -> scalar``, differentiable by jax.
    params: a pytree.
    num_iters: power-iteration steps.
    seed: start vector seed.

  Returns:
    ``|lambda_max|``, the local smoothness along the top eigenvector.
  """
  import jax
  import jax.numpy as jnp
  from jax.flatten_util import ravel_pytree

  flat, unravel = ravel_pytree(params)
  grad = jax.grad(lambda v: loss_fn(unravel(v)))

  @jax.jit
  def hvp(v):
    return jax.jvp(grad, (flat,), (v,))[1]

  v = jax.random.normal(jax.random.PRNGKey(seed), flat.shape, flat.dtype)
  v = v / jnp.linalg.norm(v)
  lam = 0.0
  for _ in range(num_iters):
    hv = hvp(v)
    lam = float(jnp.vdot(v, hv))
    norm = float(jnp.linalg.norm(hv))
    if norm == 0.0:
      return 0.0
    v = hv / norm
  return abs(lam)


def pl_ratios(losses, grad_sq_norms, f_star: float, min_gap: float = 1e-8) -> np.ndarray:
  """Pointwise PL constants ``mu_t = (||grad F(w_t)||^2 / 2) / (F(w_t) - F*)``.

  Assumption 1.2 asks ``F - F* <= ||grad F||^2 / (2 mu)`` everywhere, i.e.
  ``mu <= mu_t`` at every point. Points with a gap ``<= min_gap`` say nothing
  and are dropped.
  """
  losses = np.asarray(losses, np.float64)
  g2 = np.asarray(grad_sq_norms, np.float64)
  gap = losses - f_star
  keep = gap > min_gap
  return 0.5 * g2[keep] / gap[keep]


def estimate_pl(losses, grad_sq_norms, f_star: float, quantile: float = 0.1) -> float:
  """``mu`` as a lower quantile of :func:`pl_ratios` along a trajectory.

  The minimum is what the assumption asks for; a low quantile is robust to the
  few points where the gradient happens to be tiny (saddles of non-convex F).
  """
  r = pl_ratios(losses, grad_sq_norms, f_star)
  if r.size == 0:
    raise ValueError("no trajectory point above F*: cannot estimate mu")
  return float(np.quantile(r, quantile))


def gradient_divergence(client_grads, weights=None) -> float:
  """``varepsilon = sum_i p_i ||grad F_i - grad F||^2`` with ``grad F = sum_i p_i grad F_i``.

  Uniform ``p_i = 1/U`` (default) is the proof's eq. (53). ``client_grads`` is a
  ``[U, ...]`` array or a pytree of them (leading client axis).
  """
  g, p, mean = client_gradient_matrix(client_grads, weights)
  return float(p @ np.sum(np.square(g - mean), axis=1))


def client_gradient_matrix(client_grads, weights=None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The clients' gradients as rows, their weights and the weighted mean.

  Args:
    client_grads: a ``[U, ...]`` array or a pytree of them (leading client axis).
    weights: ``[U]`` client weights ``p_i`` (normalised here); None: uniform ``1/U``.

  Returns:
    ``(g [U, d] float64, p [U], mean [d] = p @ g)``.
  """
  import jax
  leaves = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(client_grads)]
  g = np.concatenate([x.reshape(x.shape[0], -1) for x in leaves], axis=1)
  u = g.shape[0]
  p = np.full(u, 1.0 / u) if weights is None else np.asarray(weights, np.float64)
  p = p / p.sum()
  return g, p, p @ g


def estimate_constants(loss_fn: Callable[[Any], Any], trajectory: Sequence[Any], *,
                       client_grads_fn: Callable[[Any], Any] | None = None,
                       grad_fn: Callable[[Any], Any] | None = None,
                       f_star: float | None = None, num_points: int = 3,
                       power_iters: int = 20, pl_quantile: float = 0.1,
                       seed: int = 0) -> ProblemConstants:
  """Estimates ``(L, mu, D0, varepsilon)`` from a short non-private run.

  * ``L``: the largest ``|lambda_max(Hessian)|`` over ``num_points`` points spread
    evenly along the trajectory (first and last included), by power iteration.
  * ``F*``: ``f_star`` if given (best: the final loss of a LONG non-private run),
    else the lowest loss on the trajectory (which overestimates ``F*`` and hence
    ``mu``; the lowest point itself is dropped from the PL ratios).
  * ``mu``: the ``pl_quantile`` quantile of the pointwise PL ratios along the
    whole trajectory.
  * ``D0 = F(w^0) - F*``.
  * ``varepsilon``: the largest :func:`gradient_divergence` over the same points
    (Assumption 1.5 holds "for any w"); 0 without ``client_grads_fn``.

  Args:
    loss_fn: ``params -> F(params)``, the global training loss (jax-differentiable).
    trajectory: the global models ``w^0, w^1, ...`` of the run.
    client_grads_fn: ``params -> [U, ...]`` per-client gradients ``grad F_i``
      (array or pytree with a leading client axis).
    grad_fn: ``params -> grad F``; default ``jax.grad(loss_fn)``.
    f_star: ``F*`` estimate.
    num_points: where to probe the Hessian and the divergence.
    power_iters: power-iteration steps per point.
    pl_quantile: the lower quantile taken as ``mu``.
    seed: power-iteration seed.
  """
  import jax
  from jax.flatten_util import ravel_pytree

  if len(trajectory) < 2:
    raise ValueError("need a trajectory of at least 2 models")
  # jit once: the trajectory is evaluated point by point
  value_fn = jax.jit(loss_fn)
  grad_fn = grad_fn or jax.jit(jax.grad(loss_fn))
  losses = np.array([float(value_fn(w)) for w in trajectory])
  grad_sq = np.array([float(np.sum(np.square(np.asarray(ravel_pytree(grad_fn(w))[0],
                                                        np.float64))))
                      for w in trajectory])
  fs = float(np.min(losses)) if f_star is None else float(f_star)
  idx = np.unique(np.linspace(0, len(trajectory) - 1, max(num_points, 1)).round().astype(int))
  lip = max(hessian_top_eigenvalue(loss_fn, trajectory[i], num_iters=power_iters,
                                   seed=seed + int(i)) for i in idx)
  mu = estimate_pl(losses, grad_sq, fs, pl_quantile)
  div = 0.0 if client_grads_fn is None else max(
      gradient_divergence(client_grads_fn(trajectory[i])) for i in idx)
  return ProblemConstants(float(lip), mu, float(losses[0] - fs), div, fs)
