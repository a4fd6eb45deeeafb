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


def draw(curve, cfg, args) -> None:
  seeds = int(curve["test_loss_count"].max())
  sfx = common.basis_suffix(args)
  common.plot_curves(
      curve, "E", "test_loss", f"fig5_lr_E{sfx}",
      f"Fu Fig. 5: LR / Laplace{', noise certified at eps' if sfx else ''}, T = {args.total} "
      f"(mean +- std, {seeds} seeds); "
      f"paper's grid ends at E = 12", xlabel="local iterations E", ylabel="final test MSE",
      logy=True, extra=lambda ax: ax.set_xscale("log"), reference=common.zero_model_line(cfg))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--total", type=int, default=120)
  ap.add_argument("--e-grid", default="1,2,3,4,6,12,24,40,60,120")
  common.add_replot_arg(ap)
  common.add_basis_arg(ap)
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.lr_config()
  cfg.name = "fu_fig5"
  cfg.privacy.formula = common.FORMULA[args.basis]
  sfx = common.basis_suffix(args)
  if args.replot:
    return draw(common.committed(f"fig5_lr_E{sfx}"), cfg, args)
  es = [int(e) for e in args.e_grid.split(",")]
  bad = [e for e in es if args.total % e]
  if bad:
    raise SystemExit(f"--e-grid: {bad} do not divide --total {args.total}")
  df = common.run_pairs(cfg, [(e, args.total // e) for e in es],
                        {"privacy.epsilon": list(common.LR_EPSILONS),
                         "seed": list(range(args.seeds))}, f"fig5{sfx}")
  fin = common.finals(df)
  curve = common.mean_std(fin, ["privacy.epsilon", "E"],
                          ["test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, f"fig5_lr_E{sfx}")
  paper = common.best_per(curve[curve["E"].isin(PAPER_E)], "privacy.epsilon", "E", "test_loss")
  ext = common.best_per(curve, "privacy.epsilon", "E", "test_loss")
  table = paper.merge(ext[["privacy.epsilon", "best_E", "test_loss_at_best", "interior"]],
                      on="privacy.epsilon", suffixes=("", "_extended_grid"))
  table["paper_best_E"] = [PAPER[e][0] for e in table["privacy.epsilon"]]
  table["paper_loss_at_best"] = [PAPER[e][1] for e in table["privacy.epsilon"]]
  table["paper_worst"] = [PAPER[e][2] for e in table["privacy.epsilon"]]
  common.write(table, f"table3_lr_E{sfx}")
  draw(curve, cfg, args)
  pd.set_option("display.width", 250)
  print(table.to_string())
  common.save_meta(f"fig5_lr_E{sfx}", start, seeds=args.seeds, basis=args.basis)


if __name__ == "__main__":
  main()
