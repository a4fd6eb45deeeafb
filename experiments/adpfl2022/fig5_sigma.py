"""A-DPFL Fig. 5: the noise multiplier sigma per round, and checklist items 10-12.

Reads the A-DPFL runs of ``results/table2_rounds.csv`` (IID and non-IID, every
seed; run ``table2.py`` first) and plots sigma_t against the paper's printed
trajectory (1.0 for 20 rounds, then 0.7 x4, 0.49 x4, 0.343 x7). Writes
``results/fig5.csv`` (per run: hold lengths, first reduction round, whether sigma
only takes values 0.7^m and never increases, holds after round 35 vs the first)
and ``results/fig5.png``. Run from the repository root::

  python experiments/adpfl2022/fig5_sigma.py
"""

from __future__ import annotations

import time

import common
import numpy as np
import pandas as pd

PAPER_HOLDS = ((1.0, 20), (0.7, 4), (0.49, 4), (0.343, 7))


def holds(sigma: np.ndarray) -> list[int]:
  """Lengths of the runs of equal sigma, in order."""
  change = np.flatnonzero(~np.isclose(sigma[1:], sigma[:-1])) + 1
  return np.diff(np.r_[0, change, sigma.size]).tolist()


def summary(sigma: np.ndarray, k: float = common.K_DECAY) -> dict:
  """Checklist items 10-12 on one run's ``sigma [T]`` (relative to sigma_0)."""
  m = np.log(sigma / sigma[0]) / np.log(k)
  h = holds(sigma)
  starts = np.cumsum([0, *h[:-1]])
  late = [n for s, n in zip(starts, h) if s >= 35 and s + n < sigma.size]
  return {"holds": " ".join(map(str, h)), "reductions": round(m[-1]),
          "first_reduction_round": int(starts[1]) + 1 if len(h) > 1 else None,
          "only_k_powers": bool(np.allclose(m, np.rint(m), atol=1e-6)),
          "non_increasing": bool(np.all(np.diff(sigma) <= 1e-12)),
          "late_holds_shorter_than_first": bool(late and max(late) < h[0]) if late else None}


def draw_paper(ax) -> None:
  """The paper's printed Fig. 5 trajectory (rounds 1-35) as a grey step line."""
  paper = np.concatenate([[v] * n for v, n in PAPER_HOLDS])
  ax.step(np.arange(1, paper.size + 1), paper, "k", where="post", lw=2.5, alpha=0.4,
          label="paper Fig. 5 (rounds 1-35)")


def main():
  start = time.time()
  df = pd.read_csv(common.RESULTS / "table2_rounds.csv")
  rows = []
  for run, t in df.groupby("run", sort=False):
    s = t.sort_values("round")["sigma"].to_numpy()
    rows.append({"run": run, "partition": t["partition"].iloc[0], **summary(s / s[0])})
  table = pd.DataFrame(rows)
  common.write(table, "fig5")
  print(table.to_string())
  plt = common.plt()
  fig, ax = plt.subplots(figsize=(6.5, 4))
  draw_paper(ax)
  for i, (run, t) in enumerate(df.groupby("run", sort=False)):
    ax.step(t["round"], t["sigma"], where="post", color="C0" if run.startswith("iid") else "C1",
            alpha=0.8, label=run)
  ax.set_xlabel("round")
  ax.set_ylabel("noise multiplier sigma_t")
  ax.set_yscale("log")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title(f"A-DPFL Fig. 5: sigma per round (k = {common.K_DECAY}, alpha = "
               f"{common.ALPHA})", fontsize=10)
  fig.tight_layout()
  fig.savefig(common.RESULTS / "fig5.png", dpi=110)
  common.save_meta("fig5_sigma", start)


if __name__ == "__main__":
  main()
