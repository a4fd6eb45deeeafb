"""Wei et al. Figs. 14/15: CRD's discount factor beta in {0.5, ..., 0.9}.

MNIST MLP, noise regime (|D_i| = 100), K = U = 50, T0 = 200, zeta = 1e-3,
epsilon in {4, 12} (the paper's value is not given), 3 seeds. Fig. 14: final test
loss vs beta; Fig. 15: communication rounds consumed vs beta (paper: larger beta,
slower decay of T, more rounds; beta = 0.8 best loss).

Writes ``results/fig14_15_beta.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig14_15_beta.py
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
  ap.add_argument("--epsilons", default="4,12")
  ap.add_argument("--betas", default="0.5,0.6,0.7,0.8,0.9")
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.mlp_config("noise", 1.0)
  cfg.name = "wei_fig14_15_beta"
  rows = common.sweep.run_sweep(
      cfg, {"schedule.beta": [float(b) for b in args.betas.split(",")],
            "privacy.epsilon": [float(e) for e in args.epsilons.split(",")],
            "seed": list(range(args.seeds))},
      str(common.RUNS / "fig14_15_beta"), sets=["schedule.name=crd", "eval.every=1"])
  df = pd.DataFrame(rows)
  fin = common.final_rows(df)
  fin["rounds_used"] = df.groupby("point", sort=False)["round"].max().reindex(
      fin["point"]).to_numpy()
  table = common.mean_std(fin, ["privacy.epsilon", "schedule.beta"],
                          ["test_loss", "test_accuracy", "rounds_used", "epsilon_certified"])
  common.write(table, "fig14_15_beta")
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for e, t in table.groupby("privacy.epsilon"):
    common.errorbar_plot(axes[0], t, "schedule.beta", "test_loss", f"eps={e:g}")
    common.errorbar_plot(axes[1], t, "schedule.beta", "rounds_used", f"eps={e:g}")
  axes[0].set_ylabel("CRD final test loss (Fig. 14)")
  axes[1].set_ylabel("communication rounds consumed (Fig. 15)")
  for ax in axes:
    ax.set_xlabel("beta")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.suptitle(f"Wei et al. Figs. 14/15 (noise regime, K/U = 1, T0 = 200, {args.seeds} seeds)")
  fig.tight_layout()
  fig.savefig(common.RESULTS / "fig14_15_beta.png", dpi=110)
  plt.close(fig)
  print(table.to_string())
  common.save_meta("fig14_15_beta", start)


if __name__ == "__main__":
  main()
