"""Wei et al. Fig. 7: CRD's final loss for initial T0 from 150 to 300.

MNIST MLP, noise regime (|D_i| = 100, see ``common.py``), K = U = 50, beta = 0.9,
zeta = 1e-3, epsilon in {4, 12, 20}, T0 in {100, 150, 200, 250, 300} (100 added
below the paper's range, to show the other side of the optimum). The paper's
claim: CRD converges better when T0 is closer to the optimal T of Figs. 5/6
(``results/fig5_6_loss_vs_T_noise_q1.csv`` holds that optimum for the same setting).

Writes ``results/fig7_initial_T.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig7_initial_T.py
"""

from __future__ import annotations

import argparse
import time

import common


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--epsilons", default="4,12,20")
  ap.add_argument("--t0", default="100,150,200,250,300")
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.mlp_config("noise", 1.0)
  cfg.name = "wei_fig7_initial_T"
  df = common.crd_sweep(cfg, {"rounds": [int(t) for t in args.t0.split(",")],
                              "privacy.epsilon": [float(e) for e in args.epsilons.split(",")],
                              "seed": list(range(args.seeds))}, "fig7_initial_T")
  table = common.final_table(df, ["privacy.epsilon", "rounds"],
                             ["test_loss", "test_accuracy", "rounds_used", "epsilon_certified"])
  table = table.rename(columns={"rounds": "initial_T"})
  common.write(table, "fig7_initial_T")
  common.figure(table, "initial_T", [("test_loss", "CRD final test loss"),
                                     ("rounds_used", "rounds CRD used")],
                "privacy.epsilon", "Wei et al. Fig. 7: CRD vs initial T (noise regime, "
                f"K/U = 1, {args.seeds} seeds)", "fig7_initial_T", xlabel="initial T0",
                label=lambda e: f"eps={e:g}")
  print(table.to_string())
  common.save_meta("fig7_initial_T", start)


if __name__ == "__main__":
  main()
