"""Fu et al.'s convergence bound for DP-FedAvg (Theorems 3-5) and the optimal local steps E.

Fu, Zhou, Wu, Yu, Wen, Li, "On the Practicality of Differential Privacy in
Federated Learning by Tuning Iteration Times" (spec ``fu_practicality.md``).
``T`` counts ALL iterations, ``E`` the local iterations per global iteration
(GI), ``T_g = T / E`` the GIs; ``b`` of the ``N`` clients take part in each GI.

Theorem 3 (strongly convex, smooth, bounded gradients; ``eta_k = 2 / (mu (k + gamma))``,
``gamma = max(8 lambda / mu, E)``)::

  Y_k <= (4 omega0 / mu^2 + gamma Y_0) / (k + gamma) + 4 t omega1 / (mu^2 (k + gamma - 1)^2),

  t = floor(k / E),
  omega0 = 6 lambda Gamma + 8 (E - 1)^2 G^2 + 4 E^2 G^2 (N - b) / ((N - 1) b),
  omega1 = C_M E^2 T_g^z,

with the mechanism constant ``C_M`` and exponent ``z`` (Definition 2)

* Laplace (Theorem 1, ``z = 2``): ``C_M = 8 p b xi^2 nbar2 / (n^2 eps^2)``,
* Gaussian (Theorem 2, ``z = 1``): ``C_M = 8 p c2^2 N ln(1/delta) xi^2 nbar2 / (n^2 eps^2)``,

``nbar2 / n^2 = 1 / N^2`` for balanced clients (the printed forms
``8 p b xi^2 / (N^2 eps^2)`` and ``8 p c2^2 ln(1/delta) xi^2 / (N eps^2)``).
``version='corrected'`` halves the Gaussian constant: Corollary 2.1 copies the
Laplace variance ``2 beta^2`` where a Gaussian coordinate has variance
``sigma^2 Xi^2`` (spec E5). The Laplace constant is the same in both versions.
``xi`` is the sensitivity the noise was calibrated with: pass
``2 zeta`` for the replace-one sensitivity of spec A7 (``C_M`` scales with ``xi^2``).

Theorems 4-5 (eq. (4)): keeping only the powers of ``E`` and ``T``,
``Y_T = O(E^2 / T) + O(E^(1-z) T^(z-1))``. The paper's optimum ``E* ~ T^(z/(z+1))``
(``T^(2/3)`` for Laplace) balances the two terms. It is the minimiser only for
``z > 1`` (Theorem 5); for ``z <= 1`` both terms grow with ``E`` and ``E* = 1``
(spec E7: Theorem 4's optimum is wrong). :func:`optimal_local_steps_asymptotic`
and :func:`rate_exponent` give both readings. With the constants kept (spec section 3.4, derived)::

  E* = ((z - 1) C_M / (2 G^2 kappa))^(1/(z+1)) T^(z/(z+1)),    kappa = 8 + 4 (N - b) / ((N - 1) b),

(:func:`optimal_local_steps`), which grows as ``eps`` falls, the paper's rule of
thumb. :func:`predict` returns the ``(T, E)`` that minimise the full bound of
Theorem 3 for a privacy budget and a cap on ``T`` (Corollary 5.1: for ``z > 1``
there is a finite ``T*``).

Choices the spec leaves open (documented):

* The final bound of a run, :func:`final_bound`, is Theorem 3 at ``k = T`` with
  ``t = T_g = T / E`` (the paper's eq. (4) uses ``t <= T_g = T / E``); ``E`` need
  not divide ``T`` there (real ``T_g``), which is what the asymptotics assume.
  :func:`predict` searches integer ``E`` that divide ``T`` (an integer number
  of GIs, spec A8) unless ``divisors_only=False``.
* Theorem 3 needs ``gamma >= E`` (spec E16), which ``gamma = max(8 lambda / mu, E)``
  guarantees, and ``lambda >= mu`` (checked).
* The bound holds for convex ``f_l``; Fu's CNN is not (E13), so for it the
  prediction is motivation, not a guarantee.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from fedjax_dp.privacy import formulas

VERSIONS = ("printed", "corrected")
MECHANISMS = ("laplace", "gaussian")
# Definition 2: V_M = O(eta^2 E^2 T_g^z); basic composition of Laplace (z = 2),
# moments accountant of Gaussian (z = 1).
Z_EXPONENT = {"laplace": 2.0, "gaussian": 1.0}


class FuConstants(NamedTuple):
  """The constants of Assumptions 1-3 and Definition 3.

  Attributes:
    smoothness: ``lambda`` (each ``f_l`` is ``lambda``-smooth).
    strong_convexity: ``mu``.
    grad_bound: ``G``, with ``E ||grad f_l||^2 <= G^2`` along the run.
    heterogeneity: ``Gamma = f* - sum_l (n_l / n) f_l*`` (Definition 3, >= 0).
    initial_distance: ``Y_0 = ||theta_0 - theta*||^2``.
  """

  smoothness: float
  strong_convexity: float
  grad_bound: float
  heterogeneity: float
  initial_distance: float


def _f(x):
  x = np.asarray(x, np.float64)
  return float(x) if x.ndim == 0 else x


def _check(constants: FuConstants) -> None:
  lam, mu = constants.smoothness, constants.strong_convexity
  if not (mu > 0 and lam >= mu):
    raise ValueError(f"need 0 < mu <= lambda, got mu={mu}, lambda={lam}")
  if constants.grad_bound < 0 or constants.heterogeneity < 0 or constants.initial_distance < 0:
    raise ValueError(f"G, Gamma and Y_0 must be >= 0, got {constants}")


def mechanism_constant(mechanism: str, *, dim: int, num_clients: int, clients_per_round: int,
                       epsilon: float, sensitivity: float, delta: float = 1e-4,
                       c2: float = formulas.FU_C2_DEFAULT, client_sizes=None,
                       version: str = "printed") -> float:
  """``C_M`` of Theorem 3 (module docstring); ``0`` for ``eps = inf`` (no noise).

  Args:
    mechanism: ``'laplace'`` or ``'gaussian'``.
    dim: ``p``, the number of parameters.
    num_clients: ``N``.
    clients_per_round: ``b``.
    epsilon: each client's total budget over its ``T_l`` participations.
    sensitivity: ``xi`` (``xi_1`` L1 for Laplace, ``xi_2`` L2 for Gaussian).
    delta: Gaussian only.
    c2: Theorem 2's constant (``sigma = c2 sqrt(T_l ln(1/delta)) / eps``).
    client_sizes: ``[N]`` ``n_l``; ``None`` is balanced (``nbar2 / n^2 = 1/N^2``).
    version: ``'printed'`` or ``'corrected'`` (Gaussian factor 2, spec E5).
  """
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  n_cl, b = int(num_clients), int(clients_per_round)
  if not 1 <= b <= n_cl:
    raise ValueError(f"need 1 <= b <= N, got b={b}, N={n_cl}")
  if not epsilon > 0:
    raise ValueError(f"epsilon must be > 0, got {epsilon}")
  if math.isinf(epsilon):
    return 0.0
  if client_sizes is None:
    ratio = 1.0 / n_cl ** 2
  else:
    sizes = np.asarray(client_sizes, np.float64)
    if sizes.shape != (n_cl,) or np.any(sizes <= 0):
      raise ValueError(f"client_sizes must be {n_cl} positive counts, got {client_sizes}")
    ratio = float(np.mean(sizes ** 2) / np.sum(sizes) ** 2)
  if mechanism == "laplace":
    return 8.0 * dim * b * sensitivity ** 2 * ratio / epsilon ** 2
  if not 0 < delta < 1:
    raise ValueError(f"delta must be in (0, 1), got {delta}")
  factor = 8.0 if version == "printed" else 4.0
  return factor * dim * c2 ** 2 * n_cl * math.log(1 / delta) * sensitivity ** 2 * ratio \
      / epsilon ** 2


def gamma_shift(constants: FuConstants, local_steps) -> np.ndarray | float:
  """``gamma = max(8 lambda / mu, E)`` (Theorem 3)."""
  return _f(np.maximum(8.0 * constants.smoothness / constants.strong_convexity,
                       np.asarray(local_steps, np.float64)))


def learning_rate(k, constants: FuConstants, local_steps) -> np.ndarray | float:
  """Theorem 3's schedule ``eta_k = 2 / (mu (k + gamma))``."""
  return _f(2.0 / (constants.strong_convexity
                   * (np.asarray(k, np.float64) + gamma_shift(constants, local_steps))))


