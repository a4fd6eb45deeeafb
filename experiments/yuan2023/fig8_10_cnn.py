"""Yuan et al. Figs. 8 and 10: LeNet-5 on Fashion-MNIST (and CIFAR-10 where it is available).

Algorithm 1 with the MNIST settings (U = 100, K = 10, tau = 5 full-batch steps,
param_l2 projection to C = 5 on the whole parameter vector, eq. (8) with Delta_s =
2C/|D_k|, delta = 1e-3) and the zoo's ``cnn_yuan`` (LeNet-5: conv 6@5 - pool - conv
16@5 - pool - FC 120 - FC 84 - FC 10, the spec's recommendation; the paper gives
no widths). eta and the reading of the C-ball (spec 7.3 items 1 and 12) are the
calibrated ones: the best no-DP setting of ``results/baseline_calibration.csv`` among
the clip modes that bound an upload (``param_l2``: project the parameters, the MLP's
reading; ``update_l2``: the ball around the global model). ``clip_mode=none``, which
learns best without DP, bounds nothing and cannot carry noise (calibrate.py).

``--calibration sgd`` reads instead the best block of ``calibrate.py --cnn-sgd``
(``results/baseline_calibration_cnn_sgd.csv``: batch size, tau as local steps or epochs,
the client optimizer; the block whose chosen point scores best on the unassigned
images) and writes its results with the suffix ``_sgd``.

REDUCED SCALE (2-core CPU shared with other jobs): ``--samples`` examples per client
(default 50 instead of 600, so Delta_s = 0.2 and the noise is 12x the full-data one at
equal eps), the M grid {5, 10, 20, 30} and one seed.

* Fig. 8: eps = 10, the five theta, M grid (one sweep per dataset);
* Fig. 10: theta = 1.05, eps in {5, 10, 20, inf} (one sweep per dataset).

Fashion-MNIST is read from ``/usr/share/datasets/fashion-mnist`` (Debian's
``dataset-fashion-mnist``). CIFAR-10 runs only when ``FEDJAX_DP_CIFAR10`` names a
directory with the python-version batches (``data_batch_1`` ...); otherwise it is
skipped with one message naming the command. From the repository root::

  python experiments/yuan2023/fig8_10_cnn.py --seeds 1
  FEDJAX_DP_CIFAR10=/path/to/cifar-10-batches-py python experiments/yuan2023/fig8_10_cnn.py
"""

from __future__ import annotations

import argparse
import time

import common
import pandas as pd
from fig7_9_svm_adult import plot, with_m_star

from fedjax_dp import config as config_lib

M_GRID = (5, 10, 20, 30)
FIGURE = "Figs. 8/10 (LeNet-5/FMNIST, no DP)"   # the calibration block (calibrate.py)
DP_CLIP_MODES = ("param_l2", "update_l2")
EPSILONS = (5.0, 10.0, 20.0, float("inf"))
# --calibration: the CSV each reads, and the calibrate.py flag that makes it.
CALIBRATIONS = {"gd": ("baseline_calibration.csv", "--only cnn"),
                "sgd": ("baseline_calibration_cnn_sgd.csv", "--cnn-sgd --seeds 3")}


def cnn_config(dataset: str, rounds: int, samples: int):
  cfg = common.mlp_config(rounds=rounds, samples=samples)
  cfg.name = f"yuan_{dataset}_cnn"
  cfg.data.name = dataset
  cfg.data.dir = common.CIFAR_DIR if dataset == "cifar10" else None
  cfg.model.name = "cnn_yuan"
  cfg.client.lr = 0.1
  return cfg


def calibrated_setting(calibration: str = "gd") -> str:
  """The chosen no-DP setting of the calibration (``calibrate.py`` chooses among
  :data:`DP_CLIP_MODES` only), as its ``key=value`` text (e.g.
  ``client.clip_mode=update_l2 client.lr=0.5``). ``calibration='sgd'``: of the
  ``--cnn-sgd`` blocks' chosen points, the one best on the unassigned images (its
  ``ours``; never the test value).

  Raises:
    SystemExit: no chosen CNN setting with a clip mode in :data:`DP_CLIP_MODES` yet
      (names the command).
  """
  name, flag = CALIBRATIONS[calibration]
  path = common.RESULTS / name
  table = pd.read_csv(path) if path.is_file() else pd.DataFrame(
      columns=["figure", "setting", "chosen", "ours"])
  rows = table[table["figure"].str.startswith(FIGURE) & table["chosen"].astype(bool)]
  if calibration == "gd":
    rows = rows[rows["figure"] == FIGURE]
  bounded = "|".join(f"clip_mode={m}" for m in DP_CLIP_MODES)
  rows = rows[rows["setting"].str.contains(bounded)]
  if rows.empty:
    raise SystemExit(f"no chosen CNN setting with a clip mode in {DP_CLIP_MODES} in "
                     f"{path}: run `python experiments/yuan2023/calibrate.py {flag}` first")
  return str(rows.sort_values("ours", ascending=False, kind="stable")["setting"].iloc[0])


