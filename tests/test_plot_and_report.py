"""``fedjax-dp plot``, ``list``, ``--version``, ``account --help``, the unit of privacy
and the warning when a paper formula's certified epsilon exceeds the requested one."""

import json
import math
import shutil
from types import SimpleNamespace

import pandas as pd
import pytest
from _helpers import QUICKSTART, ROOT
from matplotlib.backends.backend_agg import FigureCanvasAgg
from test_datasets_papers import write_loans

from fedjax_dp import catalog, cli, plotting
from fedjax_dp.privacy import plan, reporting, selection
from fedjax_dp.training import client

FU_LR = ROOT / "experiments" / "configs" / "fu_lr_laplace.py"
TINY = [a for k, v in {"data.num_clients": 4, "server.clients_per_round": 4,
                       "data.samples_per_client": 20, "model.name": "logistic",
                       "server.client_chunk": 0}.items() for a in ("--set", f"{k}={v}")]


def _fu_sets(data_dir):
  """fu_lr_laplace (Laplace, fu_thm1) on 100 synthetic loans, 4 clients, 4 rounds."""
  write_loans(data_dir, n=100)
  return [a for k, v in {"data.dir": data_dir, "data.num_clients": 4, "data.samples_per_client": 20,
                         "server.clients_per_round": 4, "rounds": 4,
                         "server.client_chunk": 0}.items()
          for a in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def seed_sweep(tmp_path_factory):
  """A quickstart sweep with seed as a grid axis: 2 epsilons x 2 seeds, 2 rounds."""
  out = tmp_path_factory.mktemp("sweep") / "sw"
  assert cli.main(["sweep", str(QUICKSTART), "--out", str(out), "--no-progress", *TINY,
                   "--set", "rounds=2", "--grid", "privacy.epsilon=2,8",
                   "--grid", "seed=0,1"]) == 0
  return out


def test_plot_of_a_sweep_with_seed_axis_draws_mean_and_band(seed_sweep, tmp_path, capsys):
  png = tmp_path / "sweep.png"
  assert cli.main(["plot", str(seed_sweep), "--out", str(png)]) == 0
  out = capsys.readouterr().out
  assert "2 lines (2 of them means over seeds, with a min-max band)" in out
  assert "panels: test loss, test accuracy, epsilon" in out
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

  cs = plotting.curves(plotting.load([seed_sweep]))
  assert [c.label for c in cs] == ["epsilon=2 (mean of 2 seeds)", "epsilon=8 (mean of 2 seeds)"]
  assert [c.seeds for c in cs] == [2, 2]
  fig = plotting.render(cs)
  loss, _, eps = fig.axes
  assert len(loss.lines) == 2 and len(loss.collections) == 2  # a mean and a band per curve
  band = cs[0].series["test_accuracy"]
  assert (band.lo <= band.mean).all() and (band.mean <= band.hi).all()
  assert [line.get_linestyle() for line in eps.lines] == ["-", "--", "-", "--"]
  assert "privacy unit: example-level, replace-one" in fig._suptitle.get_text()
  assert "certified epsilon 2 to 8" in fig._suptitle.get_text()


def test_sweep_csv_has_seed_wall_s_and_unit_and_the_cli_prints_the_unit(seed_sweep, tmp_path,
                                                                           capsys):
  df = pd.read_csv(seed_sweep / "sweep.csv")
  for col in ("seed", "wall_s", "privacy_unit"):
    assert col in df.columns, col
  assert (df["privacy_unit"] == "example-level, replace-one").all()
  assert df["wall_s"].notna().all()
  # seed is a column even when it is no grid axis.
  out = tmp_path / "noseed"
  assert cli.main(["sweep", str(QUICKSTART), "--out", str(out), "--no-progress", *TINY,
                   "--set", "rounds=1", "--set", "seed=7", "--grid", "privacy.epsilon=4"]) == 0
  assert "privacy unit example-level, replace-one" in capsys.readouterr().out
  df = pd.read_csv(out / "sweep.csv")
  assert list(df.columns[:3]) == ["point", "privacy.epsilon", "seed"]
  assert (df["seed"] == 7).all() and "wall_s" in df.columns
  meta = pd.read_csv(out / "points" / "000-epsilon=4.0" / "metrics.csv")
  assert (meta["privacy_unit"] == "example-level, replace-one").all()


def test_regression_run_warns_of_overspending_and_plots(tmp_path, capsys):
  """fu_lr_laplace certifies about twice its requested epsilon: one warning line in the
  CLI output and in summary.json; the unit is on the CLI line and in metrics.csv; the
  regression run plots a test MSE panel and an epsilon panel."""
  run = tmp_path / "fu"
  assert cli.main(["run", str(FU_LR), "--out", str(run), "--no-progress",
                   *_fu_sets(tmp_path)]) == 0
  captured = capsys.readouterr()
  assert "privacy unit client-level, replace-one" in captured.out
  warnings = [line for line in captured.err.splitlines() if line.startswith("WARNING")]
  assert len(warnings) == 1 and "exceeds the requested 5.000" in warnings[0]
  summary = json.loads((run / "summary.json").read_text())
  assert summary["epsilon_certified"] > 5.0 * 1.5
  assert summary["epsilon_warning"] == warnings[0]
  assert summary["privacy_unit"] == "client-level, replace-one"
  assert (pd.read_csv(run / "metrics.csv")["privacy_unit"] == "client-level, replace-one").all()

  png = tmp_path / "fu.png"
  assert cli.main(["plot", str(run), "--out", str(png)]) == 0
  assert "1 line; panels: test MSE, epsilon" in capsys.readouterr().out
  fig = plotting.render(plotting.curves(plotting.load([run])), "t")
  assert [ax.get_ylabel() for ax in fig.axes] == ["test MSE", "epsilon"]
  assert "certified exceeds the requested epsilon in 1 of 1 runs" in fig._suptitle.get_text()


def test_sweep_prints_a_warning_per_overspending_point(tmp_path, capsys):
  out = tmp_path / "sw"
  assert cli.main(["sweep", str(FU_LR), "--out", str(out), "--no-progress",
                   *_fu_sets(tmp_path), "--grid", "privacy.epsilon=5,10"]) == 0
  err = capsys.readouterr().err.splitlines()
  warned = [line for line in err if "WARNING: certified epsilon" in line]
  assert len(warned) == 2
  assert warned[0].startswith("000-epsilon=5.0: WARNING") and "requested 5.000" in warned[0]
  assert warned[1].startswith("001-epsilon=10.0: WARNING") and "requested 10.000" in warned[1]


def test_no_warning_when_certified_is_within_the_request(seed_sweep):
  for point in (seed_sweep / "points").iterdir():
    assert json.loads((point / "summary.json").read_text())["epsilon_warning"] is None


def test_header_only_metrics_csv_is_one_line_error(tmp_path, capsys):
  run = tmp_path / "empty"
  run.mkdir()
  (run / "metrics.csv").write_text("round,test_loss,test_accuracy\n")
  assert cli.main(["plot", str(run), "--out", str(tmp_path / "x.png")]) != 0
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "has a header but no rows" in err[0]
  assert not (tmp_path / "x.png").exists()
  assert cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) != 0
  assert "neither a run directory" in capsys.readouterr().err


