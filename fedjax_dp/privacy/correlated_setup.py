"""A correlated mechanism (``privacy.mechanism`` tree or bandmf) set up for a run: the
runs its accounting covers, its strategy C, and each client's participation pattern.

The matrix mechanism's guarantee (:mod:`fedjax_dp.privacy.correlated.base`) needs the
noise of the server's aggregate of clipped updates (``privacy.placement='central'``, a
fixed clip), one noise multiplier for the whole run (the constant schedule; a formula
that sizes it by our accountant or a multiplier), a public participation pattern or
b-min-sep Poisson sampling, and a horizon the host can hold the Gram matrix of.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import correlated
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.formulas import registry

# The host builds the T x T Gram matrix of the strategy for the accountant.
CORRELATED_MAX_ROUNDS = 4096


def correlated_selections() -> tuple[str, ...]:
  """The selection rules a correlated mechanism is accounted for: those whose
  participation is a deterministic function of (seed, t), drawn without reading data,
  so each client's pattern is public (one Gaussian over the realised patterns), and
  the b-min-sep Poisson rules, for a banded mechanism with b <= P (amplified,
  Choquette-Choo et al. 2023, Sec. 4; :mod:`fedjax_dp.privacy.correlated.bandmf`).
  Other random rules (uniform, poisson: a client may take part in consecutive rounds,
  so they are not b-min-sep) would need an amplification analysis that is not
  implemented: refused, never certified by a heuristic."""
  return tuple(n for n, r in selection_lib.RULES.items()
               if r.public_pattern or r.min_sep_poisson)


def amplified_selections() -> tuple[str, ...]:
  """The b-min-sep Poisson rules (:attr:`SelectionRule.min_sep_poisson`)."""
  return tuple(n for n, r in selection_lib.RULES.items() if r.min_sep_poisson)


def pass_length(inputs) -> int:
  """Rounds between a client's turns by design (the rule's ``period``: round robin's
  and cyclic's pass ``ceil(U / K)``, else 1, every client every round)."""
  s = inputs.server
  return int(selection_lib.get_rule(s.selection).period(
      int(inputs.federation.num_clients), int(s.clients_per_round), float(s.q)))


def correlated_strategy(inputs) -> correlated.Strategy | None:
  """The strategy ``C`` of a correlated ``privacy.mechanism`` (None otherwise), after
  :func:`check_correlated`: BandMF with ``privacy.bands`` bands (0: the round-robin
  pass length, so that a client's turns are about b apart, Choquette-Choo et al. 2023
  Thm. 2), the tree restarted every ``privacy.tree_restart`` rounds (0: every pass,
  Kairouz et al. 2021's restart per epoch; one tree when every client takes part
  every round), optimised for ``rounds``.

  Args:
    inputs: :class:`fedjax_dp.privacy.inputs.PrivacyInputs`.
  """
  p = inputs.privacy
  if p.mechanism not in correlated.CORRELATED:
    return None
  check_correlated(inputs)
  rounds = int(p.rounds)
  per_pass = pass_length(inputs)
  bands = int(p.bands) or per_pass
  restart = int(p.tree_restart) or (per_pass if per_pass > 1 else rounds)
  return correlated.get(p.mechanism).strategy(rounds, min(bands, rounds),
                                              min(restart, rounds))


def patterns(inputs, u: int) -> np.ndarray:
  """``[U, T]`` who takes part in each round, from the rule's own sampler."""
  s = inputs.server
  rule = selection_lib.get_rule(s.selection)
  k, q, seed = int(s.clients_per_round), float(s.q), int(inputs.federation.seed)
  return correlated.realised_patterns(lambda t: rule.sample(u, k, q, seed, t), u,
                                      int(inputs.privacy.rounds))


def check_correlated(inputs) -> None:
  """Refuses a correlated mechanism (tree, bandmf) outside what its accounting covers
  (module docstring).

  Raises:
    ConfigError: naming the fields.
  """
  p, s = inputs.privacy, inputs.server
  mech = p.mechanism
  if mech not in correlated.CORRELATED:
    return
  if p.placement not in ("central", "none"):
    raise ConfigError(f"privacy.mechanism={mech!r} is noise correlated across rounds on the "
                      "server's aggregate: it needs privacy.placement='central' (or 'none'), "
                      f"got {p.placement!r}")
  if s.selection not in correlated_selections():
    raise ConfigError(
        f"privacy.mechanism={mech!r} with server.selection={s.selection!r}: a "
        "random selection in which a client can take part in rounds fewer than b apart "
        "is not b-min-sep sampling, and no amplification of the matrix mechanism under "
        "it is implemented (Choquette-Choo et al. 2023, Sec. 4 covers b-min-sep only); "
        f"use server.selection in {correlated_selections()} (participation known in "
        f"advance, or b-min-sep Poisson: {amplified_selections()}) or "
        "privacy.mechanism='gaussian' for amplified DP-FedAvg")
  if selection_lib.get_rule(s.selection).min_sep_poisson:
    _check_amplified(inputs)
  if p.schedule != "constant":
    raise ConfigError(f"privacy.mechanism={mech!r} adds one noise multiplier to the whole "
                      f"run: schedule.name must be 'constant', got {p.schedule!r}")
  if not registry.get_formula(p.formula).accountant_sized:
    raise ConfigError(f"privacy.mechanism={mech!r} with privacy.formula="
                      f"{p.formula!r}: that formula is written for i.i.d. noise; "
                      f"use one of {registry.accountant_sized()}")
  if s.clip_rule != "fixed":
    raise ConfigError(f"privacy.mechanism={mech!r} needs server.clip_rule='fixed' (one "
                      f"sensitivity for every round), got {s.clip_rule!r}")
  if not 1 <= int(p.rounds) <= CORRELATED_MAX_ROUNDS:
    raise ConfigError(f"privacy.mechanism={mech!r}: rounds must be in [1, "
                      f"{CORRELATED_MAX_ROUNDS}] (the host holds the T x T Gram matrix of "
                      f"the strategy), got {p.rounds}")


def _check_amplified(inputs) -> None:
  """A b-min-sep Poisson rule: only a banded strategy with ``b <= P`` bands is amplified
  (Choquette-Choo et al. 2023, Sec. 4; :mod:`fedjax_dp.privacy.correlated.bandmf`).

  Raises:
    ConfigError: a mechanism that is not banded (the tree), or ``b > P``.
  """
  p = inputs.privacy
  mech, sel = p.mechanism, inputs.server.selection
  if not correlated.get(mech).banded:
    raise ConfigError(
        f"privacy.mechanism={mech!r} with server.selection={sel!r}: the amplification "
        "of b-min-sep sampling (Choquette-Choo et al. 2023, Sec. 4) needs a b-banded "
        f"strategy C; {mech!r} is not banded (a node covers many rounds, so the columns of "
        "rounds P apart share nodes). "
        f"Use privacy.mechanism='bandmf', or a selection with a public pattern")
  period = pass_length(inputs)
  bands = min(int(p.bands) or period, int(p.rounds))
  if bands > period:
    raise ConfigError(
        f"privacy.bands={bands} > the period P={period} of server.selection={sel!r}: "
        "a client's eligible rounds are P apart, so with more than P bands one client's "
        "columns of C overlap and the b-min-sep amplification (Choquette-Choo et al. "
        f"2023, Sec. 4) does not apply; use privacy.bands <= {period} (0: P)")
