"""The eps = inf baseline calibration (fedjax_dp.calibration_sweep): stated settings
are never tuned, noise is refused, and the table picks the best point of one sweep."""

import math

import pandas as pd
import pytest

from fedjax_dp import calibration_sweep as cs
from fedjax_dp import config as config_lib

TARGET = cs.Target("adpfl2022", "Fig. X", "test_accuracy", 0.9)
# The calibration sweeps' federation: small, all clients of a round at once (no probe
# compiles to size a client chunk).
_SMALL = ("data.num_clients=4", "data.samples_per_client=30", "server.clients_per_round=4",
          "server.client_chunk=0")


@pytest.mark.parametrize("paper", sorted(cs.STATED))
def test_grid_over_a_stated_setting_is_refused(paper):
  for key in cs.STATED[paper]:
    with pytest.raises(config_lib.ConfigError, match=f"{paper} states {key}"):
      cs.check_grid(paper, {key: [1, 2]})
  # a key under a stated prefix ('privacy' covers privacy.epsilon)
  with pytest.raises(config_lib.ConfigError, match="privacy.epsilon"):
    cs.check_grid(paper, {"privacy.epsilon": [1.0]})


def test_a_figures_own_stated_settings_and_open_settings():
  cs.check_grid("yuan2023", {"client.lr": [0.1, 0.5], "client.batch_size": [0, 50],
                             "client.clip_mode": ["param_l2", "none"]})
  with pytest.raises(config_lib.ConfigError, match="client.batch_size"):
    cs.check_grid("yuan2023", {"client.batch_size": [0, 50]}, stated=("client.batch_size",))
  cs.check_grid("adpfl2022", {"model.name": ["a"], "client.local_steps": [3, 15]})
  with pytest.raises(config_lib.ConfigError, match="no stated-settings list"):
    cs.check_grid("nobody2020", {"client.lr": [0.1]})


def test_the_papers_stated_learning_rates_are_never_tuned():
  for paper in ("adpfl2022",):
    with pytest.raises(config_lib.ConfigError):
      cs.check_grid(paper, {"client.lr": [0.05, 0.2]})


def test_noise_is_refused():
  cfg = config_lib.load_config("quickstart")
  with pytest.raises(config_lib.ConfigError, match="without noise"):
    cs.check_non_private(cfg)
  cs.check_non_private(config_lib.override(cfg, ["privacy.epsilon=inf"]))
  cs.check_non_private(config_lib.override(cfg, ["privacy.placement=none"]))


def _rows(finals):
  rows = []
  for i, (lr, acc) in enumerate(finals):
    for rnd, a in ((1, 0.1), (2, acc)):
      rows.append({"point": f"{i:03d}-lr={lr}", "client.lr": lr, "round": rnd,
                   "test_loss": 1.0 - a, "test_accuracy": a})
  return pd.DataFrame(rows)


def test_table_marks_the_best_point_and_which_reach_the_paper():
  grid = {"client.lr": [0.1, 0.5, 1.0]}
  table = cs.calibration_table(_rows([(0.1, 0.85), (0.5, 0.95), (1.0, 0.92)]), grid, TARGET)
  assert list(table.columns[:7]) == ["paper", "figure", "metric", "direction", "paper_value",
                                     "ours", "setting"]
  assert table["setting"].tolist() == ["client.lr=0.1", "client.lr=0.5", "client.lr=1.0"]
  assert table["reaches"].tolist() == [False, True, True]
  assert table["chosen"].tolist() == [False, True, False]
  assert (table["direction"] == "higher").all() and (table["rounds"] == 2).all()
  loss = cs.Target("yuan2023", "Table II", "test_loss", 0.1)
  table = cs.calibration_table(_rows([(0.1, 0.85), (0.5, 0.95)]), {"client.lr": [0.1, 0.5]}, loss)
  assert table["direction"].iloc[0] == "lower" and table["chosen"].tolist() == [False, True]
  assert table["reaches"].tolist() == [False, True]  # losses 0.15 and 0.05
  assert not cs.Target("p", "f", "test_loss", 1.0).reached(math.nan)


def test_seeds_are_averaged_and_a_setting_that_fails_in_one_seed_is_not_chosen():
  # lr 1.0 is the best single run (0.97) but stays at chance in its other seed (the
  # bimodal edge of stability); lr 0.5 trains in both and is chosen by the mean.
  runs = [(0.5, 0, 0.90), (0.5, 1, 0.92), (1.0, 0, 0.97), (1.0, 1, 0.10)]
  rows = pd.concat([_rows([(lr, acc)]).assign(seed=seed, point=f"{i:03d}")
                    for i, (lr, seed, acc) in enumerate(runs)], ignore_index=True)
  table = cs.calibration_table(rows, {"client.lr": [0.5, 1.0]}, TARGET)
  assert table["setting"].tolist() == ["client.lr=0.5", "client.lr=1.0"]
  assert table["ours"].tolist() == pytest.approx([0.91, 0.535])
  assert table["ours_std"].tolist() == pytest.approx([0.0141421, 0.6151829], rel=1e-5)
  assert table["seeds"].tolist() == [2, 2] and table["chosen"].tolist() == [True, False]
  assert table["reaches"].tolist() == [True, False]
  assert list(table.columns[5:9]) == ["ours", "ours_std", "seeds", "setting"]


