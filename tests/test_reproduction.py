"""Committed results can be regenerated (fedjax_dp.reproduction): each paper's
cheapest figure, run twice in its smoke version, writes identical CSVs, and every
committed meta.json names the commit of the code that made it."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedjax_dp import plotting
from fedjax_dp import reproduction as repro

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
MNIST = ROOT.parent / "shared" / "datasets" / "mnist"
_STAND_IN_PNG = b"\x89PNG\r\n\x1a\n (a run directory's plot, not drawn in this test)"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  """One persistent cache directory for the module's figures (the programs they share,
  e.g. a model's initialisation, are compiled once)."""
  return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture
def compile_cache(cache_dir):
  """A persistent compilation cache for the test: the second run of a figure loads
  the first's programs from disk (each run builds its jitted functions anew, so the
  in-memory cache does not carry over). Restored afterwards."""
  import jax
  try:
    from jax._src import compilation_cache
  except ImportError:  # another jax layout: no cache, the test is only slower
    yield
    return
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  old = {k: getattr(jax.config, k) for k in keys}
  new = (cache_dir, 0, -1)
  for k, v in zip(keys, new):
    jax.config.update(k, v)
  compilation_cache.reset_cache()
  yield
  for k, v in old.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()


def _smoke_result(script: str) -> Path:
  """The committed result whose recorded command runs ``script``."""
  paper = Path(script).parts[1]
  for meta in sorted((EXPERIMENTS / paper / "results").glob("*_meta.json")):
    if json.loads(meta.read_text()).get("command", "").split()[1:2] == [script]:
      return meta
  raise AssertionError(f"no committed result of {script}")


@pytest.mark.skipif(not MNIST.is_dir(), reason="needs ../shared/datasets/mnist")
@pytest.mark.parametrize("script", sorted(repro.SMOKE_FLAGS))
def test_smoke_figure_regenerates_identically(script, tmp_path, compile_cache, monkeypatch):
  # Each point of a figure's sweep writes a run directory whose metrics.png takes half a
  # second of matplotlib (up to 8 points, twice); those plots are not what is compared
  # (tests/test_cli_and_config.py and test_plot_and_report.py check them): here they
  # are written with a stand-in image. The figure's own PNG is drawn as usual.
  monkeypatch.setattr(plotting, "plot_rows", lambda rows, title="", name="": _STAND_IN_PNG)
  result = _smoke_result(script)
  a = repro.regenerate(result, tmp_path / "a", smoke=True, in_process=True)
  repro.regenerate(result, tmp_path / "b", smoke=True, in_process=True)
  names = sorted({*a["csv"]})
  assert names, f"{script} wrote no CSV"
  again = pd.DataFrame(repro.compare_results(tmp_path / "a" / "results",
                                             tmp_path / "b" / "results", names))
  assert (again["max_abs_diff"] == 0).all(), again[again["max_abs_diff"] != 0]
  for csv in names:  # every column, text included
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "results" / csv),
                                  pd.read_csv(tmp_path / "b" / "results" / csv))
  meta = json.loads(next((tmp_path / "a" / "results").glob("*_meta.json")).read_text())
  assert meta["command"].startswith(f"python {script} ")
  assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", meta["commit"])
  assert set(meta["versions"]) == set(repro.PACKAGES) and meta["configs"] > 0
  assert re.fullmatch(r"[0-9a-f]{64}", meta["configs_sha256"])


def test_every_committed_meta_names_a_commit():
  metas = sorted(p.relative_to(ROOT).as_posix() for p in EXPERIMENTS.glob("*/results/**/*_meta.json"))
  missing = [m for m in metas if not re.fullmatch(
      r"[0-9a-f]{40}", str(json.loads((ROOT / m).read_text()).get("commit", "")))]
  assert missing == [], "meta.json without a clean commit"


def test_regenerate_refuses_a_non_empty_out_and_unknown_results(tmp_path):
  (tmp_path / "mine.txt").write_text("keep")
  with pytest.raises(repro.RegenerateError, match="not empty"):
    repro.regenerate(EXPERIMENTS / "adpfl2022" / "results" / "fig4_ablation", tmp_path)
  assert (tmp_path / "mine.txt").read_text() == "keep"
  with pytest.raises(repro.RegenerateError, match="no nothing_meta.json"):
    repro.regenerate(EXPERIMENTS / "adpfl2022" / "results" / "nothing", tmp_path / "new")
  with pytest.raises(repro.RegenerateError, match="no smoke flags"):
    repro.recorded_command({"command": "python experiments/x.py --a 1"}, smoke=True)
  assert repro.recorded_command({"command": "python experiments/x.py --a 'b c'"})[1:] == [
      "experiments/x.py", "--a", "b c"]


