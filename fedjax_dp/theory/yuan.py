"""Yuan et al.'s loss bound (Theorem 3 / Corollary 1) and the optimal number of aggregations.

Yuan, Ni, Ding, Wei, Li, Poor, "Amplitude-Varying Perturbation for Balancing
Privacy and Utility in Federated Learning" (spec ``yuan_amplitude_varying.md``).
In this paper ``T`` is the number of LOCAL ITERATIONS, ``M`` the number of
aggregations (rounds) and ``tau = T / M`` the local iterations per round.

Corollary 1, eq. (12), bounds the optimality gap after ``M`` aggregations of
Algorithm 1 with the geometric noise ``Theta(m) = theta^(m-1) sigma^2``
calibrated by eq. (8)::

  F(w(M)) - F* <= A^M Theta0 + c N(M) + L_c H(tau),      c = q L Delta_s^2 ln(1/delta) / eps^2,

  A = 1 + 2 rho phi,
  phi = (eta^2 L / 2) ((U - K) B^2 / (K (U - 1)) + s_K) - eta,
  H(x) = (gamma / L) ((eta L + 1)^x - 1) - eta gamma x          (Lemma 1),

with the noise factor ``N`` and the sampling coefficient ``s_K``

* ``version='printed'`` (eqs. (11)-(14) as printed):
  ``N(M) = (theta^M - A^M)(theta - theta^(1-M)) / ((theta - A)(U - 1))`` and
  ``s_K = (K - 1) / (U K (U - 1))``;
* ``version='corrected'`` (spec E14, E15):
  ``N(M) = (theta^M - A^M) / (theta - A) * S_M`` with
  ``S_M = (theta - theta^(1-M)) / (theta - 1)`` (the ``(U - 1)`` of the printed
  denominator is a typo for ``(theta - 1)``; ``S_M -> M`` at ``theta = 1``, where
  the printed noise term wrongly vanishes), and
  ``s_K = U (K - 1) / (K (U - 1))`` (uniform K-of-U sampling without
  replacement; 1 at ``K = U`` as it must be).

Both ratios ``(theta^M - A^M)/(theta - A)`` and ``S_M`` are evaluated as
geometric sums with ``expm1`` so that ``theta -> A`` and ``theta -> 1`` are
continuous (their limits are ``M theta^(M-1)`` and ``M``).

Theorem 3, eq. (11), is the same bound for the centralised reference iterate at
aggregation ``m`` without the ``L_c H`` term (:func:`bound_thm3`).

The optimal number of aggregations (Section IV-C) fixes ``T`` and minimises,
over ``M`` (with ``tau = T / M``)::

  G(M) = A^M Theta0 + c N(M) + L_c H(T / M).

Eq. (13) as printed omits ``L_c H(T/M)`` while eq. (14), its derivative, keeps
it (spec E24); :func:`objective` keeps it (``with_h=False`` drops it). The root
of eq. (14) (with the corrected ``dH(T/M)/dM`` of spec section 5.3, E20) is
found by bisection (:func:`optimal_aggregations`); under Corollary 2
(``theta >= A`` and ``tau`` above :func:`tau_threshold`) ``G`` is convex and the
root is the global minimiser. :func:`optimal_aggregations_int` rounds it to the
better neighbouring integer and :func:`optimal_aggregations_exhaustive` is the
brute-force check (checklist item 20).

Open choices (documented, spec section 9):

* the bound's noise term uses the paper's ``E||n||^2 = theta^m sigma^2`` (no model
  dimension ``d`` and no ``1/K`` averaging, E16); pass ``noise_scale = d / K`` to
  :func:`coefficients` for the dimensioned variant (default 1, the paper);
* ``Theta0`` (the initial gap, called ``Theta`` in the paper) is renamed to
  avoid the clash with the variance ``Theta(m)`` (E25);
* the bound is heuristic for the paper's MLP and CNN (E18: Assumption 1 asks for
  convex, smooth ``f_k``); constants from :func:`estimate_constants` on a neural
  network are local estimates along one trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.theory import wei

VERSIONS = ("printed", "corrected")


class YuanConstants(NamedTuple):
  """The constants of Assumption 1 and Definitions 2-3.

  Attributes:
    smoothness: ``L`` (each ``f_k`` is ``L``-smooth).
    lipschitz: ``L_c`` (each ``f_k`` is ``L_c``-Lipschitz).
    pl: ``rho``, the Polyak-Lojasiewicz constant of ``F``.
    dissimilarity: ``B``, the local-dissimilarity constant of Definition 2.
    divergence: ``gamma = sum_k p_k gamma_k``, the gradient divergence of
      Definition 3 (a norm, not a squared norm: unlike Wei's ``varepsilon``).
    initial_gap: ``Theta0 = F(w(0)) - F*`` (Assumption 1.5).
    f_star: the ``F*`` estimate behind ``initial_gap`` and ``pl`` (NaN if given).
  """

  smoothness: float
  lipschitz: float
  pl: float
  dissimilarity: float
  divergence: float
  initial_gap: float
  f_star: float = math.nan


class YuanCoefficients(NamedTuple):
  """Everything :func:`objective` needs; from :func:`coefficients`.

  Attributes:
    contraction: ``A = 1 + 2 rho phi`` in (0, 1).
    initial_gap: ``Theta0``.
    noise: ``c = noise_scale q L Delta_s^2 ln(1/delta) / eps^2``.
    theta: the geometric ratio of the variances.
    version: ``'printed'`` or ``'corrected'``.
    num_clients: ``U`` (the printed ``(U - 1)`` denominator).
    lipschitz: ``L_c``.
    divergence: ``gamma``.
    smoothness: ``L``.
    eta: the learning rate.
  """

  contraction: float
  initial_gap: float
  noise: float
  theta: float
  version: str
  num_clients: int
  lipschitz: float
  divergence: float
  smoothness: float
  eta: float


# ----------------------------------------------------------------------------
# Pieces of the bound
# ----------------------------------------------------------------------------


def _f(x):
  x = np.asarray(x, np.float64)
  return float(x) if x.ndim == 0 else x


def _geo(n, log_ratio):
  """``sum_{j<n} r^j = expm1(n l) / expm1(l)`` for ``l = ln r`` (``n`` at ``l = 0``), real ``n``."""
  n = np.asarray(n, np.float64)
  if abs(log_ratio) < 1e-12:
    return n
  return np.expm1(n * log_ratio) / math.expm1(log_ratio)


def _geo_dn(n, log_ratio):
  """``d/dn sum_{j<n} r^j = l r^n / expm1(l)`` (``1`` at ``l = 0``)."""
  n = np.asarray(n, np.float64)
  if abs(log_ratio) < 1e-12:
    return np.ones_like(n)
  return log_ratio * np.exp(n * log_ratio) / math.expm1(log_ratio)


def sampling_coefficient(num_clients: int, clients_per_round: int, version: str) -> float:
  """``s_K``, the coefficient of ``||grad F||^2`` in eq. (35c)/(36).

  ``'printed'``: ``(K - 1) / (U K (U - 1))``. ``'corrected'`` (spec E15):
  ``U (K - 1) / (K (U - 1))``, which is 1 at ``K = U`` (full participation: the
  average of all client gradients is ``grad F``). Both are 0 at ``K = 1``; at
  ``U = 1`` the printed one is 0 and the corrected one 1.
  """
  u, k = int(num_clients), int(clients_per_round)
  if not 1 <= k <= u:
    raise ValueError(f"need 1 <= K <= U, got K={k}, U={u}")
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  if u == 1:
    return 0.0 if version == "printed" else 1.0
  if version == "printed":
    return (k - 1) / (u * k * (u - 1))
  return u * (k - 1) / (k * (u - 1))


def phi(constants: YuanConstants, *, eta: float, num_clients: int, clients_per_round: int,
        version: str = "corrected") -> float:
  """``phi = (eta^2 L / 2) ((U - K) B^2 / (K (U - 1)) + s_K) - eta`` (Theorem 3)."""
  u, k = int(num_clients), int(clients_per_round)
  s_k = sampling_coefficient(u, k, version)
  var = 0.0 if k == u else (u - k) * constants.dissimilarity ** 2 / (k * (u - 1))
  return float(eta ** 2 * constants.smoothness / 2 * (var + s_k) - eta)


def contraction(constants: YuanConstants, *, eta: float, num_clients: int,
                clients_per_round: int, version: str = "corrected") -> float:
  """``A = 1 + 2 rho phi`` (Theorem 3).

  Raises:
    ValueError: ``A`` outside (0, 1): ``phi >= 0`` (no descent; eta too large for
      the sampling variance) or ``2 rho |phi| >= 1``; the bound is then void.
  """
  a = 1.0 + 2.0 * constants.pl * phi(constants, eta=eta, num_clients=num_clients,
                                     clients_per_round=clients_per_round, version=version)
  if not 0.0 < a < 1.0:
    raise ValueError(f"A = 1 + 2 rho phi = {a} is not in (0, 1) (rho={constants.pl}, "
                     f"eta={eta}, L={constants.smoothness}); the bound of Theorem 3 is void")
  return float(a)


def lemma1_h(x, divergence: float, smoothness: float, eta: float):
  """Lemma 1: ``H(x) = (gamma / L) ((eta L + 1)^x - 1) - eta gamma x`` (real ``x``; ``H(0) = 0``)."""
  x = np.asarray(x, np.float64)
  g, lip = float(divergence), float(smoothness)
  return _f(g / lip * np.expm1(x * math.log1p(eta * lip)) - eta * g * x)


def lemma1_h_dm(aggregations, total_steps: float, divergence: float, smoothness: float,
                eta: float):
  """``dH(T/M)/dM = -(gamma T / (L M^2)) (1 + eta L)^(T/M) ln(1 + eta L) + eta gamma T / M^2``.

  The corrected form of spec section 5.3 (E20). It is ``<= 0`` whenever
  ``T / M >= ln(eta L / ln(1 + eta L)) / ln(1 + eta L)``, which always holds for
  ``tau >= 1`` and ``eta L <= 1``.
  """
  m = np.asarray(aggregations, np.float64)
  g, lip, t = float(divergence), float(smoothness), float(total_steps)
  l1 = math.log1p(eta * lip)
  return _f(-g * t / (lip * m ** 2) * np.exp(t / m * l1) * l1 + eta * g * t / m ** 2)


def tau_threshold(eta: float, smoothness: float, version: str = "corrected") -> float:
  """Corollary 2's condition ``tau >= ln(x / ln(eta L + 1)) / ln(eta L + 1)``.

  ``x = eta L`` (``'corrected'``, spec E21) or ``x = eta`` (``'printed'``). The
  corrected threshold is below 1 for ``eta L <= 1``, so every ``tau >= 1`` meets it.
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  l1 = math.log1p(eta * smoothness)
  x = eta * smoothness if version == "corrected" else eta
  return math.log(x / l1) / l1


def coefficients(constants: YuanConstants, *, eta: float, epsilon: float, delta: float,
                 q: float, sensitivity: float, theta: float, num_clients: int,
                 clients_per_round: int, version: str = "corrected",
                 noise_scale: float = 1.0) -> YuanCoefficients:
  """The coefficients of Corollary 1 for one configuration.

  Args:
    constants: ``L, L_c, rho, B, gamma, Theta0``.
    eta: learning rate (Assumption 1.3 asks ``eta <= 1/L``).
    epsilon, delta: the privacy target of eq. (8).
    q: client-sampling ratio ``K / U``.
    sensitivity: ``Delta_s`` (``2 C / |D_k|`` in the paper).
    theta: the geometric ratio ``theta > 0`` of the variances.
    num_clients: ``U``.
    clients_per_round: ``K``.
    version: ``'printed'`` or ``'corrected'`` (module docstring).
    noise_scale: multiplier on the noise term; 1 is the paper, ``d / K`` the
      dimensioned variant of spec E16.
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  if not (epsilon > 0 and 0 < delta < 1 and 0 < q <= 1 and sensitivity > 0 and theta > 0
          and eta > 0):
    raise ValueError(f"need epsilon > 0, delta in (0, 1), q in (0, 1], sensitivity > 0, "
                     f"theta > 0, eta > 0; got {epsilon}, {delta}, {q}, {sensitivity}, "
                     f"{theta}, {eta}")
  a = contraction(constants, eta=eta, num_clients=num_clients,
                  clients_per_round=clients_per_round, version=version)
  c = noise_scale * q * constants.smoothness * sensitivity ** 2 * math.log(1 / delta) / epsilon ** 2
  return YuanCoefficients(a, float(constants.initial_gap), float(c), float(theta), version,
                          int(num_clients), float(constants.lipschitz),
                          float(constants.divergence), float(constants.smoothness), float(eta))


def _noise_factor(m, coeffs: YuanCoefficients):
  """``(N(M), dN/dM)`` of the module docstring, continuous in ``theta`` and ``A``."""
  m = np.asarray(m, np.float64)
  a, th = coeffs.contraction, coeffs.theta
  la, lt = math.log(a), math.log(th)
  # P = (theta^M - A^M) / (theta - A) = A^(M-1) sum_{j<M} (theta/A)^j
  p = a ** (m - 1) * _geo(m, lt - la)
  dp = la * p + a ** (m - 1) * _geo_dn(m, lt - la)
  if coeffs.version == "corrected":
    # S_M = sum_{j<M} theta^-j
    s, ds = _geo(m, -lt), _geo_dn(m, -lt)
  else:
    u1 = coeffs.num_clients - 1
    if u1 <= 0:
      raise ValueError("the printed bound divides by U - 1: need U >= 2")
    s = (th - th ** (1 - m)) / u1
    ds = th ** (1 - m) * lt / u1
  return p * s, dp * s + p * ds


def bound_thm3(aggregations, coeffs: YuanCoefficients):
  """Eq. (11): ``A^m Theta0 + c N(m)`` (the centralised reference iterate), real ``m``."""
  m = np.asarray(aggregations, np.float64)
  n, _ = _noise_factor(m, coeffs)
  return _f(coeffs.contraction ** m * coeffs.initial_gap + coeffs.noise * n)


def bound(aggregations, local_steps, coeffs: YuanCoefficients):
  """Corollary 1, eq. (12): ``A^M Theta0 + c N(M) + L_c H(tau)``."""
  h = lemma1_h(local_steps, coeffs.divergence, coeffs.smoothness, coeffs.eta)
  return _f(np.asarray(bound_thm3(aggregations, coeffs)) + coeffs.lipschitz * np.asarray(h))


def objective(aggregations, total_steps: float, coeffs: YuanCoefficients, with_h: bool = True):
  """``G(M)`` for a fixed number of local iterations ``T`` (``tau = T / M``), real ``M``.

  ``with_h=False`` is eq. (13) as printed, which omits ``L_c H(T/M)`` (E24).
  """
  m = np.asarray(aggregations, np.float64)
  out = np.asarray(bound_thm3(m, coeffs))
  if with_h:
    out = out + coeffs.lipschitz * np.asarray(
        lemma1_h(float(total_steps) / m, coeffs.divergence, coeffs.smoothness, coeffs.eta))
  return _f(out)


def objective_derivative(aggregations, total_steps: float, coeffs: YuanCoefficients,
                         with_h: bool = True):
  """Eq. (14): ``dG/dM = Theta0 A^M ln A + c dN/dM + L_c dH(T/M)/dM``."""
  m = np.asarray(aggregations, np.float64)
  _, dn = _noise_factor(m, coeffs)
  out = coeffs.initial_gap * coeffs.contraction ** m * math.log(coeffs.contraction) \
      + coeffs.noise * dn
  if with_h:
    out = out + coeffs.lipschitz * np.asarray(lemma1_h_dm(
        m, total_steps, coeffs.divergence, coeffs.smoothness, coeffs.eta))
  return _f(out)


def eq14_printed(aggregations, total_steps: float, coeffs: YuanCoefficients):
  """Eq. (14) transcribed literally (``(U - 1)`` denominator) with the corrected ``dH/dM``.

  ``Theta0 A^M ln A + c theta / ((theta - A)(U - 1)) (theta^M ln theta - A^M ln A
  + (A/theta)^M ln(A/theta)) + L_c dH(T/M)/dM``; equal to
  :func:`objective_derivative` for ``version='printed'`` coefficients (a test).
  """
  m = np.asarray(aggregations, np.float64)
  a, th = coeffs.contraction, coeffs.theta
  br = th ** m * math.log(th) - a ** m * math.log(a) + (a / th) ** m * math.log(a / th)
  out = (coeffs.initial_gap * a ** m * math.log(a)
         + coeffs.noise * th / ((th - a) * (coeffs.num_clients - 1)) * br
         + coeffs.lipschitz * np.asarray(lemma1_h_dm(m, total_steps, coeffs.divergence,
                                                     coeffs.smoothness, coeffs.eta)))
  return _f(out)


# ----------------------------------------------------------------------------
# The optimal number of aggregations
# ----------------------------------------------------------------------------


def optimal_aggregations(total_steps: float, coeffs: YuanCoefficients, *, with_h: bool = True,
                         tol: float = 1e-10, max_iter: int = 200) -> float:
  """The real ``M*`` in ``[1, T]``: bisection on eq. (14) (Section IV-C).

  Returns the end point when ``dG/dM`` does not change sign on ``[1, T]``
  (``1`` if ``G`` increases from the start, ``T`` if it still decreases at
  ``tau = 1``). The root is the global minimiser when ``G`` is convex
  (Corollary 2: ``theta >= A`` and ``tau`` above :func:`tau_threshold`);
  otherwise compare with :func:`optimal_aggregations_exhaustive`.
  """
  t = float(total_steps)
  if t < 1:
    raise ValueError(f"total_steps must be >= 1, got {total_steps}")

  def d(m):
    return objective_derivative(m, t, coeffs, with_h)

  lo, hi = 1.0, t
  if d(lo) >= 0:
    return lo
  if d(hi) <= 0:
    return hi
  for _ in range(max_iter):
    mid = 0.5 * (lo + hi)
    if d(mid) < 0:
      lo = mid
    else:
      hi = mid
    if hi - lo <= tol * max(1.0, hi):
      break
  return 0.5 * (lo + hi)


def _candidates(total_steps: int, divisors_only: bool) -> np.ndarray:
  t = int(total_steps)
  ms = np.arange(1, t + 1)
  return ms[t % ms == 0] if divisors_only else ms


def optimal_aggregations_int(total_steps: int, coeffs: YuanCoefficients, *,
                             with_h: bool = True, divisors_only: bool = False) -> int:
  """The integer ``M*``: the better of ``floor`` and ``ceil`` of the bisection root.

  With ``divisors_only`` (an integer ``tau = T / M``) the neighbours are the
  nearest divisors of ``T`` below and above the root (spec section 5.5 step 3).
  """
  root = optimal_aggregations(total_steps, coeffs, with_h=with_h)
  ms = _candidates(total_steps, divisors_only)
  below, above = ms[ms <= root], ms[ms >= root]
  cands = {int(below[-1]) if below.size else int(ms[0]),
           int(above[0]) if above.size else int(ms[-1])}
  return min(sorted(cands), key=lambda m: objective(m, total_steps, coeffs, with_h))


def optimal_aggregations_exhaustive(total_steps: int, coeffs: YuanCoefficients, *,
                                    with_h: bool = True, divisors_only: bool = False) -> int:
  """``argmin_M G(M)`` over every integer ``M`` in ``[1, T]`` (or every divisor of ``T``)."""
  ms = _candidates(total_steps, divisors_only)
  vals = np.asarray(objective(ms.astype(np.float64), total_steps, coeffs, with_h))
  return int(ms[int(np.argmin(vals))])


def predict_optimal_aggregations(constants: YuanConstants, total_steps: int, **kwargs) -> int:
  """Integer ``M*`` from the constants: :func:`optimal_aggregations_int` of :func:`coefficients`."""
  return optimal_aggregations_int(total_steps, coefficients(constants, **kwargs))


# ----------------------------------------------------------------------------
# Estimating the constants from a non-private run
# ----------------------------------------------------------------------------


def client_gradient_statistics(client_grads, weights=None) -> tuple[float, float, float]:
  """``(gamma, B, L_c)`` at one point from the clients' gradients ``[U, ...]``.

  * ``gamma = sum_k p_k ||grad f_k - grad F||`` (Definition 3 with ``gamma_k``
    the divergence at this point),
  * ``B = sqrt(sum_k p_k ||grad f_k||^2 / ||grad F||^2)`` (Definition 2; ``1`` if
    ``grad F = 0`` and all client gradients vanish, ``inf`` if only ``grad F`` does),
  * ``L_c = max_k ||grad f_k||`` (a lower bound on the Lipschitz constant).

  ``grad F = sum_k p_k grad f_k`` with ``p_k = 1/U`` by default (the proofs' ``p_k``).
  """
  g, p, mean = wei.client_gradient_matrix(client_grads, weights)
  norms = np.linalg.norm(g, axis=1)
  gamma = float(p @ np.linalg.norm(g - mean, axis=1))
  second = float(p @ np.square(norms))
  full = float(mean @ mean)
  if full > 0:
    dissim = math.sqrt(second / full)
  else:
    dissim = 1.0 if second == 0 else math.inf
  return gamma, dissim, float(norms.max())


def estimate_constants(loss_fn: Callable[[Any], Any], trajectory: Sequence[Any], *,
                       client_grads_fn: Callable[[Any], Any], f_star: float | None = None,
                       num_points: int = 3, power_iters: int = 20, pl_quantile: float = 0.1,
                       seed: int = 0) -> YuanConstants:
  """Estimates ``(L, L_c, rho, B, gamma, Theta0)`` from a short non-private run.

  ``L``, ``rho`` (the PL constant; Wei's ``mu`` is the same quantity), ``F*`` and
  ``Theta0`` come from :func:`fedjax_dp.theory.wei.estimate_constants` (same
  estimators, same arguments). ``gamma``, ``B`` and ``L_c`` are the largest
  :func:`client_gradient_statistics` over the same ``num_points`` probe points
  (first and last included), since Definitions 2-3 and Assumption 1.2 hold "for
  any ``w``". ``B`` is taken over the probe points only: near the optimum
  ``grad F -> 0`` and ``B`` diverges, so probing the final point of a converged
  run gives a large value (an honest reading of Definition 2).

  Args:
    loss_fn: ``params -> F(params)``, the global training loss.
    trajectory: global models ``w(0), w(1), ...`` of the run.
    client_grads_fn: ``params -> [U, ...]`` per-client gradients (array or
      pytree with a leading client axis).
    f_star, num_points, power_iters, pl_quantile, seed: as in
      :func:`fedjax_dp.theory.wei.estimate_constants`.
  """
  w = wei.estimate_constants(loss_fn, trajectory, f_star=f_star, num_points=num_points,
                             power_iters=power_iters, pl_quantile=pl_quantile, seed=seed)
  idx = np.unique(np.linspace(0, len(trajectory) - 1, max(num_points, 1)).round().astype(int))
  stats = np.array([client_gradient_statistics(client_grads_fn(trajectory[i])) for i in idx])
  gamma, dissim, lip_c = stats.max(axis=0)
  return YuanConstants(w.smoothness, float(lip_c), w.pl, float(dissim), float(gamma),
                       w.initial_gap, w.f_star)
