"""The whole-run audit's table of the central-noise mechanisms beside their first-round
audit: x {correct, noise/10, clipping off, a late-round fault}, and for BandMF its
state dropped at round b + 1 (no privacy fault: it must not be flagged)
(docs/privacy.md, section 10). Every mechanism the registries accept is in the audit
table's whole-run mode (``python -m fedjax_dp.audit.table --whole-run``); this one
adds BandMF with two bands and the round-1 column.

  PYTHONPATH=$PWD nice -n 10 python benchmarks/audit_whole_run_table.py [--trials 1000]

A broken variant not caught at ``--trials`` is audited again at ``--escalate`` times
as many; the row states the trials of its last audit.

Writes ``benchmarks/results/audit_whole_run_table.{csv,md}``. Each row is one
:func:`fedjax_dp.audit.audit_run` (every trial a whole run of T rounds) beside the
first-round audit of the same config (:func:`fedjax_dp.audit.audit`, which cannot see
a fault after round 1). Caught: the whole-run lower bound exceeds the run's certified
epsilon after T rounds.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedjax_dp import config as config_lib
from fedjax_dp.audit import AuditOptions, audit, audit_run, table

# Four rounds of every client, epsilon 3 for the whole run, a linear model.
BASE = ["model.name=logistic", "client.clip_mode=update_l2", "privacy.placement=central",
        "rounds=4", "privacy.epsilon=3.0", "server.client_chunk=0", "progress=false"]
MECHANISMS = {
    "gaussian/uniform K=U": ["server.selection=uniform", "server.clients_per_round=10"],
    # (bands 0 resolves to the round-robin pass, 1 under 'all': independent noise;
    # two bands make the noise correlated, and give a state to drop.)
    "bandmf/all b=2": ["privacy.mechanism=bandmf", "server.selection=all", "privacy.bands=2"],
    "tree/all": ["privacy.mechanism=tree", "server.selection=all"],
}
VARIANTS = ("none", "noise_div10", "no_clip", "late_noise_div10")
# A variant for the mechanisms that carry a noise state (not a privacy fault:
# fedjax_dp.audit.whole_run's docstring; expected NOT to be flagged).
STATEFUL = {"bandmf/all b=2": ("band_state_dropped",)}
NOT_A_FAULT = ("band_state_dropped",)
COLUMNS = ("mechanism", "variant", "lower_whole_run", "certified_run", "caught",
           "lower_round1", "certified_round1", "trials", "seconds", "git_commit")


def main(argv=None) -> int:
  args = table.benchmark_parser(__doc__, escalate=4).parse_args(argv)
  commit = table._git_commit()[:12]  # pylint: disable=protected-access
  quick = config_lib.load_config("quickstart")
  rows = []
  for name, sets in MECHANISMS.items():
    if not any(o in name for o in args.only.split(",")):
      continue
    cfg = config_lib.override(quick, BASE + sets)
    for variant in VARIANTS + STATEFUL.get(name, ()):
      n = args.trials
      while True:
        t0 = time.time()
        r = audit_run(cfg, AuditOptions(trials=n, variant=variant))
        seconds = time.time() - t0
        caught = r.epsilon_lower > r.epsilon_certified
        if variant == "none" or variant in NOT_A_FAULT or caught or \
            n >= args.trials * args.escalate:
          break
        n *= args.escalate
      # The first-round audit: a fault after round 1 leaves it as it is (variant none).
      one = audit(cfg, AuditOptions(trials=args.trials, variant=(
          "none" if variant in ("late_noise_div10", *NOT_A_FAULT) else variant)))
      rows.append({"mechanism": name, "variant": variant,
                   "lower_whole_run": round(r.epsilon_lower, 3),
                   "certified_run": round(r.epsilon_certified, 3),
                   "caught": "" if variant == "none" else (
                       ("flagged" if caught else "not flagged") if variant in NOT_A_FAULT
                       else ("yes" if caught else "no")),
                   "lower_round1": round(one.epsilon_lower, 3),
                   "certified_round1": round(one.epsilon_certified, 3),
                   "trials": n, "seconds": round(seconds, 1), "git_commit": commit})
      print(rows[-1], flush=True)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = "audit_whole_run_table" + ("_only" if args.only else "")
  with open(out / f"{stem}.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
  lines = ["| mechanism | variant | whole-run lower bound | certified (T rounds) | caught | "
           "round-1 lower bound | certified (round 1) | trials | seconds |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    caught = {"yes": "**yes**", "no": "no", "": "--", "flagged": "flagged (wrongly)",
              "not flagged": "not flagged (no fault)"}[r["caught"]]
    lines.append(f"| {r['mechanism']} | {r['variant']} | {r['lower_whole_run']:.3f} | "
                 f"{r['certified_run']:.3f} | {caught} | {r['lower_round1']:.3f} | "
                 f"{r['certified_round1']:.3f} | {r['trials']} | {r['seconds']:.0f} |")
  (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
