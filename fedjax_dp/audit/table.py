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
from fedjax_dp.audit.whole_run import RUN_VARIANTS, audit_run, dropped_round
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


# The whole run's budget (epsilon 3 over 4 rounds) cannot pay for A-DPFL's validation
# score at its default noise multiplier 1 (round 1 alone certifies 3.9, so the run
# refuses to start): the clients' validation release gets 5.
WHOLE_RUN_COMPANIONS = {("schedule.validation", "clients"): {"schedule.val_noise_multiplier": 5.0}}


def audit_sets(m: dict[str, str], whole_run: bool = False) -> dict[str, object]:
  """Settings of the audited config beyond the mechanism's own (:data:`L1_GEOMETRY_SETS`
  for Laplace on an L2-clipped upload: the clip mode's ``canary.l1_geometry``; in the
  whole-run table, :data:`WHOLE_RUN_COMPANIONS`)."""
  out = {}
  if m["privacy.mechanism"] == "laplace" and \
      clip_modes.get(m["client.clip_mode"]).canary.l1_geometry:
    out.update(L1_GEOMETRY_SETS)
  if whole_run:
    for key, sets in WHOLE_RUN_COMPANIONS.items():
      if m.get(key[0]) == key[1]:
        out.update(sets)
  return out


# The whole-run table (``--whole-run``): four rounds at epsilon 3 for the run, so a
# broken run's separated trials pass the certificate at 1000 trials (a perfect attack
# reaches about 4.4 there; the per-round base's epsilon 8 could not be exceeded).
WHOLE_RUN_SETS = ("rounds=4", "privacy.epsilon=3.0")
# Not a privacy fault (fedjax_dp.audit.whole_run): a correct audit must not flag it.
NOT_A_FAULT = ("band_state_dropped",)


def run_variants(base, m: dict[str, str]) -> tuple[str, ...]:
  """The whole-run variants of mechanism ``m``: correct, noise/10, clipping off, a
  late-round fault (every mechanism: for correlated noise the later rows of its
  decoder), and where the mechanism carries a noise state, that state dropped."""
  from fedjax_dp import experiment  # (builds the mechanism: only for this question)
  sets = {**mechanisms_lib.settings(m), **audit_sets(m, whole_run=True)}
  cfg = config_lib.override(base, [f"{k}={v}" for k, v in sets.items()])
  out = ("none", "noise_div10", "no_clip", "late_noise_div10")
  if m["privacy.mechanism"] in ("bandmf",):
    try:
      dropped_round(experiment.build(cfg))
      out += NOT_A_FAULT
    except ValueError:
      pass
  assert set(out) <= set(RUN_VARIANTS)
  return out


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
                    name: str | None = None, client_optimizer=None,
                    whole_run: bool = False) -> list[dict]:
  """The rows of one mechanism: each variant, escalated until caught (broken ones).

  ``name``: the mechanism's label (default :func:`mechanism_name`);
  ``client_optimizer``: a client optimizer given from Python
  (:func:`fedjax_dp.audit.audit`'s). A mechanism the plan refuses is audited with
  broken variants only (``sgd_step_weights``: the certificate is the one SGD's plan
  claims). ``whole_run``: each variant by :func:`fedjax_dp.audit.audit_run` (every
  trial a whole run; certified: the run's epsilon after its T rounds); a variant in
  :data:`NOT_A_FAULT` is never escalated and reads "flagged" / "not flagged"."""
  sets = {**mechanisms_lib.settings(m), **audit_sets(m, whole_run)}
  cfg = config_lib.override(base, [f"{k}={v}" for k, v in sets.items()])
  rows, certified = [], None
  for variant in variants:
    n = trials
    while True:
      t0 = time.time()
      if whole_run:
        r = audit_run(cfg, AuditOptions(trials=n, seed=seed, variant=variant))
      else:
        r = audit(cfg, AuditOptions(trials=n, seed=seed, variant=variant,
                                    certify_run=certify_run and variant == "none"),
                  client_optimizer=client_optimizer)
      seconds = time.time() - t0
      certified = r.epsilon_certified if certified is None else certified
      caught = r.epsilon_lower > certified
      if variant in ("none", *NOT_A_FAULT) or caught or n >= trials * escalate:
        break
      n *= escalate
    rows.append({"mechanism": name or mechanism_name(m), "variant": variant,
                 "epsilon_lower": round(r.epsilon_lower, 4),
                 "epsilon_gdp": round(r.epsilon_gdp, 4),
                 "epsilon_certified": round(certified, 4),
                 "epsilon_certified_run": round(r.epsilon_certified_run, 4),
                 "caught": "" if variant == "none" else (
                     ("flagged" if caught else "not flagged") if variant in NOT_A_FAULT
                     else ("yes" if caught else "no")),
                 "trials": n, "seconds": round(seconds, 1), "relation": r.relation,
                 "level": r.level, "settings": json.dumps(sets, sort_keys=True),
                 "git_commit": _CODE_COMMIT[0][:12]})
    print(f"{rows[-1]['mechanism']:75s} {variant:12s} lower {r.epsilon_lower:7.3f} "
          f"certified {certified:7.3f} {rows[-1]['caught']:3s} n={n} {seconds:5.1f}s",
          flush=True)
  return rows


