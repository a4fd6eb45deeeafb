"""Yuan et al. Figs. 7 and 9: linear SVM on UCI Adult, loss/accuracy against M.

Algorithm 1 with the MNIST settings (U = 100, K = 10, tau = 5 full-batch steps,
param_l2 projection to C = 5, eq. (8) with Delta_s = 2C/|D_k|, delta = 1e-3) on UCI
Adult (``fedjax_dp.data.tabular.load_adult``: official split, 108 one-hot/standardised
features; 325 training records per client, 32,500 of 32,561), the linear SVM of the
zoo (hinge loss, spec E29) with lambda_r = 1e-4 (``client.l2_reg``) and eta = 0.5
(neither is given by the paper: our choices).

* Fig. 7: eps = 10, the five theta, M in ``common.M_GRID`` (one sweep);
* Fig. 9: theta = 1.05, eps in {5, 10, 20, inf}, M up to 50 (one sweep).

Writes ``results/fig7_svm_theta.csv``, ``results/fig9_svm_epsilon.csv`` and PNGs.
From the repository root::

  python experiments/yuan2023/fig7_9_svm_adult.py --seeds 2
"""

from __future__ import annotations

import argparse
import time

import common

M_GRID_FIG9 = (5, 10, 20, 30, 40, 50)
EPSILONS = (5.0, 10.0, 20.0, float("inf"))


def svm_config(rounds: int):
  cfg = common.mlp_config(rounds=rounds, samples=325)
  cfg.name = "yuan_adult_svm"
  cfg.data.name = "adult"
  cfg.data.dir = None
  cfg.model.name = "linear_svm"
  cfg.client.l2_reg = 1e-4
  cfg.client.lr = 0.5
  return cfg


def plot(curve, group, label, name, title, loss="hinge"):
  plt = common.plt()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for key, t in curve.groupby(group, sort=False):
    for ax, col in zip(axes, ("test_loss", "test_accuracy")):
      common.errorbar_plot(ax, t, "rounds", col, label(key))
  axes[0].set_ylabel(f"final test loss ({loss})")
  axes[1].set_ylabel("final test accuracy")
  for ax in axes:
    ax.set_xlabel("M (aggregations, tau=5)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  common.savefig(fig, name)


def with_m_star(curve, group):
  best = curve.loc[curve.groupby(group)["test_loss_mean"].idxmin()]
  return curve.merge(best[[group, "rounds"]].rename(columns={"rounds": "m_star"}), on=group)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=2)
  args = ap.parse_args(argv)
  start = time.time()
  cols = ["test_loss", "test_accuracy", "epsilon_claimed"]
  m7 = max(common.M_GRID)
  df = common.final_rows(common.run_grid(
      svm_config(m7), {"rounds": list(common.M_GRID), "schedule.theta": list(common.THETAS),
                       "seed": common.seeds(args.seeds)}, "fig7", [f"eval.every={m7}"]))
  curve = with_m_star(common.mean_std(df, ["schedule.theta", "rounds"], cols), "schedule.theta")
  common.write(curve, "fig7_svm_theta")
  print(curve[curve["rounds"] == curve["m_star"]].to_string(index=False))
  plot(curve, "schedule.theta", common.label, "fig7_svm_theta",
       f"Yuan Fig. 7: SVM/Adult, eps=10 (eq. 8), {args.seeds} seeds")

  m9 = max(M_GRID_FIG9)
  df = common.final_rows(common.run_grid(
      svm_config(m9), {"rounds": list(M_GRID_FIG9), "privacy.epsilon": list(EPSILONS),
                       "seed": common.seeds(args.seeds)}, "fig9",
      ["schedule.theta=1.05", f"eval.every={m9}"]))
  curve = with_m_star(common.mean_std(df, ["privacy.epsilon", "rounds"], cols), "privacy.epsilon")
  common.write(curve, "fig9_svm_epsilon")
  print(curve[curve["rounds"] == curve["m_star"]].to_string(index=False))
  plot(curve, "privacy.epsilon", lambda e: "no DP" if e == float("inf") else f"eps={e:g}",
       "fig9_svm_epsilon", f"Yuan Fig. 9: SVM/Adult, theta=1.05, {args.seeds} seeds")
  common.save_meta("fig7_9_svm_adult", start, seeds=args.seeds)


if __name__ == "__main__":
  main()