def test_folds_are_scored_by_their_median_so_one_outlier_fold_does_not_choose():
  # Three folds of set-aside examples, one seed each (test_loss = 1 - accuracy in
  # _rows). Fold 2 holds an outlier that
  # lr 0.5 extrapolates on (loss 90): its mean over folds (31.4) is worse than lr
  # 0.1's (9.7), its median (2.1) better; the median chooses it.
  loss = cs.Target("fu2023", "LR", "test_loss", 3.0)
  runs = [(0.1, 0, 9.5), (0.1, 1, 9.6), (0.1, 2, 10.0), (0.5, 0, 2.0), (0.5, 1, 2.1),
          (0.5, 2, 90.0)]
  rows = pd.concat([_rows([(lr, 1.0 - v)]).assign(**{"seed": 0, "data.holdout_fold": f},
                                            point=f"{i:03d}")
                    for i, (lr, f, v) in enumerate(runs)], ignore_index=True)
  table = cs.calibration_table(rows, {"client.lr": [0.1, 0.5]}, loss)
  assert table["ours"].tolist() == pytest.approx([9.6, 2.1])
  assert table["ours_fold_mean"].tolist() == pytest.approx([29.1 / 3, 94.1 / 3])
  assert table["folds"].tolist() == [3, 3] and table["chosen"].tolist() == [False, True]
  assert table["reaches"].tolist() == [False, True]


def test_a_reference_only_setting_is_shown_but_never_chosen():
  # No bound on the upload trains best, but no noise can be calibrated to it: the DP
  # figures run at the best bounded point.
  grid = {"client.clip_mode": ["update_l2", "none"]}
  rows = pd.concat([_rows([(0.5, acc)]).assign(**{"client.clip_mode": mode}, point=f"{i:03d}")
                    for i, (mode, acc) in enumerate([("update_l2", 0.66), ("none", 0.69)])],
                   ignore_index=True).drop(columns="client.lr")
  target = TARGET._replace(reference_only=("client.clip_mode=none",))
  table = cs.calibration_table(rows, grid, target)
  assert table["setting"].tolist() == ["client.clip_mode=update_l2", "client.clip_mode=none"]
  assert table["chosen"].tolist() == [True, False]
  assert cs.calibration_table(rows, grid, TARGET)["chosen"].tolist() == [False, True]


def test_merge_keeps_the_other_figures_rows(tmp_path):
  path = tmp_path / "baseline_calibration.csv"
  a = cs.calibration_table(_rows([(0.1, 0.85)]), {"client.lr": [0.1]}, TARGET)
  b = cs.calibration_table(_rows([(0.5, 0.95)]), {"client.lr": [0.5]},
                           TARGET._replace(figure="Fig. Y"))
  pd.concat([a, b]).to_csv(path, index=False)
  new = cs.calibration_table(_rows([(1.0, 0.99)]), {"client.lr": [1.0]}, TARGET)
  merged = cs.merge_table(path, new)
  assert merged["figure"].tolist() == ["Fig. Y", "Fig. X"]
  assert merged["ours"].tolist() == [0.95, 0.99]


def test_one_small_calibration_sweep(tmp_path):
  cfg = config_lib.override(config_lib.load_config("quickstart"),
                            ["privacy.epsilon=inf", "rounds=3", "progress=false", *_SMALL])
  grid = {"client.lr": [0.1, 0.5]}  # traced: one compiled program for both points
  target = cs.Target("wei2021", "smoke", "test_accuracy", 0.5)
  table, rows = cs.calibrate(cfg, grid, target)
  assert len(table) == 2 and table["chosen"].sum() == 1 and (table["rounds"] == 3).all()
  assert set(rows["point"]) == {"000-lr=0.1", "001-lr=0.5"}
  cs.write_calibration(tmp_path, table, rows, grid, target, png="cal")
  assert (tmp_path / "cal.png").is_file()
  assert pd.read_csv(tmp_path / "baseline_calibration.csv")["setting"].tolist() == [
      "client.lr=0.1", "client.lr=0.5"]