def markdown(rows: list[dict], whole_run: bool = False) -> str:
  """The rows as one markdown table (bold: a broken variant caught)."""
  header = (f"| mechanism | variant | lower bound (CP) | certified "
            f"({'T rounds' if whole_run else 'round 1'}) | caught | trials | seconds |")
  lines = [header, "|---|---|---|---|---|---|---|"]
  for r in rows:
    caught = {"yes": "**yes**", "no": "no", "": "--", "flagged": "flagged (wrongly)",
              "not flagged": "not flagged (no fault)"}[r["caught"]]
    lines.append(f"| `{r['mechanism']}` | {r['variant']} | {float(r['epsilon_lower']):.3f} | "
                 f"{float(r['epsilon_certified']):.3f} | {caught} | {r['trials']} | "
                 f"{float(r['seconds']):.0f} |")
  return "\n".join(lines) + "\n"


def joined_markdown(per_round: list[dict], whole: list[dict]) -> str:
  """The whole-run rows (:func:`audit_run`, T rounds) beside the per-round table's row
  of the same mechanism and variant (round 1; the base config's own run, epsilon 8
  over 100 rounds) where it has one: the audit table with its whole-run column. A
  fault after round 1 leaves the first round as it is: its per-round cell is the
  correct mechanism's."""
  def key(name: str) -> str:  # (the per-round table predates the optimizer axis)
    return name.removesuffix("/opt=sgd")
  first = {(key(r["mechanism"]), r["variant"]): r for r in per_round}
  lines = [("| mechanism | variant | whole run: lower bound | certified (T rounds) | caught | "
            "trials | seconds | round 1: lower bound | certified (round 1) |"),
           "|---|---|---|---|---|---|---|---|---|"]
  for r in whole:
    same = "none" if r["variant"] in ("late_noise_div10", *NOT_A_FAULT) else r["variant"]
    one = first.get((key(r["mechanism"]), same))
    caught = {"yes": "**yes**", "no": "no", "": "--", "flagged": "flagged (wrongly)",
              "not flagged": "not flagged (no fault)"}[r["caught"]]
    tail = (f"{float(one['epsilon_lower']):.3f} | {float(one['epsilon_certified']):.3f}"
            if one else "n/a | n/a")
    lines.append(f"| `{r['mechanism']}` | {r['variant']} | {float(r['epsilon_lower']):.3f} | "
                 f"{float(r['epsilon_certified']):.3f} | {caught} | {r['trials']} | "
                 f"{float(r['seconds']):.0f} | {tail} |")
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
  p.add_argument("--whole-run", action="store_true",
                 help="audit whole runs (fedjax_dp.audit.audit_run; base: "
                 + ", ".join(WHOLE_RUN_SETS) + "): audit_table_whole_run.{csv,md}")
  p.add_argument("--rerun-uncaught", type=int, default=0, metavar="F",
                 help="re-audit the table's broken variants not caught at F times their "
                 "trials (the table's CSV in --out; its rows replaced)")
  p.add_argument("--replace", action="store_true",
                 help="with --only: re-audit those mechanisms and replace their rows in the "
                 "table's CSV in --out (the rest kept; the re-run recorded in its meta)")
  p.add_argument("--resume", action="store_true",
                 help="keep the mechanisms already in this shard's CSV and audit the rest")
  p.add_argument("--merge", type=int, default=0, metavar="N",
                 help="only merge the N shards' CSV files into the table")
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                 help="directory of audit_table.{csv,md} and audit_table_meta.json")
  args = p.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = "audit_table_whole_run" if args.whole_run else "audit_table"
  if args.merge:
    return merge(out, args.merge, stem, args.whole_run)
  index, count = (int(v) for v in args.shard.split("/"))
  _CODE_COMMIT[0] = _git_commit()
  base_sets = [*BASE_SETS, *(WHOLE_RUN_SETS if args.whole_run else ()), *args.set]
  base = config_lib.override(config_lib.load_config(args.config), base_sets)
  if args.rerun_uncaught:
    return rerun_uncaught(out, stem, base, args)
  all_mechanisms = list(mechanisms_lib.enumerate_mechanisms(base))
  chosen = mechanisms_lib.covering(all_mechanisms, CORE)
  only = args.only.split(",")
  chosen = [m for m in chosen if any(o in mechanism_name(m) for o in only)][index::count]
  print(f"{len(all_mechanisms)} accepted mechanisms; auditing {len(chosen)} (every "
        f"combination of {', '.join(CORE)}, then each selection rule; shard {args.shard})",
        flush=True)
  if args.replace:
    return replace_rows(out, stem, base, chosen, args)
  t0 = time.time()
  suffix = f".{index}" if count > 1 else ""
  rows, done = [], set()
  if args.resume and (out / f"{stem}.csv{suffix}").exists():
    # Keep the mechanisms this shard's CSV already holds (the table's own file): a long
    # table stopped part way goes on from the next mechanism.
    rows = list(csv.DictReader((out / f"{stem}.csv{suffix}").read_text().splitlines()))
    done = {r["mechanism"] for r in rows}
    print(f"resuming: {len(done)} mechanisms already audited", flush=True)
  for m in chosen:
    if mechanism_name(m) in done:
      continue
    rows += audit_mechanism(base, m, args.trials, args.escalate, args.seed,
                            not args.no_run_certificate,
                            run_variants(base, m) if args.whole_run else VARIANTS,
                            whole_run=args.whole_run)
    _write_csv(out / f"{stem}.csv{suffix}", rows)  # (each mechanism's rows as they come)
  meta = {"command": "python -m fedjax_dp.audit.table " + " ".join(
              sys.argv[1:] if argv is None else argv),
          "git_commit": _git_commit(), "base_config": args.config,
          "base_sets": base_sets, "accepted_mechanisms": len(all_mechanisms),
          "audited_mechanisms": len(chosen), "core_axes": list(CORE),
          "trials": args.trials, "escalate": args.escalate, "seed": args.seed,
          "load_average": os.getloadavg(), "cpus": os.cpu_count(),
          "machine": platform.platform(), "wall_s": round(time.time() - t0, 1)}
  (out / f"{stem}_meta.json{suffix}").write_text(json.dumps(meta, indent=2) + "\n")
  if count == 1:
    _write_markdown(out, stem, rows, args.whole_run)
  print(f"wrote {out}/{stem}.csv{suffix}; "
        f"{sum(r['caught'] == 'no' for r in rows)} broken variants not caught", flush=True)
  return 0


