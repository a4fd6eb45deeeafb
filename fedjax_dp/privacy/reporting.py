"""What a run reports beside its metrics: the unit of privacy and budget warnings.

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
