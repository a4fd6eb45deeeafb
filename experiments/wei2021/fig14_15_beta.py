"""Wei et al. Figs. 14/15: CRD's discount factor beta in {0.5, ..., 0.9}.

MNIST MLP, noise regime (|D_i| = 100), K = U = 50, T0 = 200, zeta = 1e-3,
epsilon in {4, 12} (the paper's value is not given). Fig. 14: final test loss vs
beta; Fig. 15: communication rounds consumed vs beta (paper: larger beta, slower
decay of T, more rounds; beta = 0.8 best loss).

Writes ``results/fig14_15_beta.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig14_15_beta.py
"""

from __future__ import annotations

import argparse
import time

import common


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--epsilons", default="4,12")
  ap.add_argument("--betas", default="0.5,0.6,0.7,0.8,0.9")
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.mlp_config("noise", 1.0)
  cfg.name = "wei_fig14_15_beta"
  df = common.crd_sweep(cfg, {"schedule.beta": [float(b) for b in args.betas.split(",")],
                              "privacy.epsilon": [float(e) for e in args.epsilons.split(",")],
                              "seed": list(range(args.seeds))}, "fig14_15_beta")
  table = common.final_table(df, ["privacy.epsilon", "schedule.beta"],
                             ["test_loss", "test_accuracy", "rounds_used", "epsilon_certified"])
  common.write(table, "fig14_15_beta")
  common.figure(table, "schedule.beta", [("test_loss", "CRD final test loss (Fig. 14)"),
                                         ("rounds_used", "rounds consumed (Fig. 15)")],
                "privacy.epsilon", "Wei et al. Figs. 14/15 (noise regime, K/U = 1, T0 = 200, "
                f"{args.seeds} seeds)", "fig14_15_beta", xlabel="beta",
                label=lambda e: f"eps={e:g}")
  print(table.to_string())
  common.save_meta("fig14_15_beta", start)


if __name__ == "__main__":
  main()
