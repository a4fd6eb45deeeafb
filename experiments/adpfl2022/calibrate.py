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
non-IID partition (the harder one; ``--partition iid`` for the other). The N x 60
clients hold all 60,000 MNIST training images, so the choice is made on a held-out
federation (``--select-on unassigned``, the default;
:func:`fedjax_dp.calibration_sweep.held_out_federation`): the same N clients with
:data:`HOLD_OUT` fewer images each, scored on the N x :data:`HOLD_OUT` images set
aside (``data.holdout``); the chosen setting then runs on the paper's federation and
its test accuracy is the table's ``test_value``. ``--select-on test`` chooses on the
test set (the results made before the split existed). Writes
``results/baseline_calibration.csv`` (``_<partition>.png``) and its meta.json.

``--controls`` runs, at the chosen non-IID setting, what explains a baseline below
the target (:func:`fedjax_dp.calibration_sweep.run_control`; never a calibration):
eta = 0.2 instead of the stated 0.05 (the issue's control) on the non-IID
partition, and the stated eta on the IID partition -> ``results/baseline_control.csv``. From the repository root::

  nice -n 10 python experiments/adpfl2022/calibrate.py
  nice -n 10 python experiments/adpfl2022/calibrate.py --controls
"""

from __future__ import annotations

import argparse
import time

import common
import pandas as pd

from fedjax_dp import calibration_sweep as cs
from fedjax_dp import config as config_lib

TARGET = cs.Target("adpfl2022", "Table 2 / Fig. 4 non-private FedAvg (T = 50, K = 10)",
                   "test_accuracy", 0.97)
MODELS = ("mlp_784_256_10", "cnn_yuan", "cnn_adpfl_mnist")
LOCAL_STEPS = (3, 15, 30)
CONTROL_LRS = {"noniid": (0.2,), "iid": (0.05,)}
HOLD_OUT = 10  # images per client set aside for the choice: 50 of 60 train (1/6)


def base_config(partition: str, rounds: int, eval_every: int):
  """Non-private FedAvg at Table 1's settings on ``partition``."""
  cfg = common.method_config(common.paper_config("mnist", partition, rounds=rounds),
                             "nonprivate")
  cfg.eval.every = eval_every
  cfg.progress = False
  return cfg


def run_controls(args) -> None:
  """:data:`CONTROL_LRS` on each partition at the chosen non-IID setting."""
  table = pd.read_csv(common.RESULTS / "baseline_calibration.csv")
  figure = f"{TARGET.figure}, noniid"
  chosen = table[(table["figure"] == figure) & table["chosen"]]
  if chosen.empty:
    raise SystemExit(f"no chosen setting for {figure!r} in results/baseline_calibration.csv: "
                     "run the calibration first")
  setting = chosen["setting"].iloc[0]
  for partition, lrs in CONTROL_LRS.items():
    grid = {"client.lr": list(lrs)}
    cfg = config_lib.override(base_config(partition, args.rounds, args.eval_every),
                              cs.parse_setting(setting))
    target = TARGET._replace(figure=f"{TARGET.figure}, {partition}")
    out = common.RUNS / f"control_{partition}_T{args.rounds}"
    t, rows = cs.run_control(cfg, grid, target, f"{setting}, eta stated 0.05", out)
    control = target._replace(figure=str(t["figure"].iloc[0]))  # "... [control: ...]"
    cs.write_calibration(common.RESULTS, t, rows, grid, control,
                         png=f"baseline_control_{partition}", name="baseline_control")
    print(t.to_string(index=False), flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default=",".join(MODELS))
  ap.add_argument("--local-steps", default=",".join(map(str, LOCAL_STEPS)))
  ap.add_argument("--partition", choices=["iid", "noniid"], default="noniid")
  ap.add_argument("--eval-every", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=common.ROUNDS,
                  help="T (the paper's 50; fewer only for a quick check)")
  ap.add_argument("--controls", action="store_true",
                  help="run the controls at the chosen setting instead of the calibration")
  cs.add_select_arg(ap)
  args = ap.parse_args(argv)
  start = time.time()
  if args.controls:
    run_controls(args)
    common.save_meta("baseline_control", start, lrs=CONTROL_LRS)
    return
  cfg, back = cs.selection_config(base_config(args.partition, args.rounds, args.eval_every),
                                  args.select_on, HOLD_OUT)
  grid = {"model.name": args.models.split(","),
          "client.local_steps": [int(s) for s in args.local_steps.split(",")]}
  target = TARGET._replace(figure=f"{TARGET.figure}, {args.partition}")
  runs = f"calibration_{args.partition}_T{args.rounds}{cs.select_suffix(args.select_on)}"
  table, rows = cs.calibrate(cfg, grid, target, common.RUNS / runs, test_overrides=back)
  cs.write_calibration(common.RESULTS, table, rows, grid, target,
                       png=f"baseline_calibration_{args.partition}")
  print(table.to_string(index=False))
  name = "baseline_calibration" + ("" if args.partition == "noniid" else f"_{args.partition}")
  common.save_meta(name, start, partition=args.partition, grid=grid,
                   select_on=args.select_on, hold_out_per_client=HOLD_OUT if back else 0)


if __name__ == "__main__":
  main()
