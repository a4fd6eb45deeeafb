"""Yuan et al. Figs. 5 and 6: online refinement (Theorem 2, eq. (9)) on MLP/MNIST.

M = 30 to start, eps = 10, ``schedule.refine = 1`` with alpha_d in {0.8, 0.9} and the
five theta; the server evaluates the test loss after every round and, when it
does not decrease (previous-round comparison, patience 1, tolerance 0: the rule of
``fedjax_dp/privacy/schedules/geometric.py``), sets M' = ceil(alpha_d M_cur) and re-solves
sigma' by eq. (9) as printed for rounds m+1..M'. alpha_d x theta x seed is ONE sweep.

Fig. 5 is the horizon M' after every round (the ``horizon`` column, a staircase);
Fig. 6 the test loss/accuracy per round. ``results/fig5_6_summary.csv`` gives per
curve the last round, the final and minimal loss, the final claimed epsilon (the
paper's accountant on the realised amplitudes: above 10 where eq. (9) overspends,
spec E9) and, when ``results/table2.csv`` exists, the best fixed-M loss of Fig. 3
(checklist item 14). From the repository root::

  python experiments/yuan2023/fig5_6_refinement.py --seeds 3
  python experiments/yuan2023/fig5_6_refinement.py --seeds 3 --samples 100   # *_n100
"""

from __future__ import annotations

import argparse
import time

import common
import numpy as np
import pandas as pd

ALPHAS = (0.8, 0.9)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--samples", type=int, default=600,
                  help="examples per client (100: the 6x-noise regime, outputs *_n100)")
  args = ap.parse_args(argv)
  tag = common.tag(args.samples)
  start = time.time()
  cfg = common.mlp_config(samples=args.samples)
  grid = {"schedule.alpha_d": list(ALPHAS), "schedule.theta": list(common.THETAS),
          "seed": common.seeds(args.seeds)}
  df = common.run_grid(cfg, grid, f"fig5_6{tag}", ["schedule.refine=1", "eval.every=1"])
  by = ["schedule.alpha_d", "schedule.theta"]
  per_round = common.mean_std(df, by + ["round"],
                              ["test_loss", "test_accuracy", "horizon", "noise_mean",
                               "epsilon_claimed"])
  common.write(per_round, f"fig5_6_per_round{tag}")
  stair = df[df["seed"] == 0][by + ["round", "horizon", "noise_mean"]]
  common.write(stair, f"fig5_staircase_seed0{tag}")
  fin = common.final_rows(df)
  fin["min_test_loss"] = df.groupby("point", sort=False)["test_loss"].min().reindex(
      fin["point"]).to_numpy()
  summary = common.mean_std(fin, by, ["rounds_used", "test_loss", "min_test_loss",
                                      "test_accuracy", "epsilon_claimed", "epsilon_certified"])
  t2 = common.RESULTS / f"table2{tag}.csv"
  if t2.exists():
    fixed = pd.read_csv(t2).set_index("theta")
    summary["fixed_M_best_loss"] = summary["schedule.theta"].map(fixed["min_loss"])
    summary["fixed_M_star"] = summary["schedule.theta"].map(fixed["measured_m_star"])
  common.write(summary, f"fig5_6_summary{tag}")
  print(summary.to_string(index=False))

  plt = common.plt()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, alpha in zip(axes, ALPHAS):
    s = stair[stair["schedule.alpha_d"] == alpha]
    for theta, t in s.groupby("schedule.theta"):
      ax.step(t["round"], t["horizon"], where="post", label=common.label(theta))
    ax.set_title(f"alpha_d={alpha} (seed 0)")
    ax.set_xlabel("aggregation m")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("M' after round m")
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Yuan Fig. 5: refined horizon M' (eq. 9), MLP/MNIST, {args.samples}/client, "
               "eps=10")
  common.savefig(fig, f"fig5_staircase{tag}")

  fig, axes = plt.subplots(2, 2, figsize=(11, 8))
  for row, alpha in enumerate(ALPHAS):
    p = per_round[per_round["schedule.alpha_d"] == alpha]
    for theta, t in p.groupby("schedule.theta"):
      for ax, col in zip(axes[row], ("test_loss", "test_accuracy")):
        common.curve_band(ax, t, "round", col, common.label(theta))
    axes[row, 0].set_ylabel(f"test loss (alpha_d={alpha})")
    axes[row, 1].set_ylabel(f"test accuracy (alpha_d={alpha})")
  for ax in np.ravel(axes):
    ax.set_xlabel("aggregation m")
    ax.grid(alpha=0.3)
  axes[0, 0].legend(fontsize=8)
  fig.suptitle(f"Yuan Fig. 6: online refinement, {args.samples}/client, {args.seeds} seeds (band: +-1 std over the "
               "seeds still running)")
  common.savefig(fig, f"fig6_refinement{tag}")
  common.save_meta(f"fig5_6_refinement{tag}", start, seeds=args.seeds, samples=args.samples)


if __name__ == "__main__":
  main()
