"""The papers' privacy formulas, exactly as printed, with corrected variants.

Every function is a vectorised numpy closed form (arguments broadcast). Each
``*_sigma_*`` calibration has an inverse ``*_epsilon_*``: the epsilon that the
paper's formula *claims* for the noise actually used, which the engine records
as ``epsilon_claimed`` every round, next to the certified epsilon of
:mod:`fedjax_dp.privacy.accounting`.

Naming:
  * ``<paper>_<quantity>_eq<N>`` / ``_thm<N>``: as printed (paper fidelity).
  * ``..._corrected``: the algebra fixed as in the specs' errata. These repair
    the step that goes the wrong way; they still use the paper's accountant
    (Wei/Yuan: the moment bound linear in ``q``, exact only for ``q = 1``), so
    they are *not* certified for ``q < 1``. Certified numbers come from
    ``accounting.epsilon``.

Symbols: ``delta`` is the target delta (natural logs throughout), ``q`` the
client-sampling ratio ``K/U``, ``sensitivity`` the L2 (Gaussian) or L1 (Laplace)
sensitivity of one client's upload, ``sigma`` the noise standard deviation in the
same units as the sensitivity (so ``sigma / sensitivity`` is the noise
multiplier), unless a docstring says the value is a multiplier.

Sources (plain-text copies in ``shared/papers``, specs in ``shared/specs``):
  * Wei et al., "User-Level Privacy-Preserving FL: Analysis and Performance
    Optimization", IEEE TMC 2021 (UDP + CRD), eqs. (10), (13)-(17), (25).
  * Yuan et al., "Amplitude-Varying Perturbation for Balancing Privacy and
    Utility in FL", eqs. (6), (8), (9), (16)-(27).
  * Fu et al., "On the Practicality of DP in FL by Tuning Iteration Times",
    Theorems 1 (Laplace) and 2 (Gaussian).
  * "Utility Optimization of FL with DP" (A-DPFL), Discrete Dynamics in Nature and
    Society 2021, Sec. 3.1 and eq. (15).
"""

from __future__ import annotations

import numpy as np
from scipy import special

# Fu et al.'s unspecified constant c2 of Theorem 2: the asymptotic sqrt(2) (spec A6).
FU_C2_DEFAULT = float(np.sqrt(2.0))


def _arr(x) -> np.ndarray:
  return np.asarray(x, dtype=np.float64)


def _out(x):
  x = np.asarray(x, dtype=np.float64)
  return float(x) if x.ndim == 0 else x


def _log_inv(delta) -> np.ndarray:
  d = _arr(delta)
  if np.any((d <= 0) | (d >= 1)):
    raise ValueError(f"delta must be in (0, 1), got {delta}")
  return -np.log(d)


def _pos(name, x) -> np.ndarray:
  a = _arr(x)
  if np.any(~(a > 0)):
    raise ValueError(f"{name} must be > 0, got {x}")
  return a


def _prob(name, x) -> np.ndarray:
  a = _arr(x)
  if np.any(~((a > 0) & (a <= 1))):
    raise ValueError(f"{name} must be in (0, 1], got {x}")
  return a


def zcdp_rho(epsilon, delta) -> np.ndarray | float:
  """Largest ``rho`` whose zCDP conversion ``rho + 2 sqrt(rho ln(1/delta))`` is ``epsilon``.

  ``rho* = (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))^2`` (Bun & Steinke
  2016, Prop. 1.3). This is also the exact minimiser of the papers' own moment
  bound over real orders, so it is the shared core of the corrected variants.
  """
  li = _log_inv(delta)
  e = _pos("epsilon", epsilon)
  return _out((np.sqrt(li + e) - np.sqrt(li)) ** 2)


def zcdp_epsilon(rho, delta) -> np.ndarray | float:
  """``rho + 2 sqrt(rho ln(1/delta))``: epsilon of ``rho``-zCDP at ``delta``.

  The inverse of :func:`zcdp_rho`.
  """
  r = _arr(rho)
  return _out(r + 2 * np.sqrt(r * _log_inv(delta)))


# ----------------------------------------------------------------------------
# Wei et al. (UDP + CRD)
# ----------------------------------------------------------------------------


