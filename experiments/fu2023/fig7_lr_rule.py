"""Fu et al. Fig. 7: final test MSE against T for E = 1, T^(1/3), T^(1/2), T^(2/3), T.

Lending Club linear regression, Laplace noise (Theorem 1), epsilon = 3 and b = N (every
client every round, so T_l = T_g and beta = T eta zeta / eps for every E). E =
round(T^a), T_g = max(1, round(T / E)); the realised T = E T_g is recorded (spec A8).
T in {1, 10, 20, ..., 120}. Theorem 5 predicts the lowest loss at E ~ T^(2/3). One
sweep per distinct E over its T_g values x seeds. Writes
``results/fig7_lr_rule.{csv,png}`` and ``results/fig7_lr_rule_best.csv`` (the best
rule at every T). Run from the repository root::

  python experiments/fu2023/fig7_lr_rule.py
"""

from __future__ import annotations

import argparse

import common
import numpy as np
import pandas as pd

RULES = {"E=1": 0.0, "E=T^(1/3)": 1 / 3, "E=T^(1/2)": 1 / 2, "E=T^(2/3)": 2 / 3, "E=T": 1.0}


def rule_points(t_grid):
  """``[(rule, T, E, T_g)]``: E = round(T^a) (at least 1), T_g = max(1, round(T / E))."""
  out = []
  for rule, a in RULES.items():
    for t in t_grid:
      e = max(1, round(t**a))
      out.append((rule, t, e, max(1, round(t / e))))
  return out


def draw(curve, cfg, args) -> None:
  seeds = int(curve["test_loss_count"].max())
  common.plot_curves(curve, "T", "test_loss", "fig7_lr_rule",
                     f"Fu Fig. 7: LR / Laplace, eps = {args.epsilon:g}, b = N "
                     f"(mean +- std, {seeds} seeds)", xlabel="total iterations T = E T_g",
                     ylabel="final test MSE", logy=True, group="rule",
                     label=lambda r: r, reference=common.zero_model_line(cfg))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--epsilon", type=float, default=3.0)
  ap.add_argument("--t-grid", default="1,10,20,30,40,50,60,70,80,90,100,110,120")
  common.add_replot_arg(ap)
  args = ap.parse_args(argv)
  start = common.now()
  n = common.LR["num_clients"]
  cfg = common.lr_config(clients_per_round=n)
  cfg.name = "fu_fig7"
  cfg.privacy.epsilon = args.epsilon
  if args.replot:
    return draw(common.committed("fig7_lr_rule"), cfg, args)
  pts = rule_points([int(t) for t in args.t_grid.split(",")])
  df = common.run_pairs(cfg, [(e, tg) for _, _, e, tg in pts],
                        {"seed": list(range(args.seeds))}, "fig7")
  fin = common.finals(df)
  rows = []
  for rule, t, e, tg in pts:
    r = fin[(fin["E"] == e) & (fin["T_g"] == tg)].copy()
    r["rule"], r["T_target"] = rule, t
    rows.append(r)
  fin = pd.concat(rows, ignore_index=True)
  curve = common.mean_std(fin, ["rule", "T_target", "E", "T_g", "T"],
                          ["test_loss", "epsilon_claimed", "epsilon_certified"])
  curve["rule_order"] = curve["rule"].map(list(RULES).index)
  curve = curve.sort_values(["rule_order", "T_target"]).drop(columns="rule_order")
  common.write(curve, "fig7_lr_rule")
  best = curve.loc[curve.groupby("T_target")["test_loss_mean"].idxmin(),
                   ["T_target", "rule", "E", "T_g", "test_loss_mean"]]
  t23 = curve[curve["rule"] == "E=T^(2/3)"].set_index("T_target")["test_loss_mean"]
  best["t23_loss"] = best["T_target"].map(t23).to_numpy()
  best["t23_over_best"] = best["t23_loss"] / best["test_loss_mean"]
  common.write(best, "fig7_lr_rule_best")
  draw(curve, cfg, args)
  pd.set_option("display.width", 200)
  print(best.to_string())
  wins = int(np.sum(best["rule"] == "E=T^(2/3)"))
  print(f"E = T^(2/3) is the best rule at {wins} of {len(best)} T values")
  common.save_meta("fig7_lr_rule", start, seeds=args.seeds, epsilon=args.epsilon)


if __name__ == "__main__":
  main()
