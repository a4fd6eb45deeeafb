"""Fu et al. Fig. 1: test MSE over the iterations k of the LR task for each epsilon.

Lending Club linear regression, Laplace noise (Theorem 1), T = 100 iterations with
E = 1 (T_g = 100 rounds, T_l = 10 turns per client), epsilon in {1, 3, 5, inf}; the
setting of ``common.lr_config`` (N = 1,000 clients of 8 loans, b = 100) at the eps = inf
calibrated eta (``common.LR_CALIBRATED``, ``calibrate.py``). Two bases of epsilon:
``claimed`` (Theorem 1's Laplace scale at the paper's eps, ``privacy.formula =
fu_thm1``) and ``certified`` (the smallest Laplace noise whose certified epsilon, our
accountant's client-level replace-one bound, equals the paper's eps: ``privacy.formula
= calibrated``). One sweep per basis over epsilon x seeds, evaluated after every
round. Writes ``results/fig1_lr_epsilon.{csv,png}`` (mean, std over seeds per basis,
eps and k) and ``fig1_lr_epsilon_final.csv``. Run from the repository root::

  python experiments/fu2023/fig1_lr_epsilon.py
"""

from __future__ import annotations

import argparse

import common
import pandas as pd

FORMULA = common.FORMULA


def _label(key) -> str:
  basis, eps = key
  return f"{common.eps_label(eps)}, {basis}"


def draw(curve, cfg, args) -> None:
  seeds = int(curve["test_loss_count"].max())
  common.plot_curves(curve, "k", "test_loss", "fig1_lr_epsilon",
                     f"Fu Fig. 1: LR / Laplace, T = {args.rounds}, E = 1, eta = {args.lr:g} "
                     f"(mean +- std, {seeds} seeds)",
                     xlabel="iteration k", ylabel="test MSE", logy=True,
                     group=["basis", "privacy.epsilon"], label=_label,
                     reference=common.zero_model_line(cfg))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=100)
  ap.add_argument("--lr", type=float, default=common.LR_CALIBRATED,
                  help="eta (default: the eps = inf calibration's choice)")
  ap.add_argument("--bases", default="claimed,certified")
  common.add_replot_arg(ap)
  args = ap.parse_args(argv)
  start = common.now()
  cfg = common.lr_config(lr=args.lr)
  cfg.name = "fu_fig1"
  cfg.rounds = args.rounds
  cfg.eval.every = 1
  if args.replot:
    return draw(common.committed("fig1_lr_epsilon"), cfg, args)
  frames = []
  for basis in args.bases.split(","):
    rows = common.repro.run_sweep(cfg, {"privacy.epsilon": list(common.LR_EPSILONS),
                                        "seed": list(range(args.seeds))},
                                  str(common.RUNS / f"fig1_lr{args.lr:g}" / basis),
                                  sets=[f"privacy.formula={FORMULA[basis]}"])
    df = pd.DataFrame(rows)
    df["basis"] = basis
    frames.append(df)
  df = pd.concat(frames, ignore_index=True)
  df = df[df["test_loss"].notna()].rename(columns={"round": "k"})
  curve = common.mean_std(df, ["basis", "privacy.epsilon", "k"],
                          ["test_loss", "epsilon_claimed", "epsilon_certified"])
  common.write(curve, "fig1_lr_epsilon")
  final = curve[curve["k"] == curve["k"].max()]
  common.write(final, "fig1_lr_epsilon_final")
  draw(curve, cfg, args)
  print(final[["basis", "privacy.epsilon", "k", "test_loss_mean", "test_loss_std",
               "epsilon_claimed_mean", "epsilon_certified_mean"]].to_string())
  common.save_meta("fig1_lr_epsilon", start, seeds=args.seeds, lr=args.lr,
                   bases=args.bases.split(","))


if __name__ == "__main__":
  main()