def wei_sensitivity(eta, clip, n) -> np.ndarray | float:
  """Eq. (13): ``Delta_l = 2 eta C / |D_i|``.

  L2 sensitivity of one full-batch clipped gradient step of client ``i`` under
  replace-one adjacency of an example (the 2 is the replace-one factor).
  """
  return _out(2 * _pos("eta", eta) * _pos("clip", clip) / _pos("n", n))


def wei_sigma_eq10(epsilon, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """Theorem 1, eq. (10), as printed: ``sigma_i = Delta_l sqrt(2 q T ln(1/delta_i)) / eps_i``.

  Returns the std of the Gaussian noise added to every model coordinate. The
  spec (section 3.5) shows the stated ``(eps, delta)`` is NOT met, even by the
  paper's own accountant (16)-(17); see :func:`wei_sigma_eq10_corrected`.
  """
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      2 * _prob("q", q) * _pos("rounds", rounds) * _log_inv(delta)) / _pos("epsilon", epsilon))


def wei_epsilon_eq10(sigma, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """Inverse of eq. (10): the epsilon the paper claims after ``rounds`` rounds at ``sigma``.

  ``eps = Delta_l sqrt(2 q T ln(1/delta)) / sigma``.
  """
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      2 * _prob("q", q) * _pos("rounds", rounds) * _log_inv(delta)) / _pos("sigma", sigma))


def wei_budget(epsilon, delta, q, sensitivity) -> np.ndarray | float:
  """The budget behind eqs. (10) and (25): ``B = eps^2 / (2 q Delta_l^2 ln(1/delta))``.

  The paper's guarantee is exactly ``sum over rounds of sigma_tau^-2 <= B``
  (spec section 3.6).
  """
  return _out(_pos("epsilon", epsilon) ** 2 / (
      2 * _prob("q", q) * _pos("sensitivity", sensitivity) ** 2 * _log_inv(delta)))


def wei_sigma_eq25(epsilon, delta, q, sensitivity, rounds, t,
                   past_inv_var_sum) -> np.ndarray | float:
  """Theorem 4, eq. (25): noise std for round ``t`` when the horizon becomes ``T = rounds``.

  ``sigma_i^t = sqrt((T - t) / (eps^2 / (2 q Delta^2 ln(1/delta))
  - sum_{tau<t} (sigma_i^tau)^-2))``,
  with 0-based rounds and ``past_inv_var_sum = sum_{tau=0}^{t-1} (sigma_i^tau)^-2``
  (spec section 10 item 9). At ``t = 0`` it equals eq. (10). Returns ``inf`` where
  the budget is already exhausted or ``t >= T`` (training must stop).
  """
  return _spread_budget(wei_budget(epsilon, delta, q, sensitivity), rounds, t, past_inv_var_sum)


def _spread_budget(budget, rounds, t, past_inv_var_sum):
  """``sqrt((T - t) / (B - S))``: the budget left spread evenly over the rounds left
  (eq. (25)'s form); ``inf`` where the budget is exhausted or ``t >= T``."""
  left = _arr(rounds) - _arr(t)
  room = _arr(budget) - _arr(past_inv_var_sum)
  with np.errstate(divide="ignore", invalid="ignore"):
    s = np.sqrt(left / room)
  return _out(np.where((room > 0) & (left > 0), s, np.inf))


