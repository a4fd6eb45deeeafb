"""Configs, overrides, bad input, and an end-to-end CLI smoke test."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedjax_dp import cli, experiment
from fedjax_dp import config as config_lib
from fedjax_dp.privacy import accounting, formulas

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
WEI = ROOT / "experiments" / "configs" / "wei_mnist_mlp.py"
MNIST_DIR = ROOT / ".." / "shared" / "datasets" / "mnist"


# The shapes of every small run here (and of the CLI run): runs of one program share its
# compilation. All clients at once: the default client_chunk=-1 compiles two probe
# rounds per new program (tests/test_chunking.py covers it).
SMALL = {"data.num_clients": "4", "data.samples_per_client": "30",
         "server.clients_per_round": "4", "server.client_chunk": "0"}


def _small(**sets):
  cfg = config_lib.load_config(QUICKSTART)
  base = {"rounds": "3", **SMALL, "progress": "false"}
  base.update(sets)
  return config_lib.override(cfg, [f"{k}={v}" for k, v in base.items()])


def test_shipped_configs_have_required_keys():
  for path in (QUICKSTART, WEI):
    cfg = config_lib.load_config(path)
    for key in ("seed", "rounds", "data.name", "data.dir", "privacy.epsilon"):
      config_lib.override(cfg, [f"{key}=1" if key != "data.name" else "data.name=digits"])
  wei = config_lib.load_config(WEI)
  assert (wei.data.num_clients, wei.server.clients_per_round, wei.data.samples_per_client,
          wei.model.name, wei.client.clip_mode, wei.client.local_steps, wei.client.batch_size,
          wei.rounds, wei.privacy.delta) == (50, 50, 800, "mlp_784_256_10", "per_example_l2",
                                             1, 0, 200, 1e-3)


def test_override_parses_types():
  cfg = config_lib.override(config_lib.base_config(), [
      "privacy.epsilon=inf", "rounds=7", "privacy.enforce_budget=true",
      "data.group_sizes=(1,2)", "data.dir=../x", "client.lr=1e-2"])
  assert math.isinf(cfg.privacy.epsilon) and cfg.rounds == 7
  assert cfg.privacy.enforce_budget is True and cfg.data.group_sizes == (1, 2)
  assert cfg.data.dir == "../x" and cfg.client.lr == 0.01


@pytest.mark.parametrize("assignment,match", [
    ("privacy.epsilonn=3", "did you mean privacy.epsilon"),
    ("rounds=abc", "rounds"),
    ("noequals", "key=value"),
])
def test_override_errors(assignment, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.override(config_lib.base_config(), [assignment])


@pytest.mark.parametrize("sets,match", [
    ({"privacy.epsilon": "0"}, "privacy.epsilon"),
    ({"privacy.epsilon": "-1"}, "privacy.epsilon"),
    ({"privacy.delta": "1"}, "privacy.delta"),
    ({"privacy.delta": "0"}, "privacy.delta"),
    ({"server.clients_per_round": "5"}, "clients_per_round"),
    ({"data.samples_per_client": "100000"}, "samples_per_client"),
    ({"data.name": "imagenet"}, "data.name"),
    ({"model.name": "resnet"}, "model.name"),
    ({"data.partition": "shards"}, "partition"),
    ({"client.clip_mode": "per_layer"}, "clip_mode"),
    ({"schedule.name": "cosine"}, "schedule.name"),
    ({"privacy.formula": "magic"}, "privacy.formula"),
    ({"server.conv_impl": "winograd"}, "server.conv_impl"),
    ({"data.name": "mnist", "data.dir": "/nonexistent_dir"}, "train-images"),
])
def test_bad_input_fails_before_compute_with_named_field(sets, match):
  with pytest.raises((ValueError, RuntimeError), match=match):
    cfg = _small(**sets)
    setup = experiment.build(cfg)
    experiment.run(cfg, None, setup)


def test_cli_run_writes_run_directory(tmp_path, capsys):
  out = tmp_path / "run"
  code = cli.main(["run", str(QUICKSTART), "--out", str(out), "--no-progress",
                   "--set", "rounds=4",
                   *[a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]])
  assert code == 0
  assert "final test accuracy" in capsys.readouterr().out
  for name in ("config.json", "metrics.csv", "summary.json", "metrics.png"):
    assert (out / name).exists(), name
  df = pd.read_csv(out / "metrics.csv")
  assert list(df["round"]) == [1, 2, 3, 4]
  for col in ("test_loss", "test_accuracy", "epsilon_claimed", "epsilon_certified"):
    assert df[col].notna().all()
  summary = json.loads((out / "summary.json").read_text())
  assert summary["rounds_run"] == 4 and summary["status"] == "completed"
  assert summary["wall_seconds"] > 0
  assert json.loads((out / "config.json").read_text())["rounds"] == 4
  # Only finished files are visible: no temporary leftovers (the manifest is hidden).
  assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".fedjax_dp.json"]


def test_cli_reports_bad_input(capsys):
  code = cli.main(["run", str(QUICKSTART), "--out", "/tmp/never", "--set", "privacy.delta=2"])
  assert code == 2
  assert "privacy.delta" in capsys.readouterr().err


def test_epsilon_inf_means_no_noise_and_infinite_certified_epsilon():
  res = experiment.run(_small(**{"privacy.epsilon": "inf"}))
  assert all(math.isinf(r["epsilon_certified"]) for r in res.rows)
  assert all(r["noise_mean"] == 0 for r in res.rows)


def test_divergence_is_detected_and_reported(tmp_path):
  cfg = _small(**{"client.lr": "1e30", "client.clip_mode": "none",
                  "privacy.placement": "none", "rounds": "20"})
  res = experiment.run(cfg, str(tmp_path))
  assert res.summary["diverged"] and res.summary["status"] == "diverged"
  assert res.summary["diverged_round"] == len(res.rows) < 20


def test_enforce_budget_stops_before_passing_target():
  cfg = _small(**{"privacy.formula": "noise_multiplier", "privacy.noise_multiplier": "2.0",
                  "privacy.epsilon": "3.0", "privacy.enforce_budget": "true",
                  "rounds": "100"})
  res = experiment.run(cfg)
  assert res.summary["status"] == "budget_exhausted"
  assert 0 < len(res.rows) < 100
  assert max(r["epsilon_certified"] for r in res.rows) <= 3.0


def test_wei_eq10_run_records_claimed_and_certified():
  T = 50
  res = experiment.run(_small(**{"privacy.epsilon": "4", "rounds": str(T),
                                 "privacy.formula": "wei_eq10"}))
  claimed = [r["epsilon_claimed"] for r in res.rows]
  certified = [r["epsilon_certified"] for r in res.rows]
  # Eq. (10) spends its budget as sqrt(t / T): the claim reaches 4 exactly at T.
  np.testing.assert_allclose(claimed[-1], 4.0, rtol=1e-6)
  np.testing.assert_allclose(claimed[0], 4.0 * math.sqrt(1 / T), rtol=1e-6)
  assert all(np.diff(certified) > 0)
  # The certified value is the RDP accountant on the run's own events: replace-one,
  # all clients every round (q = 1), z = sigma / Delta_l from eq. (10).
  z = formulas.wei_sigma_eq10(4.0, 1e-3, 1.0, T, 1.0)
  event = accounting.Event(noise_multiplier=z, sampling="full", relation="replace_one",
                           count=T)
  np.testing.assert_allclose(certified[-1], accounting.epsilon([event], 1e-3), rtol=1e-9)


@pytest.mark.skipif(not MNIST_DIR.exists(), reason="shared MNIST not present")
def test_wei_config_builds_on_real_mnist():
  cfg = config_lib.override(config_lib.load_config(WEI), [
      f"data.dir={MNIST_DIR}", "rounds=2", "progress=false"])
  # The shipped federation (50 clients of 800 real images) builds; it trains as 10 of
  # them (the same config, one program for all ten): 2 rounds, above chance.
  assert experiment.build(cfg).data.x.shape == (50, 800, 28, 28, 1)
  cfg = config_lib.override(cfg, ["data.num_clients=10", "server.clients_per_round=10",
                                  "server.client_chunk=0"])
  res = experiment.run(cfg)
  assert res.summary["rounds_run"] == 2
  assert res.rows[-1]["test_accuracy"] > 0.15  # above chance after two rounds


def test_central_placement_adds_server_noise_and_is_accounted():
  res = experiment.run(_small(**{
      "privacy.placement": "central", "client.clip_mode": "update_l2",
      "privacy.formula": "calibrated", "privacy.epsilon": "5", "rounds": "4"}))
  assert math.isfinite(res.summary["epsilon_certified"])
  np.testing.assert_allclose(res.summary["epsilon_certified"], 5.0, rtol=2e-3)
  assert res.summary["epsilon_certified"] <= 5.0 + 1e-9
  assert res.summary["privacy"]["accounting"]["level"] == "client"