def rerun_uncaught(out: Path, stem: str, base, args) -> int:
  """Re-audits every broken variant of ``<stem>.csv`` that was not caught, at
  ``args.rerun_uncaught`` times its trials (its row replaced, with this code's commit),
  and records the re-run in the meta file."""
  path = out / f"{stem}.csv"
  rows = list(csv.DictReader(path.read_text().splitlines()))
  redone = []
  for r in rows:
    if r["caught"] != "no":
      continue
    sets = json.loads(r["settings"])
    cfg = config_lib.override(base, [f"{k}={v}" for k, v in sets.items()])
    n = int(r["trials"]) * int(args.rerun_uncaught)
    t0 = time.time()
    opts = AuditOptions(trials=n, seed=args.seed, variant=r["variant"])
    res = audit_run(cfg, opts) if args.whole_run else audit(cfg, opts)
    caught = res.epsilon_lower > float(r["epsilon_certified"])
    r.update(epsilon_lower=round(res.epsilon_lower, 4), epsilon_gdp=round(res.epsilon_gdp, 4),
             caught="yes" if caught else "no", trials=n, seconds=round(time.time() - t0, 1),
             git_commit=_CODE_COMMIT[0][:12])
    redone.append(f"{r['mechanism']} {r['variant']}: {n} trials, lower "
                  f"{res.epsilon_lower:.3f} vs {float(r['epsilon_certified']):.3f}")
    print(redone[-1], flush=True)
  _write_csv(path, rows)
  _write_markdown(out, stem, rows, args.whole_run)
  _record_rerun(out, stem, redone)
  return 0


