"""Yuan et al. Fig. 4: final test loss/accuracy against M for several eps at theta = 1.05.

MLP/MNIST as in Fig. 3 with theta = 1.05 and eps in {5, 10, 20, 40, inf} (inf = no
DP; the paper lists no values beyond "eps >= 20" and no DP). M x eps x seed is ONE
sweep. Writes ``results/fig4_epsilon.csv`` (mean/std per eps and M, with the
measured M* per eps, the claimed and the certified epsilon) and the PNG.

``--basis certified``: the equal-certified comparison. Each (eps, M) runs at the
``privacy.epsilon`` whose eq. (8) noise equals the amplitude that CERTIFIES eps at the
paper's Delta_s (:func:`common.equal_certified_epsilon`, the basis of
``equal_certified.py``), so every M spends the same certified eps; writes
``results/fig4_epsilon_certified.csv``. From the repository root::

  python experiments/yuan2023/fig4_epsilon.py --seeds 2
  python experiments/yuan2023/fig4_epsilon.py --seeds 2 --samples 100   # 6x noise, *_n100
  python experiments/yuan2023/fig4_epsilon.py --seeds 5 --basis certified
"""

from __future__ import annotations

import argparse
import math
import time

import common

EPSILONS = (5.0, 10.0, 20.0, 40.0, float("inf"))


def certified_basis(cfg, m_grid, args, tag):
  """Final rows of every (eps, M, seed) at the equal-certified noise; ``privacy.epsilon``
  is the certified target, ``epsilon_claimed`` what eq. (8) claims for that noise."""
  points = [(e, m, common.equal_certified_epsilon(1.05, m, e, args.samples)
             if math.isfinite(e) else e) for e in EPSILONS for m in m_grid]
  df = common.run_points(cfg, [{"rounds": m, "privacy.epsilon": run_eps}
                               for _, m, run_eps in points], args.seeds, f"fig4{tag}")
  target = {(m, run_eps): e for e, m, run_eps in points}
  df["privacy.epsilon"] = [target[(int(m), float(r))] for m, r in
                           zip(df["rounds"], df["privacy.epsilon"])]
  return df


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=2)
  ap.add_argument("--m-grid", default=",".join(map(str, common.M_GRID)))
  ap.add_argument("--samples", type=int, default=600,
                  help="examples per client (100: the 6x-noise regime, outputs *_n100)")
  ap.add_argument("--basis", choices=["claimed", "certified"], default="claimed",
                  help="claimed: eq. (8) at eps; certified: the noise that certifies eps "
                       "at the paper's Delta_s (module docstring)")
  args = ap.parse_args(argv)
  tag = common.tag(args.samples) + ("" if args.basis == "claimed" else f"_{args.basis}")
  m_grid = [int(v) for v in args.m_grid.split(",")]
  start = time.time()
  cfg = common.mlp_config(rounds=max(m_grid), samples=args.samples)
  sets = ["schedule.theta=1.05", f"eval.every={max(m_grid)}"]
  if args.basis == "claimed":
    grid = {"rounds": m_grid, "privacy.epsilon": list(EPSILONS),
            "seed": common.seeds(args.seeds)}
    df = common.final_rows(common.run_grid(cfg, grid, f"fig4{tag}", sets))
  else:
    df = certified_basis(common.config_lib.override(cfg, sets), m_grid, args, tag)
  curve = common.mean_std(df, ["privacy.epsilon", "rounds"],
                          ["test_loss", "test_accuracy", "epsilon_claimed", "epsilon_certified"])
  best = curve.loc[curve.groupby("privacy.epsilon")["test_loss_mean"].idxmin()]
  curve = curve.merge(best[["privacy.epsilon", "rounds"]].rename(columns={"rounds": "m_star"}),
                      on="privacy.epsilon")
  common.write(curve, f"fig4_epsilon{tag}")
  print(best[["privacy.epsilon", "rounds", "test_loss_mean", "test_accuracy_mean"]]
        .to_string(index=False))
  common.loss_acc_panels(
      curve, "privacy.epsilon", lambda e: "no DP" if e == float("inf") else f"eps={e:g}",
      "rounds", "M (aggregations, tau=5)",
      f"Yuan Fig. 4: MLP/MNIST, {args.samples}/client, theta=1.05, eq. (8), {args.seeds} seeds",
      f"fig4_epsilon{tag}")
  common.save_meta(f"fig4_epsilon{tag}", start, seeds=args.seeds, m_grid=m_grid,
                   samples=args.samples, basis=args.basis)


if __name__ == "__main__":
  main()
