"""``schedule.name = 'optimal_t'`` (Wei's optimal-T baseline) and lane queues."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from _helpers import FLOAT_COLUMNS, assert_rows_close, small_config

from fedjax_dp import config as config_lib
from fedjax_dp import experiment, optimal_t, sweep

T_GRID = (2, 4, 6)
# The optimal_t rows certify every candidate together (optimal_t.composed_epsilon), so
# they equal the chosen candidate's run in every column but that one.
RUN_COLUMNS = tuple(c for c in FLOAT_COLUMNS if c != "epsilon_certified")


def _base(**sets):
  # K < U and real noise, so a run that reads another round's cohort or keys shows.
  return small_config({"rounds": "6", "data.num_clients": "5",
                       "data.samples_per_client": "24", "server.clients_per_round": "3",
                       "model.name": "logistic", "client.lr": "0.5",
                       "privacy.epsilon": "4.0", "progress": "false"}, **sets)


def _optimal(**sets):
  return _base(**{"schedule.name": "optimal_t",
                  "schedule.t_grid": ",".join(map(str, T_GRID)), **sets})



# ----------------------------------------------------------------------------- selection


def test_optimal_t_keeps_the_lowest_final_loss_and_equals_the_constant_run(tmp_path):
  cfg = _optimal()
  res = experiment.run(cfg, str(tmp_path / "opt"))
  singles = {t: experiment.run(config_lib.override(
      cfg, ["schedule.name=constant", f"rounds={t}"])) for t in T_GRID}
  finals = {t: r.summary["final_test_loss"] for t, r in singles.items()}
  best = min(finals, key=finals.get)
  s = res.summary
  assert s["best_rounds"] == best
  assert s["schedule"] == "optimal_t" and s["t_grid"] == list(T_GRID)
  # The chosen run is the plain constant-schedule run of T = best (same seed).
  assert_rows_close(res.rows, singles[best].rows, RUN_COLUMNS)
  want = singles[best].summary
  assert s["rounds_run"] == want["rounds_run"] == best
  for k in ("final_test_loss", "final_test_accuracy", "epsilon_claimed"):
    np.testing.assert_allclose(s[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)
  np.testing.assert_allclose(s["epsilon_certified_chosen"], want["epsilon_certified"],
                             rtol=2e-5)
  # What the command releases is every candidate: their composition, above each one's.
  assert s["epsilon_certified"] > max(r.summary["epsilon_certified"] for r in singles.values())
  assert all(r["epsilon_certified"] == s["epsilon_certified"] for r in res.rows)
  # One table row per T with the separate constant runs' final losses.
  table = s["optimal_t"]
  assert [r["rounds"] for r in table] == list(T_GRID)
  for r in table:
    np.testing.assert_allclose(r["final_test_loss"], finals[r["rounds"]], rtol=2e-5)
    assert r["status"] == "completed"
  # eq. (10)'s sigma depends on T: the candidates are different runs, not prefixes.
  assert len({round(r["final_test_loss"], 7) for r in table}) == len(T_GRID)
  # The run directory.
  out = tmp_path / "opt"
  for name in ("config.json", "metrics.csv", "optimal_t.csv", "summary.json", "metrics.png"):
    assert (out / name).exists(), name
  for t in T_GRID:
    assert (out / f"T={t}" / "summary.json").exists()
  csv = pd.read_csv(out / "optimal_t.csv")
  assert list(csv["rounds"]) == list(T_GRID)
  assert json.loads((out / "config.json").read_text())["schedule"]["name"] == "optimal_t"
  assert len(pd.read_csv(out / "metrics.csv")) == best


def test_select_never_picks_a_diverged_candidate():
  def result(loss):
    return experiment.RunResult([], {"final_test_loss": loss, "status": "x"}, None)

  cfg = _optimal()
  chosen = optimal_t.select(cfg, [(2, result(float("nan"))), (4, result(0.7)),
                                  (6, result(None)), (8, result(0.9))])
  assert chosen.summary["best_rounds"] == 4
  assert [r["rounds"] for r in chosen.summary["optimal_t"]] == [2, 4, 6, 8]
  with pytest.raises(ValueError, match="no candidate"):
    optimal_t.select(cfg, [])


# ----------------------------------------------------------------------------- sweeps


def test_sweep_with_optimal_t_points_and_resume(tmp_path):
  cfg = _optimal(rounds="4", **{"schedule.t_grid": "(1,2,4)"})
  grid = {"schedule.name": ["constant", "optimal_t"]}
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  rows = sweep.run_sweep(cfg, grid, str(full))
  shutil.copytree(full, resumed)  # what the same sweep writes there (no paths inside)
  points = {p.name: p for p in sweep.expand(cfg, grid)}
  const_name, opt_name = sorted(points)
  opt_dir = full / "points" / opt_name
  assert not (full / "points" / const_name / "optimal_t.csv").exists()
  assert (opt_dir / "optimal_t.csv").exists()
  assert list(pd.read_csv(opt_dir / "optimal_t.csv")["rounds"]) == [1, 2, 4]
  for t in (1, 2, 4):
    for name in ("config.json", "metrics.csv", "summary.json"):
      assert (opt_dir / f"T={t}" / name).exists()
  summary = json.loads((opt_dir / "summary.json").read_text())
  best = summary["best_rounds"]
  assert best in (1, 2, 4)
  # The sweep's rows of the optimal_t point are its chosen candidate's rounds, and the
  # constant point (T = 4) equals its single run.
  df = pd.DataFrame(rows)
  assert df[df.point == opt_name]["round"].max() == best
  assert_rows_close([r for r in rows if r["point"] == const_name],
                     experiment.run(points[const_name].config).rows)
  assert_rows_close([r for r in rows if r["point"] == opt_name],
                     experiment.run(config_lib.override(
                         points[opt_name].config,
                         ["schedule.name=constant", f"rounds={best}"])).rows, RUN_COLUMNS)

  # Interrupt: one candidate and the point itself unfinished.
  point = resumed / "points" / opt_name
  (point / "T=2" / "summary.json").unlink()
  (point / "summary.json").unlink()
  kept = {t: (point / f"T={t}" / "summary.json").stat().st_mtime_ns for t in (1, 4)}
  const_kept = (resumed / "points" / const_name / "summary.json").stat().st_mtime_ns
  sweep.run_sweep(cfg, grid, str(resumed))
  assert (point / "T=2" / "summary.json").exists() and (point / "summary.json").exists()
  for t, mtime in kept.items():  # finished candidates are not re-run
    assert (point / f"T={t}" / "summary.json").stat().st_mtime_ns == mtime
  assert (resumed / "points" / const_name / "summary.json").stat().st_mtime_ns == const_kept
  pd.testing.assert_frame_equal(pd.read_csv(full / "sweep.csv").drop(columns="wall_s"),
                                pd.read_csv(resumed / "sweep.csv").drop(columns="wall_s"),
                                rtol=1e-5)
  pd.testing.assert_frame_equal(pd.read_csv(full / "points" / opt_name / "optimal_t.csv"),
                                pd.read_csv(point / "optimal_t.csv"), rtol=1e-5)


# ----------------------------------------------------------------------------- config


def test_empty_t_grid_is_tens_up_to_rounds():
  assert optimal_t.t_grid(_optimal(rounds="35", **{"schedule.t_grid": "()"})) == [10, 20, 30]
  assert optimal_t.t_grid(_optimal(rounds="40", **{"schedule.t_grid": "()"})) == [10, 20, 30,
                                                                                   40]
  assert optimal_t.t_grid(_optimal(rounds="7", **{"schedule.t_grid": "()"})) == [7]
  # Given grids are sorted and deduplicated.
  assert optimal_t.t_grid(_optimal(**{"schedule.t_grid": "(6,2,6)"})) == [2, 6]
  cands = optimal_t.candidates(_optimal(rounds="20", **{"schedule.t_grid": "()"}))
  assert [t for t, _ in cands] == [10, 20]
  for t, c in cands:
    assert c.schedule.name == "constant" and c.rounds == t and c.name.endswith(f"/T={t}")


@pytest.mark.parametrize("grid", ["(0,5)", "(-3,)", "(4,-1)"])
def test_bad_t_grid_is_a_config_error(grid):
  cfg = _optimal(**{"schedule.t_grid": grid})
  with pytest.raises(config_lib.ConfigError, match="schedule.t_grid"):
    config_lib.validate(cfg)
  with pytest.raises(config_lib.ConfigError, match="schedule.t_grid"):
    optimal_t.t_grid(cfg)
  with pytest.raises(config_lib.ConfigError, match="schedule.t_grid"):
    experiment.run(cfg)


def test_unknown_schedule_is_a_config_error():
  cfg = _base(**{"schedule.name": "optimal"})
  with pytest.raises(config_lib.ConfigError, match="schedule.name"):
    config_lib.validate(cfg)
  with pytest.raises(config_lib.ConfigError, match="optimal_t"):  # listed as known
    experiment.run(cfg)


# ----------------------------------------------------------------------------- lane layout


def _check_partition(layout, n):
  flat = [i for row in layout for queue in row for i in queue if i is not None]
  assert sorted(flat) == list(range(n))  # every run exactly once
  assert len({len(row) for row in layout}) == 1  # a [G][L] grid
  for row in layout:  # one entry per wave in every lane of a row
    assert len({len(q) for q in row}) == 1


def _makespan(layout, rounds):
  """Rounds until the last row's last wave ends (a wave lasts as its longest run)."""
  return max(sum(max(rounds[q[w]] for q in row if q[w] is not None)
                 for w in range(len(row[0]))) for row in layout)


