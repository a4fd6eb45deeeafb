"""Wei et al. Fig. 7: CRD's final loss for initial T0 from 150 to 300.

MNIST MLP, K = U = 50, beta = 0.9, zeta = 1e-3, epsilon in {4, 12, 20}, T0 in
{100, 150, 200, 250, 300} (100 added below the paper's range, to show the other side
of the optimum); by default the added noise regime (|D_i| = 100, see ``common.py``),
``--regime paper --lr ETA --clip C`` the paper's |D_i| = 800 at a calibrated setting.
The paper's claim: CRD converges better when T0 is closer to the optimal T of Figs.
5/6 (``results/fig5_6_loss_vs_T_<regime>_q1*.csv`` holds that optimum).

Writes ``results/fig7_initial_T.{csv,png}`` (noise regime) or
``results/fig7_initial_T_<regime><tag>.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig7_initial_T.py
  python experiments/wei2021/fig7_initial_T.py --regime paper --lr 2 --clip 0.5 --tag _cal
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
  common.add_setting_args(ap)
  args = ap.parse_args(argv)
  start = time.time()
  name = common.setting_name("fig7_initial_T", args)
  cfg = common.setting_config(args)
  cfg.name = "wei_fig7_initial_T"
  df = common.crd_sweep(cfg, {"rounds": [int(t) for t in args.t0.split(",")],
                              "privacy.epsilon": [float(e) for e in args.epsilons.split(",")],
                              "seed": list(range(args.seeds))}, name)
  table = common.final_table(df, ["privacy.epsilon", "rounds"],
                             ["test_loss", "test_accuracy", "rounds_used", "epsilon_certified"])
  table = table.rename(columns={"rounds": "initial_T"})
  common.write(table, name)
  common.figure(table, "initial_T", [("test_loss", "CRD final test loss"),
                                     ("rounds_used", "rounds CRD used")],
                "privacy.epsilon", f"Wei et al. Fig. 7: CRD vs initial T ({args.regime} "
                f"regime, K/U = 1, {args.seeds} seeds)", name, xlabel="initial T0",
                label=lambda e: f"eps={e:g}")
  print(table.to_string())
  common.save_meta(name, start, setting=common.setting_meta(cfg))


if __name__ == "__main__":
  main()