def _rows(shift, rounds=5, accuracy=True):
  return [{"round": t, "test_loss": 1.0 / t + shift, "epsilon_certified": 0.5 * t,
           "epsilon_claimed": 0.4 * t, "test_accuracy": 0.1 * t if accuracy else "",
           "privacy_unit": "example-level, add/remove"} for t in range(1, rounds + 1)]


def test_more_than_ten_lines_have_distinct_styles_and_the_legend_is_outside():
  members = [plotting.Member({"client.lr": 0.1 * i}, _rows(0.01 * i), f"m{i}")
             for i in range(13)]
  fig = plotting.render(plotting.curves(members), "thirteen")
  loss = fig.axes[0]
  looks = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in loss.lines}
  assert len(loss.lines) == 13 and len(looks) == 13
  eps = fig.axes[-1]
  certified = {(line.get_color(), line.get_marker()) for line in eps.lines[::2]}
  assert len(certified) == 13  # distinct with the epsilon panel's line styles fixed
  assert len({tuple(plotting.style(i).values()) for i in range(320)}) == 320
  assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
  renderer = FigureCanvasAgg(fig).get_renderer()
  legend_box = fig.legends[0].get_window_extent(renderer)
  assert legend_box.x0 >= max(ax.get_window_extent(renderer).x1 for ax in fig.axes)


def test_lines_of_different_units_say_which():
  client_rows = [dict(r, privacy_unit="client-level, replace-one") for r in _rows(0)]
  cs = plotting.curves([plotting.Member({"privacy.placement": "upload"}, _rows(0), "a"),
                        plotting.Member({"privacy.placement": "central"}, client_rows, "b")])
  assert [c.label for c in cs] == ["placement=upload [example-level, add/remove]",
                                   "placement=central [client-level, replace-one]"]


