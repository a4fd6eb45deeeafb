"""A-DPFL Fig. 5 as the calibration target of alpha (spec checklist items 10-12).

The paper gives neither alpha nor the spacing of its "dynamic adjustment rounds";
its Fig. 5 holds sigma at 1.0 for 20 rounds and then 4, 4 and 7 rounds at each
lower value. This script runs A-DPFL (the Table 2 setting, label-skewed MNIST) over
a grid of ``schedule.alpha`` x ``schedule.adjust_every`` as one batched program,
summarises each run's sigma trajectory with :func:`fig5_sigma.summary`, and ranks
the grid by the distance of its holds to the paper's (first hold 20, then 4, 4, 7).
Writes ``results/fig5_alpha.csv`` (per run), ``results/fig5_alpha_best.csv``
(per grid point, mean over seeds) and ``results/fig5_alpha.png`` (sigma per round of
the closest grid point and of the default, beside the paper's trajectory). Run from
the repository root::

  python experiments/adpfl2022/fig5_alpha.py --seeds 2
"""

from __future__ import annotations

import argparse
import time

import common
import fig5_sigma
import numpy as np
import pandas as pd

PAPER = np.array([n for _, n in fig5_sigma.PAPER_HOLDS], float)  # 20, 4, 4, 7


def hold_distance(holds: str) -> float:
  """Mean absolute difference between a run's first four holds and the paper's
  (a missing hold counts as the rest of the run)."""
  h = np.array([int(x) for x in holds.split()], float)
  h = np.r_[h, np.zeros(max(0, PAPER.size - h.size))][:PAPER.size]
  return float(np.mean(np.abs(h - PAPER)))


def main(argv=None):
  ap = common.add_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]), seeds=2)
  ap.add_argument("--alphas", default="0,0.002,0.005,0.01,0.02,0.04")
  ap.add_argument("--adjust-every", default="1,2,3,4")
  ap.add_argument("--partition", default="noniid", choices=["iid", "noniid"])
  args = ap.parse_args(argv)
  start = time.time()
  base = common.apply_args(common.paper_config(args.dataset, args.partition,
                                               clients=args.clients, model=args.model,
                                               local_steps=args.local_steps,
                                               rounds=args.rounds), args)
  cfgs = {}
  for alpha in (float(a) for a in args.alphas.split(",")):
    for every in (int(e) for e in args.adjust_every.split(",")):
      for seed in range(args.seeds):
        cfg = common.method_config(base, "adpfl")
        cfg.schedule.alpha, cfg.schedule.adjust_every, cfg.seed = alpha, float(every), seed
        cfgs[f"a{alpha:g}_e{every}_s{seed}"] = cfg
  df = common.run_configs(cfgs, f"fig5_alpha_{args.model}_k{args.clients}_{args.partition}")
  rows = []
  for run, t in df.groupby("run", sort=False):
    s = t.sort_values("round")["sigma"].to_numpy()
    alpha, every, seed = run.split("_")
    rows.append({"alpha": float(alpha[1:]), "adjust_every": int(every[1:]),
                 "seed": int(seed[1:]), "final_accuracy": float(t["test_accuracy"].iloc[-1]),
                 "epsilon_certified": float(t["epsilon_certified"].iloc[-1]),
                 **fig5_sigma.summary(s / s[0])})
  table = pd.DataFrame(rows)
  table["hold_distance"] = table["holds"].map(hold_distance)
  common.write(table, "fig5_alpha")
  best = (table.groupby(["alpha", "adjust_every"])
          [["hold_distance", "first_reduction_round", "reductions", "final_accuracy",
            "epsilon_certified"]].mean().reset_index().sort_values("hold_distance"))
  common.write(best, "fig5_alpha_best")
  print(table[["alpha", "adjust_every", "seed", "holds", "final_accuracy"]].to_string())
  plot(df, best.iloc[0])
  print(best.to_string(index=False))
  common.save_meta("fig5_alpha", start, validation=args.validation,
                   seeds=args.seeds, partition=args.partition)


def plot(df: pd.DataFrame, top) -> None:
  """Sigma per round of the closest grid point's runs and of the default's
  (alpha = common.ALPHA, every round), over the paper's Fig. 5 trajectory."""
  plt = common.plt()
  fig, ax = plt.subplots(figsize=(6.5, 4))
  fig5_sigma.draw_paper(ax)
  picks = {f"a{top['alpha']:g}_e{int(top['adjust_every'])}": "C1",
           f"a{common.ALPHA:g}_e1": "C0"}
  for run, t in df.groupby("run", sort=False):
    key = run.rsplit("_s", 1)[0]
    if key in picks:
      ax.step(t["round"], t["sigma"] / t["sigma"].iloc[0], where="post", color=picks[key],
              alpha=0.8, label=run)
  ax.set_xlabel("round")
  ax.set_ylabel("sigma_t / sigma_0")
  ax.set_yscale("log")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title("A-DPFL Fig. 5 as the target of alpha: closest grid point vs default",
               fontsize=10)
  fig.tight_layout()
  fig.savefig(common.RESULTS / "fig5_alpha.png", dpi=110)


if __name__ == "__main__":
  main()
