"""Fu et al. Fig. 4: final test accuracy of the CNN against T (E = 5), Gaussian noise.

Fu's FEMNIST CNN (``cnn_fu_femnist``, 10 classes) on real MNIST with ``writer_like``
clients (FEMNIST is not available, REPRODUCTION.md), L2 clipping zeta = 3 per local
step, Gaussian noise of Theorem 2 (spec A6's c_2, delta = 1e-4). Each T is its own run
(sigma grows like sqrt(T_l)); T_g = T / 5 rounds over ``--rounds`` x epsilon x seeds run
as ONE sweep (T is host-side). The paper's grid is T in {0, 50, ..., 500} with N = 3,500,
b = 350 (T_l = T b / (N E) in {1, ..., 10}); the default here (``common.CNN_FIG4``) is
N = 1,600 one-image clients, b = 160 (b / N = 1/10, E = 5, zeta = 3 as in the paper),
the paper's eps in {10, 20, 30, inf} and T_g in {10, 20, 50, 100} (T = 50..500, T_l =
b T_g / N = 1, 2, 5, 10: the paper's range), 5 seeds: 35 minutes on 2 idle CPU cores.
Many clients per round matter more than images per client for the cost: the mean of b
uploads has noise std ``sigma eta E zeta / sqrt(b)`` per coordinate, so at b = 2
(``common.CNN``, Figs. 2 and 6) every DP run stays at chance. One-image clients give a
weaker signal than the paper's ~230-image writers, though (``fig4_signal.py``);
``--epsilons 51,118,195 --name fig4_cnn_T_snr`` runs the noise levels that match the
paper's per-round signal-to-noise at its eps = 10, 20, 30 (REPRODUCTION.md, item 11).

Writes ``results/<name>.{csv,png}``, ``_meta.json`` and ``results/<name>_verdict.csv``
(at chance / plateau / decline / collapse per epsilon, by the rule of
:func:`common.plateau_verdicts`, fixed before the runs). Run from the repository root::

  python experiments/fu2023/fig4_cnn_T.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--rounds", default="10,20,50,100", help="T_g grid (T = 5 T_g)")
  ap.add_argument("--epsilons", default="10,20,30,inf")
  common.add_federation_args(ap, common.CNN_FIG4)
  ap.add_argument("--name", default="fig4_cnn_T",
                  help="results/<name>.* (and runs/fu2023/<name>) for a variant run")
  ap.add_argument("--note", default="", help="a line added to the plot's title")
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.federation_config(args)
  cfg.name = "fu_fig4"
  rows = common.repro.run_sweep(cfg, {"rounds": [int(r) for r in args.rounds.split(",")],
                                      "privacy.epsilon": [float(e) for e in
                                                          args.epsilons.split(",")],
                                      "seed": list(range(args.seeds))},
                                str(common.RUNS / ("fig4" if args.name == "fig4_cnn_T" else args.name)))
  fin = common.finals(pd.DataFrame(rows), int(cfg.client.local_steps))
  curve = common.mean_std(fin, ["privacy.epsilon", "T"],
                          ["test_accuracy", "test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, args.name)
  # The claim as a test (common.plateau_verdicts): plateau, decline or collapse per eps.
  verdicts = common.plateau_verdicts(fin, chance=0.1)
  common.write(verdicts, f"{args.name}_verdict")
  common.plot_curves(curve, "T", "test_accuracy", args.name,
                     f"Fu Fig. 4 (reduced): CNN / Gaussian, MNIST, E = 5, N = {args.clients}, "
                     f"b = {args.per_round}, {args.seeds} seeds" + (f"\n{args.note}" if args.note else ""),
                     xlabel="total iterations T", ylabel="final test accuracy (mean +- std)",
                     reference=common.CHANCE_LINE)
  pd.set_option("display.width", 200)
  print(curve[["privacy.epsilon", "T", "test_accuracy_mean", "test_accuracy_std",
               "epsilon_claimed_mean", "epsilon_certified_mean"]].to_string())
  print(verdicts.to_string())
  common.save_meta(args.name, start, seeds=args.seeds, rounds=args.rounds,
                   **common.federation_meta(args))


if __name__ == "__main__":
  main()
