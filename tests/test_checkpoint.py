"""Checkpoints and exact resume: SIGKILL / SIGINT at random rounds, then re-running
the same command, gives the uninterrupted run's files (wall-clock fields excepted)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flax import serialization

from fedjax_dp import cli, experiment, sweep
from fedjax_dp import config as config_lib
from fedjax_dp.host import checkpoint
from fedjax_dp.privacy.plan import AccountantState
from fedjax_dp.privacy.schedules import NoiseContext, get_schedule

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
# The only fields allowed to differ between a resumed and an uninterrupted run.
WALL_COLUMNS = ("wall_s",)
WALL_SUMMARY_FIELDS = ("wall_seconds", "seconds_per_round")
# All clients at once (server.client_chunk=0): the default (-1) compiles two probe
# rounds in every process, which these tiny rounds do not need (tests/test_chunking.py
# covers -1).
SMALL = ["--set", "data.num_clients=6", "--set", "data.samples_per_client=40",
         "--set", "server.clients_per_round=4", "--set", "server.client_chunk=0",
         "--no-progress"]

# Runs ``python -m fedjax_dp.cli`` in a fresh process that SIGKILLs itself right after
# recording round KILL_AT: a kill at an exactly chosen round, at any point of the
# checkpoint cycle.
_KILLER = """
import os, runpy, signal, sys
from fedjax_dp import experiment
kill_at = int(sys.argv.pop(1))
record = experiment.RunLoop.record
def killing_record(self, *args, **kwargs):
  record(self, *args, **kwargs)
  if self.t == kill_at:
    os.kill(os.getpid(), signal.SIGKILL)
experiment.RunLoop.record = killing_record
runpy.run_module("fedjax_dp.cli", run_name="__main__", alter_sys=True)
"""


def _same_run(a: Path, b: Path) -> None:
  """metrics.csv (minus wall_s), summary.json (minus wall times) and the final model
  of two run directories are identical."""
  ma = pd.read_csv(a / "metrics.csv").drop(columns=list(WALL_COLUMNS))
  mb = pd.read_csv(b / "metrics.csv").drop(columns=list(WALL_COLUMNS))
  pd.testing.assert_frame_equal(ma, mb, check_exact=True)
  sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
  for field in WALL_SUMMARY_FIELDS:
    sa.pop(field), sb.pop(field)
  assert sa == sb
  assert (a / "model.msgpack").read_bytes() == (b / "model.msgpack").read_bytes()


def _env():
  # The checkout first on the path. The suite's persistent compilation cache
  # (tests/conftest.py) is inherited: the subprocess loads the programs the test's
  # process compiled (the same program, so the same bits) where they were kept.
  return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _rows_on_disk_after_crash(run: Path, crashed_at: int, every: int) -> dict:
  """A run that died in round ``crashed_at``: no summary, and on disk the rows of the
  last checkpoint before it; the checkpoint holds FedAdam's state beside the model."""
  assert not (run / "summary.json").exists()
  assert len(pd.read_csv(run / "metrics.csv")) == (crashed_at - 1) // every * every
  saved = checkpoint.verified_payload(run / checkpoint.FILENAME)
  params = serialization.msgpack_restore(saved)["params"]
  assert set(params) == {"model", "opt"}  # the bare model and FedAdam's state
  return params


