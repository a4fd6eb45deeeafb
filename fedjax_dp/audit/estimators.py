"""Empirical epsilon from canary scores, through ``jax_privacy.auditing``.

The statistics are jax_privacy's (2.x) :class:`CanaryScoreAuditor`, not re-derived
here: it installs beside this project's pins without changing them (``pip install
-e ".[audit]"``; the ``test`` extra has it too). Without it the audit refuses with a
message saying what to install.

Scores of held-in canaries (``in_scores``) are expected to be larger than those of
held-out ones (``out_scores``). Each (in or out) score comes from an independent
trial (:mod:`fedjax_dp.audit.audit` runs one canary per lane), so the estimators'
assumptions hold exactly:

* ``epsilon_clopper_pearson`` (Jagielski et al. 2020; Nasr et al. 2021): at every
  threshold, Clopper-Pearson bounds on the attack's FPR and FNR, Bonferroni over the
  thresholds; ``log((TPR_lb - delta) / FPR_ub)``. A lower bound on the mechanism's
  epsilon at ``delta`` with confidence ``1 - significance``, whatever the mechanism.
* ``epsilon_one_run`` (Steinke, Nasr & Jagielski, NeurIPS 2023): guesses on the
  top-scoring canaries, valid because each canary's in/out bit is an independent fair
  coin; also a lower bound with confidence ``1 - significance``.
* ``gdp`` (Andrew et al., ICLR 2024): the Gaussian-DP ``mu`` implied by the
  Clopper-Pearson bounds, ``max_thr Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)`` (Dong, Roth &
  Su 2019, eq. 6; Bonferroni over the thresholds), converted to ``(epsilon, delta)``
  (:func:`fedjax_dp.privacy.accounting.gaussian_epsilon`). It assumes the mechanism's
  trade-off curve is Gaussian (true for Gaussian noise, not in general). Computed here,
  one-sided: jax_privacy 2.0.0's ``epsilon_from_gdp`` also takes the absolute value of
  a negative ``mu`` (the reversed claim), which needs LOWER bounds on FPR and FNR; with
  its upper bounds, FPR_ub + FNR_ub > 1 from sampling error alone, and it reported
  epsilon 3.7 for two Gaussians 0.2 apart from 200 + 200 samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import scipy.stats

INSTALL_HINT = ('the privacy audit needs jax-privacy>=2: pip install "jax-privacy>=2" '
                '(or pip install -e ".[audit]")')


class Estimates(NamedTuple):
  """Empirical epsilons of one set of trials (see the module docstring)."""

  clopper_pearson: float
  one_run: float
  gdp: float


def _auditing():
  try:
    from jax_privacy import auditing
  except ImportError as e:  # optional dependency
    raise ImportError(INSTALL_HINT) from e
  return auditing


def available() -> bool:
  """Whether jax_privacy's estimators can be imported."""
  try:
    _auditing()
  except ImportError:
    return False
  return True


def estimate(in_scores: Sequence[float], out_scores: Sequence[float], delta: float,
             significance: float) -> Estimates:
  """The three empirical epsilons of one attack's scores.

  Args:
    in_scores: ``[n_in]`` scores of trials that held the canary.
    out_scores: ``[n_out]`` scores of trials that did not.
    delta: the delta the epsilons are stated at.
    significance: allowed failure probability (``1 - confidence``).
  """
  auditing = _auditing()
  auditor = auditing.CanaryScoreAuditor(np.asarray(in_scores, np.float64),
                                        np.asarray(out_scores, np.float64))
  return Estimates(
      clopper_pearson=float(auditor.epsilon_clopper_pearson(significance, delta)),
      one_run=float(auditor.epsilon_one_run(significance, delta)),
      gdp=epsilon_gdp(in_scores, out_scores, delta, significance))


def clopper_pearson_upper(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
  """One-sided ``1 - alpha`` upper confidence bound on a binomial rate from ``k`` of ``n``."""
  k = np.asarray(k, np.float64)
  with np.errstate(invalid="ignore"):
    ub = scipy.stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
  return np.where(k >= n, 1.0, ub)


def epsilon_gdp(in_scores: Sequence[float], out_scores: Sequence[float], delta: float,
                significance: float) -> float:
  """Andrew et al.'s Gaussian-DP estimate of epsilon (see the module docstring)."""
  from fedjax_dp.privacy import accounting

  ins = np.sort(np.asarray(in_scores, np.float64))
  outs = np.sort(np.asarray(out_scores, np.float64))
  thresholds = np.unique(np.concatenate([ins, outs, [np.inf]]))
  # Guess "in" when score >= threshold.
  fn = np.searchsorted(ins, thresholds, side="left")
  fp = outs.size - np.searchsorted(outs, thresholds, side="left")
  alpha = significance / (2 * thresholds.size)
  fnr_ub = clopper_pearson_upper(fn, ins.size, alpha)
  fpr_ub = clopper_pearson_upper(fp, outs.size, alpha)
  mu = float(np.max(scipy.stats.norm.isf(fpr_ub) - scipy.stats.norm.ppf(fnr_ub)))
  if not mu > 0:
    return 0.0
  return float(accounting.gaussian_epsilon(min(mu, 40.0), delta))


def best_of(in_scores: np.ndarray, out_scores: np.ndarray, delta: float,
            significance: float) -> Estimates:
  """The largest estimates over several attacks, Bonferroni-corrected.

  Args:
    in_scores: ``[A, n_in]`` scores of A attacks on the held-in trials.
    out_scores: ``[A, n_out]``.
    delta: delta of the epsilons.
    significance: overall failure probability; each attack gets ``significance / A``,
      so the maximum is still a lower bound with confidence ``1 - significance``.
  """
  a = len(in_scores)
  per = [estimate(i, o, delta, significance / a) for i, o in zip(in_scores, out_scores)]
  return Estimates(*(max(e[k] for e in per) for k in range(3)))