def _record_rerun(out: Path, stem: str, redone: list[str]) -> None:
  """Appends this re-run (command, commit, the rows it made) to ``<stem>_meta.json``."""
  meta_path = out / f"{stem}_meta.json"
  meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
  meta.setdefault("reruns", []).append({
      "command": "python -m fedjax_dp.audit.table " + " ".join(sys.argv[1:]),
      "git_commit": _CODE_COMMIT[0], "rows": redone})
  meta_path.write_text(json.dumps(meta, indent=2) + "\n")


def replace_rows(out: Path, stem: str, base, chosen: list[dict], args) -> int:
  """Re-audits the mechanisms ``chosen`` (``--only``) and puts their rows in place of
  theirs in ``<stem>.csv`` (the others kept), e.g. after a change of the attack that
  only they use; recorded in the meta file."""
  if not args.only:
    raise SystemExit("--replace needs --only (the mechanisms to re-audit)")
  path = out / f"{stem}.csv"
  rows = list(csv.DictReader(path.read_text().splitlines()))
  new, redone = {}, []
  for m in chosen:
    name = mechanism_name(m)
    if not any(r["mechanism"] == name for r in rows):
      raise SystemExit(f"{name} has no rows in {path}: run the table for it first")
    new[name] = audit_mechanism(base, m, args.trials, args.escalate, args.seed,
                                not args.no_run_certificate,
                                run_variants(base, m) if args.whole_run else VARIANTS,
                                whole_run=args.whole_run)
    redone += [f"{r['mechanism']} {r['variant']}: {r['trials']} trials, lower "
               f"{r['epsilon_lower']:.3f} vs {r['epsilon_certified']:.3f}" for r in new[name]]
  merged, placed = [], set()
  for r in rows:
    if r["mechanism"] not in new:
      merged.append(r)
    elif r["mechanism"] not in placed:
      merged.extend(new[r["mechanism"]])
      placed.add(r["mechanism"])
  _write_csv(path, merged)
  _write_markdown(out, stem, merged, args.whole_run)
  _record_rerun(out, stem, redone)
  print(f"replaced the rows of {len(new)} mechanisms in {path}", flush=True)
  return 0


def _write_markdown(out: Path, stem: str, rows: list[dict], whole_run: bool) -> None:
  """``<stem>.md``; the whole-run table joined with the per-round one's rows
  (``audit_table.csv`` in ``out``, if there) as :func:`joined_markdown`."""
  if whole_run and (out / "audit_table.csv").exists():
    per_round = list(csv.DictReader((out / "audit_table.csv").read_text().splitlines()))
    (out / f"{stem}.md").write_text(joined_markdown(per_round, rows))
  else:
    (out / f"{stem}.md").write_text(markdown(rows, whole_run))


def _write_csv(path: Path, rows: list[dict]) -> None:
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)


def merge(out: Path, count: int, stem: str = "audit_table", whole_run: bool = False) -> int:
  """Joins the shards ``<stem>.csv.<i>`` (in the covering's order) into
  ``<stem>.csv`` and ``.md``, and their meta files into one."""
  shards = [list(csv.DictReader((out / f"{stem}.csv.{i}").read_text().splitlines()))
            for i in range(count)]
  rows, i = [], 0
  while any(shards):  # round robin over the shards, one mechanism's rows at a time
    shard = shards[i % count]
    n = 1 + next((j for j, r in enumerate(shard[1:]) if r["mechanism"] != shard[0]["mechanism"]),
                 len(shard) - 1) if shard else 0
    rows.extend(shard[:n])
    del shard[:n]
    i += 1
  for r in rows:
    for k in ("epsilon_lower", "epsilon_certified", "seconds"):
      r[k] = float(r[k])
  _write_csv(out / f"{stem}.csv", rows)
  _write_markdown(out, stem, rows, whole_run)
  metas = [json.loads((out / f"{stem}_meta.json.{i}").read_text()) for i in range(count)]
  meta = {**metas[0], "shards": metas, "audited_mechanisms": sum(
      m["audited_mechanisms"] for m in metas), "wall_s": max(m["wall_s"] for m in metas)}
  (out / f"{stem}_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
  for i in range(count):
    (out / f"{stem}.csv.{i}").unlink()
    (out / f"{stem}_meta.json.{i}").unlink()
  print(f"merged {count} shards: {len(rows)} rows", flush=True)
  return 0

if __name__ == "__main__":
  sys.exit(main())