def test_max_abs_diff_treats_equal_infinities_and_nans_as_equal():
  new = pd.DataFrame({"m": ["x", "y"], "v": [1.0, float("inf")], "w": [float("nan"), 2.0]})
  old = pd.DataFrame({"m": ["x", "z"], "v": [1.5, float("inf")], "w": [float("nan"), None]})
  assert repro.max_abs_diff(new, old) == {"v": 0.5, "w": float("inf")}


def test_commit_is_dirty_for_code_changes_not_for_results(tmp_path):
  import subprocess

  def git(*args):
    subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
  for rel in ("fedjax_dp/a.py", "experiments/p/run.py", "experiments/p/results/r.csv"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("x\n")
  git("init", "-q")
  git("add", "-A")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
  head = repro.git_commit(tmp_path)
  assert re.fullmatch(r"[0-9a-f]{40}", head)
  (tmp_path / "experiments/p/results/r.csv").write_text("y\n")  # what a run writes
  (tmp_path / "experiments/p/results/new.csv").write_text("y\n")
  assert repro.git_commit(tmp_path) == head
  (tmp_path / "experiments/p/run.py").write_text("changed\n")
  assert repro.git_commit(tmp_path) == head + "-dirty"
  assert repro.git_commit(tmp_path / "nowhere") == "unknown"


def test_command_is_recorded_relative_to_the_repository():
  argv = [str(ROOT / "experiments" / "fu2023" / "fig1_lr_epsilon.py"), "--note", "a b"]
  assert repro.command_line(argv) == "python experiments/fu2023/fig1_lr_epsilon.py --note 'a b'"


def test_every_experiment_reads_the_results_and_runs_folders_regenerate_sets():
  """regenerate points <PAPER>_RESULTS / <PAPER>_RUNS under its new folder; a script
  that reads other names would overwrite the committed results and read cached runs."""
  for script in sorted(EXPERIMENTS.glob("*/*.py")):
    names = set(re.findall(r'environ\.get\("([A-Z0-9_]+_(?:RESULTS|RUNS))"', script.read_text()))
    paper = script.parent.name.upper()
    assert names <= {f"{paper}_RESULTS", f"{paper}_RUNS"}, (script, names)


def test_regenerate_refuses_a_command_that_writes_nothing_under_out(tmp_path, monkeypatch):
  monkeypatch.setattr(repro, "_run_in_process", lambda argv, env: None)
  with pytest.raises(repro.RegenerateError, match="wrote no CSV"):
    repro.regenerate(EXPERIMENTS / "fu2023" / "results" / "fig1_lr_epsilon", tmp_path / "new",
                     in_process=True)


def test_max_abs_diff_leaves_out_wall_clock_columns():
  new = pd.DataFrame({"v": [1.0], "wall_s": [3.0], "sweep_seconds": [9.0]})
  old = pd.DataFrame({"v": [1.0], "wall_s": [2.0], "sweep_seconds": [1.0]})
  assert repro.max_abs_diff(new, old) == {"v": 0.0}


def test_accounted_epsilon_is_the_run_loop_s_without_training():
  """The host-only loop gives a real run's last claimed and certified epsilon, and
  refuses a schedule whose noise reads the metrics."""
  from fedjax_dp import config as config_lib
  from fedjax_dp import experiment
  cfg = config_lib.override(config_lib.load_config("quickstart"), [
      "rounds=3", "data.num_clients=4", "data.samples_per_client=20",
      "server.clients_per_round=2", "privacy.formula=wei_eq10", "progress=false",
      "server.client_chunk=0"])
  last = experiment.run(cfg).rows[-1]
  got = repro.accounted_epsilon(cfg)
  assert got["rounds"] == 3
  np.testing.assert_allclose([got["epsilon_claimed"], got["epsilon_certified"]],
                             [last["epsilon_claimed"], last["epsilon_certified"]], rtol=1e-12)
  cfg.schedule.name = "crd"
  with pytest.raises(ValueError, match="reads the round's metrics"):
    repro.accounted_epsilon(cfg)


def test_cpu_difference_names_an_unknown_or_other_cpu():
  here = {"cpu_model": "AMD EPYC", "cpu_flags": ["avx2"]}
  assert repro.cpu_difference({"cpu_model": "AMD EPYC", "cpu_flags": ["avx2"]}, here) is None
  assert "unknown" in repro.cpu_difference({"cpu_model": repro.CPU_UNKNOWN}, here)
  assert "another CPU" in repro.cpu_difference(
      {"cpu_model": "Intel Xeon", "cpu_flags": ["avx512f"]}, here)
  info = repro.cpu_info("processor\t: 0\nmodel name\t: Test CPU\nflags\t: fpu avx2 avx512f\n")
  assert info == {"cpu_model": "Test CPU", "cpu_flags": ["avx2", "avx512f"]}
