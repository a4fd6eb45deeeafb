"""Yuan et al. Fig. 4: final test loss/accuracy against M for several eps at theta = 1.05.

MLP/MNIST as in Fig. 3 with theta = 1.05 and eps in {5, 10, 20, 40, inf} (inf = no
DP; the paper lists no values beyond "eps >= 20" and no DP). M x eps x seed is ONE
sweep. Writes ``results/fig4_epsilon.csv`` (mean/std per eps and M, with the
measured M* per eps) and the PNG. From the repository root::

  python experiments/yuan2023/fig4_epsilon.py --seeds 2
  python experiments/yuan2023/fig4_epsilon.py --seeds 2 --samples 100   # 6x noise, *_n100
"""

from __future__ import annotations

import argparse
import time

import common

EPSILONS = (5.0, 10.0, 20.0, 40.0, float("inf"))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=2)
  ap.add_argument("--m-grid", default=",".join(map(str, common.M_GRID)))
  ap.add_argument("--samples", type=int, default=600,
                  help="examples per client (100: the 6x-noise regime, outputs *_n100)")
  args = ap.parse_args(argv)
  tag = common.tag(args.samples)
  m_grid = [int(v) for v in args.m_grid.split(",")]
  start = time.time()
  cfg = common.mlp_config(rounds=max(m_grid), samples=args.samples)
  grid = {"rounds": m_grid, "privacy.epsilon": list(EPSILONS), "seed": common.seeds(args.seeds)}
  df = common.final_rows(common.run_grid(cfg, grid, f"fig4{tag}",
                                         ["schedule.theta=1.05", f"eval.every={max(m_grid)}"]))
  curve = common.mean_std(df, ["privacy.epsilon", "rounds"],
                          ["test_loss", "test_accuracy", "epsilon_claimed"])
  best = curve.loc[curve.groupby("privacy.epsilon")["test_loss_mean"].idxmin()]
  curve = curve.merge(best[["privacy.epsilon", "rounds"]].rename(columns={"rounds": "m_star"}),
                      on="privacy.epsilon")
  common.write(curve, f"fig4_epsilon{tag}")
  print(best[["privacy.epsilon", "rounds", "test_loss_mean", "test_accuracy_mean"]]
        .to_string(index=False))
  common.loss_acc_panels(
      curve, "privacy.epsilon", lambda e: "no DP" if e == float("inf") else f"eps={e:g}",
      "rounds", "M (aggregations, tau=5)",
      f"Yuan Fig. 4: MLP/MNIST, {args.samples}/client, theta=1.05, eq. (8), {args.seeds} seeds",
      f"fig4_epsilon{tag}")
  common.save_meta(f"fig4_epsilon{tag}", start, seeds=args.seeds, m_grid=m_grid,
                   samples=args.samples)


if __name__ == "__main__":
  main()
