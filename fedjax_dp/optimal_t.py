"""``optimal_t``: "optimal UDP" of Wei et al. (TMC 2021), Sec. 5.4 baseline 3.

"The UDP algorithm will be trained with the optimal T (obtained by heuristic
search)": the constant schedule (Algorithm 1, sigma from eq. (10) for that T) is run
for every T of a grid and the T with the lowest final test loss is kept (spec
``wei_udp_crd.md`` section 6 item 3). Each T is a separate, complete run: eq. (10)'s
sigma grows like sqrt(T), so a shorter run is not a prefix of a longer one.

It is not a state machine like the other schedules (it needs every candidate's
final loss before it can choose), so the run loop does not drive it: a config with
``schedule.name = 'optimal_t'`` expands into one constant-schedule candidate per T
of ``schedule.t_grid``, and the candidates run together as ONE sweep (they share
every array shape, so :func:`fedjax_dp.experiment.run_batched` runs them as one
vmapped program, T being host-side). ``fedjax-dp run`` and ``fedjax-dp sweep`` both
accept it, so ``--grid schedule.name=constant,crd,linear_decay,optimal_t`` compares
all four of the paper's methods in one command.

Choosing T by the test loss is what the paper does; it is an oracle choice (the
test set is looked at T-grid-size times). The paper does not account for it; here
the certified epsilon is that of the whole procedure: every candidate's model is
written (``DIR/T=<T>/``) and the choice reads every candidate's final test loss,
a function of its model, so the release is all candidates together. They draw
independent noise (their configs differ in T, so their noise streams do,
:mod:`fedjax_dp.config.noise_identity`) on the same data, and their RDP curves add
(adaptive composition; each candidate's curve is that of its worst client, so the
sum bounds every client's): ``summary.json``'s ``epsilon_certified``, the CLI's
line and the ``epsilon_certified`` column of ``DIR/metrics.csv`` hold that
composed value (:func:`composed_epsilon`); ``epsilon_certified_chosen`` and
``DIR/optimal_t.csv`` keep each candidate's own. ``epsilon_claimed`` stays the
chosen candidate's (the paper's claim, which ignores the search).

Output (a run directory, plus the candidates'): ``DIR/config.json`` (the
``optimal_t`` config), ``DIR/metrics.csv`` and ``metrics.png`` (the chosen
candidate's rounds), ``DIR/optimal_t.csv`` (one row per T: final test loss and
accuracy, certified epsilon), ``DIR/summary.json`` (the chosen candidate's summary
with ``best_rounds`` and the table), and ``DIR/T=<T>/`` (each candidate's run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp import sharding
from fedjax_dp.config import schema
from fedjax_dp.files import outputs, results
from fedjax_dp.privacy import accounting

NAME = config_lib.OPTIMAL_T
TABLE_COLUMNS = ("rounds", "final_test_loss", "final_test_accuracy", "epsilon_claimed",
                 "epsilon_certified", "status")


is_optimal_t = config_lib.is_optimal_t  # (the config knows its special schedule name)


def t_grid(cfg) -> list[int]:
  """The searched T values: ``schedule.t_grid``, or 10, 20, ..., ``rounds`` if empty."""
  grid = [int(t) for t in cfg.schedule.t_grid]
  if not grid:
    grid = list(range(10, int(cfg.rounds) + 1, 10)) or [int(cfg.rounds)]
  if any(t < 1 for t in grid):
    raise config_lib.ConfigError(f"schedule.t_grid must hold rounds >= 1, got {grid}")
  return sorted(set(grid))


def candidates(cfg) -> list[tuple[int, Any]]:
  """``[(T, config)]``: the constant-schedule run of ``cfg`` for every T of the grid."""
  out = []
  for t in t_grid(cfg):
    c = config_lib.override(cfg, ["schedule.name=constant", f"rounds={t}"])
    c.name = f"{cfg.name}/T={t}"
    out.append((t, c))
  return out


def candidate_dir(out_dir: str | Path | None, rounds: int) -> Path | None:
  """Where the candidate of ``rounds`` rounds writes its run directory."""
  return None if out_dir is None else Path(out_dir) / f"T={rounds}"


def claim_candidate(out_dir: str | Path | None, rounds: int) -> Path | None:
  """:func:`candidate_dir`, claimed as the ``optimal_t`` directory's own (listed in
  its manifest, :func:`fedjax_dp.files.outputs.claim`) by the process that writes."""
  path = candidate_dir(out_dir, rounds)
  if path is not None and sharding.is_primary():
    outputs.claim(path, "candidate", parent=out_dir)
  return path


def _final(summary) -> float:
  loss = summary.get("final_test_loss")
  return math.inf if loss is None or not math.isfinite(float(loss)) else float(loss)


def composed_epsilon(summaries: Sequence[dict[str, Any]], delta: float
                     ) -> tuple[float, dict[str, Any] | None]:
  """Certified epsilon at ``delta`` of releasing every run of ``summaries`` together.

  The runs use the same data, neighbour relation and accountant and draw independent
  noise, so their RDP curves add at every order; each summary's ``accountant``
  holds its worst client's curve, so the sum bounds every client's (the same bound
  for identical clients). Pure Laplace runs also compose by adding their pure
  epsilons; the smaller bound is kept, as for a single run.

  Args:
    summaries: the runs' ``summary.json`` dicts.
    delta: the delta to certify at.

  Returns:
    ``(epsilon, accountant)``: ``inf`` (and None) if a run is certified at ``inf``
    or its summary has no ``accountant`` (written before it was recorded).
  """
  accts = [s.get("accountant") for s in summaries]
  if any(a is None for a in accts) or any(
      not math.isfinite(float(s.get("epsilon_certified", math.inf))) for s in summaries):
    return math.inf, None
  orders = np.asarray(accts[0]["orders"], np.float64)
  if any(not np.array_equal(np.asarray(a["orders"], np.float64), orders) for a in accts):
    raise ValueError("composed_epsilon: the runs' accountants use different RDP orders")
  rdp = np.sum([np.asarray(a["rdp_worst_client"], np.float64) for a in accts], axis=0)
  pure = float(sum(float(a["pure_epsilon_worst_client"]) for a in accts))
  eps = math.inf
  if np.all(np.isfinite(rdp)):
    eps = float(accounting.rdp_epsilon(accounting.RdpState(orders, rdp), delta))
  return min(eps, pure), {"orders": orders, "rdp_worst_client": rdp,
                          "pure_epsilon_worst_client": pure}


def select(cfg, runs: Sequence[tuple[int, results.RunResult]],
           out_dir: str | Path | None = None) -> results.RunResult:
  """Keeps the candidate with the lowest final test loss (diverged ones never win).

  Args:
    cfg: the ``optimal_t`` config.
    runs: ``[(T, RunResult)]`` of its candidates.
    out_dir: the ``optimal_t`` run directory to write (None: write nothing).

  Returns:
    The chosen candidate's result, its summary extended with ``schedule``,
    ``best_rounds`` and ``optimal_t`` (the table of all candidates); its
    ``epsilon_certified`` (and that column of its rows) is the composition over all
    candidates (:func:`composed_epsilon`), the chosen one's own is
    ``epsilon_certified_chosen``.
  """
  if not runs:
    raise ValueError("optimal_t: no candidate runs")
  table = [dict(rounds=t, **{k: r.summary.get(k) for k in TABLE_COLUMNS[1:]})
           for t, r in sorted(runs, key=lambda tr: tr[0])]
  best_t, best = min(runs, key=lambda tr: (_final(tr[1].summary), tr[0]))
  eps, acct = composed_epsilon([r.summary for _, r in runs], float(cfg.privacy.delta))
  summary = dict(best.summary, name=cfg.name, schedule=NAME, best_rounds=best_t,
                 t_grid=[t for t, _ in sorted(runs, key=lambda tr: tr[0])], optimal_t=table,
                 epsilon_certified=eps, accountant=acct,
                 epsilon_certified_chosen=best.summary.get("epsilon_certified"),
                 epsilon_certified_scope=f"all {len(runs)} candidates (each one's model is "
                 "written and the choice of T reads every candidate's test loss)")
  # The rows report what the directory releases: every candidate, composed.
  rows = [dict(r, epsilon_certified=eps) for r in best.rows]
  if out_dir is not None:
    run_dir = results.RunDir(out_dir)
    run_dir.write_config(schema.stamped(cfg.to_dict()))
    run_dir.write_metrics(rows, results.METRIC_COLUMNS)
    results.write_csv(Path(out_dir) / "optimal_t.csv", table, TABLE_COLUMNS, owned=True)
    run_dir.write_plot(rows, title=f"{cfg.name}: optimal T = {best_t} of "
                       f"{len(runs)} (constant schedule)")
    run_dir.write_summary(summary)  # last: its presence marks the directory complete
  return results.RunResult(rows, summary, best.params)