def wei_epsilon_claimed(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Epsilon claimed by eqs. (10)/(25) after rounds with the given ``sum sigma^-2``.

  ``eps(t) = Delta_l sqrt(2 q ln(1/delta) sum_{tau<t} (sigma_tau)^-2)`` (spec
  section 3.6, the inverse of (10)/(25)); at constant sigma and ``t = T`` it is
  :func:`wei_epsilon_eq10`.
  """
  s = _arr(past_inv_var_sum)
  if np.any(s < 0):
    raise ValueError(f"past_inv_var_sum must be >= 0, got {past_inv_var_sum}")
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      2 * _prob("q", q) * _log_inv(delta) * s))


def wei_log_moment_bound(lam, q, sensitivity, sigma) -> np.ndarray | float:
  """Eq. (15), the paper's per-round log-moment approximation:
  ``alpha(lambda) ~= q lambda (lambda + 1) Delta^2 / (2 sigma^2)``.

  (The paper's last step is "~=", a first-order approximation; Fig. 2 checks it
  numerically.)
  """
  lam = _arr(lam)
  return _out(_prob("q", q) * lam * (lam + 1) * _arr(sensitivity) ** 2
              / (2 * _pos("sigma", sigma) ** 2))


def wei_log_moment_exact(lam, q, sensitivity, sigma) -> np.ndarray | float:
  """Eq. (14), exact: ``ln D_{nu1,nu0}(lambda)``, ``nu1 = q N(Delta, s^2) + (1-q) N(0, s^2)``.

  Against ``nu0 = N(0, s^2)``:

  ``D = sum_{l=0}^{lambda+1} C(lambda+1, l) (1-q)^(lambda+1-l) q^l exp(l (l-1) Delta^2 / (2 s^2))``,
  computed in log space. ``lambda`` must be a non-negative integer (array).
  """
  lam = np.asarray(lam)
  if np.any(lam < 0) or np.any(lam != np.round(lam)):
    raise ValueError(f"lam must be non-negative integers, got {lam}")
  q = _prob("q", q)
  r = _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  lam_b, q_b, r_b = np.broadcast_arrays(lam.astype(np.float64), q, r)
  out = np.empty(lam_b.shape)
  for idx in np.ndindex(*lam_b.shape):
    n = int(lam_b[idx]) + 1
    l = np.arange(n + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
      log_terms = (special.gammaln(n + 1) - special.gammaln(l + 1) - special.gammaln(n - l + 1)
                   + (n - l) * np.log1p(-q_b[idx]) + l * np.log(q_b[idx]) + l * (l - 1) * r_b[idx])
    out[idx] = special.logsumexp(log_terms)
  return _out(out)


def wei_log_moment_intermediate(lam, q, sensitivity, sigma) -> np.ndarray | float:
  """The rigorous intermediate bound of eq. (14).

  ``(lambda+1) ln(1 - q + q exp(lambda Delta^2 / (2 s^2)))``.
  """
  lam = _arr(lam)
  q = _prob("q", q)
  r = _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  with np.errstate(divide="ignore"):
    return _out((lam + 1) * np.logaddexp(np.log1p(-q), np.log(q) + lam * r))


def wei_delta_eq17(epsilon, q, rounds, sensitivity, sigma, max_order: int = 1000,
                   integer_orders: bool = True) -> np.ndarray | float:
  """Eq. (17), the paper's tail bound: ``delta = min_lambda exp(T alpha(lambda) - lambda eps)``
  with ``alpha`` from eq. (15)/(16).

  Args:
    integer_orders: minimise over ``lambda = 1..max_order`` (the paper's
      "positive integer"), else over real ``lambda > 0`` (closed form
      ``exp(-(eps - a)^2 / (4 a))`` for ``eps > a``, ``a = T q Delta^2 / (2 sigma^2)``).
  """
  e = _arr(epsilon)
  a = _arr(rounds) * _prob("q", q) * _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  if not integer_orders:
    return _out(np.where(e > a, np.exp(-(e - a) ** 2 / (4 * a)), 1.0))
  lam = np.arange(1, max_order + 1, dtype=np.float64)
  e_b, a_b = np.broadcast_arrays(e, a)
  logd = a_b[..., None] * lam * (lam + 1) - lam * e_b[..., None]
  return _out(np.exp(np.min(logd, axis=-1)))


def wei_epsilon_eq17(sigma, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """The epsilon that the paper's OWN accountant (16)-(17) gives for ``sigma`` (real lambda).

  ``eps = a + 2 sqrt(a ln(1/delta))``, ``a = T q Delta^2 / (2 sigma^2)``. Plugging
  eq. (10) in gives ``eps + eps^2 / (4 ln(1/delta))`` > the claimed ``eps``
  (spec section 3.5).
  """
  a = _arr(rounds) * _prob("q", q) * _arr(sensitivity) ** 2 / (2 * _pos("sigma", sigma) ** 2)
  return zcdp_epsilon(a, delta)


def wei_sigma_eq10_corrected(epsilon, delta, q, rounds, sensitivity) -> np.ndarray | float:
  """Corrected eq. (10): solve ``(eps - a)^2 / (4 a) = ln(1/delta)`` for ``a``.

  Here ``a = T q Delta^2 / (2 sigma^2)``.

  I.e. ``a = rho*(eps, delta)`` and ``sigma = Delta sqrt(q T / (2 rho*))``; 1.13x
  (eps = 4) to 1.49x (eps = 20) the printed sigma at delta = 1e-3 (spec section
  3.5). Meets the paper's own accountant exactly; certified only for ``q = 1``
  (where (15) is the exact Gaussian moment).
  """
  rho = _arr(zcdp_rho(epsilon, delta))
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      _prob("q", q) * _pos("rounds", rounds) / (2 * rho)))


def wei_budget_corrected(epsilon, delta, q, sensitivity) -> np.ndarray | float:
  """Corrected budget: ``sum sigma_tau^-2 <= 2 rho*(eps, delta) / (q Delta^2)``."""
  return _out(2 * _arr(zcdp_rho(epsilon, delta))
              / (_prob("q", q) * _pos("sensitivity", sensitivity) ** 2))


def wei_sigma_eq25_corrected(epsilon, delta, q, sensitivity, rounds, t,
                             past_inv_var_sum) -> np.ndarray | float:
  """Eq. (25) with the corrected budget of :func:`wei_budget_corrected` (``inf`` when exhausted)."""
  return _spread_budget(wei_budget_corrected(epsilon, delta, q, sensitivity), rounds, t,
                        past_inv_var_sum)


def wei_epsilon_claimed_corrected(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Inverse of the corrected calibration: ``zcdp_epsilon(q Delta^2 S / 2, delta)``."""
  return zcdp_epsilon(_prob("q", q) * _arr(sensitivity) ** 2 * _arr(past_inv_var_sum) / 2, delta)


# ----------------------------------------------------------------------------
# Yuan et al. (amplitude-varying noise)
# ----------------------------------------------------------------------------


def yuan_sensitivity(clip, n) -> np.ndarray | float:
  """Section III: ``Delta s = 2 C / |D_k|`` (full-batch local training, from Wei et al.)."""
  return _out(2 * _pos("clip", clip) / _pos("n", n))


def yuan_geometric_sum(theta, rounds) -> np.ndarray | float:
  """``S_M = (theta - theta^(1-M)) / (theta - 1) = sum_{m=1}^M theta^-(m-1)``.

  ``S_M = M`` at ``theta = 1``.

  The factor of eq. (8)/(16); computed as ``sum theta^-(m-1)`` in closed form with
  ``expm1`` so ``theta -> 1`` is continuous (spec checklist item 2).
  """
  th = _pos("theta", theta)
  m = _pos("rounds", rounds)
  lt = np.log(th)
  with np.errstate(divide="ignore", invalid="ignore"):
    # sum_{k=0}^{M-1} e^{-k lt} = expm1(-M lt) / expm1(-lt)
    s = np.expm1(-m * lt) / np.expm1(-lt)
  return _out(np.where(np.abs(lt) < 1e-12, m, s))


def yuan_sigma_eq8(epsilon, delta, q, rounds, theta, sensitivity) -> np.ndarray | float:
  """Theorem 1, eq. (8), as printed: base amplitude
  ``sigma = (Delta s / eps) sqrt(2 q S_M ln(1/delta))`` of ``Theta(m) = theta^(m-1) sigma^2``.

  ``rounds`` is ``M`` (global aggregations); Remark 3 (``theta = 1``) is the
  limit ``S_M = M``. Under the paper's own accountant this delivers
  ``eps + eps^2/(4 ln(1/delta))``, not ``eps`` (spec E4).
  """
  return _out(_pos("sensitivity", sensitivity) / _pos("epsilon", epsilon) * np.sqrt(
      2 * _prob("q", q) * _arr(yuan_geometric_sum(theta, rounds)) * _log_inv(delta)))


def yuan_round_sigma(sigma, theta, m) -> np.ndarray | float:
  """Eq. (6): the amplitude (std) at aggregation ``m`` (1-based): ``sigma theta^((m-1)/2)``.

  ``theta`` multiplies the VARIANCE: ``Theta(m) = theta^(m-1) sigma^2``.
  """
  return _out(_pos("sigma", sigma) * _pos("theta", theta) ** ((_arr(m) - 1) / 2))


def yuan_epsilon_eq8(sigma, delta, q, rounds, theta, sensitivity) -> np.ndarray | float:
  """Inverse of eq. (8): epsilon the paper claims for base amplitude ``sigma`` over ``M`` rounds."""
  return _out(_pos("sensitivity", sensitivity) / _pos("sigma", sigma) * np.sqrt(
      2 * _prob("q", q) * _arr(yuan_geometric_sum(theta, rounds)) * _log_inv(delta)))


def yuan_epsilon_claimed(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Epsilon claimed by (8)/(16) after rounds with ``sum_m 1/Theta(m) = past_inv_var_sum``.

  ``Delta s sqrt(2 q ln(1/delta) sum_m sigma_m^-2)``; reaches the target eps at ``m = M``.
  """
  return wei_epsilon_claimed(past_inv_var_sum, delta, q, sensitivity)


def yuan_epsilon_achieved(past_inv_var_sum, delta, q, sensitivity) -> np.ndarray | float:
  """Epsilon of the paper's own accountant (16)-(17) minimised over real lambda.

  ``a + 2 sqrt(a ln(1/delta))`` with ``a = sum_m q Delta s^2 / (2 sigma_m^2)``
  (spec section 3.3: 13.62 at eps = 10, delta = 1e-3 with eq. (8)).
  """
  return zcdp_epsilon(_prob("q", q) * _arr(sensitivity) ** 2 * _arr(past_inv_var_sum) / 2, delta)


def yuan_sigma_eq8_corrected(epsilon, delta, q, rounds, theta, sensitivity) -> np.ndarray | float:
  """Corrected eq. (8) (spec E4): ``sigma^2 = q Delta s^2 S_M / (2 rho*)``.

  1.282x the printed sigma at eps = 10, delta = 1e-3.
  """
  rho = _arr(zcdp_rho(epsilon, delta))
  return _out(_pos("sensitivity", sensitivity) * np.sqrt(
      _prob("q", q) * _arr(yuan_geometric_sum(theta, rounds)) / (2 * rho)))


def yuan_sigma_eq9(epsilon, delta, q, sensitivity, theta, m, new_rounds) -> np.ndarray | float:
  """Theorem 2, eq. (9), as printed: base amplitude after shortening the horizon to ``M'``.

  The refinement happens at round ``m``:

  ``theta > 1``: ``(Delta s/eps) sqrt(2q ((theta - theta^(1-m))/(theta-1) + M' - m) ln(1/delta))``;
  ``theta = 1``: ``(Delta s/eps) sqrt(2 q M' ln(1/delta))``;
  ``theta < 1``:
  ``(Delta s/eps) sqrt(2q (theta^(1-m) - theta + theta^(m-M'))/(1-theta) ln(1/delta))``.
  The ``theta < 1`` branch under-counts the spend (spec E9); use
  :func:`yuan_sigma_refine_exact` for a budget-exact refinement.
  """
  th = _pos("theta", theta)
  m = _arr(m)
  mp = _arr(new_rounds)
  base = _pos("sensitivity", sensitivity) / _pos("epsilon", epsilon)
  li = _log_inv(delta)
  q = _prob("q", q)
  with np.errstate(divide="ignore", invalid="ignore"):
    gt = (th - th ** (1 - m)) / (th - 1) + mp - m
    lt = (th ** (1 - m) - th + th ** (m - mp)) / (1 - th)
  factor = np.where(th > 1, gt, np.where(th < 1, lt, mp))
  return _out(base * np.sqrt(2 * q * factor * li))


def yuan_sigma_refine_exact(epsilon, delta, q, sensitivity, theta, m, new_rounds,
                            past_inv_var_sum) -> np.ndarray | float:
  """Budget-exact refinement (spec section 4, "exact alternative").

  ``(sigma')^2 = sum_{n=m+1}^{M'} theta^-(n-1) / (B - P_m)``,
  ``B = eps^2 / (2 q Delta s^2 ln(1/delta))``, ``P_m = past_inv_var_sum`` (the
  realised ``sum_{n<=m} 1/Theta(n)``). ``inf`` when the budget is spent.
  """
  th = _pos("theta", theta)
  m = _arr(m)
  mp = _arr(new_rounds)
  # sum_{n=m+1}^{M'} theta^-(n-1) = theta^-m S_{M'-m}
  tail = th ** (-m) * _arr(yuan_geometric_sum(th, np.maximum(mp - m, 1e-300)))
  tail = np.where(mp > m, tail, 0.0)
  room = _arr(wei_budget(epsilon, delta, q, sensitivity)) - _arr(past_inv_var_sum)
  with np.errstate(divide="ignore", invalid="ignore"):
    s = np.sqrt(tail / room)
  return _out(np.where((room > 0) & (tail > 0), s, np.inf))


# ----------------------------------------------------------------------------
# Fu et al. (DP-FedAvg, Laplace vs Gaussian)
# ----------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------
# A-DPFL
# ----------------------------------------------------------------------------


def adpfl_next_sigma(sigma, k, accuracy_gain, alpha) -> np.ndarray | float:
  """Eq. (15): ``sigma' = k sigma`` if ``S_t - S_{t-1} <= alpha`` else ``sigma``, 0 < k < 1."""
  k = _arr(k)
  if np.any((k <= 0) | (k >= 1)):
    raise ValueError(f"k must be in (0, 1), got {k}")
  return _out(np.where(_arr(accuracy_gain) <= _arr(alpha), k * _pos("sigma", sigma), _arr(sigma)))


def adpfl_sigma_schedule(sigma0, k, num_reductions) -> np.ndarray | float:
  """Closed form of eq. (15): the per-step noise multiplier ``sigma_t = sigma_0 k^m(t)``.

  ``m(t)`` = number of triggered reductions so far; the noise added to the
  summed clipped batch gradient at every local step is ``N(0, sigma_t^2 C^2 I)`` (eq. 17).
  """
  return _out(_pos("sigma0", sigma0) * _pos("k", k) ** _arr(num_reductions))


def adpfl_gaussian_sigma_printed(epsilon, delta, sensitivity=1.0) -> np.ndarray | float:
  """Sec. 3.1, as printed: ``sigma >= (Delta Q / eps) sqrt(ln(1.25/delta))`` (the 2 is missing)."""
  d = _arr(delta)
  _log_inv(d)
  return _out(_pos("sensitivity", sensitivity) / _pos("epsilon", epsilon)
              * np.sqrt(np.log(1.25 / d)))


def adpfl_gaussian_sigma_dwork_roth(epsilon, delta, sensitivity=1.0) -> np.ndarray | float:
  """Corrected (Dwork & Roth Thm. A.1): ``(Delta Q / eps) sqrt(2 ln(1.25/delta))``, for eps < 1."""
  return _out(np.sqrt(2.0) * _arr(adpfl_gaussian_sigma_printed(epsilon, delta, sensitivity)))


def adpfl_epsilon_step(noise_multiplier, delta, printed: bool = True) -> np.ndarray | float:
  """Per-step epsilon implied by the Sec. 3.1 calibration for a noise multiplier ``sigma_t``.

  ``sqrt(ln(1.25/delta)) / sigma_t`` (printed) or ``sqrt(2 ln(1.25/delta)) / sigma_t``
  (corrected); 3.43 / 4.84 at ``sigma_t = 1``, ``delta = 1e-5``, outside the
  ``eps < 1`` range where the formula is valid.
  """
  d = _arr(delta)
  _log_inv(d)
  c = 1.0 if printed else 2.0
  return _out(np.sqrt(c * np.log(1.25 / d)) / _pos("noise_multiplier", noise_multiplier))


def adpfl_epsilon_claimed(noise_multipliers_steps, delta, printed: bool = True) -> float:
  """NOT IN PAPER: basic composition of :func:`adpfl_epsilon_step` over the steps taken so far.

  The paper states only "(eps, delta)-DP" and no composition or number; this sum
  is the naive reading of its per-step calibration (at ``k * delta`` overall),
  recorded so a run still has an ``epsilon_claimed`` column.
  """
  s = np.asarray(noise_multipliers_steps, dtype=np.float64).reshape(-1)
  if s.size == 0:
    return 0.0
  return float(np.sum(adpfl_epsilon_step(s, delta, printed)))
