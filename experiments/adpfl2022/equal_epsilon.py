"""The four A-DPFL methods at EQUAL certified epsilon (issue 14 item 8).

The paper compares methods at unequal privacy: A-DPFL's decaying sigma and its
fixed top-K cohort (no sampling amplification) spend far more budget than DPFL's
constant sigma = 1 with uniform selection. Here each method's noise is calibrated
(:func:`fedjax_dp.privacy.calibration.calibrate`) so that its 50 rounds spend the
same certified epsilon (RDP, delta = 1e-5), for two budgets read from
``results/fig4.csv`` (run ``fig4_ablation.py`` first):

* ``dpfl``: DPFL's epsilon at sigma = 1 (DPFL unchanged; A-DPFL and CL-FL get
  more noise);
* ``adpfl``: A-DPFL's epsilon at the paper's settings (A-DPFL unchanged; DPFL and
  CL-FL get less noise).

At DPFL's budget A-DPFL also runs as the paper words it ("until the total privacy
budget is exhausted", ``adpfl_stop``): sigma_0 calibrated for 50 rounds without
reductions, then eq. (15) as usual, stopping when the next round would pass the
budget.

A-DPFL's schedule depends on the run, so its sigma_0 is calibrated on the decay
pattern (sigma_t / sigma_0) its paper-settings run realised, and the run carries
``privacy.enforce_budget`` with ``privacy.epsilon`` = the budget: it stops before
a round would take it past the budget if its realised pattern spends faster.
CL-FL runs with the private median clip (Andrew et al. 2021, certified) instead
of the exact median (certified inf). CL-FL's epsilon is client-level, the others'
example-level: equal numbers, not equal guarantees. ``--seeds`` uses each seed's own Fig. 4 run (pattern and
A-DPFL's budget). Writes ``results/equal_epsilon.{csv,png}`` (per seed) and
``results/equal_epsilon_summary.csv`` (mean and std over seeds). Run from the
repository root::

  python experiments/adpfl2022/equal_epsilon.py --seeds 3
"""

from __future__ import annotations

import argparse
import time

import common
import numpy as np
import pandas as pd

LABELS = {"nonprivate": "non-private FL", "dpfl": "DPFL (uniform, constant sigma)",
          "clfl": "CL-FL (private median clip; client-level)",
          "adpfl": "A-DPFL, sigma_0 on its realised decay pattern",
          "adpfl_stop": "A-DPFL, sigma_0 for no decay, stops at the budget"}