def omega0(constants: FuConstants, local_steps, num_clients: int, clients_per_round: int):
  """``6 lambda Gamma + 8 (E - 1)^2 G^2 + 4 E^2 G^2 (N - b) / ((N - 1) b)``."""
  e = np.asarray(local_steps, np.float64)
  n_cl, b = int(num_clients), int(clients_per_round)
  samp = 0.0 if b == n_cl else (n_cl - b) / ((n_cl - 1) * b)
  g2 = constants.grad_bound ** 2
  return _f(6 * constants.smoothness * constants.heterogeneity + 8 * (e - 1) ** 2 * g2
            + 4 * e ** 2 * g2 * samp)


def omega1(mech_constant: float, local_steps, rounds, z: float):
  """``C_M E^2 T_g^z`` (Theorem 3)."""
  e = np.asarray(local_steps, np.float64)
  return _f(mech_constant * e ** 2 * np.asarray(rounds, np.float64) ** z)


def bound_thm3(k, constants: FuConstants, *, local_steps, rounds, mech_constant: float,
               z: float, num_clients: int, clients_per_round: int, progress=None):
  """Theorem 3's bound on ``Y_k`` (vectorised over ``k`` and ``local_steps``).

  Args:
    k: iteration index (``k >= 0``).
    constants: ``lambda, mu, G, Gamma, Y_0``.
    local_steps: ``E``.
    rounds: ``T_g``, the GIs the noise was calibrated for (the planned total).
    mech_constant: ``C_M`` (:func:`mechanism_constant`).
    z: the noise exponent (2 Laplace, 1 Gaussian).
    num_clients, clients_per_round: ``N``, ``b``.
    progress: ``t``, the GIs completed; default ``floor(k / E)``.
  """
  _check(constants)
  kk = np.asarray(k, np.float64)
  e = np.asarray(local_steps, np.float64)
  t = np.floor(kk / e) if progress is None else np.asarray(progress, np.float64)
  gam = np.asarray(gamma_shift(constants, e))
  mu2 = constants.strong_convexity ** 2
  w0 = np.asarray(omega0(constants, e, num_clients, clients_per_round))
  w1 = np.asarray(omega1(mech_constant, e, rounds, z))
  return _f((4 * w0 / mu2 + gam * constants.initial_distance) / (kk + gam)
            + 4 * t * w1 / (mu2 * (kk + gam - 1) ** 2))


