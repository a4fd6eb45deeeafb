"""Fu et al. Fig. 6 + Table IV: final test accuracy of the CNN against E at fixed T.

Fu's FEMNIST CNN on real MNIST with ``writer_like`` clients (REPRODUCTION.md), L2
clipping zeta = 3 per local step, Gaussian noise of Theorem 2 (spec A6's c_2, delta =
1e-4). T = E T_g fixed; the paper's T = 240 and E in {1, 2, 3, 4, 6, 8, 12, 24}. One
sweep per E (its own compiled round) over epsilon x seeds. Writes
``results/fig6_cnn_E.{csv,png}`` and ``results/table4_cnn_E.csv``; ``--clients``,
``--per-round``, ``--samples``, ``--size-sigma`` run another federation under
``--name`` (its table ``<name>_table4.csv``). Run from the repository root::

  python experiments/fu2023/fig6_cnn_E.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd

PAPER = {10.0: (24, 0.4663, 0.0509), 20.0: (12, 0.6347, 0.0521), 30.0: (12, 0.6781, 0.3500),
         common.INF: (2, 0.7470, 0.7088)}


def draw(curve, args) -> None:
  seeds = int(curve["test_accuracy_count"].max())
  common.plot_curves(curve, "E", "test_accuracy", args.name,
                     f"Fu Fig. 6 (reduced): CNN / Gaussian on MNIST, T = {args.total}, "
                     f"N = {args.clients}, b = {args.per_round} "
                     f"(mean +- std, {seeds} seeds)", xlabel="local iterations E",
                     ylabel="final test accuracy", reference=common.CHANCE_LINE)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--total", type=int, default=240)
  ap.add_argument("--e-grid", default="1,2,3,4,6,8,12,24")
  ap.add_argument("--epsilons", default="10,20,30,inf")
  ap.add_argument("--name", default="fig6_cnn_E",
                  help="results/<name>.* (and runs/fu2023/<name>) for another federation")
  common.add_federation_args(ap, common.CNN)
  common.add_replot_arg(ap)
  args = ap.parse_args(argv)
  if args.replot:
    return draw(common.committed(args.name), args)
  start = common.now()
  cfg = common.federation_config(args)
  cfg.name = "fu_fig6"
  es = [int(e) for e in args.e_grid.split(",")]
  bad = [e for e in es if args.total % e]
  if bad:
    raise SystemExit(f"--e-grid: {bad} do not divide --total {args.total}")
  df = common.run_pairs(cfg, [(e, args.total // e) for e in es],
                        {"privacy.epsilon": [float(e) for e in args.epsilons.split(",")],
                         "seed": list(range(args.seeds))},
                        "fig6" if args.name == "fig6_cnn_E" else args.name)
  fin = common.finals(df)
  curve = common.mean_std(fin, ["privacy.epsilon", "E"],
                          ["test_accuracy", "test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, args.name)
  table = common.best_per(curve, "privacy.epsilon", "E", "test_accuracy", lowest=False)
  for i, col in enumerate(("paper_best_E", "paper_acc_at_best", "paper_worst")):
    table[col] = [PAPER.get(e, (None,) * 3)[i] for e in table["privacy.epsilon"]]
  common.write(table, "table4_cnn_E" if args.name == "fig6_cnn_E" else f"{args.name}_table4")
  draw(curve, args)
  pd.set_option("display.width", 200)
  print(table.to_string())
  common.save_meta(args.name, start, seeds=args.seeds, **common.federation_meta(args))


if __name__ == "__main__":
  main()
