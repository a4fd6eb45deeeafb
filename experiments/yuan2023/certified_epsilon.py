"""Yuan et al.: the certified epsilon of every DP row of Fig. 4 and the SVM Figs. 7/9.

Those results were committed with the claimed epsilon (eq. (8)) only. The noise of a
row follows from its config alone (the geometric schedule without refinement reads
no metric), so its certified epsilon needs the accountant, not a re-run:

* ``epsilon_certified``: what the run's last metrics row records, by the run loop's
  host side without training (:func:`fedjax_dp.reproduction.accounted_epsilon`): the
  RDP accountant at the sensitivity the engine proves for the ``param_l2`` upload,
  ``2 C`` (spec E7), with the q = K/U selection amplifying;
* ``epsilon_certified_paper_delta``: the same accountant at the paper's
  ``Delta_s = 2 C / |D_k|`` (the basis of ``equal_certified.py``): what eq. (8)'s
  noise certifies if the paper's sensitivity were right.

One row per (figure, epsilon or theta, M) of the committed CSVs (no seed enters the
accounting). Writes ``results/certified_epsilon.csv``; the equal-certified runs
are ``fig4_epsilon.py --basis certified`` and ``fig7_9_svm_adult.py --basis
certified``. From the repository root::

  python experiments/yuan2023/certified_epsilon.py
"""

from __future__ import annotations

import argparse
import math
import time

import common
import fig7_9_svm_adult as svm
import pandas as pd

from fedjax_dp import reproduction as repro
from fedjax_dp.privacy import accounting, calibration, formulas

# The committed CSVs and the column their rows differ in beside M.
SOURCES = {
    "fig4_epsilon": "privacy.epsilon",
    "fig4_epsilon_n100": "privacy.epsilon",
    "fig7_svm_theta": "schedule.theta",
    "fig9_svm_epsilon": "privacy.epsilon",
}


def row_config(name: str, key: float, rounds: int):
  """The config a row of ``name`` ran (its script's, with the row's values)."""
  if name.startswith("fig4"):
    cfg = common.mlp_config(rounds=rounds, samples=100 if name.endswith("n100") else 600)
  else:
    cfg = svm.svm_config(rounds)
  if name.startswith("fig7"):  # eps = 10, the theta of the row
    cfg.schedule.theta, cfg.privacy.epsilon = float(key), common.EPS
  else:  # theta = 1.05, the eps of the row
    cfg.schedule.theta, cfg.privacy.epsilon = 1.05, float(key)
  return cfg


def paper_delta_epsilon(cfg) -> float:
  """RDP epsilon of eq. (8)'s schedule at the paper's ``Delta_s = 2 C / |D_k|`` (the
  selection amplified, as :func:`common.certified_sigma0` calibrates)."""
  samples = int(cfg.data.samples_per_client)
  theta, rounds, eps = float(cfg.schedule.theta), int(cfg.rounds), float(cfg.privacy.epsilon)
  delta_s = common.paper_sensitivity(samples)
  sigma0 = float(formulas.yuan_sigma_eq8(eps, common.DELTA, common.Q, rounds, theta, delta_s))
  z = calibration.schedule_multipliers(sigma0 / delta_s, rounds, math.sqrt(theta))
  events = [accounting.Event(mechanism="gaussian", noise_multiplier=float(zi),
                             sampling="selection", q=common.Q) for zi in z]
  return float(accounting.epsilon(events, common.DELTA))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sources", default=",".join(SOURCES))
  args = ap.parse_args(argv)
  start = time.time()
  cache, rows = {}, []
  for name in args.sources.split(","):
    group = SOURCES[name]
    table = pd.read_csv(common.RESULTS / f"{name}.csv")
    for key, rounds in table[[group, "rounds"]].drop_duplicates().itertuples(index=False):
      cfg = row_config(name, key, int(rounds))
      if not math.isfinite(float(cfg.privacy.epsilon)):
        continue  # no DP: nothing to certify
      repro.note_configs([cfg])
      acc = repro.accounted_epsilon(cfg, cache=cache)
      rows.append({"figure": name, group: key, "rounds": int(rounds),
                   "epsilon_claimed": acc["epsilon_claimed"],
                   "epsilon_certified": acc["epsilon_certified"],
                   "epsilon_certified_paper_delta": paper_delta_epsilon(cfg)})
      print(rows[-1], flush=True)
  out = pd.DataFrame(rows)
  out["certified_over_claimed"] = out["epsilon_certified"] / out["epsilon_claimed"]
  out["paper_delta_over_claimed"] = out["epsilon_certified_paper_delta"] / out["epsilon_claimed"]
  common.write(out, "certified_epsilon")
  with pd.option_context("display.width", 200):
    print(out.groupby("figure")[["certified_over_claimed", "paper_delta_over_claimed"]]
          .agg(["min", "max"]).to_string())
  common.save_meta("certified_epsilon", start, sources=args.sources.split(","),
                   note="accountant only (fedjax_dp.reproduction.accounted_epsilon): no "
                        "training; the rows' losses are the committed CSVs'")


if __name__ == "__main__":
  main()
