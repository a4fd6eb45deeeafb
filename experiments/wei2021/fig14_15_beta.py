"""Wei et al. Figs. 14/15: CRD's discount factor beta in {0.5, ..., 0.9}.

MNIST MLP, K = U = 50, T0 = 200, zeta = 1e-3, epsilon in {4, 12} (the paper's value
is not given); by default the added noise regime (|D_i| = 100), ``--regime paper --lr
ETA --clip C`` the paper's |D_i| = 800 at a calibrated setting. Fig. 14: final test
loss vs beta; Fig. 15: communication rounds consumed vs beta (paper: larger beta,
slower decay of T, more rounds; beta = 0.8 best loss).

Writes ``results/fig14_15_beta.{csv,png}`` (noise regime) or
``results/fig14_15_beta_<regime><tag>.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig14_15_beta.py
  python experiments/wei2021/fig14_15_beta.py --regime paper --lr 2 --clip 0.5 --tag _cal
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
  common.add_setting_args(ap)
  args = ap.parse_args(argv)
  start = time.time()
  name = common.setting_name("fig14_15_beta", args)
  cfg = common.setting_config(args)
  cfg.name = "wei_fig14_15_beta"
  df = common.crd_sweep(cfg, {"schedule.beta": [float(b) for b in args.betas.split(",")],
                              "privacy.epsilon": [float(e) for e in args.epsilons.split(",")],
                              "seed": list(range(args.seeds))}, name)
  table = common.final_table(df, ["privacy.epsilon", "schedule.beta"],
                             ["test_loss", "test_accuracy", "rounds_used", "epsilon_certified"])
  common.write(table, name)
  common.figure(table, "schedule.beta", [("test_loss", "CRD final test loss (Fig. 14)"),
                                         ("rounds_used", "rounds consumed (Fig. 15)")],
                "privacy.epsilon", f"Wei et al. Figs. 14/15 ({args.regime} regime, K/U = 1, "
                f"T0 = 200, {args.seeds} seeds)", name, xlabel="beta",
                label=lambda e: f"eps={e:g}")
  print(table.to_string())
  common.save_meta(name, start, setting=common.setting_meta(cfg))


if __name__ == "__main__":
  main()
