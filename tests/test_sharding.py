"""8 forced CPU devices give the metrics of 1 device (sweep axis and client axis sharded).

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

from fedjax_dp import experiment, sharding, sweep

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
COLUMNS = ("train_loss", "test_loss", "test_accuracy", "grad_norm", "update_norm",
           "epsilon_certified", "num_selected")


def _base(**sets):
  return small_config({"rounds": "3", "data.num_clients": "5",
                       "data.samples_per_client": "24", "server.clients_per_round": "3",
                       "model.name": "logistic", "progress": "false"}, **sets)


def workload() -> dict:
  """Sweeps and runs whose layouts differ with 8 devices."""
  out = {}
  # 4 points, 2 cohorts (seeds) of 2: mesh (2, 4); 3 client slots padded to 4, split.
  out["sweep_cohorts"] = sweep.run_sweep(_base(), {"privacy.epsilon": [2.0, 8.0],
                                                   "seed": [0, 1]})
  # 8 points of 8 seeds, one lane each (stacked partitions): mesh (8, 1).
  out["sweep_seeds"] = sweep.run_sweep(_base(rounds="2"), {"seed": list(range(8))})
  # 16 cohorts of 2 lanes: mesh (8, 1), each device runs its 2 cohorts one after the
  # other on CPU (engine.sweep_step's cohorts_in_sequence).
  out["sweep_cohorts_in_sequence"] = sweep.run_sweep(
      _base(rounds="2"), {"seed": list(range(16)), "client.lr": [0.1, 0.3]})
  # 2 points, 1 cohort: mesh (1, 8); chunks of 2 clients rounded up to the axis, 8.
  out["sweep_chunked"] = sweep.run_sweep(
      _base(**{"server.client_chunk": "2", "data.num_clients": "9",
               "server.clients_per_round": "9"}), {"client.lr": [0.1, 0.5]})
  # One run: mesh (1, 8), its clients over all devices; central noise.
  out["run"] = experiment.run(_base(**{"privacy.placement": "central",
                                       "client.clip_mode": "update_l2"})).rows
  return out


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
  assert eight.pop("meshes") == [[2, 4], [8, 1], [1, 8], [8, 1]]
  one = workload()
  for name, rows in one.items():
    assert len(rows) == len(eight[name]), name
    for a, b in zip(rows, eight[name]):
      for c in COLUMNS:
        if a[c] in ("", None):
          assert b[c] in ("", None)
        else:
          np.testing.assert_allclose(b[c], a[c], rtol=2e-5, atol=1e-6, err_msg=f"{name} {c}")


if __name__ == "__main__":
  import jax

  result = workload()
  result["num_devices"] = len(jax.devices())
  result["meshes"] = [list(sharding.make_mesh(g).devices.shape) for g in (2, 8, 1, 16)]
  Path(sys.argv[1]).write_text(json.dumps(result))