def test_title_shows_the_certified_epsilon_not_the_target():
  rows = [dict(r, epsilon_certified=1.43e7 * r["round"] / 5, epsilon_claimed=2.0 * r["round"])
          for r in _rows(0)]
  fig = plotting.render(plotting.curves([plotting.Member({}, rows, "yuan")]))
  title = fig._suptitle.get_text()
  assert "certified epsilon 1.43e+07 (claimed 10)" in title
  assert "privacy unit: example-level, add/remove" in title
  assert fig.axes[-1].get_yscale() == "log"


def test_list_names_everything_a_config_can_name(capsys):
  assert cli.main(["list"]) == 0
  out = capsys.readouterr().out
  assert "digits: embedded" in out
  assert "mlp_784_256_10: 203,530 parameters on 28x28x1, 10 classes" in out
  assert "linear_regression: 11 parameters" in out
  assert "crd: CRD" in out and "schedule.beta=0.9" in out
  # Every registered object's own summary is listed (none is written in catalog.py).
  for registry in (plan.FORMULAS, selection.RULES, client.CLIP_MODES):
    for name, obj in registry.items():
      assert obj.summary and f"\n  {name}: {obj.summary}" in out, name
  assert set(catalog.formula_notes()) == set(plan.FORMULAS)
  assert catalog.dataset_source("femnist").startswith("needs data.dir=")


def test_version(capsys):
  from importlib import metadata
  with pytest.raises(SystemExit) as e:
    cli.main(["--version"])
  assert e.value.code == 0
  assert capsys.readouterr().out.strip() == f"fedjax-dp {metadata.version('fedjax_dp')}"


def test_account_help_has_no_raw_markup(capsys):
  with pytest.raises(SystemExit):
    cli.main(["account", "--help"])
  out = capsys.readouterr().out
  assert "Examples:\n" in out and "fedjax-dp account --mechanism gaussian" in out
  assert "``" not in out and "::" not in out


def test_budget_warning_only_for_a_requested_epsilon():
  def fake(formula, over, noiseless=False):
    return SimpleNamespace(formula=formula, noiseless=noiseless, over_budget=lambda _: over,
                           target_epsilon=8.0, delta=1e-3)

  assert "certified epsilon 9.257 exceeds the requested 8.000" in reporting.budget_warning(
      fake("wei_eq10", True), None, 9.257)
  assert reporting.budget_warning(fake("calibrated", False), None, 8.0) is None
  # privacy.formula=noise_multiplier fixes the noise: privacy.epsilon is no request.
  assert reporting.budget_warning(fake("noise_multiplier", True), None, 50.0) is None


def test_unit_text():
  assert reporting.unit_text("client", "add_remove") == "client-level, add/remove"
  assert math.isnan(plotting._final({}, "epsilon_certified"))


def _run_dir(path, seed: int, lr: float = 0.1, loss0: float = 2.0):
  """A run directory as ``fedjax-dp run`` leaves it (config.json, metrics.csv)."""
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps(
      {"name": "quickstart", "seed": seed, "client": {"lr": lr},
       "model": {"name": "logistic"}, "data": {"name": "digits"}}))
  pd.DataFrame(_rows(loss0 * 0.01)).to_csv(path / "metrics.csv", index=False)


def test_two_copies_of_one_run_keep_their_own_lines_labelled_by_path(tmp_path):
  """Issue 50: runs/quickstart and elsewhere/runs/quickstart (both seed 0) are not two
  seeds: two lines, told apart by their paths."""
  a, b = tmp_path / "runs/quickstart", tmp_path / "elsewhere/runs/quickstart"
  _run_dir(a, seed=0)
  _run_dir(b, seed=0, loss0=3.0)
  cs = plotting.curves(plotting.load([a, b]))
  assert [(c.label, c.seeds) for c in cs] == [(f"run={a}", 1), (f"run={b}", 1)]
  # Names that do not collide label by name; replicates of one config still average.
  c, s1 = tmp_path / "copy", tmp_path / "seed1"
  shutil.copytree(a, c)
  _run_dir(s1, seed=1)
  cs = plotting.curves(plotting.load([a, c, s1]))
  assert [(c.label, c.seeds) for c in cs] == [
      ("seed=0, run=quickstart", 1), ("seed=0, run=copy", 1), ("seed=1", 1)]
  cs = plotting.curves(plotting.load([a, s1]))
  assert [(c.label, c.seeds) for c in cs] == [("quickstart (mean of 2 seeds)", 2)]


def test_two_sweeps_of_one_name_are_told_apart(seed_sweep, tmp_path):
  other = tmp_path / "elsewhere" / seed_sweep.name
  shutil.copytree(seed_sweep, other)
  cs = plotting.curves(plotting.load([seed_sweep, other]))
  assert len(cs) == 4 and all(c.seeds == 2 for c in cs)
  assert cs[0].label == f"sweep={seed_sweep}, epsilon=2 (mean of 2 seeds)"
