"""The whole-run audit's table: central-noise mechanisms x {correct, noise/10,
clipping off, a late-round fault} (docs/privacy.md, section 10).

  PYTHONPATH=$PWD nice -n 10 python benchmarks/audit_whole_run_table.py [--trials 1000]

Writes ``benchmarks/results/audit_whole_run_table.{csv,md}``. Each row is one
:func:`fedjax_dp.audit.audit_run` (every trial a whole run of T rounds) beside the
first-round audit of the same config (:func:`fedjax_dp.audit.audit`, which cannot see
a fault after round 1). Caught: the whole-run lower bound exceeds the run's certified
epsilon after T rounds.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedjax_dp import config as config_lib
from fedjax_dp.audit import AuditOptions, audit, audit_run

# Four rounds of every client, epsilon 3 for the whole run, a linear model.
BASE = ["model.name=logistic", "client.clip_mode=update_l2", "privacy.placement=central",
        "rounds=4", "privacy.epsilon=3.0", "server.client_chunk=0", "progress=false"]
MECHANISMS = {
    "gaussian/uniform K=U": ["server.selection=uniform", "server.clients_per_round=10"],
    "bandmf/all": ["privacy.mechanism=bandmf", "server.selection=all"],
    "tree/all": ["privacy.mechanism=tree", "server.selection=all"],
}
VARIANTS = ("none", "noise_div10", "no_clip", "late_noise_div10")
COLUMNS = ("mechanism", "variant", "lower_whole_run", "certified_run", "caught",
           "lower_round1", "certified_round1", "trials", "seconds")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--trials", type=int, default=1000)
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  args = p.parse_args(argv)
  quick = config_lib.load_config("quickstart")
  rows = []
  for name, sets in MECHANISMS.items():
    cfg = config_lib.override(quick, BASE + sets)
    for variant in VARIANTS:
      t0 = time.time()
      r = audit_run(cfg, AuditOptions(trials=args.trials, variant=variant))
      seconds = time.time() - t0
      # The first-round audit: a late fault leaves round 1 as it is (variant none).
      one = audit(cfg, AuditOptions(trials=args.trials, variant=(
          "none" if variant == "late_noise_div10" else variant)))
      rows.append({"mechanism": name, "variant": variant,
                   "lower_whole_run": round(r.epsilon_lower, 3),
                   "certified_run": round(r.epsilon_certified, 3),
                   "caught": "" if variant == "none" else
                   ("yes" if r.epsilon_lower > r.epsilon_certified else "no"),
                   "lower_round1": round(one.epsilon_lower, 3),
                   "certified_round1": round(one.epsilon_certified, 3),
                   "trials": args.trials, "seconds": round(seconds, 1)})
      print(rows[-1], flush=True)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  with open(out / "audit_whole_run_table.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
  lines = ["| mechanism | variant | whole-run lower bound | certified (T rounds) | caught | "
           "round-1 lower bound | certified (round 1) | trials | seconds |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    caught = {"yes": "**yes**", "no": "no", "": "--"}[r["caught"]]
    lines.append(f"| {r['mechanism']} | {r['variant']} | {r['lower_whole_run']:.3f} | "
                 f"{r['certified_run']:.3f} | {caught} | {r['lower_round1']:.3f} | "
                 f"{r['certified_round1']:.3f} | {r['trials']} | {r['seconds']:.0f} |")
  (out / "audit_whole_run_table.md").write_text("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
