"""The audit table: every accepted mechanism x {correct, noise/10, clipping off}.

``python -m fedjax_dp.audit.table`` audits each mechanism of
:func:`fedjax_dp.audit.mechanisms.covering` (every combination of the core axes that
the validation accepts, then the selection rules until each occurs) on a small base
config, with the variants ``none``, ``noise_div10`` and ``no_clip``, and writes

* ``benchmarks/results/audit_table.csv``: one row per (mechanism, variant);
* ``benchmarks/results/audit_table.md``: the same as a markdown table (docs/privacy.md
  quotes it);
* ``benchmarks/results/audit_table_meta.json``: the command, the git commit, the
  machine's load, the base config's overrides.

Caught (a broken variant): its empirical lower bound (Clopper-Pearson, 95%) exceeds
the certified epsilon of the correct mechanism's first round (the run's own
accountant). A variant not caught at ``--trials`` is audited again at
``--escalate`` times as many trials; the row states the trials of its last audit.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from fedjax_dp import config as config_lib
from fedjax_dp.audit import mechanisms as mechanisms_lib
from fedjax_dp.audit.audit import AuditOptions, audit
from fedjax_dp.privacy import clip_modes

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
# The base: the quickstart's data and privacy target (epsilon 8 over 100 rounds), a
# linear model (the canaries' gradients reach the clip on it) and 5 of 10 clients per
# round (random rules amplify).
BASE_SETS = ("model.name=logistic", "server.clients_per_round=5", "server.client_chunk=0",
             "progress=false", "checkpoint.every=0", "eval.every=50")
# Laplace noise on an L2-clipped upload (param_l2, update_l2) is certified with the L1
# sensitivity 2 C sqrt(d) (plan.param_l1_sensitivity). The L1 geometry's extreme pair,
# a difference of 2 C in one coordinate, reaches 1 / sqrt(d) of it, and a difference
# spread evenly over all d coordinates (the pair that attains 2 C sqrt(d)) has a privacy
# loss that concentrates (a sum of d small terms): at d = 650 (logistic on digits) a
# tenth of the noise stays within the certificate for every pair an audit can draw at
# delta = 1e-3. These mechanisms are audited on Fu et al.'s linear regression (d = 11,
# Lending Club's 10 PCA features), where the one-coordinate canary reaches
# 10 / sqrt(11) = 3 times the certificate under noise / 10.
L1_GEOMETRY_SETS = {"data.name": "lending_club", "model.name": "linear_regression",
                    "data.partition": "iid", "data.samples_per_client": 80}


def audit_sets(m: dict[str, str]) -> dict[str, object]:
  """Settings of the audited config beyond the mechanism's own (:data:`L1_GEOMETRY_SETS`
  for Laplace on an L2-clipped upload: the clip mode's ``canary.l1_geometry``)."""
  if m["privacy.mechanism"] == "laplace" and \
      clip_modes.get(m["client.clip_mode"]).canary.l1_geometry:
    return dict(L1_GEOMETRY_SETS)
  return {}


CORE = ("client.clip_mode", "privacy.placement", "privacy.mechanism", "client.minibatch",
        "server.clip_rule", "schedule.validation")
VARIANTS = ("none", "noise_div10", "no_clip")
COLUMNS = ("mechanism", "variant", "epsilon_lower", "epsilon_gdp", "epsilon_certified",
           "epsilon_certified_run", "caught", "trials", "seconds", "relation", "level",
           "settings", "git_commit")
SHORT = {"client.clip_mode": "", "privacy.placement": "", "privacy.mechanism": "",
         "client.minibatch": "mb=", "server.selection": "sel=", "server.clip_rule": "S=",
         "schedule.validation": "val=", "client.optimizer": "opt="}


def mechanism_name(m: dict[str, str]) -> str:
  """``clip/placement/noise/mb=.../sel=.../S=.../val=.../opt=...``."""
  return "/".join(f"{SHORT[a]}{m[a]}" for a in mechanisms_lib.axes())


def _git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


