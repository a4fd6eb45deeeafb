"""Fu et al. Fig. 2: test accuracy of the CNN over the iterations k for each epsilon.

Fu's FEMNIST CNN on real MNIST with ``writer_like`` clients (REPRODUCTION.md), L2
clipping zeta = 3 per local step, Gaussian noise of Theorem 2 (spec A6's c_2, delta =
1e-4), E = 5. The paper runs T = 250 (T_g = 50) with N = 3,500, b = 350; the default
here is the reduced federation of ``common.CNN`` and ``--rounds`` T_g. One sweep over
epsilon x seeds, evaluated every ``--eval-every`` rounds. Writes
``results/fig2_cnn_epsilon.{csv,png}``; ``--clients``, ``--per-round``, ``--samples``,
``--size-sigma`` run another federation under ``--name`` (``federation_cost.py``
measures what each costs). Run from the repository root::

  python experiments/fu2023/fig2_cnn_epsilon.py
  python experiments/fu2023/fig2_cnn_epsilon.py --clients 350 --per-round 35 --samples 17 \
      --size-sigma 0 --name fig2_cnn_epsilon_n350_b35
"""

from __future__ import annotations

import argparse

import common
import pandas as pd


def draw(curve, args) -> None:
  seeds = int(curve["test_accuracy_count"].max())
  common.plot_curves(curve, "k", "test_accuracy", args.name,
                     f"Fu Fig. 2 (reduced): CNN / Gaussian on MNIST, E = 5, N = {args.clients}, "
                     f"b = {args.per_round} (mean +- std, {seeds} seeds)", xlabel="iteration k",
                     ylabel="test accuracy", reference=common.CHANCE_LINE)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--rounds", type=int, default=50, help="T_g (T = 5 T_g)")
  ap.add_argument("--eval-every", type=int, default=5)
  ap.add_argument("--epsilons", default="10,20,30,inf")
  ap.add_argument("--name", default="fig2_cnn_epsilon",
                  help="results/<name>.* (and runs/fu2023/<name>) for another federation")
  common.add_federation_args(ap, common.CNN)
  common.add_replot_arg(ap)
  args = ap.parse_args(argv)
  if args.replot:
    return draw(common.committed(args.name), args)
  start = common.now()
  cfg = common.federation_config(args)
  cfg.name = "fu_fig2"
  cfg.rounds = args.rounds
  cfg.eval.every = args.eval_every
  rows = common.repro.run_sweep(cfg, {"privacy.epsilon": [float(e) for e in
                                                          args.epsilons.split(",")],
                                      "seed": list(range(args.seeds))},
                                str(common.RUNS / ("fig2" if args.name == "fig2_cnn_epsilon"
                                                   else args.name)))
  df = pd.DataFrame(rows)
  df = df[df["test_loss"].notna()].copy()
  df["k"] = df["round"] * int(cfg.client.local_steps)
  curve = common.mean_std(df, ["privacy.epsilon", "k"],
                          ["test_accuracy", "test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, args.name)
  draw(curve, args)
  final = curve[curve["k"] == curve["k"].max()]
  print(final[["privacy.epsilon", "k", "test_accuracy_mean", "test_accuracy_std",
               "epsilon_claimed_mean", "epsilon_certified_mean"]].to_string())
  common.save_meta(args.name, start, seeds=args.seeds, **common.federation_meta(args))


if __name__ == "__main__":
  main()
