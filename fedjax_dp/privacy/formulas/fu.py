"""Fu et al., "On the Practicality of DP in FL by Tuning Iteration Times": Theorems 1
(Laplace) and 2 (Gaussian), as printed and corrected (spec ``fu_practicality.md``)."""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.formulas.core import (
  _arr,
  _log_inv,
  _out,
  _pos,
  _prob,
  zcdp_epsilon,
  zcdp_rho,
)

# Fu et al.'s unspecified constant c2 of Theorem 2: the asymptotic sqrt(2) (spec A6).
FU_C2_DEFAULT = float(np.sqrt(2.0))


def fu_participations(clients_per_round, rounds, num_clients) -> np.ndarray | float:
  """``T_l = ceil(b T_g / N)``: participations of each client under round robin (Sec. IV)."""
  return _out(np.ceil(_pos("clients_per_round", clients_per_round) * _pos("rounds", rounds)
                      / _pos("num_clients", num_clients) - 1e-12))


def fu_sensitivity(eta_max, local_steps, clip) -> np.ndarray | float:
  """Theorems 1/2: ``Xi = eta~_t E zeta`` (L1 for Laplace, L2 bound for Gaussian), as printed."""
  return _out(_pos("eta_max", eta_max) * _pos("local_steps", local_steps) * _pos("clip", clip))


def fu_sensitivity_corrected(eta_max, local_steps, clip) -> np.ndarray | float:
  """Replace-one sensitivity of the uploaded update, ``2 eta~_t E zeta`` (spec A7)."""
  return _out(2 * _arr(fu_sensitivity(eta_max, local_steps, clip)))


def fu_laplace_scale_thm1(epsilon, participations, sensitivity) -> np.ndarray | float:
  """Theorem 1: per-coordinate Laplace scale ``beta = T_l Xi_1 / eps``.

  Each participation is ``eps / T_l``-DP and basic composition over the client's
  ``T_l`` participations gives ``eps`` (pure DP; valid if ``Xi_1`` is the true L1
  sensitivity, see :func:`fu_sensitivity_corrected`).
  """
  return _out(_pos("participations", participations) * _pos("sensitivity", sensitivity)
              / _pos("epsilon", epsilon))


def fu_epsilon_thm1(scale, participations, sensitivity) -> np.ndarray | float:
  """Inverse of Theorem 1: ``eps = t Xi_1 / beta`` after ``t`` participations (0 at ``t = 0``)."""
  t = _arr(participations)
  if np.any(t < 0):
    raise ValueError(f"participations must be >= 0, got {participations}")
  return _out(t * _pos("sensitivity", sensitivity) / _pos("scale", scale))


def fu_sigma_thm2(epsilon, delta, participations, q=1.0, c2=FU_C2_DEFAULT) -> np.ndarray | float:
  """Theorem 2 (Abadi et al. Thm. 1): noise MULTIPLIER ``sigma = c2 q sqrt(T_l ln(1/delta)) / eps``.

  The per-coordinate std is ``sigma Xi_2``. The paper gives no ``c2``; the
  default ``sqrt(2)`` is the asymptotic constant (literal in form; it under-noises
  at large eps, spec A6). Alg. 1 uses ``q = 1`` (full batch).
  """
  return _out(_arr(c2) * _prob("q", q) * np.sqrt(_pos("participations", participations)
                                                  * _log_inv(delta)) / _pos("epsilon", epsilon))


def fu_epsilon_thm2(sigma, delta, participations, q=1.0, c2=FU_C2_DEFAULT) -> np.ndarray | float:
  """Inverse of Theorem 2: ``eps = c2 q sqrt(t ln(1/delta)) / sigma`` after ``t`` participations."""
  t = _arr(participations)
  if np.any(t < 0):
    raise ValueError(f"participations must be >= 0, got {participations}")
  return _out(_arr(c2) * _prob("q", q) * np.sqrt(t * _log_inv(delta)) / _pos("sigma", sigma))


def fu_sigma_zcdp(epsilon, delta, participations) -> np.ndarray | float:
  """Corrected Theorem 2 (spec A6): multiplier ``sqrt(T_l / (2 rho*))``.

  For ``T_l`` Gaussian releases with q = 1.

  Certified (zCDP of composed Gaussians); keeps ``sigma ~ sqrt(T_l)``.
  """
  return _out(np.sqrt(_pos("participations", participations)
                      / (2 * _arr(zcdp_rho(epsilon, delta)))))


def fu_epsilon_zcdp(sigma, delta, participations) -> np.ndarray | float:
  """Inverse of :func:`fu_sigma_zcdp`: ``rho + 2 sqrt(rho ln(1/delta))``, ``rho = t/(2 s^2)``."""
  return zcdp_epsilon(_arr(participations) / (2 * _pos("sigma", sigma) ** 2), delta)