# The commit whose code this process runs (read once: a later commit must not relabel
# rows that this code produced).
_CODE_COMMIT = [""]


def audit_mechanism(base, m: dict[str, str], trials: int, escalate: int, seed: int,
                    certify_run: bool = True, variants: tuple[str, ...] = VARIANTS, *,
                    name: str | None = None, client_optimizer=None) -> list[dict]:
  """The rows of one mechanism: each variant, escalated until caught (broken ones).

  ``name``: the mechanism's label (default :func:`mechanism_name`);
  ``client_optimizer``: a client optimizer given from Python
  (:func:`fedjax_dp.audit.audit`'s). A mechanism the plan refuses is audited with
  broken variants only (``sgd_step_weights``: the certificate is the one SGD's plan
  claims)."""
  sets = {**mechanisms_lib.settings(m), **audit_sets(m)}
  cfg = config_lib.override(base, [f"{k}={v}" for k, v in sets.items()])
  rows, certified = [], None
  for variant in variants:
    n = trials
    while True:
      t0 = time.time()
      r = audit(cfg, AuditOptions(trials=n, seed=seed, variant=variant,
                                  certify_run=certify_run and variant == "none"),
                client_optimizer=client_optimizer)
      seconds = time.time() - t0
      certified = r.epsilon_certified if certified is None else certified
      caught = r.epsilon_lower > certified
      if variant == "none" or caught or n >= trials * escalate:
        break
      n *= escalate
    rows.append({"mechanism": name or mechanism_name(m), "variant": variant,
                 "epsilon_lower": round(r.epsilon_lower, 4),
                 "epsilon_gdp": round(r.epsilon_gdp, 4),
                 "epsilon_certified": round(certified, 4),
                 "epsilon_certified_run": round(r.epsilon_certified_run, 4),
                 "caught": "" if variant == "none" else ("yes" if caught else "no"),
                 "trials": n, "seconds": round(seconds, 1), "relation": r.relation,
                 "level": r.level, "settings": json.dumps(sets, sort_keys=True),
                 "git_commit": _CODE_COMMIT[0][:12]})
    print(f"{rows[-1]['mechanism']:75s} {variant:12s} lower {r.epsilon_lower:7.3f} "
          f"certified {certified:7.3f} {rows[-1]['caught']:3s} n={n} {seconds:5.1f}s",
          flush=True)
  return rows


def markdown(rows: list[dict]) -> str:
  """The rows as one markdown table (bold: a broken variant caught)."""
  header = ("| mechanism | variant | lower bound (CP) | certified (round 1) | caught | "
            "trials | seconds |")
  lines = [header, "|---|---|---|---|---|---|---|"]
  for r in rows:
    caught = {"yes": "**yes**", "no": "no", "": "--"}[r["caught"]]
    lines.append(f"| `{r['mechanism']}` | {r['variant']} | {r['epsilon_lower']:.3f} | "
                 f"{r['epsilon_certified']:.3f} | {caught} | {r['trials']} | "
                 f"{r['seconds']:.0f} |")
  return "\n".join(lines) + "\n"


