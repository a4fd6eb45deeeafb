"""The noise each method of ``compare.py`` adds, from the run's own privacy plan (no
training): calibrated sigma and the error of the model's prefix sums.

  python experiments/correlated_noise/noise_table.py

For a method with strategy C (i.i.d.: C = I) the server's model after t rounds carries
the noise ``sigma Delta (A C^+ Z)_t``; its per-coordinate variance over Delta^2 is
``sigma^2 ||(A C^+)_{t,:}||^2``. Writes ``results/noise_table.csv``: sigma (the
calibrated multiplier against the per-round sensitivity), the RMS over rounds and the
last round of ``sigma ||(A C^+)_{t,:}||`` for each method and epsilon, and the largest
matrix sensitivity s_i over the clients (1 per participation for i.i.d. noise is
replaced by the accountant's own event: amplified for the random rule).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pandas as pd
from compare import EPSILONS, METHODS, RESULTS, base_config

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro
from fedjax_dp.privacy import correlated
from fedjax_dp.privacy.plan import make_privacy_plan


def prefix_noise(plan) -> np.ndarray:
  """``[T]`` ``||(A C^+)_{t,:}||`` of the plan's strategy (i.i.d.: sqrt(t + 1))."""
  t = plan.rounds
  a = np.tril(np.ones((t, t)))
  if plan.correlated is None:
    return np.sqrt(np.arange(1, t + 1))
  if plan.correlated.name == "bandmf":
    b = a @ np.linalg.inv(correlated.bandmf.matrix(plan.correlated))
  else:
    b = a @ np.linalg.pinv(correlated.tree.matrix(plan.correlated))
  return np.linalg.norm(b, axis=1)


def main():
  start = time.time()
  cfg = base_config(100)
  u, n = int(cfg.data.num_clients), int(cfg.data.samples_per_client)
  rows = []
  for method, sets in METHODS.items():
    for eps in EPSILONS:
      c = config_lib.override(cfg, [*sets, f"privacy.epsilon={eps}"])
      plan = make_privacy_plan(c, np.full(u, n))
      sigma = float(plan.noise_scale(plan.rounds)[0] / plan.sensitivity[0])
      err = sigma * prefix_noise(plan)
      s_max = float(np.sqrt(np.max(plan.correlated_sens_sq()))) if plan.correlated else None
      rows.append({"method": method, "epsilon": eps, "sigma": sigma, "rms_prefix_noise": float(
          np.sqrt(np.mean(err ** 2))), "last_prefix_noise": float(err[-1]), "matrix_sens_max": s_max})
  df = pd.DataFrame(rows)
  repro.write_csv(RESULTS, df, "noise_table")
  repro.save_meta(RESULTS, "noise_table", start)
  print(df.to_string())


if __name__ == "__main__":
  main()
