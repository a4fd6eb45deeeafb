"""Fu et al. Fig. 3 + Table II: final test MSE of the LR task against T (E = 1).

Lending Club linear regression, Laplace noise (Theorem 1), E = 1 so T_g = T and
T_l = T / 10; each T is a separate run whose noise is sized for its own T (beta =
T_l eta zeta / eps grows with T). T in {10, 20, ..., 100} x epsilon in {1, 3, 5, inf} x
seeds run as ONE sweep (T is host-side: one compiled program). T = 0 is the zero
model (spec A10). Writes ``results/fig3_lr_T.{csv,png}`` (mean, std over seeds) and
``results/table2_lr_T.csv`` (best T per epsilon, its loss, the worst loss, whether the
best T is interior). Run from the repository root::

  python experiments/fu2023/fig3_lr_T.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd

PAPER = {1.0: (10, 27.40, 1963.41), 3.0: (30, 23.55, 26.82), 5.0: (30, 23.13, 24.94),
         common.INF: (100, 22.59, 24.06)}


def draw(curve, cfg, sfx="") -> None:
  seeds = int(curve["test_loss_count"].max())
  common.plot_curves(curve, "T", "test_loss", f"fig3_lr_T{sfx}",
                     f"Fu Fig. 3: LR / Laplace, E = 1 (mean +- std, {seeds} seeds)"
                     + (", noise certified at eps" if sfx else ""),
                     xlabel="total iterations T", ylabel="final test MSE", logy=True,
                     reference=common.zero_model_line(cfg))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--t-grid", default="10,20,30,40,50,60,70,80,90,100")
  common.add_replot_arg(ap)
  common.add_basis_arg(ap)
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.lr_config()
  cfg.name = "fu_fig3"
  cfg.privacy.formula = common.FORMULA[args.basis]
  sfx = common.basis_suffix(args)
  if args.replot:
    return draw(common.committed(f"fig3_lr_T{sfx}"), cfg, sfx)
  grid = [int(t) for t in args.t_grid.split(",")]
  rows = common.repro.run_sweep(cfg, {"rounds": grid, "privacy.epsilon": list(common.LR_EPSILONS),
                                      "seed": list(range(args.seeds))},
                                str(common.RUNS / f"fig3{sfx}"))
  fin = common.finals(pd.DataFrame(rows))
  curve = common.mean_std(fin, ["privacy.epsilon", "T"],
                          ["test_loss", "epsilon_claimed", "epsilon_certified"])
  y0 = common.initial_test_loss(cfg)
  zero = pd.DataFrame([{"privacy.epsilon": e, "T": 0, "test_loss_mean": y0, "test_loss_std": 0.0,
                        "test_loss_count": args.seeds} for e in common.LR_EPSILONS])
  curve = pd.concat([zero, curve], ignore_index=True).sort_values(["privacy.epsilon", "T"])
  common.write(curve, f"fig3_lr_T{sfx}")
  table = common.best_per(curve, "privacy.epsilon", "T", "test_loss")
  table["paper_best_T"] = [PAPER[e][0] for e in table["privacy.epsilon"]]
  table["paper_loss_at_best"] = [PAPER[e][1] for e in table["privacy.epsilon"]]
  table["paper_worst"] = [PAPER[e][2] for e in table["privacy.epsilon"]]
  common.write(table, f"table2_lr_T{sfx}")
  draw(curve, cfg, sfx)
  pd.set_option("display.width", 200)
  print(table.to_string())
  common.save_meta(f"fig3_lr_T{sfx}", start, seeds=args.seeds, basis=args.basis)


if __name__ == "__main__":
  main()