def test_sigkill_at_random_rounds_then_resume_equals_uninterrupted(tmp_path, monkeypatch):
  """A process SIGKILLed at a random round, resumed, dying again at a later random
  round, then resumed to the end gives the uninterrupted run bit for bit. FedAdam's
  moments are carried on the device beside the model: the checkpoint holds them
  (model.msgpack the model only) and the resumed runs continue them."""
  rounds, every = 12, 3
  args = ["run", str(QUICKSTART), *SMALL, "--set", f"rounds={rounds}",
          "--set", f"checkpoint.every={every}", "--set", "server.optimizer=fedadam",
          "--set", "server.lr=0.05", "--set", "client.optimizer=momentum",
          "--set", "client.local_steps=2"]
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  assert cli.main([*args, "--out", str(full)]) == 0
  # Two deaths at random rounds (fixed draw: 8 and 10): one mid-cycle, one later, in
  # the run resumed from the first one's checkpoint.
  kill_at, crash_at = sorted(
      np.random.default_rng(7).choice(np.arange(2, rounds), 2, replace=False))
  script = tmp_path / "killer.py"
  script.write_text(_KILLER)
  proc = subprocess.run(
      [sys.executable, str(script), str(kill_at), *args, "--out", str(resumed)],
      env=_env(), capture_output=True, cwd=ROOT, check=False)
  assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
  _rows_on_disk_after_crash(resumed, kill_at, every)

  # The second death in this process (the compiled programs are reused): an exception
  # in the round, which leaves the files as a kill does.
  class Killed(Exception):
    pass

  record = experiment.RunLoop.record

  def dying_record(self, *a, **k):
    record(self, *a, **k)
    if self.t == crash_at:
      raise Killed

  monkeypatch.setattr(experiment.RunLoop, "record", dying_record)
  with pytest.raises(Killed):
    cli.main([*args, "--out", str(resumed)])
  monkeypatch.setattr(experiment.RunLoop, "record", record)
  params = _rows_on_disk_after_crash(resumed, crash_at, every)
  assert cli.main([*args, "--out", str(resumed)]) == 0
  _same_run(full, resumed)
  model = serialization.msgpack_restore((full / "model.msgpack").read_bytes())
  assert set(model) == set(params["model"])


def test_sigint_marks_interrupted_and_resume_equals_uninterrupted(tmp_path, monkeypatch,
                                                                    capsys):
  # CRD carries schedule state (budget spent, horizon, last loss) across rounds.
  args = ["run", str(QUICKSTART), *SMALL, "--set", "rounds=15", "--set", "checkpoint.every=4",
          "--set", "schedule.name=crd", "--set", "schedule.zeta=0.05"]
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  assert cli.main([*args, "--out", str(full)]) == 0
  record = experiment.RunLoop.record

  def interrupting_record(self, *a, **k):
    record(self, *a, **k)
    if self.t == 6:
      os.kill(os.getpid(), signal.SIGINT)  # deferred to the end of the round

  monkeypatch.setattr(experiment.RunLoop, "record", interrupting_record)
  capsys.readouterr()
  before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
  try:
    assert cli.main([*args, "--out", str(resumed)]) == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
  finally:
    signal.signal(signal.SIGINT, before)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "interrupted" in err[0] and str(resumed) in err[0]
  summary = json.loads((resumed / "summary.json").read_text())
  assert summary["status"] == "interrupted" and summary["rounds_run"] == 6
  monkeypatch.setattr(experiment.RunLoop, "record", record)
  assert cli.main([*args, "--out", str(resumed)]) == 0
  _same_run(full, resumed)
  assert json.loads((full / "summary.json").read_text())["rounds_run"] > 0


def test_sweep_points_resume_from_their_checkpoints(tmp_path, monkeypatch):
  cfg = config_lib.override(config_lib.load_config(QUICKSTART), [
      "rounds=7", "data.num_clients=6", "data.samples_per_client=40",
      "server.clients_per_round=4", "server.client_chunk=0", "checkpoint.every=3",
      "progress=false"])
  grid = {"privacy.epsilon": [2.0, 8.0]}
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  sweep.run_sweep(cfg, grid, str(full))

  class Killed(Exception):
    pass

  record = experiment.RunLoop.record

  def dying_record(self, *a, **k):
    record(self, *a, **k)
    if self.t == 5:
      raise Killed  # the process dies mid-sweep: no summaries, checkpoints at round 3

  monkeypatch.setattr(experiment.RunLoop, "record", dying_record)
  with pytest.raises(Killed):
    sweep.run_sweep(cfg, grid, str(resumed))
  monkeypatch.setattr(experiment.RunLoop, "record", record)
  points = sorted((resumed / "points").iterdir())
  assert [len(pd.read_csv(p / "metrics.csv")) for p in points] == [3, 3]
  started = []
  load = checkpoint.load

  def spying_load(*a, **k):
    out = load(*a, **k)
    started.append(out[0].t)
    return out

  monkeypatch.setattr(checkpoint, "load", spying_load)
  sweep.run_sweep(cfg, grid, str(resumed))
  assert started == [3, 3]  # both points continued from round 3
  pd.testing.assert_frame_equal(pd.read_csv(full / "sweep.csv").drop(columns=list(WALL_COLUMNS)),
                                pd.read_csv(resumed / "sweep.csv").drop(
                                    columns=list(WALL_COLUMNS)), check_exact=True)
  for p in points:
    _same_run(full / "points" / p.name, p)


