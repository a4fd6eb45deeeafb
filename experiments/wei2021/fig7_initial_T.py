"""Wei et al. Fig. 7: CRD's final loss for initial T0 from 150 to 300.

MNIST MLP, noise regime (|D_i| = 100, see ``common.py``), K = U = 50, beta = 0.9,
zeta = 1e-3, epsilon in {4, 12, 20}, T0 in {100, 150, 200, 250, 300} (100 added
below the paper's range, to show the other side of the optimum), 3 seeds. The
paper's claim: CRD converges better when T0 is closer to the optimal T of Figs. 5/6
(``results/fig5_6_loss_vs_T_noise_q1.csv`` holds that optimum for the same setting).

Writes ``results/fig7_initial_T.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig7_initial_T.py
"""

from __future__ import annotations

import argparse
import time

import common
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--epsilons", default="4,12,20")
  ap.add_argument("--t0", default="100,150,200,250,300")
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.mlp_config("noise", 1.0)
  cfg.name = "wei_fig7_initial_T"
  eps = [float(e) for e in args.epsilons.split(",")]
  rows = common.sweep.run_sweep(
      cfg, {"rounds": [int(t) for t in args.t0.split(",")], "privacy.epsilon": eps,
            "seed": list(range(args.seeds))},
      str(common.RUNS / "fig7_initial_T"), sets=["schedule.name=crd", "eval.every=1"])
  df = pd.DataFrame(rows)
  fin = common.final_rows(df)
  fin["rounds_used"] = df.groupby("point", sort=False)["round"].max().reindex(
      fin["point"]).to_numpy()
  table = common.mean_std(fin, ["privacy.epsilon", "rounds"],
                          ["test_loss", "test_accuracy", "rounds_used", "epsilon_certified"])
  table = table.rename(columns={"rounds": "initial_T"})
  common.write(table, "fig7_initial_T")
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for e, t in table.groupby("privacy.epsilon"):
    common.errorbar_plot(axes[0], t, "initial_T", "test_loss", f"eps={e:g}")
    common.errorbar_plot(axes[1], t, "initial_T", "rounds_used", f"eps={e:g}")
  axes[0].set_ylabel("CRD final test loss")
  axes[1].set_ylabel("rounds CRD used")
  for ax in axes:
    ax.set_xlabel("initial T0")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.suptitle("Wei et al. Fig. 7: CRD vs initial T (noise regime, K/U = 1, "
               f"{args.seeds} seeds)")
  fig.tight_layout()
  fig.savefig(common.RESULTS / "fig7_initial_T.png", dpi=110)
  plt.close(fig)
  print(table.to_string())
  common.save_meta("fig7_initial_T", start)


if __name__ == "__main__":
  main()