def final_bound(total_steps, local_steps, constants: FuConstants, *, mech_constant: float,
                z: float, num_clients: int, clients_per_round: int):
  """The bound on ``Y_T`` of a run of ``T`` iterations with ``E`` local steps.

  Theorem 3 at ``k = T`` with ``t = T_g = T / E`` (real; module docstring).
  """
  t = np.asarray(total_steps, np.float64)
  e = np.asarray(local_steps, np.float64)
  return bound_thm3(t, constants, local_steps=e, rounds=t / e, mech_constant=mech_constant,
                    z=z, num_clients=num_clients, clients_per_round=clients_per_round,
                    progress=t / e)


# ----------------------------------------------------------------------------
# Optimal E (Theorems 4-5)
# ----------------------------------------------------------------------------


def asymptotic_objective(local_steps, total_steps, z: float):
  """Eq. (4) with unit constants: ``E^2 / T + E^(1-z) T^(z-1)``."""
  e = np.asarray(local_steps, np.float64)
  t = np.asarray(total_steps, np.float64)
  return _f(e ** 2 / t + e ** (1 - z) * t ** (z - 1))


def optimal_local_steps_asymptotic(total_steps, z: float, version: str = "corrected"):
  """The real minimiser of :func:`asymptotic_objective` over ``E >= 1``.

  ``'printed'`` (Theorems 4-5): ``T^(z/(z+1))`` for every ``z``.
  ``'corrected'``: ``((z - 1) / 2)^(1/(z+1)) T^(z/(z+1))`` for ``z > 1`` (the
  exact stationary point; the same power of ``T``) and ``1`` for ``z <= 1``,
  where both terms increase with ``E`` (spec E7). Clipped to ``[1, T]``.
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  t = np.asarray(total_steps, np.float64)
  if version == "printed":
    e = t ** (z / (z + 1))
  elif z <= 1:
    e = np.ones_like(t)
  else:
    e = ((z - 1) / 2) ** (1 / (z + 1)) * t ** (z / (z + 1))
  return _f(np.clip(e, 1.0, np.maximum(t, 1.0)))


def rate_exponent(z: float, version: str = "corrected") -> float:
  """The exponent ``r`` of ``min_E Y_T = O(T^r)`` (Theorems 4-5).

  ``'printed'``: ``(z - 1) / (z + 1)`` for every ``z`` (Theorem 4's "fastest
  convergence rate", Theorem 5's "lowest divergence rate"; Laplace ``1/3``).
  ``'corrected'``: the same for ``z > 1``; for ``z <= 1`` the optimum ``E = 1``
  gives ``O(1/T) + O(T^(z-1))``, i.e. ``max(-1, z - 1)`` (spec E7: faster than
  printed for ``0 < z < 1``; ``0``, a constant, for the Gaussian's ``z = 1``).
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  if version == "printed" or z > 1:
    return (z - 1) / (z + 1)
  return max(-1.0, z - 1)


def optimal_local_steps(total_steps, constants: FuConstants, *, mech_constant: float, z: float,
                        num_clients: int, clients_per_round: int):
  """``E*`` with the constants kept (spec section 3.4, derived), clipped to ``[1, T]``.

  ``E* = ((z - 1) C_M / (2 G^2 kappa))^(1/(z+1)) T^(z/(z+1))`` for ``z > 1`` and
  ``C_M > 0``; ``1`` for ``z <= 1`` (Gaussian) or without noise (``C_M = 0``),
  where the ``E^2 / T`` term alone favours ``E = 1``. It minimises the large-``T`` part ``(4 G^2 kappa / mu^2) E^2 / T + (4 C_M / mu^2) E^(1-z) T^(z-1)``.
  """
  _check(constants)
  t = np.asarray(total_steps, np.float64)
  n_cl, b = int(num_clients), int(clients_per_round)
  kappa = 8.0 + (0.0 if b == n_cl else 4.0 * (n_cl - b) / ((n_cl - 1) * b))
  g2 = constants.grad_bound ** 2
  if z <= 1 or mech_constant <= 0 or g2 <= 0:
    e = np.ones_like(t)
  else:
    e = ((z - 1) * mech_constant / (2 * g2 * kappa)) ** (1 / (z + 1)) * t ** (z / (z + 1))
  return _f(np.clip(e, 1.0, np.maximum(t, 1.0)))


class FuPrediction(NamedTuple):
  """The ``(T, E)`` that minimise the bound; ``rounds = T / E`` GIs."""

  total_steps: int
  local_steps: int
  rounds: int
  bound: float


def best_local_steps(total_steps: int, constants: FuConstants, *, mech_constant: float,
                     z: float, num_clients: int, clients_per_round: int,
                     divisors_only: bool = True) -> tuple[int, float]:
  """Exhaustive ``argmin_E`` of :func:`final_bound` for one ``T``: ``(E, bound)``."""
  t = int(total_steps)
  es = np.arange(1, t + 1)
  if divisors_only:
    es = es[t % es == 0]
  vals = np.asarray(final_bound(float(t), es.astype(np.float64), constants,
                                mech_constant=mech_constant, z=z, num_clients=num_clients,
                                clients_per_round=clients_per_round)).reshape(-1)
  i = int(np.argmin(vals))
  return int(es[i]), float(vals[i])


def predict(constants: FuConstants, *, mechanism: str, epsilon: float, max_total_steps: int,
            dim: int, num_clients: int, clients_per_round: int, sensitivity: float,
            delta: float = 1e-4, c2: float = formulas.FU_C2_DEFAULT, client_sizes=None,
            version: str = "printed", divisors_only: bool = True,
            min_total_steps: int = 1) -> FuPrediction:
  """Given a privacy budget ``eps`` (and a cap on ``T``), the ``(T, E)`` of the lowest bound.

  Exhaustive over every ``T`` in ``[min_total_steps, max_total_steps]`` and every
  ``E`` (dividing ``T`` by default) of :func:`final_bound`; the noise constant
  is :func:`mechanism_constant` for the budget. For ``z > 1`` the bound diverges
  in ``T`` (Theorem 5), so ``T*`` is interior once the cap is large enough
  (Corollary 5.1); for the Gaussian the bound saturates and ``T*`` may sit at
  the cap.
  """
  c_m = mechanism_constant(mechanism, dim=dim, num_clients=num_clients,
                           clients_per_round=clients_per_round, epsilon=epsilon,
                           sensitivity=sensitivity, delta=delta, c2=c2,
                           client_sizes=client_sizes, version=version)
  z = Z_EXPONENT[mechanism]
  if not 1 <= min_total_steps <= max_total_steps:
    raise ValueError(f"need 1 <= min_total_steps <= max_total_steps, got "
                     f"{min_total_steps}, {max_total_steps}")
  best = None
  for t in range(int(min_total_steps), int(max_total_steps) + 1):
    e, val = best_local_steps(t, constants, mech_constant=c_m, z=z, num_clients=num_clients,
                              clients_per_round=clients_per_round, divisors_only=divisors_only)
    if best is None or val < best.bound:
      best = FuPrediction(t, e, t // e if t % e == 0 else round(t / e), val)
  assert best is not None
  return best
