"""Scores to attack metrics: ROC, AUC, thresholds, balanced accuracy (pure numpy).

A membership score is higher for records the attacker believes are members; a
threshold ``thr`` predicts "member" when ``score >= thr``. Members and non-members
are evaluated in equal numbers (the callers balance them), so accuracy is the
balanced accuracy ``(TPR + 1 - FPR) / 2`` and the membership advantage of Yeom et
al. (2018, Def. 4) is ``TPR - FPR = 2 accuracy - 1``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class AttackResult(NamedTuple):
  """A membership-inference attack evaluated on members and non-members.

  Attributes:
    accuracy: balanced accuracy ``(TPR + 1 - FPR) / 2`` at ``threshold``.
    advantage: ``TPR - FPR`` at ``threshold`` (Yeom et al. 2018, Def. 4).
    tpr: true-positive rate (members called members) at ``threshold``.
    fpr: false-positive rate (non-members called members) at ``threshold``.
    threshold: the score threshold used (``score >= threshold`` means member).
    threshold_held_out: True when ``threshold`` was fixed without the evaluated
      records' membership labels (on a disjoint calibration split, or by shadow
      models); then ``accuracy`` is an honest estimate. False marks an optimistic one.
    auc: area under the ROC curve of the scores (threshold-free).
    best_accuracy: balanced accuracy at the best threshold chosen ON the evaluated
      records (optimistic: an oracle threshold, reported for comparison).
    best_advantage: ``TPR - FPR`` at that oracle threshold.
    num_members: evaluated members.
    num_nonmembers: evaluated non-members.
  """

  accuracy: float
  advantage: float
  tpr: float
  fpr: float
  threshold: float
  threshold_held_out: bool
  auc: float
  best_accuracy: float
  best_advantage: float
  num_members: int
  num_nonmembers: int

  def as_row(self, prefix: str) -> dict[str, float | int | bool]:
    """The fields as a flat dict with keys ``f'{prefix}_{field}'``."""
    return {f"{prefix}_{k}": (v if isinstance(v, (bool, int)) else float(v))
            for k, v in self._asdict().items()}


def _as_1d(a) -> np.ndarray:
  a = np.asarray(a, np.float64).reshape(-1)
  if not a.size:
    raise ValueError("attack scores: need at least one member and one non-member score")
  if np.isnan(a).any():
    raise ValueError("attack scores contain NaN")
  return a


def rates(threshold: float, members, nonmembers) -> tuple[float, float]:
  """``(TPR, FPR)`` of the rule ``score >= threshold``."""
  members, nonmembers = _as_1d(members), _as_1d(nonmembers)
  return float(np.mean(members >= threshold)), float(np.mean(nonmembers >= threshold))


def auc(members, nonmembers) -> float:
  """ROC AUC = P(member score > non-member score) + P(tie) / 2 (Mann-Whitney U)."""
  members, nonmembers = _as_1d(members), np.sort(_as_1d(nonmembers))
  below = np.searchsorted(nonmembers, members, side="left")
  ties = np.searchsorted(nonmembers, members, side="right") - below
  return float(np.mean(below + 0.5 * ties) / nonmembers.size)


def best_threshold(members, nonmembers) -> tuple[float, float]:
  """The threshold maximising ``TPR - FPR`` on these scores, and that maximum.

  Candidates are the midpoints between consecutive distinct scores and +-inf, so the
  threshold generalises sensibly to unseen scores. Ties are broken towards the
  smallest threshold.

  Returns:
    ``(threshold, TPR - FPR)``.
  """
  members, nonmembers = _as_1d(members), _as_1d(nonmembers)
  values = np.unique(np.concatenate([members, nonmembers]))
  cands = np.concatenate([[-np.inf], (values[:-1] + values[1:]) / 2, [np.inf]])
  # Rates for every candidate at once: the fraction of scores >= candidate.
  tpr = 1.0 - np.searchsorted(np.sort(members), cands, side="left") / members.size
  fpr = 1.0 - np.searchsorted(np.sort(nonmembers), cands, side="left") / nonmembers.size
  adv = tpr - fpr
  i = int(np.argmax(adv))
  return float(cands[i]), float(adv[i])


def evaluate(threshold: float, members, nonmembers, *, held_out: bool) -> AttackResult:
  """Evaluates the rule ``score >= threshold`` on member and non-member scores.

  Args:
    threshold: the decision threshold.
    members: scores ``[n]`` of members.
    nonmembers: scores ``[m]`` of non-members (callers pass ``m == n``).
    held_out: whether ``threshold`` was chosen without these records' labels.

  Returns:
    The :class:`AttackResult`, including the oracle best threshold for comparison.
  """
  members, nonmembers = _as_1d(members), _as_1d(nonmembers)
  tpr, fpr = rates(threshold, members, nonmembers)
  _, best_adv = best_threshold(members, nonmembers)
  return AttackResult(
      accuracy=0.5 * (tpr + 1.0 - fpr), advantage=tpr - fpr, tpr=tpr, fpr=fpr,
      threshold=float(threshold), threshold_held_out=bool(held_out),
      auc=auc(members, nonmembers), best_accuracy=0.5 * (1.0 + best_adv),
      best_advantage=best_adv, num_members=int(members.size),
      num_nonmembers=int(nonmembers.size))


def calibrated(calib_members, calib_nonmembers, eval_members, eval_nonmembers
               ) -> AttackResult:
  """Chooses the best threshold on a calibration split, reports on a disjoint one."""
  thr, _ = best_threshold(calib_members, calib_nonmembers)
  return evaluate(thr, eval_members, eval_nonmembers, held_out=True)
