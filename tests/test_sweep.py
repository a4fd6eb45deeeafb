"""Sweeps: batched points equal single runs, resume, one compile per shape group."""

import json
import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from _helpers import assert_rows_close, small_config, toy_federated

from fedjax_dp import cli, experiment, sweep
from fedjax_dp import config as config_lib
from fedjax_dp.config import noise_identity
from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"


def _base(**sets):
  return small_config({"rounds": "4", "data.num_clients": "5",
                       "data.samples_per_client": "24", "server.clients_per_round": "3",
                       "model.name": "logistic", "progress": "false"}, **sets)



class _CompileCounter:
  """Counts XLA compilations of the sweep's round and eval programs."""

  def __init__(self):
    self.names = []

  def __call__(self, event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      self.names.append(kw.get("fun_name", ""))

  def count(self, name):
    return sum(n == f"jit({name})" for n in self.names)

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self)


def test_sweep_points_equal_single_runs():
  cfg = _base(**{"eval.every": "2"})
  grid = {"privacy.epsilon": [2.0, math.inf], "seed": [0, 3], "client.lr": [0.5],
          "rounds": [3, 5]}
  rows = sweep.run_sweep(cfg, grid)
  df = pd.DataFrame(rows)
  assert len(df.point.unique()) == 8
  assert set(grid) <= set(df.columns)
  for point in sweep.expand(cfg, grid):
    got = [r for r in rows if r["point"] == point.name]
    want = experiment.run(point.config).rows
    assert_rows_close(got, want)
    assert got[-1]["round"] == point.values["rounds"]  # T differs within one program


def test_points_of_different_shapes_run_as_separate_groups():
  cfg = _base()
  grid = {"data.num_clients": [5, 6], "privacy.epsilon": [4.0]}
  points = sweep.expand(cfg, grid)
  cache: dict = {}
  keys = {experiment.group_key(experiment.build(p.config, cache=cache)) for p in points}
  assert len(keys) == 2
  rows = sweep.run_sweep(cfg, grid)
  for point in points:
    got = [r for r in rows if r["point"] == point.name]
    assert_rows_close(got, experiment.run(point.config).rows)


def test_no_recompile_across_epsilon_lr_seed_and_T():
  # A shape no other test uses, so the first sweep compiles exactly once.
  cfg = _base(**{"data.samples_per_client": "19", "rounds": "3"})
  setup = experiment.build(sweep.expand(cfg, {"seed": [0]})[0].config)
  round_fn, _ = engine.make_sweep_fns(setup.model, setup.round_cfg, 2048, None)
  cached = round_fn._cache_size()  # other tests' shapes share the same jitted function
  with _CompileCounter() as counter:
    sweep.run_sweep(cfg, {"privacy.epsilon": [1.0, 8.0], "client.lr": [0.1, 0.7],
                          "seed": [0, 1]})
  assert counter.count("round_fn") == 1, counter.names
  # The evaluation's shapes do not depend on the client data: maybe compiled already.
  assert counter.count("eval_fn") <= 1, counter.names
  assert round_fn._cache_size() == cached + 1
  # Points of different T (and clip, seed, delta): still one program for the sweep.
  # Its lanes run queues of points (experiment.lane_layout), so the lane count, and
  # with it the compiled shape, may differ from the first sweep's, but not per T.
  with _CompileCounter() as counter:
    sweep.run_sweep(cfg, {"rounds": [4, 1, 7], "client.clip": [0.5, 2.0], "seed": [5, 6],
                          "privacy.delta": [1e-4]})
  assert counter.count("round_fn") <= 1, counter.names


def test_no_recompile_across_learning_rates_with_non_default_optimizers():
  """The optimizers' directions carry no learning rate: sweeps over server.lr and
  client.lr with momentum on the clients and FedAdam on the server (whose state is
  carried per lane) are one compiled round."""
  cfg = _base(**{"data.samples_per_client": "17", "rounds": "3",
                 "client.optimizer": "momentum", "client.local_steps": "2",
                 "server.optimizer": "fedadam"})
  with _CompileCounter() as counter:
    rows = sweep.run_sweep(cfg, {"server.lr": [0.01, 0.1], "client.lr": [0.1, 0.5],
                                 "seed": [0, 1]})
  assert counter.count("round_fn") == 1, counter.names
  finals = {r["point"]: r["test_loss"] for r in rows if r["round"] == 3}
  assert len(finals) == 8 and len(set(finals.values())) == 8  # eight different runs


