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
test set is looked at T-grid-size times) and its privacy cost -- the selection among
the candidates is itself data-dependent -- is not accounted, as in the paper. The
certified epsilon reported is that of the chosen run alone.

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

from fedjax_dp import config as config_lib
from fedjax_dp import outputs, results, sharding

NAME = "optimal_t"
TABLE_COLUMNS = ("rounds", "final_test_loss", "final_test_accuracy", "epsilon_claimed",
                 "epsilon_certified", "status")


def is_optimal_t(cfg) -> bool:
  """Whether ``cfg`` asks for the T search."""
  return cfg.schedule.name == NAME


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
  its manifest, :func:`fedjax_dp.outputs.claim`) by the process that writes."""
  path = candidate_dir(out_dir, rounds)
  if path is not None and sharding.is_primary():
    outputs.claim(path, "candidate", parent=out_dir)
  return path


def _final(summary) -> float:
  loss = summary.get("final_test_loss")
  return math.inf if loss is None or not math.isfinite(float(loss)) else float(loss)


def select(cfg, runs: Sequence[tuple[int, results.RunResult]],
           out_dir: str | Path | None = None) -> results.RunResult:
  """Keeps the candidate with the lowest final test loss (diverged ones never win).

  Args:
    cfg: the ``optimal_t`` config.
    runs: ``[(T, RunResult)]`` of its candidates.
    out_dir: the ``optimal_t`` run directory to write (None: write nothing).

  Returns:
    The chosen candidate's result, its summary extended with ``schedule``,
    ``best_rounds`` and ``optimal_t`` (the table of all candidates).
  """
  if not runs:
    raise ValueError("optimal_t: no candidate runs")
  table = [dict(rounds=t, **{k: r.summary.get(k) for k in TABLE_COLUMNS[1:]})
           for t, r in sorted(runs, key=lambda tr: tr[0])]
  best_t, best = min(runs, key=lambda tr: (_final(tr[1].summary), tr[0]))
  summary = dict(best.summary, name=cfg.name, schedule=NAME, best_rounds=best_t,
                 t_grid=[t for t, _ in sorted(runs, key=lambda tr: tr[0])], optimal_t=table)
  if out_dir is not None:
    run_dir = results.RunDir(out_dir)
    run_dir.write_config(cfg.to_dict())
    run_dir.write_metrics(best.rows, results.METRIC_COLUMNS)
    results.write_csv(Path(out_dir) / "optimal_t.csv", table, TABLE_COLUMNS, owned=True)
    run_dir.write_plot(best.rows, title=f"{cfg.name}: optimal T = {best_t} of "
                       f"{len(runs)} (constant schedule)")
    run_dir.write_summary(summary)  # last: its presence marks the directory complete
  return results.RunResult(best.rows, summary, best.params)