def main(argv=None):
  ap = common.add_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
  args = ap.parse_args(argv)
  start = time.time()
  fig4 = pd.read_csv(common.RESULTS / "fig4.csv")
  base = common.paper_config(args.dataset, "noniid", clients=args.clients, model=args.model,
                             local_steps=args.local_steps, rounds=args.rounds,
                             validation=args.validation)
  methods = ["dpfl", "adpfl"] + (["clfl"] if common.has_clfl() else [])
  if "clfl" not in methods:
    print("CL-FL skipped: this engine has no server.clip_rule (server-side median clipping)")
  paper = {m: common.certified(common.method_config(base, m)) for m in methods}
  cfgs, plan_rows, keep = {}, [], []
  for seed in range(args.seeds):
    ref = fig4[fig4["seed"] == seed]
    tag = "" if seed == 0 else f"_s{seed}"
    pattern = {m: np.ones(args.rounds) for m in methods}
    a = ref[ref["method"] == "adpfl"].sort_values("round")["sigma"].to_numpy()
    pattern["adpfl"] = a / a[0]
    budgets = {m: float(ref[ref["method"] == m]["epsilon_certified"].iloc[-1])
               for m in ("dpfl", "adpfl")}

    def add(label, m, budget_of, target, cfg, rel, z, seed=seed):
      cfg.seed = seed
      cfg.privacy.noise_multiplier = z
      cfg.privacy.epsilon = target
      cfg.privacy.enforce_budget = True
      cfgs[label] = cfg
      plan_rows.append({"seed": seed, "budget": budget_of, "target_epsilon": target,
                        "method": m, "sigma0": z / float(paper[m.split("_")[0]]
                                                          .privacy.noise_multiplier),
                        "planned_epsilon": float(common.epsilon_of(
                            paper[m.split("_")[0]], rel, z))})

    for budget_of, target in budgets.items():
      for m in methods:
        if m == budget_of:
          plan_rows.append({"seed": seed, "budget": budget_of, "target_epsilon": target,
                            "method": m, "sigma0": common.SIGMA0,
                            "planned_epsilon": float(common.epsilon_of(paper[m], pattern[m]))})
          continue
        z = common.calibrate_multiplier(paper[m], pattern[m], target)
        add(f"{m}_at_{budget_of}{tag}", m, budget_of, target,
            common.certified(common.method_config(base, m)), pattern[m], z)
      # A-DPFL as the paper words it, "reduce sigma until the total privacy budget is
      # exhausted": sigma_0 calibrated for a run WITHOUT reductions; the run stops when
      # its reductions would take it past the budget (spends at most it, stops early).
      if budget_of != "adpfl":
        flat = np.ones(args.rounds)
        z = common.calibrate_multiplier(paper["adpfl"], flat, target)
        add(f"adpfl_stop_at_{budget_of}{tag}", "adpfl_stop", budget_of, target,
            common.method_config(base, "adpfl"), flat, z)
      # The unchanged method and the non-private reference come from fig4.csv.
      r = ref[ref["method"].isin([budget_of, "nonprivate"])].copy()
      r["budget"] = budget_of
      r["run"] = r["method"] + "_paper" + tag
      keep.append(r)
  print(pd.DataFrame(plan_rows).to_string())
  df = common.run_configs(cfgs, f"equal_eps_{args.dataset}_k{args.clients}")
  df["method"] = df["run"].str.split("_at_").str[0]
  rest = df["run"].str.split("_at_").str[1]
  df["budget"] = rest.str.split("_s").str[0]
  df["seed"] = rest.str.split("_s").str[1].fillna(0).astype(int)
  cols = ["run", "method", "budget", "seed", "round", "test_accuracy", "sigma",
          "epsilon_certified"]
  allrows = pd.concat([df[cols], *[k[cols] for k in keep]], ignore_index=True)
  fin = allrows.groupby(["budget", "run"], sort=False).tail(1).copy()
  fin = fin.merge(pd.DataFrame(plan_rows), on=["seed", "budget", "method"], how="left")
  fin["rounds_run"] = fin["round"]
  fin["epsilon_claimed"] = "none given"
  common.write(fin[["seed", "budget", "target_epsilon", "method", "sigma0", "planned_epsilon",
                    "epsilon_certified", "rounds_run", "test_accuracy", "epsilon_claimed"]],
               "equal_epsilon")
  summary = common.mean_std(fin, ["budget", "method"],
                            ["test_accuracy", "rounds_run", "sigma0", "target_epsilon",
                             "epsilon_certified"])
  common.write(summary, "equal_epsilon_summary")
  common.write(allrows, "equal_epsilon_rounds")
  print(summary.to_string())
  budgets = summary.groupby("budget")["target_epsilon_mean"].first().to_dict()
  plt = common.plt()
  fig, axes = plt.subplots(1, len(budgets), figsize=(5.5 * len(budgets), 4), sharey=True)
  for ax, (budget_of, target) in zip(np.atleast_1d(axes), budgets.items()):
    for m in (*common.METHODS, "adpfl_stop"):
      t = allrows[(allrows["budget"] == budget_of) & (allrows["method"] == m)]
      if len(t):
        g = t.groupby("round")["test_accuracy"].mean()
        ax.plot(g.index, g.to_numpy(), label=LABELS[m])
    ax.set_title(f"all at epsilon = {target:.3g} ({budget_of}'s budget; mean over seeds)",
                 fontsize=9)
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  np.atleast_1d(axes)[0].set_ylabel("test accuracy")
  fig.suptitle(f"A-DPFL methods at equal certified epsilon (delta=1e-5), non-IID "
               f"{args.dataset}, K={args.clients}, {args.model}", fontsize=10)
  fig.tight_layout()
  fig.savefig(common.RESULTS / "equal_epsilon.png", dpi=110)
  common.save_meta("equal_epsilon", start, validation=args.validation,
                   clients=args.clients, model=args.model,
                   local_steps=args.local_steps)


if __name__ == "__main__":
  main()