def _rows_of(layout, keys):
  rows_of = {}
  for g, row in enumerate(layout):
    for q in row:
      for i in q:
        if i is not None:
          rows_of.setdefault(keys[i], set()).add(g)
  return rows_of


def test_lane_layout_rows_are_cohorts():
  keys = ["a", "b", "a", "b", "b", "a"]
  layout = experiment.lane_layout(keys, [5] * len(keys))
  _check_partition(layout, len(keys))
  assert len(layout) == 2
  for row in layout:
    assert len({keys[i] for q in row for i in q if i is not None}) == 1  # one cohort per row
  assert all(len(gs) == 1 for gs in _rows_of(layout, keys).values())  # ... in one row
  # All equal rounds: every run of a cohort gets its own lane.
  for row in layout:
    assert sorted(len(q) for q in row) == [1, 1, 1]
  # Default rounds are all equal.
  assert experiment.lane_layout(keys) == experiment.lane_layout(keys, [1] * len(keys))


def test_lane_layout_falls_back_to_a_row_per_run():
  # Cohorts of 3, 2 and 1 runs of equal T: three rows of three lanes would compute
  # 9 lane-rounds per round for 6 runs; six rows of one lane are cheaper.
  keys = ["a", "b", "a", "c", "b", "a"]
  layout = experiment.lane_layout(keys, [5] * len(keys))
  _check_partition(layout, len(keys))
  cohort_rows = all(len(gs) == 1 for gs in _rows_of(layout, keys).values())
  assert cohort_rows or all(len(row) == 1 for row in layout)
  assert all(len(q) == 1 for row in layout for q in row if q)


