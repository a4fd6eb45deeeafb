"""Fu et al. Fig. 1: test MSE over the iterations k of the LR task for each epsilon.

Lending Club linear regression, Laplace noise (Theorem 1), T = 100 iterations with
E = 1 (T_g = 100 rounds, T_l = 10 turns per client), epsilon in {1, 3, 5, inf}; the
setting of ``common.lr_config`` (N = 1,000 clients of 8 loans, b = 100). One sweep
over epsilon x seeds, evaluated after every round. Writes
``results/fig1_lr_epsilon.{csv,png}`` (mean, std over seeds per k) and
``fig1_lr_epsilon_final.csv``. Run from the repository root::

  python experiments/fu2023/fig1_lr_epsilon.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=100)
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.lr_config()
  cfg.name = "fu_fig1"
  cfg.rounds = args.rounds
  cfg.eval.every = 1
  rows = common.repro.run_sweep(cfg, {"privacy.epsilon": list(common.LR_EPSILONS),
                                      "seed": list(range(args.seeds))},
                                str(common.RUNS / "fig1"))
  df = pd.DataFrame(rows)
  df = df[df["test_loss"].notna()].rename(columns={"round": "k"})
  curve = common.mean_std(df, ["privacy.epsilon", "k"],
                          ["test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, "fig1_lr_epsilon")
  final = curve[curve["k"] == curve["k"].max()]
  common.write(final, "fig1_lr_epsilon_final")
  common.plot_curves(curve, "k", "test_loss", "fig1_lr_epsilon",
                     f"Fu Fig. 1: LR / Laplace, T = {args.rounds}, E = 1 "
                     f"(mean +- std, {args.seeds} seeds)",
                     xlabel="iteration k", ylabel="test MSE", logy=True)
  print(final[["privacy.epsilon", "k", "test_loss_mean", "test_loss_std",
               "epsilon_claimed_mean", "epsilon_certified_mean"]].to_string())
  common.save_meta("fig1_lr_epsilon", start, seeds=args.seeds)


if __name__ == "__main__":
  main()
