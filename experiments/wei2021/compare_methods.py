"""Wei et al. Figs. 5/6 and 8-10: loss vs T, and CRD vs original UDP vs Lei vs optimal UDP.

One sweep runs, for every epsilon in {4, 8, 12, 16, 20} and every seed, the four
methods of Sec. 5.4 (``schedule.name`` = constant (T = 200), crd (T0 = 200,
beta = 0.9, zeta = 1e-3), linear_decay (Lei; spec section 6 assumptions), optimal_t
(the constant schedule over T in {10, 25, 50, 100, 150, 200, 300}, best final test
loss)). The optimal_t candidates ARE the loss-vs-T curves of Figs. 5 (q = 1) and
6 (q = 0.6), so one command gives Figs. 5 or 6, 8, 9 and 10 for one q.

Writes to ``experiments/wei2021/results/`` (``<tag> = <regime>_q<q>``):

* ``fig5_6_loss_vs_T_<tag>.{csv,png}``: final test loss/accuracy vs T per epsilon
  (mean, std over seeds) and the best T per epsilon;
* ``fig8_9_methods_<tag>.{csv,png}``: final test loss and accuracy vs epsilon per
  method (mean, std, n over seeds), with rounds used and the certified epsilon
  (RDP accountant) beside the claimed one;
* ``fig10_crd_T_<tag>.{csv,png}``: CRD's horizon T after every round (seed 0), and
  the rounds CRD used per epsilon.

Run from the repository root (wall times in REPRODUCTION.md)::

  python experiments/wei2021/compare_methods.py --q 1            # Figs. 5, 8a, 9a, 10a
  python experiments/wei2021/compare_methods.py --q 0.6          # Figs. 6, 8b, 9b, 10b
  python experiments/wei2021/compare_methods.py --q 1 --regime paper --seeds 1
"""

from __future__ import annotations

import argparse
import time

import common
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--q", type=float, default=1.0, help="K / U (1 or 0.6)")
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in common.EPSILONS))
  ap.add_argument("--methods", default=",".join(common.METHODS))
  ap.add_argument("--rounds", type=int, default=200, help="T of UDP, T0 of CRD and Lei")
  ap.add_argument("--t-grid", default=",".join(map(str, common.T_GRID)),
                  help="T values of the optimal-UDP search (and the loss-vs-T curve)")
  common.add_setting_args(ap)
  args = ap.parse_args(argv)
  start = time.time()
  tag = f"{args.regime}_q{args.q:g}{args.tag}"
  cfg = common.setting_config(args, args.q, args.rounds)
  cfg.schedule.t_grid = tuple(int(t) for t in args.t_grid.split(","))
  cfg.name = f"wei_compare_{tag}"
  eps = [float(e) for e in args.epsilons.split(",")]
  methods = args.methods.split(",")
  out = common.RUNS / f"compare_{tag}"
  df = common.run_methods(cfg, methods, {"privacy.epsilon": eps,
                                         "seed": list(range(args.seeds))}, out)

  # Figs. 8/9: final loss and accuracy per method and epsilon.
  table = common.final_table(df, ["schedule.name", "privacy.epsilon"],
                             ["test_loss", "test_accuracy", "rounds_used", "horizon",
                              "epsilon_claimed", "epsilon_certified"])
  common.write(table, f"fig8_9_methods_{tag}")
  common.figure(table, "privacy.epsilon",
                [("test_loss", "final test loss"), ("test_accuracy", "final test accuracy"),
                 ("epsilon_certified_mean", "certified epsilon (RDP, delta=1e-3)")],
                "schedule.name", f"Wei et al. Figs. 8/9 ({args.regime} regime, K/U = "
                f"{args.q:g}, mean +- std over {args.seeds} seeds)", f"fig8_9_methods_{tag}",
                xlabel="privacy level epsilon_p (claimed, eq. (10))", label=common.LABELS.get,
                extra=lambda axes: axes[2].plot(eps, eps, "k:", label="claimed = target"))

  # Figs. 5/6: loss vs T from the optimal_t candidates.
  if "optimal_t" in methods:
    cand = common.optimal_t_tables(out / "eval10")
    cand = cand[cand["schedule.name"] == "optimal_t"]
    curve = common.mean_std(cand, ["privacy.epsilon", "rounds"],
                            ["final_test_loss", "final_test_accuracy", "epsilon_certified"])
    best = curve.loc[curve.groupby("privacy.epsilon")["final_test_loss_mean"].idxmin()]
    curve["best_T"] = curve["privacy.epsilon"].map(dict(zip(best["privacy.epsilon"],
                                                             best["rounds"])))
    common.write(curve, f"fig5_6_loss_vs_T_{tag}")
    common.figure(curve, "rounds", [("final_test_loss", "final test loss"),
                                    ("final_test_accuracy", "final test accuracy")],
                  "privacy.epsilon", f"Wei et al. Fig. {5 if args.q == 1 else 6}: loss vs T "
                  f"({args.regime} regime, K/U = {args.q:g})", f"fig5_6_loss_vs_T_{tag}",
                  xlabel="number of rounds T (constant schedule, sigma from eq. (10))",
                  label=lambda e: f"eps={e:g}",
                  extra=lambda axes: axes[0].plot(best["rounds"], best["final_test_loss_mean"],
                                                  "k*", ms=12, label="best T"))

  # Fig. 10: CRD's T after every round.
  if "crd" in methods:
    crd = df[df["schedule.name"] == "crd"]
    traj = crd[["privacy.epsilon", "seed", "round", "horizon"]]
    common.write(traj, f"fig10_crd_T_{tag}")
    fig, ax = plt.subplots(figsize=(6, 4))
    for e, t in traj[traj["seed"] == 0].groupby("privacy.epsilon"):
      ax.step(t["round"], t["horizon"], where="post", label=f"eps={e:g}")
    ax.set_xlabel("round t")
    ax.set_ylabel("planned number of rounds T")
    ax.set_title(f"Wei et al. Fig. 10: CRD's T ({args.regime}, K/U = {args.q:g}, seed 0)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(common.RESULTS / f"fig10_crd_T_{tag}.png", dpi=110)
    plt.close(fig)

  pd.set_option("display.width", 200)
  print(table.to_string())
  # A run below the full design (3 seeds, every epsilon, method and T of the grid)
  # says so in its meta.json, so that a table built from it cannot pass for the full one.
  reduced = []
  if args.seeds < 3:
    reduced.append(f"{args.seeds} seed(s) instead of 3")
  if sorted(eps) != sorted(common.EPSILONS):
    reduced.append(f"epsilons {args.epsilons} instead of "
                   f"{','.join(f'{e:g}' for e in common.EPSILONS)}")
  if tuple(sorted(cfg.schedule.t_grid)) != tuple(common.T_GRID):
    reduced.append(f"optimal-UDP T grid {args.t_grid} instead of "
                   f"{','.join(map(str, common.T_GRID))}")
  if sorted(methods) != sorted(common.METHODS):
    reduced.append(f"methods {args.methods} instead of {','.join(common.METHODS)}")
  common.save_meta(f"compare_{tag}", start, points=int(df["point"].nunique()),
                   setting=common.setting_meta(cfg),
                   reduced=reduced or None)


if __name__ == "__main__":
  main()
