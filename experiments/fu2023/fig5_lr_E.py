"""Fu et al. Fig. 5 + Table III: final test MSE of the LR task against E at T = 120.

Lending Club linear regression, Laplace noise (Theorem 1). T = E T_g = 120 fixed, so
T_g = 120 / E and T_l = T_g / 10; the per-upload scale beta = T_l eta E zeta / eps is
the same for every E (T_l E = 12), so a larger E means fewer noisy rounds. The paper's
grid E in {1, 2, 3, 4, 6, 12}; ``--e-grid`` adds 24, 40, 60, 120 (T_g down to 1) to see
where the curve turns when the paper's grid ends too early. One sweep per E (its own
compiled round) over epsilon x seeds. Writes ``results/fig5_lr_E.{csv,png}`` and
``results/table3_lr_E.csv`` (best E per epsilon on the paper's grid and on the
extended one). Run from the repository root::

  python experiments/fu2023/fig5_lr_E.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd

PAPER = {1.0: (12, 40.44, 3568.41), 3.0: (3, 25.95, 28.78), 5.0: (2, 23.94, 26.65),
         common.INF: (1, 22.58, 26.14)}
PAPER_E = (1, 2, 3, 4, 6, 12)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--total", type=int, default=120)
  ap.add_argument("--e-grid", default="1,2,3,4,6,12,24,40,60,120")
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.lr_config()
  cfg.name = "fu_fig5"
  es = [int(e) for e in args.e_grid.split(",")]
  bad = [e for e in es if args.total % e]
  if bad:
    raise SystemExit(f"--e-grid: {bad} do not divide --total {args.total}")
  df = common.run_pairs(cfg, [(e, args.total // e) for e in es],
                        {"privacy.epsilon": list(common.LR_EPSILONS),
                         "seed": list(range(args.seeds))}, "fig5")
  fin = common.finals(df)
  curve = common.mean_std(fin, ["privacy.epsilon", "E"],
                          ["test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, "fig5_lr_E")
  paper = common.best_per(curve[curve["E"].isin(PAPER_E)], "privacy.epsilon", "E", "test_loss")
  ext = common.best_per(curve, "privacy.epsilon", "E", "test_loss")
  table = paper.merge(ext[["privacy.epsilon", "best_E", "test_loss_at_best", "interior"]],
                      on="privacy.epsilon", suffixes=("", "_extended_grid"))
  table["paper_best_E"] = [PAPER[e][0] for e in table["privacy.epsilon"]]
  table["paper_loss_at_best"] = [PAPER[e][1] for e in table["privacy.epsilon"]]
  table["paper_worst"] = [PAPER[e][2] for e in table["privacy.epsilon"]]
  common.write(table, "table3_lr_E")
  common.plot_curves(
      curve, "E", "test_loss", "fig5_lr_E",
      f"Fu Fig. 5: LR / Laplace, T = {args.total} (mean +- std, {args.seeds} seeds); "
      f"paper's grid ends at E = 12", xlabel="local iterations E", ylabel="final test MSE",
      logy=True, extra=lambda ax: ax.set_xscale("log"))
  pd.set_option("display.width", 250)
  print(table.to_string())
  common.save_meta("fig5_lr_E", start, seeds=args.seeds)


if __name__ == "__main__":
  main()
