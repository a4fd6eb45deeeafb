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

One module per paper (:mod:`.wei`, :mod:`.yuan`, :mod:`.fu`, :mod:`.adpfl`) over
:mod:`.core` (argument checks, the zCDP conversion); every name is re-exported here.
The registry of ``privacy.formula`` (how a run's plan uses them) is
:mod:`fedjax_dp.privacy.formulas.registry`.

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

from fedjax_dp.privacy.formulas.adpfl import (
  adpfl_epsilon_claimed,
  adpfl_epsilon_step,
  adpfl_gaussian_sigma_dwork_roth,
  adpfl_gaussian_sigma_printed,
  adpfl_next_sigma,
  adpfl_sigma_schedule,
)
from fedjax_dp.privacy.formulas.core import zcdp_epsilon, zcdp_rho
from fedjax_dp.privacy.formulas.fu import (
  FU_C2_DEFAULT,
  fu_epsilon_thm1,
  fu_epsilon_thm2,
  fu_epsilon_zcdp,
  fu_laplace_scale_thm1,
  fu_participations,
  fu_sensitivity,
  fu_sensitivity_corrected,
  fu_sigma_thm2,
  fu_sigma_zcdp,
)
from fedjax_dp.privacy.formulas.wei import (
  wei_budget,
  wei_budget_corrected,
  wei_delta_eq17,
  wei_epsilon_claimed,
  wei_epsilon_claimed_corrected,
  wei_epsilon_eq10,
  wei_epsilon_eq17,
  wei_log_moment_bound,
  wei_log_moment_exact,
  wei_log_moment_intermediate,
  wei_sensitivity,
  wei_sigma_eq10,
  wei_sigma_eq10_corrected,
  wei_sigma_eq25,
  wei_sigma_eq25_corrected,
)
from fedjax_dp.privacy.formulas.yuan import (
  yuan_epsilon_achieved,
  yuan_epsilon_claimed,
  yuan_epsilon_eq8,
  yuan_geometric_sum,
  yuan_round_sigma,
  yuan_sensitivity,
  yuan_sigma_eq8,
  yuan_sigma_eq8_corrected,
  yuan_sigma_eq9,
  yuan_sigma_refine_exact,
)

__all__ = ["FU_C2_DEFAULT", "adpfl_epsilon_claimed", "adpfl_epsilon_step",
           "adpfl_gaussian_sigma_dwork_roth", "adpfl_gaussian_sigma_printed", "adpfl_next_sigma",
           "adpfl_sigma_schedule", "fu_epsilon_thm1", "fu_epsilon_thm2", "fu_epsilon_zcdp",
           "fu_laplace_scale_thm1", "fu_participations", "fu_sensitivity",
           "fu_sensitivity_corrected", "fu_sigma_thm2", "fu_sigma_zcdp", "wei_budget",
           "wei_budget_corrected", "wei_delta_eq17", "wei_epsilon_claimed",
           "wei_epsilon_claimed_corrected", "wei_epsilon_eq10", "wei_epsilon_eq17",
           "wei_log_moment_bound", "wei_log_moment_exact", "wei_log_moment_intermediate",
           "wei_sensitivity", "wei_sigma_eq10", "wei_sigma_eq10_corrected", "wei_sigma_eq25",
           "wei_sigma_eq25_corrected", "yuan_epsilon_achieved", "yuan_epsilon_claimed",
           "yuan_epsilon_eq8", "yuan_geometric_sum", "yuan_round_sigma", "yuan_sensitivity",
           "yuan_sigma_eq8", "yuan_sigma_eq8_corrected", "yuan_sigma_eq9",
           "yuan_sigma_refine_exact", "zcdp_epsilon", "zcdp_rho"]
