"""8 forced CPU devices give the metrics of 1 device (sweep axis and client axis sharded),
and cohorts streamed from host memory those of resident data.

XLA reads ``--xla_force_host_platform_device_count`` once, when jax starts, so the
8-device half runs this file as a script in a subprocess.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from _helpers import HANG_S, small_config

from fedjax_dp import config as config_lib
from fedjax_dp import experiment, sharding, sweep

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
COLUMNS = ("train_loss", "test_loss", "test_accuracy", "grad_norm", "update_norm",
           "epsilon_certified", "num_selected")


def _base(**sets):
  return small_config({"rounds": "2", "data.num_clients": "5",
                       "data.samples_per_client": "24", "server.clients_per_round": "3",
                       "model.name": "logistic", "progress": "false"}, **sets)


# The cohorts of each workload item, which set its mesh with 8 devices.
COHORTS = {"sweep_cohorts_in_sequence": 6, "sweep_seeds": 8, "run_chunked": 1,
           "unassigned_seeds": 8}
# Each seed leaves other examples unassigned: 8 evaluation sets in one sharded group.
UNASSIGNED = {"eval.split": "unassigned"}
GRIDS = {"sweep_cohorts_in_sequence": {"privacy.epsilon": [2.0, 8.0], "seed": list(range(6))},
         "sweep_seeds": {"seed": list(range(8))}}


def _run_config():
  return _base(**{"server.client_chunk": "2", "data.num_clients": "9",
                  "server.clients_per_round": "9", "privacy.placement": "central",
                  "client.clip_mode": "update_l2"})


def workload() -> dict:
  """Sweeps and a run whose layouts differ with 8 devices: between them every branch
  of engine.sweep_step (one cohort; cohorts vmapped over the devices; cohorts one
  after another on each device) with one lane and with two, client slots padded and
  split, chunks rounded up to the 'clients' axis, stacked partitions, and per-example
  clipping with per-client noise and update clipping with central noise."""
  out = {}
  # 12 points, 6 cohorts (seeds) of 2 lanes: mesh (2, 4); each device runs its 3
  # cohorts one after the other on CPU (engine.sweep_step's cohorts_in_sequence), each
  # cohort's 3 client slots padded to 4 and split; 6 stacked partitions.
  # 8 points of 8 seeds, one lane each (stacked partitions): mesh (8, 1), the 8
  # cohorts vmapped, one per device.
  for name, grid in GRIDS.items():
    out[name] = sweep.run_sweep(_base(), grid)
  # The first again with its cohorts streamed from host memory (data.placement='host',
  # tests/test_streaming.py): gathered on the host, then split over the mesh.
  out["streamed"] = sweep.run_sweep(config_lib.override(_base(), ["data.placement=host"]),
                                    GRIDS["sweep_cohorts_in_sequence"])
  # One run: mesh (1, 8), its 9 clients over all devices in chunks of 2 rounded up to
  # the axis, 8; central noise.
  out["run_chunked"] = experiment.run(_run_config()).rows
  # The seeds' sweep scored on each seed's unassigned examples (sweep_evaluate_sets).
  out["unassigned_seeds"] = sweep.run_sweep(_base(**UNASSIGNED), GRIDS["sweep_seeds"])
  return out


def _point(row) -> tuple:
  """(epsilon, seed, round) of a sweep's row (the config's epsilon where not swept)."""
  return (float(row.get("privacy.epsilon", _base().privacy.epsilon)), int(row["seed"]),
          int(row["round"]))


def _but_wall(rows: list) -> list:
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def reference() -> tuple[dict, list]:
  """The workload on this process's one device: the two sweeps' points as one sweep
  (a point's rows do not depend on the sweep it runs in: tests/test_sweep.py), one
  compiled round fewer, its rows by :func:`_point`; and the run's rows."""
  rows = sweep.run_sweep(_base(), {"privacy.epsilon": [2.0, 8.0], "seed": list(range(8))})
  return {_point(r): r for r in rows}, experiment.run(_run_config()).rows


def unassigned_reference() -> dict:
  """Each seed's run alone on its own unassigned examples, rows by :func:`_point`."""
  return {_point({**r, "seed": s}): r for s in GRIDS["sweep_seeds"]["seed"]
          for r in experiment.run(_base(**UNASSIGNED, seed=s)).rows}


def test_eight_devices_match_one(tmp_path):
  path = tmp_path / "eight.json"
  # Added to the suite's XLA flags (tests/conftest.py), which the subprocess keeps.
  # The timeout catches a hang (HANG_S), not a loaded machine's minutes of compiling.
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
  # The checkout first on the path: the subprocess runs this file from tests/, so the
  # package must not depend on being installed (a stale editable install broke it).
  path_env = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", PYTHONPATH=path_env)
  proc = subprocess.run([sys.executable, __file__, str(path)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=HANG_S, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  eight = json.loads(path.read_text())
  assert eight.pop("num_devices") == 8
  assert eight.pop("meshes") == {"sweep_cohorts_in_sequence": [2, 4], "sweep_seeds": [8, 1],
                                 "run_chunked": [1, 8], "unassigned_seeds": [8, 1]}
  unassigned, by_seed = eight.pop("unassigned_seeds"), unassigned_reference()
  assert len(unassigned) == len(by_seed) == 16
  _assert_rows_close([by_seed[_point(r)] for r in unassigned], unassigned, "unassigned")
  # Streamed cohorts give the resident sweep's rows bit for bit.
  streamed = eight.pop("streamed")
  assert _but_wall(streamed) == _but_wall(eight["sweep_cohorts_in_sequence"])
  by_point, run_rows = reference()
  assert len(eight) == 3 and len(eight["run_chunked"]) == 2
  for name, grid in GRIDS.items():  # every point's every round, once
    points = [_point(r) for r in eight[name]]
    assert len(set(points)) == len(points) == 2 * int(np.prod([len(v) for v in grid.values()]))
  for name, rows in eight.items():
    want = run_rows if name == "run_chunked" else [by_point[_point(r)] for r in rows]
    _assert_rows_close(want, rows, name)


def _assert_rows_close(want: list, rows: list, name: str) -> None:
  assert len(rows) == len(want), name
  for a, b in zip(want, rows):
    for c in COLUMNS:
      if a[c] in ("", None):
        assert b[c] in ("", None)
      else:
        np.testing.assert_allclose(b[c], a[c], rtol=2e-5, atol=1e-6, err_msg=f"{name} {c}")


if __name__ == "__main__":
  import jax

  result = workload()
  result["num_devices"] = len(jax.devices())
  result["meshes"] = {name: list(sharding.make_mesh(g).devices.shape)
                      for name, g in COHORTS.items()}
  Path(sys.argv[1]).write_text(json.dumps(result))
