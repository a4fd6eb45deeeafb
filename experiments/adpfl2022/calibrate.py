"""A-DPFL: the eps = inf baseline, calibrated before any DP verdict.

Target: non-private FedAvg reaches 0.97 test accuracy after the paper's T = 50
rounds on MNIST with K = 10 clients per round (the paper's A-DPFL alone reports
0.989 IID / 0.942 non-IID in Table 2, so a baseline below that cannot judge it).
Everything Table 1 states stays as stated (B = 20, eta = 0.05, C = 4, N = 1000
clients of 60 examples, T = 50; :data:`fedjax_dp.calibration_sweep.STATED`). The
grid covers what the paper leaves open (spec adpfl.md section 5.4):

* ``model.name`` (item 11, the architecture): the MLP 784-256-10 of the earlier
  runs, LeNet-5 (``cnn_yuan``) and the spec's "Deep MNIST" CNN (``cnn_adpfl_mnist``,
  the paper's conv 5x5-32 / pool / FC 1024 with the second conv layer its text
  names);
* ``client.local_steps`` (item 2, "max local_round"): 3 (one local epoch), 15, 30.

One batched sweep (:func:`fedjax_dp.calibration_sweep.calibrate`), one seed, the
non-IID partition (the harder one; ``--partition iid`` for the other). Writes
``results/baseline_calibration.csv`` (``_<partition>.png``) and its meta.json. From the repository
root::

  nice -n 10 python experiments/adpfl2022/calibrate.py
"""

from __future__ import annotations

import argparse
import time

import common

from fedjax_dp import calibration_sweep as cs

TARGET = cs.Target("adpfl2022", "Table 2 / Fig. 4 non-private FedAvg (T = 50, K = 10)",
                   "test_accuracy", 0.97)
MODELS = ("mlp_784_256_10", "cnn_yuan", "cnn_adpfl_mnist")
LOCAL_STEPS = (3, 15, 30)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default=",".join(MODELS))
  ap.add_argument("--local-steps", default=",".join(map(str, LOCAL_STEPS)))
  ap.add_argument("--partition", choices=["iid", "noniid"], default="noniid")
  ap.add_argument("--eval-every", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=common.ROUNDS,
                  help="T (the paper's 50; fewer only for a quick check)")
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.method_config(common.paper_config("mnist", args.partition, rounds=args.rounds),
                             "nonprivate")
  cfg.eval.every = args.eval_every
  cfg.progress = False
  grid = {"model.name": args.models.split(","),
          "client.local_steps": [int(s) for s in args.local_steps.split(",")]}
  target = TARGET._replace(figure=f"{TARGET.figure}, {args.partition}")
  table, rows = cs.calibrate(cfg, grid, target,
                             common.RUNS / f"calibration_{args.partition}_T{args.rounds}")
  cs.write_calibration(common.RESULTS, table, rows, grid, target,
                       png=f"baseline_calibration_{args.partition}")
  print(table.to_string(index=False))
  common.save_meta("baseline_calibration", start, partition=args.partition, grid=grid)


if __name__ == "__main__":
  main()
