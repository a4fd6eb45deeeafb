"""Fu et al. Tables II-IV and Fig. 2 judged with the seeds' spread, the untrained model
and the certified epsilon (read from the committed CSVs; no run).

For every epsilon of a table (its best T or E on the paper's grid):

* ``epsilon_claimed`` and ``epsilon_certified`` at the best point (the figure CSVs'
  means over seeds: Theorem 1/2's claim and our RDP accountant's certificate);
* ``untrained``: the level a DP run has to beat, the zero model's test MSE (LR, T = 0)
  or chance accuracy (CNN, 10 classes); ``degenerate``: the best DP point is no better
  than it (LR: a loss at or above the zero model's; CNN: an accuracy not above chance
  by a one-sided t-test at ``ALPHA`` over the seeds);
* ``within_one_std``: the grid points whose mean lies within one std (the best
  point's, over seeds) of the best mean: the best point is resolved only if it is
  the only one; ``paper_within_one_std``: the paper's best point is among them.

The verdict of a table's DP claim (its best point per eps; the shape claims are
judged in REPRODUCTION.md) follows from those columns by the rules of
:func:`verdict`.
Writes ``results/table2_lr_T_judged.csv``, ``table3_lr_E_judged.csv``,
``table4_cnn_E_judged.csv`` and ``fig2_cnn_epsilon_judged.csv``. From the repository
root::

  python experiments/fu2023/judge_tables.py
"""

from __future__ import annotations

import argparse
import math

import common
import numpy as np
import pandas as pd
from scipy import stats

ALPHA = 0.05
PAPER_T2 = {1.0: 10, 3.0: 30, 5.0: 30, math.inf: 100}
PAPER_T3 = {1.0: 12, 3.0: 3, 5.0: 2, math.inf: 1}
PAPER_E_GRID = (1, 2, 3, 4, 6, 12)  # Table III's grid (ours extends it to 120)
PAPER_T4 = {10.0: 24, 20.0: 12, 30.0: 12, math.inf: 2}


def above_chance(mean: float, std: float, n: int, chance: float = common.CHANCE) -> bool:
  """One-sided one-sample t-test: the seeds' mean accuracy is above ``chance``."""
  if n < 2 or not np.isfinite(std) or std == 0:
    return bool(mean > chance)
  t = (mean - chance) / (std / math.sqrt(n))
  return bool(stats.t.sf(t, n - 1) < ALPHA)


def judge(curve: pd.DataFrame, x: str, y: str, paper: dict, untrained: float,
          lower: bool) -> pd.DataFrame:
  """One row per epsilon of ``curve`` (``<y>_mean/_std/_count`` per ``x``): the best
  ``x``, its spread, certificate and whether it beats the untrained model."""
  rows = []
  for eps, t in curve.groupby("privacy.epsilon", sort=True):
    t = t[t[x] > 0] if x == "T" else t  # T = 0 is the untrained model itself
    best = t.loc[t[f"{y}_mean"].idxmin() if lower else t[f"{y}_mean"].idxmax()]
    mean, std, n = best[f"{y}_mean"], best[f"{y}_std"], int(best[f"{y}_count"])
    sd = 0.0 if not np.isfinite(std) else std
    near = t[(t[f"{y}_mean"] <= mean + sd) if lower else (t[f"{y}_mean"] >= mean - sd)]
    finite = math.isfinite(eps)
    if lower:
      degenerate = finite and mean >= untrained
    else:
      degenerate = finite and not above_chance(mean, std, n)
    rows.append({
        "privacy.epsilon": eps, f"best_{x}": int(best[x]), f"{y}_at_best": mean,
        f"{y}_std_at_best": std, "seeds": n,
        "within_one_std": " ".join(str(int(v)) for v in sorted(near[x])),
        f"paper_best_{x}": paper.get(eps), "paper_within_one_std": paper.get(eps) in set(
            int(v) for v in near[x]),
        "epsilon_claimed": best.get("epsilon_claimed_mean", np.nan) if finite else math.inf,
        "epsilon_certified": best.get("epsilon_certified_mean", np.nan) if finite else math.inf,
        "untrained": untrained, "degenerate": bool(degenerate)})
  return pd.DataFrame(rows)


def verdict(table: pd.DataFrame, judged: bool = True) -> str:
  """The DP claim's verdict from a table's finite-eps rows: ``degenerate`` when every
  DP point is no better than the untrained model (the figure then says nothing about
  DP training); else, over the DP rows that beat it, ``reproduced`` when the paper's
  best point lies within one std of ours at each, ``partly`` at some, ``not
  reproduced`` at none, with the degenerate eps named. ``judged=False`` (no paper
  points to compare): only the degenerate eps."""
  dp = table[np.isfinite(table["privacy.epsilon"])]
  bad = dp[dp["degenerate"]]["privacy.epsilon"].tolist()
  if bad and len(bad) == len(dp):
    return "degenerate (every DP point is no better than the untrained model)"
  tail = f"degenerate at eps {', '.join(f'{e:g}' for e in bad)}" if bad else ""
  if not judged:
    return tail or "every DP point beats the untrained model"
  live = dp[~dp["degenerate"]]
  hits = int(live["paper_within_one_std"].sum())
  base = ("reproduced" if hits == len(live) else "partly" if hits else "not reproduced")
  return base + (f"; {tail}" if tail else "")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.parse_args(argv)
  start = common.now()
  zero = common.initial_test_loss(common.lr_config())
  fig3 = common.committed("fig3_lr_T")
  fig5 = common.committed("fig5_lr_E")
  fig6 = common.committed("fig6_cnn_E")
  fig2 = common.committed("fig2_cnn_epsilon")
  tables = {
      "table2_lr_T_judged": (judge(fig3, "T", "test_loss", PAPER_T2, zero, True), "T",
                             ("Table II (Fig. 3), LR N = 1,000 x 8, b = 100, "
                              f"eta {common.LR_CALIBRATED}")),
      "table3_lr_E_judged": (judge(fig5[fig5["E"].isin(PAPER_E_GRID)], "E", "test_loss",
                                   PAPER_T3, zero, True), "E",
                             "Table III (Fig. 5, the paper's E grid), LR N = 1,000 x 8, b = 100"),
      "table4_cnn_E_judged": (judge(fig6, "E", "test_accuracy", PAPER_T4, common.CHANCE,
                                    False), "E",
                              "Table IV (Fig. 6), CNN N = 20, b = 2 (reduced federation)"),
      "fig2_cnn_epsilon_judged": (judge(fig2[fig2["k"] == fig2["k"].max()], "k",
                                        "test_accuracy", {}, common.CHANCE, False), "k",
                                  "Fig. 2 final accuracy, CNN N = 20, b = 2 (reduced)"),
  }
  verdicts = {}
  for name, (table, _, regime) in tables.items():
    table.insert(0, "regime", regime)
    table["verdict"] = verdict(table, judged=name != "fig2_cnn_epsilon_judged")
    verdicts[name] = str(table["verdict"].iloc[0])
    common.write(table, name)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
      print(name, "->", verdicts[name])
      print(table.drop(columns=["regime", "verdict"]).to_string(index=False))
  common.save_meta("judged_tables", start, alpha=ALPHA, zero_model_loss=zero,
                   chance=common.CHANCE, verdicts=verdicts,
                   sources=["fig3_lr_T.csv", "fig5_lr_E.csv", "fig6_cnn_E.csv",
                            "fig2_cnn_epsilon.csv"],
                   note="reads the committed CSVs only (no run)")


if __name__ == "__main__":
  main()