def benchmark_parser(description: str, escalate: int) -> argparse.ArgumentParser:
  """The options the audit tables' benchmarks share: ``--trials``, ``--escalate``
  (re-audit a broken variant not caught at that many times the trials), ``--only``
  (labels containing one of these, comma separated) and ``--out``."""
  p = argparse.ArgumentParser(description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--trials", type=int, default=1000)
  p.add_argument("--escalate", type=int, default=escalate,
                 help="re-audit a broken variant not caught at this many times the trials")
  p.add_argument("--only", default="", help="labels containing one of these (comma separated)")
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  return p


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m fedjax_dp.audit.table", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default=str(QUICKSTART))
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="more overrides of the base config")
  p.add_argument("--trials", type=int, default=1000)
  p.add_argument("--escalate", type=int, default=4)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-run-certificate", action="store_true",
                 help="skip running each mechanism's run for its whole-run certificate")
  p.add_argument("--only", default="", help="audit the mechanisms whose name contains one of these (comma separated)")
  p.add_argument("--shard", default="0/1", metavar="I/N",
                 help="audit every N-th mechanism from the I-th (the files get a suffix)")
  p.add_argument("--merge", type=int, default=0, metavar="N",
                 help="only merge the N shards' CSV files into the table")
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                 help="directory of audit_table.{csv,md} and audit_table_meta.json")
  args = p.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if args.merge:
    return merge(out, args.merge)
  index, count = (int(v) for v in args.shard.split("/"))
  _CODE_COMMIT[0] = _git_commit()
  base = config_lib.override(config_lib.load_config(args.config), [*BASE_SETS, *args.set])
  all_mechanisms = list(mechanisms_lib.enumerate_mechanisms(base))
  chosen = mechanisms_lib.covering(all_mechanisms, CORE)
  only = args.only.split(",")
  chosen = [m for m in chosen if any(o in mechanism_name(m) for o in only)][index::count]
  print(f"{len(all_mechanisms)} accepted mechanisms; auditing {len(chosen)} (every "
        f"combination of {', '.join(CORE)}, then each selection rule; shard {args.shard})",
        flush=True)
  t0 = time.time()
  rows = [row for m in chosen for row in audit_mechanism(
      base, m, args.trials, args.escalate, args.seed, not args.no_run_certificate)]
  suffix = f".{index}" if count > 1 else ""
  _write_csv(out / f"audit_table.csv{suffix}", rows)
  meta = {"command": "python -m fedjax_dp.audit.table " + " ".join(
              sys.argv[1:] if argv is None else argv),
          "git_commit": _git_commit(), "base_config": args.config,
          "base_sets": [*BASE_SETS, *args.set], "accepted_mechanisms": len(all_mechanisms),
          "audited_mechanisms": len(chosen), "core_axes": list(CORE),
          "trials": args.trials, "escalate": args.escalate, "seed": args.seed,
          "load_average": os.getloadavg(), "cpus": os.cpu_count(),
          "machine": platform.platform(), "wall_s": round(time.time() - t0, 1)}
  (out / f"audit_table_meta.json{suffix}").write_text(json.dumps(meta, indent=2) + "\n")
  if count == 1:
    (out / "audit_table.md").write_text(markdown(rows))
  print(f"wrote {out}/audit_table.csv{suffix}; "
        f"{sum(r['caught'] == 'no' for r in rows)} broken variants not caught", flush=True)
  return 0


def _write_csv(path: Path, rows: list[dict]) -> None:
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)


def merge(out: Path, count: int) -> int:
  """Joins the shards ``audit_table.csv.<i>`` (in the covering's order) into
  ``audit_table.csv`` and ``.md``, and their meta files into one."""
  shards = [list(csv.DictReader((out / f"audit_table.csv.{i}").read_text().splitlines()))
            for i in range(count)]
  rows, i = [], 0
  while any(shards):  # round robin over the shards, one mechanism (3 rows) at a time
    shard = shards[i % count]
    rows.extend(shard[:len(VARIANTS)])
    del shard[:len(VARIANTS)]
    i += 1
  for r in rows:
    for k in ("epsilon_lower", "epsilon_certified", "seconds"):
      r[k] = float(r[k])
  _write_csv(out / "audit_table.csv", rows)
  (out / "audit_table.md").write_text(markdown(rows))
  metas = [json.loads((out / f"audit_table_meta.json.{i}").read_text()) for i in range(count)]
  meta = {**metas[0], "shards": metas, "audited_mechanisms": sum(
      m["audited_mechanisms"] for m in metas), "wall_s": max(m["wall_s"] for m in metas)}
  (out / "audit_table_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
  for i in range(count):
    (out / f"audit_table.csv.{i}").unlink()
    (out / f"audit_table_meta.json.{i}").unlink()
  print(f"merged {count} shards: {len(rows)} rows", flush=True)
  return 0

if __name__ == "__main__":
  sys.exit(main())
