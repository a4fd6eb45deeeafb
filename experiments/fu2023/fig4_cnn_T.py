"""Fu et al. Fig. 4: final test accuracy of the CNN against T (E = 5), Gaussian noise.

Fu's FEMNIST CNN (``cnn_fu_femnist``, 10 classes) on real MNIST with ``writer_like``
clients (FEMNIST is not available, REPRODUCTION.md), L2 clipping zeta = 3 per local
step, Gaussian noise of Theorem 2 (spec A6's c_2, delta = 1e-4). Each T is its own run
(sigma grows like sqrt(T_l)); T_g = T / 5 rounds over ``--rounds`` x epsilon x seeds run
as ONE sweep (T is host-side). The paper's grid is T in {0, 50, ..., 500} with N = 3,500,
b = 350; the default here is a reduced federation (``common.CNN``) and T_g in
{2, 4, 8, 16} (T = 10..80), what 2 shared CPU cores finish in minutes. Writes
``results/fig4_cnn_T.{csv,png}``. Run from the repository root::

  python experiments/fu2023/fig4_cnn_T.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--rounds", default="2,4,8,16", help="T_g grid (T = 5 T_g)")
  ap.add_argument("--epsilons", default="10,30,inf")
  ap.add_argument("--clients", type=int, default=common.CNN["num_clients"])
  ap.add_argument("--per-round", type=int, default=common.CNN["clients_per_round"])
  ap.add_argument("--samples", type=int, default=common.CNN["samples_per_client"])
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.cnn_config(num_clients=args.clients, clients_per_round=args.per_round,
                          samples_per_client=args.samples)
  cfg.name = "fu_fig4"
  rows = common.sweep.run_sweep(cfg, {"rounds": [int(r) for r in args.rounds.split(",")],
                                      "privacy.epsilon": [float(e) for e in
                                                          args.epsilons.split(",")],
                                      "seed": list(range(args.seeds))},
                                str(common.RUNS / "fig4"))
  fin = common.finals(pd.DataFrame(rows), int(cfg.client.local_steps))
  curve = common.mean_std(fin, ["privacy.epsilon", "T"],
                          ["test_accuracy", "test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, "fig4_cnn_T")
  common.plot_curves(curve, "T", "test_accuracy", "fig4_cnn_T",
                     f"Fu Fig. 4 (reduced): CNN / Gaussian on MNIST, E = 5, N = {args.clients}, "
                     f"b = {args.per_round} (mean +- std, {args.seeds} seeds)",
                     xlabel="total iterations T", ylabel="final test accuracy")
  pd.set_option("display.width", 200)
  print(curve[["privacy.epsilon", "T", "test_accuracy_mean", "test_accuracy_std",
               "epsilon_claimed_mean", "epsilon_certified_mean"]].to_string())
  common.save_meta("fig4_cnn_T", start, seeds=args.seeds, clients=args.clients,
                   per_round=args.per_round)


if __name__ == "__main__":
  main()