def test_resume_after_kill_reproduces_sweep_csv(tmp_path):
  cfg = _base(rounds="2")
  grid = {"privacy.epsilon": [2.0, 8.0], "seed": [0, 1]}
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  sweep.run_sweep(cfg, grid, str(full))
  shutil.copytree(full, resumed)  # what the same sweep writes there (no paths inside)
  points = sorted((resumed / "points").iterdir())
  # A kill leaves unfinished points without summary.json (maybe with partial files).
  shutil.rmtree(points[1])
  (points[2] / "summary.json").unlink()
  kept = (points[0] / "summary.json").stat().st_mtime_ns
  sweep.run_sweep(cfg, grid, str(resumed))
  assert (points[0] / "summary.json").stat().st_mtime_ns == kept  # not re-run
  a = pd.read_csv(full / "sweep.csv")
  b = pd.read_csv(resumed / "sweep.csv")
  # Equal but for the wall-clock column (tests/test_plot_and_report.py checks it is there).
  pd.testing.assert_frame_equal(a.drop(columns="wall_s"), b.drop(columns="wall_s"), rtol=1e-5)
  assert list(a.columns[:3]) == ["point", "privacy.epsilon", "seed"]
  for p in points:
    for name in ("config.json", "metrics.csv", "summary.json", "metrics.png"):
      assert (p / name).exists()


def test_resume_refuses_a_directory_of_another_sweep(tmp_path):
  cfg = _base(rounds="2")
  sweep.run_sweep(cfg, {"seed": [0]}, str(tmp_path))
  with pytest.raises(ValueError, match="different config"):
    sweep.run_sweep(config_lib.override(cfg, ["client.lr=0.3"]), {"seed": [0]}, str(tmp_path))


def test_cli_sweep(tmp_path, capsys):
  out = tmp_path / "sw"
  # The shapes of _base(), so the compiled round is shared with the tests above.
  sets = [a for k, v in {"data.num_clients": 5, "server.clients_per_round": 3,
                         "data.samples_per_client": 24, "model.name": "logistic"}.items()
          for a in ("--set", f"{k}={v}")]
  code = cli.main(["sweep", str(QUICKSTART), "--out", str(out), "--no-progress",
                   "--grid", "privacy.epsilon=4,inf", "--grid", "rounds=2,3",
                   "--grid", "seed=1", *sets])
  assert code == 0
  assert "4 points" in capsys.readouterr().out
  df = pd.read_csv(out / "sweep.csv")
  assert sorted(df.groupby("point")["round"].max()) == [2, 2, 3, 3]
  assert df["privacy.epsilon"].isin([4.0, math.inf]).all() and (df["seed"] == 1).all()
  meta = json.loads((out / "sweep.json").read_text())
  assert meta["grid"] == {"privacy.epsilon": ["4", "inf"], "rounds": ["2", "3"],
                          "seed": ["1"]}


@pytest.mark.parametrize("raw,values", [("1,2,3", ["1", "2", "3"]),
                                        ("(1,2),(3,4)", ["(1,2)", "(3,4)"]),
                                        ("a, b", ["a", "b"])])
def test_split_values(raw, values):
  assert sweep.split_values(raw) == values


def test_bad_grid_is_reported():
  with pytest.raises(config_lib.ConfigError, match="did you mean privacy.epsilon"):
    sweep.expand(_base(), {"privacy.epsilonn": [1.0]})
  with pytest.raises(config_lib.ConfigError, match="key=v1"):
    sweep.parse_grid(["seed"])