def test_a_calibration_over_seeds_sweeps_each_point_per_seed(tmp_path):
  cfg = config_lib.override(config_lib.load_config("quickstart"),
                            ["privacy.epsilon=inf", "rounds=2", "progress=false", *_SMALL])
  target = cs.Target("wei2021", "smoke", "test_accuracy", 0.5)
  table, rows = cs.calibrate(cfg, {"client.lr": [0.1, 0.5]}, target, seeds=2)
  assert rows["point"].nunique() == 4 and sorted(set(rows["seed"])) == [0, 1]
  fin = rows.dropna(subset=["test_accuracy"]).groupby("point").tail(1)
  for setting, lr in zip(table["setting"], (0.1, 0.5)):
    mine = fin[fin["client.lr"] == lr]["test_accuracy"]
    assert table.set_index("setting").loc[setting, "ours"] == pytest.approx(mine.mean())
  assert (table["seeds"] == 2).all()
  cs.write_calibration(tmp_path, table, rows, {"client.lr": [0.1, 0.5]}, target, png="cal")
  assert (tmp_path / "cal.png").is_file()
  with pytest.raises(config_lib.ConfigError, match="seeds"):
    cs.calibrate(cfg, {"client.lr": [0.1], "seed": [0, 1]}, target)


def test_the_plot_finds_each_curve_when_a_fixed_setting_is_appended_to_the_label(tmp_path):
  # Wei's calibrate.py appends the clip C it fixed by the median rule before the sweep
  # ("client.lr=0.5 client.clip=5.521"); the plot must still find the grid's curve.
  grid = {"client.lr": [0.1, 0.5]}
  rows = _rows([(0.1, 0.85), (0.5, 0.95)])
  table = cs.calibration_table(rows, grid, TARGET)
  table["setting"] = table["setting"] + " client.clip=5.521"
  cs.write_calibration(tmp_path, table, rows, grid, TARGET, png="cal")
  assert (tmp_path / "cal.png").is_file()
  assert pd.read_csv(tmp_path / "baseline_calibration.csv")["setting"].tolist() == [
      "client.lr=0.1 client.clip=5.521", "client.lr=0.5 client.clip=5.521"]


def test_a_calibration_on_the_unassigned_split_reports_the_chosen_test_value(tmp_path):
  from fedjax_dp import reproduction as repro
  cfg = config_lib.override(config_lib.load_config("quickstart"),
                            ["privacy.epsilon=inf", "rounds=2", "progress=false", *_SMALL,
                             "data.samples_per_client=60", "eval.split=unassigned"])
  target = cs.Target("wei2021", "smoke", "test_accuracy", 0.5)
  table, _ = cs.calibrate(cfg, {"client.lr": [0.1, 0.5]}, target, out_dir=tmp_path)
  chosen = table[table["chosen"]].iloc[0]
  assert table["test_value"].notna().sum() == 1 and 0 < chosen["test_value"] <= 1
  # the chosen setting run on the test split: its own number, not the held-out one
  again = config_lib.override(cfg, [*cs.parse_setting(chosen["setting"]), "eval.split=test"])
  fin = repro.final_rows(pd.DataFrame(repro.run_sweep(again, {"seed": [0]})))
  assert chosen["test_value"] == pytest.approx(float(fin["test_accuracy"].iloc[0]))
  assert chosen["test_value"] != pytest.approx(chosen["ours"])
  assert repro.decision("eps = inf calibration: the grid point of best final test_accuracy "
                        "on the training examples no client holds",
                        repro.READS_UNASSIGNED) in repro._DECISIONS


def test_a_held_out_federation_chooses_on_the_set_aside_examples_and_runs_the_full_one(
    tmp_path):
  from fedjax_dp import experiment
  from fedjax_dp import reproduction as repro
  full = config_lib.override(config_lib.load_config("quickstart"),
                             ["privacy.epsilon=inf", "rounds=2", "progress=false", *_SMALL,
                              "data.samples_per_client=60"])
  cal, back = cs.held_out_federation(full, 10)
  assert (cal.data.samples_per_client, cal.data.holdout, cal.eval.split) == (
      50, 10 * full.data.num_clients, "unassigned")
  assert back == ["data.samples_per_client=60", "data.holdout=0", "data.holdout_fold=0"]
  s = experiment.build(cal)
  assert s.x_test.shape[0] >= cal.data.holdout  # the set-aside examples are its split
  target = cs.Target("wei2021", "smoke", "test_accuracy", 0.5)
  table, _ = cs.calibrate(cal, {"client.lr": [0.1, 0.5]}, target, out_dir=tmp_path,
                          test_overrides=back)
  chosen = table[table["chosen"]].iloc[0]
  # the test value is the chosen setting on the paper's federation (60 per client)
  again = config_lib.override(full, cs.parse_setting(chosen["setting"]))
  fin = repro.final_rows(pd.DataFrame(repro.run_sweep(again, {"seed": [0]})))
  assert chosen["test_value"] == pytest.approx(float(fin["test_accuracy"].iloc[0]))
  with pytest.raises(config_lib.ConfigError, match="per_client"):
    cs.held_out_federation(full, 60)
  with pytest.raises(config_lib.ConfigError, match="folds=2 needs"):
    cs.calibrate(full, {"client.lr": [0.1]}, target, folds=2)  # nothing set aside
  with pytest.raises(config_lib.ConfigError, match="unbalanced"):
    cs.held_out_federation(config_lib.override(full, ["data.partition=unbalanced"]), 5)
