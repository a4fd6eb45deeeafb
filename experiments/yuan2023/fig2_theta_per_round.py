"""Yuan et al. Fig. 2: test loss and accuracy per aggregation m for the five theta (M = 30).

MLP 784-32-10 on MNIST (``common.mlp_config``), eps = 10, sigma from eq. (8) as
printed for M = 30, theta in {0.9, 0.95, 1, 1.05, 1.1}, beside the Laplace baseline
(b = M Delta_s / eps, and the variance-matched b) and no DP. The theta x seed grid
is one sweep (one compiled program); each baseline is one sweep over the seeds.

Writes ``results/fig2_theta_per_round.csv`` (mean/std over seeds per curve and
round), ``results/fig2_best_round.csv`` (per curve: round of minimal mean test loss,
that loss, the final loss; checklist items 6, 7, 11) and the PNG. From the
repository root::

  python experiments/yuan2023/fig2_theta_per_round.py --seeds 3
  python experiments/yuan2023/fig2_theta_per_round.py --seeds 3 --samples 100   # 6x noise
"""

from __future__ import annotations

import argparse
import time

import common
import pandas as pd


def per_round(seeds: int, samples: int) -> pd.DataFrame:
  cfg = common.mlp_config(samples=samples)
  tag = common.tag(samples)
  grid = {"schedule.theta": list(common.THETAS), "seed": common.seeds(seeds)}
  df = common.run_grid(cfg, grid, f"fig2{tag}")
  df["curve"] = df["schedule.theta"].map(common.label)
  frames = [df]
  for i, (name, sets) in enumerate(common.BASELINES.items()):
    b = common.run_grid(cfg, {"seed": common.seeds(seeds)}, f"fig2{tag}_base{i}", sets)
    b["curve"], b["schedule.theta"] = name, float("nan")
    frames.append(b)
  return pd.concat(frames, ignore_index=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--samples", type=int, default=600,
                  help="examples per client (100: the 6x-noise regime, outputs *_n100)")
  args = ap.parse_args(argv)
  start = time.time()
  tag = common.tag(args.samples)
  df = per_round(args.seeds, args.samples)
  cols = ["test_loss", "test_accuracy", "epsilon_claimed", "epsilon_certified", "noise_mean"]
  table = common.mean_std(df, ["curve", "round"], cols)
  order = {c: i for i, c in enumerate(df["curve"].unique())}
  table = table.sort_values(["curve", "round"], key=lambda s: s.map(order) if s.name == "curve"
                            else s).reset_index(drop=True)
  common.write(table, f"fig2_theta_per_round{tag}")
  best = []
  for curve, t in table.groupby("curve", sort=False):
    i = t["test_loss_mean"].idxmin()
    j = t["test_accuracy_mean"].idxmax()
    last = t.iloc[-1]
    best.append({"curve": curve, "best_round": int(t.loc[i, "round"]),
                 "min_loss": t.loc[i, "test_loss_mean"], "min_loss_std": t.loc[i, "test_loss_std"],
                 "best_acc_round": int(t.loc[j, "round"]), "max_acc": t.loc[j, "test_accuracy_mean"],
                 "final_loss": last["test_loss_mean"], "final_loss_std": last["test_loss_std"],
                 "final_acc": last["test_accuracy_mean"],
                 "eps_claimed": last["epsilon_claimed_mean"],
                 "eps_certified": last["epsilon_certified_mean"]})
  best = pd.DataFrame(best)
  common.write(best, f"fig2_best_round{tag}")
  print(best.to_string(index=False))
  common.loss_acc_panels(
      table, "curve", str, "round", "aggregation m",
      f"Yuan Fig. 2: MLP/MNIST, {args.samples}/client, eps=10 (eq. 8), M=30, "
      f"{args.seeds} seeds (band: +-1 std)", f"fig2_theta_per_round{tag}",
      final=False, band=True, style_of=lambda lab: "--" if lab.startswith(("Lap", "no")) else "-", legend_size=7)
  common.save_meta(f"fig2_theta_per_round{tag}", start, seeds=args.seeds, samples=args.samples)


if __name__ == "__main__":
  main()
