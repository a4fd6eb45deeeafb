"""Yuan et al.: the eps = inf baselines, calibrated before any DP verdict.

Two targets, one batched sweep each (:func:`fedjax_dp.calibration_sweep.calibrate`),
at the paper's stated U = 100, K = 10, tau = 5, C = 5 and M = 30
(:data:`fedjax_dp.calibration_sweep.STATED`):

* ``mlp``: the MLP 784-32-10 (linear) on MNIST, full-batch GD with the C = 5
  projection (all stated), 600 examples per client: its no-DP test loss after M = 30
  should reach Table II's level (the best loss there, 0.88862 at theta = 1.05 and
  eps = 10: a no-DP baseline above it cannot judge the DP curves). Open and swept:
  eta (spec 7.3 item 1).
* ``cnn``: LeNet-5 (``cnn_yuan``) on Fashion-MNIST, the setting of Figs. 8/10 (50
  examples per client, the committed reduction): no-DP test accuracy >= 0.80 within
  M = 30. Open and swept: eta (item 1) and whether the C = 5 projection applies to
  the CNN (item 12: ``client.clip_mode`` ``param_l2`` or ``none``).

Writes ``results/baseline_calibration.csv`` (one block per target) with
``baseline_calibration_{mlp,cnn}.png`` and the meta.json. From the repository root::

  nice -n 10 python experiments/yuan2023/calibrate.py
"""

from __future__ import annotations

import argparse
import time

import common
from fig8_10_cnn import cnn_config

from fedjax_dp import calibration_sweep as cs

TARGETS = {
    "mlp": cs.Target("yuan2023", "Table II (MLP/MNIST, no DP vs best DP loss)", "test_loss",
                     common.TABLE2_PAPER[1.05], stated=("client.batch_size", "model.name")),
    "cnn": cs.Target("yuan2023", "Figs. 8/10 (LeNet-5/FMNIST, no DP)", "test_accuracy", 0.80,
                     stated=("model.name",)),
}
GRIDS = {
    "mlp": {"client.lr": [0.1, 0.3, 1.0, 3.0]},
    "cnn": {"client.clip_mode": ["param_l2", "none"], "client.lr": [0.1, 0.5, 1.0, 2.0]},
}


def base_config(which: str, samples: int):
  """The no-DP config of ``which`` at the paper's stated settings."""
  if which == "mlp":
    cfg = common.mlp_config(rounds=common.M, samples=samples)
  else:
    cfg = cnn_config("fashion_mnist", common.M, samples)
  cfg.privacy.epsilon = float("inf")
  cfg.privacy.placement = "none"  # no noise, so no sensitivity to bound: clip_mode=none runs
  cfg.privacy.noise_sampling = "per_client"  # 'aggregate' describes upload noise
  cfg.eval.every = 5
  return cfg


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", choices=list(TARGETS), nargs="*", default=list(TARGETS))
  ap.add_argument("--cnn-samples", type=int, default=50,
                  help="examples per client of the CNN (Figs. 8/10's reduction)")
  args = ap.parse_args(argv)
  start = time.time()
  for which in args.only:
    samples = 600 if which == "mlp" else args.cnn_samples
    cfg = base_config(which, samples)
    table, rows = cs.calibrate(cfg, GRIDS[which], TARGETS[which],
                               common.RUNS / f"calibration_{which}_n{samples}")
    cs.write_calibration(common.RESULTS, table, rows, GRIDS[which], TARGETS[which],
                         png=f"baseline_calibration_{which}")
    print(table.to_string(index=False), flush=True)
  common.save_meta("baseline_calibration", start, only=args.only, grids=GRIDS,
                   cnn_samples=args.cnn_samples)


if __name__ == "__main__":
  main()