def test_lane_layout_queues_short_runs_behind_long_ones():
  n = 31
  rounds = [300] + [10] * (n - 1)
  layout = experiment.lane_layout(["k"] * n, rounds)
  _check_partition(layout, n)
  lanes = len(layout) * len(layout[0])
  cost = lanes * _makespan(layout, rounds)
  assert cost <= 2 * sum(rounds)
  assert cost < n * max(rounds) / 5
  assert any(len(q) > 1 for row in layout for q in row)
  # Waves hold runs of similar T: T = 10, 20, ..., 300 with 5 runs per T (a T x
  # epsilon grid) runs waves of equal or neighbouring T: little is wasted.
  rounds = [t for t in range(10, 301, 10) for _ in range(5)]
  layout = experiment.lane_layout(["k"] * len(rounds), rounds)
  _check_partition(layout, len(rounds))
  assert len(layout[0]) * _makespan(layout, rounds) <= 1.1 * sum(rounds)
  # Mixed cohorts keep one row each; no cheaper than all at once, or a row per run.
  keys = ["a"] * 4 + ["b"] * 4
  rounds = [40, 10, 10, 20, 40, 30, 5, 5]
  layout = experiment.lane_layout(keys, rounds)
  _check_partition(layout, len(keys))
  assert len(layout) == 2
  assert (len(layout[0]) + 0.5) * _makespan(layout, rounds) <= 4.5 * 40
  # Every run its own row is never worse than the layout chosen.
  cost = len(layout) * (len(layout[0]) + 0.5) * _makespan(layout, rounds)
  assert cost <= len(keys) * 1.5 * max(rounds)


def test_queued_runs_in_one_lane_equal_single_runs():
  # One cohort (one seed), T = 6 and shorter points (a grid holds no value twice): a
  # lane runs the long point while others run short ones one after another, starting
  # at round 0 while the long point is further on (a lane re-initialised for each run).
  cfg = _base()
  grid = {"rounds": [6, 1, 5, 2, 4, 3], "privacy.epsilon": [4.0]}
  points = sweep.expand(cfg, grid)
  layout = experiment.lane_layout([experiment.cohort_key(p.config) for p in points],
                                  [int(p.config.rounds) for p in points])
  assert any(len(q) > 1 for row in layout for q in row)  # really queued
  # Points differ only in their names here (grid values are shared); vary the
  # learning rate so that a mix-up of two points' models would show.
  points = [p._replace(config=config_lib.override(p.config, [f"client.lr={0.3 + 0.1 * i}"]))
            for i, p in enumerate(points)]
  res = experiment.run_batched([p.config for p in points], [None] * len(points))
  for p, r in zip(points, res):
    assert len(r.rows) == p.config.rounds
    assert_rows_close(r.rows, experiment.run(p.config).rows)
  rows = sweep.run_sweep(cfg, grid)
  for p in sweep.expand(cfg, grid):
    assert_rows_close([r for r in rows if r["point"] == p.name],
                       experiment.run(p.config).rows)
