"""What a run reports beside its metrics: the plan described, the unit of privacy, and
budget warnings.

A certified epsilon means nothing without the unit it protects (one example or one
client's whole dataset) and the neighbouring relation (add/remove one unit, or
replace one); both come from the run's :class:`fedjax_dp.privacy.plan.PrivacyPlan`
and are printed on the CLI line, written to ``metrics.csv`` (column
``privacy_unit``), ``sweep.csv``, ``summary.json`` and the plots.

A paper formula may size its noise for an epsilon that the accountant does not
certify (Wei eq. (10), Fu Thm. 1, Yuan eq. (8)): :func:`budget_warning` says so in
one line whenever the certified epsilon exceeds the requested one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_dp.privacy import adaptive_clip, minibatch

_RELATIONS = {"add_remove": "add/remove", "replace_one": "replace-one"}
NO_UNIT = "none (no noise)"
# ``privacy.formula='noise_multiplier'`` fixes the noise, not epsilon: privacy.epsilon
# is then no request, and exceeding it is no overspend.
UNREQUESTED_FORMULAS = ("noise_multiplier",)


def unit_text(level: str, relation: str) -> str:
  """``('example', 'replace_one')`` -> ``'example-level, replace-one'``."""
  return f"{level}-level, {_RELATIONS.get(relation, relation)}"


def privacy_unit(plan) -> str:
  """The unit of privacy of ``plan``'s accounting, e.g. ``'client-level, add/remove'``.

  Args:
    plan: a :class:`fedjax_dp.privacy.plan.PrivacyPlan`.

  Returns:
    :func:`unit_text` of the accounting event's level and relation, or
    :data:`NO_UNIT` for a run that adds no noise (nothing is certified).
  """
  accounting = plan.describe().get("accounting")
  if not accounting:
    return NO_UNIT
  return unit_text(accounting["level"], accounting["relation"])


def budget_warning(plan, acct, certified: float) -> str | None:
  """One line when the certified epsilon exceeds the requested one, else None.

  Per-client targets are compared client by client
  (:meth:`PrivacyPlan.over_budget`), so a heterogeneous budget warns only when some
  client passes its own target.

  Args:
    plan: the run's :class:`fedjax_dp.privacy.plan.PrivacyPlan`.
    acct: its accountant state after the last round.
    certified: the run's certified epsilon (worst client).
  """
  if plan.formula in UNREQUESTED_FORMULAS or plan.noiseless or not plan.over_budget(acct):
    return None
  return (f"WARNING: certified epsilon {certified:.3f} exceeds the requested "
          f"{plan.target_epsilon:.3f} (privacy.formula={plan.formula!r} sizes the noise "
          f"for a claim the accountant does not certify; delta {plan.delta:g})")


def summary_fields(plan, acct, certified: float) -> dict[str, Any]:
  """The ``summary.json`` fields of this module: ``privacy_unit`` and
  ``epsilon_warning`` (None when the certified epsilon is within the request)."""
  return {"privacy_unit": privacy_unit(plan),
          "epsilon_warning": budget_warning(plan, acct, certified)}


def describe(plan) -> dict[str, Any]:
  """A JSON-able summary for ``summary.json``: the accounting event, whether the
  selection is amplified, and what the certified epsilon assumes beyond the
  adjacency (a rule's :attr:`SelectionRule.assumption`)."""
  ev = None if plan.noiseless else plan.event(np.ones(plan.num_clients))
  accounting_info = None if ev is None else {
      "sampling": ev.sampling, "relation": ev.relation, "level": ev.level,
      "accountant": "rdp (certified, worst client)",
      "certified_note": adaptive_clip.MEDIAN_REASON if plan.uncertifiable else None,
      "amplification": (
          f"minibatch: poisson (q_i = B / |D_i|, {plan.steps} steps per round); "
          "client selection: none, each client is charged the rounds it was selected in"
          if plan.poisson_steps else
          "none: each client is charged the rounds it was selected in"
          if plan.rule.deterministic else ev.sampling),
      "assumption": (plan.rule.assumption if not plan.poisson_steps else
                     "; ".join(filter(None, [plan.rule.assumption,
                                             minibatch.POISSON_ASSUMPTION[plan.adjacency]])))}
  return {
      "mechanism": plan.mechanism, "placement": plan.placement, "formula": plan.formula,
      "adjacency": plan.adjacency,
      "delta": plan.delta, "q": plan.q, "selection": plan.selection, "steps": plan.steps,
      "sensitivity_min": float(np.min(plan.sensitivity)),
      "sensitivity_max": float(np.max(plan.sensitivity)),
      "sensitivity_claimed_max": None if plan.claimed_sensitivity is None
      else float(np.max(plan.claimed_sensitivity)),
      "clip_rule": plan.clip_rule,
      "validation": plan.validation,
      "val_noise_multiplier": plan.val_noise_multiplier if plan.validation == "clients"
      else None,
      "accounting": accounting_info,
      **({"correlated": describe_correlated(plan)} if plan.correlated is not None else {})}


def describe_correlated(plan) -> dict[str, Any]:
  """The strategy of a correlated mechanism and each client's matrix sensitivity over
  the run (``s_i``: the release is one Gaussian of multiplier ``sigma / s_i``)."""
  s, sens = plan.correlated, np.sqrt(plan.correlated_sens_sq())
  return {"strategy": s.name, "rounds": s.rounds, "bands": len(s.coefs) or None,
          "coefs": list(s.coefs) or None, "tree_restart": s.restart or None,
          "matrix_sensitivity_max": float(np.max(sens)),
          "matrix_sensitivity_min": float(np.min(sens)),
          "amplification": (
              f"b-min-sep Poisson (Choquette-Choo et al. 2023, Sec. 4): each eligible "
              f"round (every {plan.period}-th) a Poisson-subsampled Gaussian, rate "
              f"{plan.rule_rate}, multiplier sigma / {plan.max_column_norm:.6g}"
              if plan.amplified else
              "none: the realised (public) participation of each client")}
