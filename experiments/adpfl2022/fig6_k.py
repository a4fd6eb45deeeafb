"""A-DPFL Fig. 6: final accuracy against the decay factor k on label-skewed MNIST.

A-DPFL (W top-K + eq. (15) decay, sigma_0 = 1) for k in {0.3, 0.4, ..., 0.9}, one
sweep (a single compiled program over the k lanes). Writes ``results/fig6.csv``
(final accuracy, certified epsilon at delta = 1e-5, the number of reductions and
the final sigma per k) and ``results/fig6.png``. Checklist items 13-14: accuracy
non-increasing in k, with a knee near 0.7-0.8. Run from the repository root::

  python experiments/adpfl2022/fig6_k.py
"""

from __future__ import annotations

import argparse
import time

import common
import numpy as np
import pandas as pd

K_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def main(argv=None):
  ap = common.add_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
  ap.add_argument("--k-grid", default=",".join(f"{k:g}" for k in K_GRID))
  args = ap.parse_args(argv)
  start = time.time()
  base = common.paper_config(args.dataset, "noniid", clients=args.clients, model=args.model,
                             local_steps=args.local_steps, rounds=args.rounds,
                             validation=args.validation)
  cfg = common.method_config(base, "adpfl")
  ks = [float(k) for k in args.k_grid.split(",")]
  rows = common.repro.run_sweep(cfg, {"schedule.k": ks, "seed": list(range(args.seeds))},
                                str(common.RUNS / f"fig6_{args.dataset}_k{args.clients}"))
  df = pd.DataFrame(rows)
  df["sigma"] = common.paper_sigma(cfg, df["noise_mean"].to_numpy(np.float64))
  df["reductions"] = np.rint(np.log(df["sigma"] / common.SIGMA0) / np.log(df["schedule.k"]))
  fin = df.groupby("point", sort=False).tail(1)
  table = common.mean_std(fin, ["schedule.k"], ["test_accuracy", "epsilon_certified",
                                                 "reductions", "sigma"])
  table["epsilon_claimed"] = "none given"
  common.write(table, "fig6")
  print(table.to_string())
  plt = common.plt()
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  axes[0].errorbar(table["schedule.k"], table["test_accuracy_mean"],
                   yerr=np.nan_to_num(table["test_accuracy_std"]), marker="o", capsize=3)
  axes[0].set_ylabel(f"test accuracy after {args.rounds} rounds")
  axes[1].semilogy(table["schedule.k"], table["epsilon_certified_mean"], "o-")
  axes[1].set_ylabel("certified epsilon (RDP, delta=1e-5)")
  for ax in axes:
    ax.set_xlabel("noise decay factor k")
    ax.grid(alpha=0.3)
  fig.suptitle(f"A-DPFL Fig. 6: non-IID {args.dataset}, K={args.clients}, {args.model}, "
               f"{args.seeds} seed(s)", fontsize=10)
  fig.tight_layout()
  fig.savefig(common.RESULTS / "fig6.png", dpi=110)
  common.save_meta("fig6", start, validation=args.validation,
                   clients=args.clients, model=args.model,
                   local_steps=args.local_steps)


if __name__ == "__main__":
  main()