def _states():
  ctx = NoiseContext(np.full(3, 4.0), 1e-3, 1.0, np.full(3, 0.01), 20,
                     lambda t: np.full(3, 0.5), 0.1, params={"beta": 0.9, "zeta": 0.01})
  sched = get_schedule("crd").init(ctx)
  from fedjax_dp.privacy import accounting
  acct = AccountantState(accounting.rdp_init((3,)), np.arange(3.0), 5, np.zeros(3))
  return sched, acct


def test_checkpoint_round_trip_and_corruption_is_named(tmp_path):
  sched, acct = _states()
  params = {"dense": {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
                      "b": np.zeros(3, np.float32)}}
  rows = [{"round": 1, "test_loss": "", "x": float("nan"), "e": float("inf")}]
  state = checkpoint.RunState(3, 20, "completed", True, None, (0.5, 0.25), sched, acct,
                              rows, 1.5)
  path = tmp_path / checkpoint.FILENAME
  checkpoint.save(path, state, params, {"seed": 1, "progress": True})
  back, p2, cfg = checkpoint.load(path, schedule_template=sched, acct_template=acct,
                                  params_template=params)
  assert type(back.schedule_state) is type(sched) and type(back.acct) is type(acct)
  np.testing.assert_array_equal(back.schedule_state.budget, sched.budget)
  assert back.acct.rdp.rdp.dtype == np.float64 and back.acct.rounds == 5
  assert p2["dense"]["w"].dtype == np.float32
  np.testing.assert_array_equal(p2["dense"]["w"], params["dense"]["w"])
  assert back.rows[0]["test_loss"] == "" and np.isnan(back.rows[0]["x"])
  assert back.rows[0]["e"] == float("inf") and (back.t, back.test) == (3, (0.5, 0.25))
  assert cfg == {"seed": 1, "progress": True}
  blob = path.read_bytes()
  for bad in (blob[:-7], blob[:10], b"junk", blob[:200] + bytes([blob[200] ^ 1]) + blob[201:]):
    path.write_bytes(bad)
    with pytest.raises(checkpoint.CheckpointError, match=f"corrupt checkpoint {path}"):
      checkpoint.load(path, schedule_template=sched, acct_template=acct,
                      params_template=params)


def test_config_diff_names_fields_and_ignores_non_result_fields():
  a = config_lib.base_config().to_dict()
  b = config_lib.override(config_lib.base_config(), [
      "privacy.epsilon=2", "progress=false", "checkpoint.every=3"]).to_dict()
  assert checkpoint.config_diff(a, b) == ["privacy.epsilon: 4.0 -> 2.0"]


def test_out_of_another_config_is_an_error_unless_overwrite(tmp_path, capsys):
  out = tmp_path / "run"
  args = ["run", str(QUICKSTART), *SMALL, "--set", "rounds=2", "--out", str(out)]
  assert cli.main(args) == 0
  capsys.readouterr()
  assert cli.main([*args, "--set", "seed=3", "--set", "client.lr=0.2"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "client.lr: 0.5 -> 0.2" in err[0] and "seed: 0 -> 3" in err[0]
  assert "--overwrite" in err[0]
  assert cli.main([*args, "--set", "seed=3", "--overwrite"]) == 0
  assert json.loads((out / "config.json").read_text())["seed"] == 3
  # A corrupt checkpoint is named and not loaded.
  ckpt = out / checkpoint.FILENAME
  ckpt.write_bytes(ckpt.read_bytes()[:-1])
  capsys.readouterr()
  assert cli.main([*args, "--set", "seed=3"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and f"corrupt checkpoint {ckpt}" in err[0]
