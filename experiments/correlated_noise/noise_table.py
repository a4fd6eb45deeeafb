"""The noise each method of ``compare.py`` adds, from the run's own privacy plan (no
training): calibrated sigma and the error of the model's prefix sums.

  python experiments/correlated_noise/noise_table.py [--task mnist|lending_club]

For a method with strategy C (i.i.d.: C = I) the server's model after t rounds carries
the noise ``sigma Delta (A C^+ Z)_t``; its per-coordinate variance over Delta^2 is
``sigma^2 ||(A C^+)_{t,:}||^2``. Writes ``results/noise_table.csv``: sigma (the
calibrated multiplier against the per-round sensitivity), the RMS over rounds and the
last round of ``sigma ||(A C^+)_{t,:}||`` for each method and epsilon, and the largest
matrix sensitivity s_i over the clients (1 per participation for i.i.d. noise is
replaced by the accountant's own event: amplified for the random rule). ``--task
lending_club`` writes ``results/noise_table_lending_club.csv`` for that comparison.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pandas as pd
from compare import EPSILONS, NONPRIVATE, RESULTS, TASKS

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.privacy import correlated


def prefix_noise(plan, decay: float = 0.0) -> np.ndarray:
  """``[T]`` ``||(A C^+)_{t,:}||`` of the plan's strategy (i.i.d.: C = I).

  ``A`` is the prefix-sum workload (``decay`` = 0: the model after t rounds of server
  step 1 is the sum of the noisy aggregates), or with ``decay`` = lambda the workload
  ``A_ts = (1 - lambda)^(t - s)``: gradient descent on a quadratic contracts an earlier
  round's noise by ``1 - eta E h`` a round along a Hessian direction of curvature h,
  so the model's noise after t rounds is ``sigma Delta (A_lambda C^+ Z)_t`` there.
  """
  t = plan.rounds
  i = np.arange(t)
  a = np.tril((1.0 - decay) ** np.maximum(i[:, None] - i[None, :], 0))
  if plan.correlated is None:
    return np.linalg.norm(a, axis=1)
  if plan.correlated.name == "bandmf":
    b = a @ np.linalg.inv(correlated.bandmf.matrix(plan.correlated))
  else:
    b = a @ np.linalg.pinv(correlated.tree.matrix(plan.correlated))
  return np.linalg.norm(b, axis=1)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", choices=sorted(TASKS), default="mnist")
  parser.add_argument("--decays", default="", help="comma-separated lambdas: also the "
                      "last round's noise under the contracting workload A_lambda")
  args = parser.parse_args(argv)
  start = time.time()
  task = TASKS[args.task]
  cfg = task.config(100)
  u, n = int(cfg.data.num_clients), int(cfg.data.samples_per_client)
  decays = [float(d) for d in args.decays.split(",") if d]
  rows = []
  for method, sets in task.methods.items():
    if method in NONPRIVATE:
      continue
    for eps in EPSILONS:
      c = config_lib.override(cfg, [*sets, f"privacy.epsilon={eps}"])
      plan = plan_from_config(c, np.full(u, n))
      sigma = float(plan.noise_scale(plan.rounds)[0] / plan.sensitivity[0])
      err = sigma * prefix_noise(plan)
      s_max = float(np.sqrt(np.max(plan.correlated_sens_sq()))) if plan.correlated else None
      rows.append({"method": method, "epsilon": eps, "sigma": sigma, "rms_prefix_noise": float(
          np.sqrt(np.mean(err ** 2))), "last_prefix_noise": float(err[-1]), "matrix_sens_max": s_max})
      for lam in decays:
        rows[-1][f"last_noise_decay_{lam:g}"] = float(sigma * prefix_noise(plan, lam)[-1])
  df = pd.DataFrame(rows)
  name = "noise_table" + task.suffix
  repro.write_csv(RESULTS, df, name)
  repro.save_meta(RESULTS, name, start)
  print(df.to_string())


if __name__ == "__main__":
  main()
