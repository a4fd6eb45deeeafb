"""Fu et al. Fig. 4: final test accuracy of the CNN against T (E = 5), Gaussian noise.

Fu's FEMNIST CNN (``cnn_fu_femnist``, 10 classes) on real MNIST with ``writer_like``
clients (FEMNIST is not available, REPRODUCTION.md), L2 clipping zeta = 3 per local
step, Gaussian noise of Theorem 2 (spec A6's c_2, delta = 1e-4). Each T is its own run
(sigma grows like sqrt(T_l)); T_g = T / 5 rounds over ``--rounds`` x epsilon x seeds run
as ONE sweep (T is host-side). The paper's grid is T in {0, 50, ..., 500} with N = 3,500,
b = 350 (T_l = T b / (N E) in {1, ..., 10}); the default here (``common.CNN_FIG4``) is
N = 1,600 one-image clients, b = 160 (b / N = 1/10, E = 5, zeta = 3 as in the paper) and
T_g in {5, 10, 20, 40} (T = 25..200, T_l = ceil(b T_g / N) = 1, 1, 2, 4), what 2
shared CPU cores finish in ~15 minutes. Many clients per round matter more than
images per client: the mean of b uploads has noise std ``sigma eta E zeta / sqrt(b)``
per coordinate, so at b = 2 (``common.CNN``, Figs. 2 and 6) every DP run stays at
chance. Writes ``results/fig4_cnn_T.{csv,png}``, ``_meta.json`` and
``results/fig4_cnn_T_verdict.csv`` (plateau / decline / collapse per epsilon, by the
rule of :func:`common.plateau_verdicts`). Run from the
repository root::

  python experiments/fu2023/fig4_cnn_T.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--rounds", default="5,10,20,40", help="T_g grid (T = 5 T_g)")
  ap.add_argument("--epsilons", default="10,30,inf")
  d = common.CNN_FIG4
  ap.add_argument("--clients", type=int, default=d["num_clients"], help="N")
  ap.add_argument("--per-round", type=int, default=d["clients_per_round"], help="b")
  ap.add_argument("--samples", type=int, default=d["samples_per_client"],
                  help="mean images per client")
  ap.add_argument("--size-sigma", type=float, default=d["size_sigma"],
                  help="log-normal spread of client sizes (0 = equal)")
  ap.add_argument("--lr", type=float, default=d["lr"], help="eta")
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.cnn_config(num_clients=args.clients, clients_per_round=args.per_round,
                          samples_per_client=args.samples, size_sigma=args.size_sigma,
                          lr=args.lr)
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
  # The claim as a test (common.plateau_verdicts): plateau, decline or collapse per eps.
  verdicts = common.plateau_verdicts(fin, chance=0.1)
  common.write(verdicts, "fig4_cnn_T_verdict")
  common.plot_curves(curve, "T", "test_accuracy", "fig4_cnn_T",
                     f"Fu Fig. 4 (reduced): CNN / Gaussian on MNIST, E = 5, N = {args.clients}, "
                     f"b = {args.per_round} (mean +- std, {args.seeds} seeds)",
                     xlabel="total iterations T", ylabel="final test accuracy")
  pd.set_option("display.width", 200)
  print(curve[["privacy.epsilon", "T", "test_accuracy_mean", "test_accuracy_std",
               "epsilon_claimed_mean", "epsilon_certified_mean"]].to_string())
  print(verdicts.to_string())
  common.save_meta("fig4_cnn_T", start, seeds=args.seeds, clients=args.clients,
                   per_round=args.per_round, samples=args.samples,
                   size_sigma=args.size_sigma, lr=args.lr, rounds=args.rounds)


if __name__ == "__main__":
  main()