def test_cohorts_in_sequence_equal_vmapped_cohorts():
  """engine.sweep_step: running cohorts one after another (CPU), on 1 or 2 devices'
  shares, equals vmapping them (one vmapped program serves both comparisons)."""
  data = toy_federated(8, 12, (4, 4, 1), 3, 0, n_max=12)
  model = get_model("logistic", (4, 4, 1), 3)
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "per_example_l2", "upload"))
  g, lanes, k = 4, 2, 3
  params = jax.vmap(jax.vmap(model.init))(
      jax.random.split(jax.random.PRNGKey(0), g * lanes).reshape(g, lanes, -1))
  rng = np.random.default_rng(0)
  idx = np.repeat(rng.integers(0, 8, (g, 1, k)), lanes, 1).astype(np.int32)
  args = engine.RoundArgs(
      idx=idx, sel_mask=np.ones((g, lanes, k), np.float32),
      lr=np.full((g, lanes, 1), 0.4, np.float32), clip=np.full((g, lanes), 0.7, np.float32),
      noise=rng.uniform(0.01, 0.1, (g, lanes, k)).astype(np.float32),
      central_noise=np.zeros((g, lanes), np.float32),
      server_lr=np.ones((g, lanes), np.float32), round=np.full((g, lanes), 2, np.int32),
      seed=np.repeat(np.arange(g, dtype=np.uint32)[:, None], lanes, 1),
      data_id=np.zeros((g, lanes), np.int32), stream=np.zeros((g, lanes), np.int32))
  active = np.ones((g, lanes), bool)
  active[1, 1] = False

  def step(in_sequence, sweep_devices=1):
    return jax.jit(lambda p, a, on: engine.sweep_step(
        model, cfg, p, data, a, on, in_sequence, sweep_devices))(params, args, active)

  vmapped = jax.tree_util.tree_leaves(step(False))
  for sweep_devices in (1, 2):
    got = jax.tree_util.tree_leaves(step(True, sweep_devices))
    for a, b in zip(got, vmapped):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=f"{sweep_devices}")


def test_points_draw_independent_noise_unless_common_random_numbers():
  """Lanes of one cohort (same seed) get their own noise stream by default (from
  their configs, fedjax_dp.config.noise_identity); with privacy.common_random_numbers they
  share it (same noise at different scales)."""
  base = _base()
  streams = {tuple(noise_identity.stream(p.config))
             for p in sweep.expand(base, {"privacy.epsilon": [1, 4, 16]})}
  assert len(streams) == 3
  crn = config_lib.override(base, ["privacy.common_random_numbers=true"])
  assert [tuple(noise_identity.stream(p.config))
          for p in sweep.expand(crn, {"privacy.epsilon": [1, 4]})] == [(0, 0), (0, 0)]

  data = toy_federated(6, 12, (8,), 3, 0, n_max=12)
  model = get_model("logistic", (8,), 3)
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "per_example_l2", "upload"))
  lanes, k = 2, 3
  params = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (1, lanes) + a.shape),
                                  model.init(jax.random.PRNGKey(0)))

  step = jax.jit(lambda p, a: engine.sweep_step(model, cfg, p, data, a,
                                                np.ones((1, lanes), bool)))

  def noise_of(streams):
    args = engine.RoundArgs(
        idx=np.tile(np.arange(k, dtype=np.int32), (1, lanes, 1)),
        sel_mask=np.ones((1, lanes, k), np.float32), lr=np.full((1, lanes, 1), 1e-6, np.float32),
        clip=np.full((1, lanes), 0.7, np.float32),
        noise=np.ones((1, lanes, k), np.float32) * np.asarray([1.0, 2.0])[None, :, None],
        central_noise=np.zeros((1, lanes), np.float32),
        server_lr=np.ones((1, lanes), np.float32), round=np.full((1, lanes), 2, np.int32),
        seed=np.zeros((1, lanes), np.uint32), data_id=np.zeros((1, lanes), np.int32),
        stream=np.asarray([streams], np.int32))
    new, _ = step(params, args)
    moved = [np.concatenate([np.ravel(n[0, j] - o[0, j]) for n, o in zip(
        jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(params))])
             for j in range(lanes)]
    return moved

  a, b = noise_of([0, 0])
  np.testing.assert_allclose(b, 2 * a, rtol=1e-3, atol=1e-4)   # common random numbers
  a, b = noise_of([0, 1])
  assert abs(np.corrcoef(a, b)[0, 1]) < 0.2                    # independent draws