def run_dataset(dataset: str, seeds: int, samples: int, m_grid, calibration: str = "gd"
                ) -> None:
  cols = ["test_loss", "test_accuracy", "epsilon_claimed", "epsilon_certified"]
  mx = max(m_grid)
  setting = calibrated_setting(calibration)
  tag = "" if calibration == "gd" else f"_{calibration}"
  print(f"LeNet-5 at the calibrated setting {setting}", flush=True)
  cfg = config_lib.override(cnn_config(dataset, mx, samples), setting.split())
  df = common.final_rows(common.run_grid(
      cfg, {"rounds": list(m_grid), "schedule.theta": list(common.THETAS),
            "seed": common.seeds(seeds)}, f"fig8_{dataset}_n{samples}{tag}", [f"eval.every={mx}"]))
  curve = with_m_star(common.mean_std(df, ["schedule.theta", "rounds"], cols), "schedule.theta")
  common.write(curve, f"fig8_cnn_{dataset}{tag}")
  print(curve[curve["rounds"] == curve["m_star"]].to_string(index=False))
  plot(curve, "schedule.theta", common.label, f"fig8_cnn_{dataset}{tag}",
       f"Yuan Fig. 8: LeNet-5/{dataset}, eps=10, {samples}/client, {seeds} seed(s), {setting}",
       loss="cross-entropy")
  df = common.final_rows(common.run_grid(
      cfg, {"rounds": list(m_grid), "privacy.epsilon": list(EPSILONS),
            "seed": common.seeds(seeds)}, f"fig10_{dataset}_n{samples}{tag}",
      ["schedule.theta=1.05", f"eval.every={mx}"]))
  curve = with_m_star(common.mean_std(df, ["privacy.epsilon", "rounds"], cols), "privacy.epsilon")
  common.write(curve, f"fig10_cnn_{dataset}{tag}")
  print(curve[curve["rounds"] == curve["m_star"]].to_string(index=False))
  plot(curve, "privacy.epsilon", lambda e: "no DP" if e == float("inf") else f"eps={e:g}",
       f"fig10_cnn_{dataset}{tag}",
       f"Yuan Fig. 10: LeNet-5/{dataset}, theta=1.05, {samples}/client, {seeds} seed(s), "
       f"{setting}", loss="cross-entropy")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=1)
  ap.add_argument("--samples", type=int, default=50)
  ap.add_argument("--m-grid", default=",".join(map(str, M_GRID)))
  ap.add_argument("--calibration", choices=list(CALIBRATIONS), default="gd",
                  help="the no-DP setting: full-batch GD's calibration (gd) or the best "
                       "block of the minibatch/optimizer calibration (sgd; module docstring)")
  args = ap.parse_args(argv)
  m_grid = [int(v) for v in args.m_grid.split(",")]
  cal = args.calibration
  setting = calibrated_setting(cal)  # checked before any compute
  start = time.time()
  run_dataset("fashion_mnist", args.seeds, args.samples, m_grid, cal)
  if common.CIFAR_DIR:
    run_dataset("cifar10", args.seeds, min(args.samples, 500), m_grid, cal)
  else:
    print("CIFAR-10 skipped: no copy on this machine (no package we can reach ships it). "
          "Run `FEDJAX_DP_CIFAR10=/path/to/cifar-10-batches-py python "
          "experiments/yuan2023/fig8_10_cnn.py` where the data is.")
  common.save_meta("fig8_10_cnn" + ("" if cal == "gd" else f"_{cal}"), start,
                   seeds=args.seeds, samples=args.samples, m_grid=m_grid,
                   cifar10=bool(common.CIFAR_DIR), setting=setting, calibration=cal)


if __name__ == "__main__":
  main()
