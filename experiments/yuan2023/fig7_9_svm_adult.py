"""Yuan et al. Figs. 7 and 9: linear SVM on UCI Adult, loss/accuracy against M.

Algorithm 1 with the MNIST settings (U = 100, K = 10, tau = 5 full-batch steps,
param_l2 projection to C = 5, eq. (8) with Delta_s = 2C/|D_k|, delta = 1e-3) on UCI
Adult (``fedjax_dp.data.tabular.load_adult``: official split, 108 one-hot/standardised
features; 325 training records per client, 32,500 of 32,561), the linear SVM of the
zoo (hinge loss, spec E29) with lambda_r = 1e-4 (``client.l2_reg``) and eta = 0.5
(neither is given by the paper: our choices).

* Fig. 7: eps = 10, the five theta, M in ``common.M_GRID`` (one sweep);
* Fig. 9: theta = 1.05, eps in {5, 10, 20, inf}, M up to 50 (one sweep).

Writes ``results/fig7_svm_theta.csv``, ``results/fig9_svm_epsilon.csv`` and PNGs, with
the claimed and the certified epsilon. ``--basis certified``: the equal-certified
comparison (each point at the noise that certifies its eps at the paper's Delta_s,
:func:`common.equal_certified_epsilon`), written as ``*_certified``. From the
repository root::

  python experiments/yuan2023/fig7_9_svm_adult.py --seeds 2
  python experiments/yuan2023/fig7_9_svm_adult.py --seeds 5 --basis certified
"""

from __future__ import annotations

import argparse
import math
import textwrap
import time

import common

M_GRID_FIG9 = (5, 10, 20, 30, 40, 50)
SAMPLES = 325  # Adult records per client
EPSILONS = (5.0, 10.0, 20.0, float("inf"))


def svm_config(rounds: int):
  cfg = common.mlp_config(rounds=rounds, samples=SAMPLES)
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
  fig.suptitle(textwrap.fill(title, 120), fontsize=9)  # long settings wrap, not clip
  common.savefig(fig, name)


def with_m_star(curve, group):
  best = curve.loc[curve.groupby(group)["test_loss_mean"].idxmin()]
  return curve.merge(best[[group, "rounds"]].rename(columns={"rounds": "m_star"}), on=group)


def certified_points(cfg, thetas, epsilons, m_grid, seeds: int, name: str):
  """Final rows at the equal-certified noise of every (theta, eps, M) (module
  docstring); ``privacy.epsilon`` is the certified target."""
  points = [(t, e, m, common.equal_certified_epsilon(t, m, e, SAMPLES) if math.isfinite(e)
             else e) for t in thetas for e in epsilons for m in m_grid]
  df = common.run_points(cfg, [{"schedule.theta": t, "rounds": m, "privacy.epsilon": r}
                               for t, _, m, r in points], seeds, name)
  target = {(t, m, r): e for t, e, m, r in points}
  df["privacy.epsilon"] = [target[(float(t), int(m), float(r))] for t, m, r in
                           zip(df["schedule.theta"], df["rounds"], df["privacy.epsilon"])]
  return df


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=2)
  ap.add_argument("--basis", choices=["claimed", "certified"], default="claimed",
                  help="claimed: eq. (8) at eps; certified: the noise that certifies eps "
                       "at the paper's Delta_s (module docstring)")
  args = ap.parse_args(argv)
  start = time.time()
  sfx = "" if args.basis == "claimed" else f"_{args.basis}"
  cols = ["test_loss", "test_accuracy", "epsilon_claimed", "epsilon_certified"]
  m7 = max(common.M_GRID)
  if args.basis == "claimed":
    df = common.final_rows(common.run_grid(
        svm_config(m7), {"rounds": list(common.M_GRID), "schedule.theta": list(common.THETAS),
                         "seed": common.seeds(args.seeds)}, "fig7", [f"eval.every={m7}"]))
  else:
    cfg = svm_config(m7)
    cfg.eval.every = m7
    df = certified_points(cfg, common.THETAS, [common.EPS], common.M_GRID, args.seeds,
                          f"fig7{sfx}")
  curve = with_m_star(common.mean_std(df, ["schedule.theta", "rounds"], cols), "schedule.theta")
  common.write(curve, f"fig7_svm_theta{sfx}")
  print(curve[curve["rounds"] == curve["m_star"]].to_string(index=False))
  plot(curve, "schedule.theta", common.label, f"fig7_svm_theta{sfx}",
       f"Yuan Fig. 7: SVM/Adult, eps=10 ({'eq. 8' if not sfx else 'certified'}), "
       f"{args.seeds} seeds")

  m9 = max(M_GRID_FIG9)
  if args.basis == "claimed":
    df = common.final_rows(common.run_grid(
        svm_config(m9), {"rounds": list(M_GRID_FIG9), "privacy.epsilon": list(EPSILONS),
                         "seed": common.seeds(args.seeds)}, "fig9",
        ["schedule.theta=1.05", f"eval.every={m9}"]))
  else:
    cfg = svm_config(m9)
    cfg.eval.every = m9
    df = certified_points(cfg, [1.05], EPSILONS, M_GRID_FIG9, args.seeds, f"fig9{sfx}")
  curve = with_m_star(common.mean_std(df, ["privacy.epsilon", "rounds"], cols), "privacy.epsilon")
  common.write(curve, f"fig9_svm_epsilon{sfx}")
  print(curve[curve["rounds"] == curve["m_star"]].to_string(index=False))
  plot(curve, "privacy.epsilon", lambda e: "no DP" if e == float("inf") else f"eps={e:g}",
       f"fig9_svm_epsilon{sfx}", f"Yuan Fig. 9: SVM/Adult, theta=1.05"
       f"{', certified eps' if sfx else ''}, {args.seeds} seeds")
  common.save_meta(f"fig7_9_svm_adult{sfx}", start, seeds=args.seeds, basis=args.basis)


if __name__ == "__main__":
  main()
