"""All benchmarks W1-W4 and W7 with their baselines, side by side, in one command.

  python benchmarks/run_all.py [--quick] [--only W1,W3] [--no-torch]

Every (workload, method) runs in a fresh process (``workloads.py``), so its peak
memory and its compile cache are its own; the machine's fp32 matmul roofline is
measured inside each process, just before its timing. Prints one table and writes
``benchmarks/results/<workload>.csv`` plus ``benchmarks/results/all.csv`` and
``benchmarks/results/table.md``. ``--quick`` takes fewer repeats and skips the
slowest baselines; the full run takes about 12 minutes on 2 CPU cores.
``--only W3,W4/batched`` re-measures the tasks starting with those prefixes and
keeps the saved rows of the others. W8 (cohorts streamed from a 5 GB memory-mapped
federation) has its own script, ``bench_w8_stream.py``, which writes its rows here;
this script keeps them. The PyTorch rows need ``pip install
torch==2.13.0`` (CPU wheel); without torch they are skipped. ``W2/pfl`` (pfl-research
0.6.0 on W2, ``pfl_w2.py``) runs with ``--pfl-python /tmp/pflvenv/bin/python``, the
interpreter of a virtual environment with ``pip install torch==2.13.0`` then ``pip
install 'pfl==0.6.0'``;
there ``W2/torch`` runs too when this environment has no torch. ``startup.py`` writes the
``startup/*`` rows and, from one interleaved run, ``W2/ours`` and ``W2/pfl`` (with a
``run_id``: compared only with each other); ``--only W2`` here replaces them with this
script's separate-process rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, machine, print_table, run_task

SCRIPT = Path(__file__).resolve().parent / "workloads.py"
PFL_SCRIPT = Path(__file__).resolve().parent / "pfl_w2.py"
# (task, timeout in seconds); the order is the table's.
TASKS = [
    ("W1/ours", 300), ("W1/ours_all_at_once", 300), ("W1/loop", 300), ("W1/torch", 600),
    ("W2/ours", 600), ("W2/loop", 600), ("W2/torch", 300), ("W2/pfl", 600),
    ("W3-1k/ours", 300), ("W3-1k/ours_unfused", 300), ("W3-1k/fused", 300),
    ("W3-1k/loop", 300), ("W3-1k/torch", 300),
    ("W3-10k/ours", 300), ("W3-10k/ours_unfused", 300), ("W3-10k/ours_all_at_once", 300),
    ("W3-10k/fused", 300), ("W3-10k/loop", 300), ("W3-10k/torch", 300),
    ("W4/batched", 600), ("W4/one_by_one", 900),
    ("W4/batched_files", 600), ("W4/one_by_one_files", 900), ("W4/one_by_one_cli", 1200),
    ("W4-agg/batched", 600), ("W4-agg/one_by_one", 900),
]
# W7: DP-FedAvg (update clipping + central noise) in W1's setting.
TASKS += [("W7/ours", 300), ("W7/ours_all_at_once", 300), ("W7/ours_unfused", 300),
          ("W7/loop", 300), ("W7/torch", 600)]
# W5 / W6: the A-DPFL MNIST CNN and Fu's FEMNIST CNN.
TASKS += [
    ("W5/ours", 600), ("W5/ours_conv", 600), ("W5/loop", 600), ("W5/torch", 600),
    ("W6/ours", 600), ("W6/ours_conv", 600), ("W6/loop", 600), ("W6/torch", 600),
]
QUICK_SKIP = {"W3-10k/loop", "W3-10k/torch", "W4/one_by_one_cli", "W5/ours_conv",
              "W6/ours_conv"}
COLUMNS = ["task", "seconds_per_round", "client_updates_per_s", "effective_gflops",
           "roofline_gflops", "roofline_frac", "peak_rss_mb", "compile_s", "vs", "note"]


def _notes(rows: dict[str, dict]) -> None:
  """Adds the comparisons the targets ask for (speedups and ratios)."""
  def ratio(a, b, key="seconds_per_round"):
    # Rows written by another script in one run of its own (startup.py's interleaved
    # W2/ours and W2/pfl carry a run_id) are compared only with rows of that run.
    if a in rows and b in rows and "error" not in rows[a] and "error" not in rows[b] and (
        rows[a].get("run_id") == rows[b].get("run_id")):
      return rows[b][key] / rows[a][key]
    return None

  def faster(r, base):
    return f"{r:.1f}x faster than {base}" if r >= 1 else f"{1 / r:.1f}x slower than {base}"

  for w in ("W1", "W2", "W5", "W6"):
    for base in ("torch", "pfl", "loop", "ours_conv"):
      r = ratio(f"{w}/ours", f"{w}/{base}")
      if r is not None:
        rows[f"{w}/ours"].setdefault("vs", []).append(faster(r, base))
  for w in ("W3-1k", "W3-10k"):
    r = ratio(f"{w}/fused", f"{w}/ours")
    if r is not None:
      rows[f"{w}/ours"].setdefault("vs", []).append(f"{r:.1f}x the fused batch's time")
    for base in ("loop", "torch"):
      r = ratio(f"{w}/ours", f"{w}/{base}")
      if r is not None:
        rows[f"{w}/ours"].setdefault("vs", []).append(faster(r, base))
  for base in ("torch", "loop", "ours_unfused"):
    r = ratio("W7/ours", f"W7/{base}")
    if r is not None:
      rows["W7/ours"].setdefault("vs", []).append(faster(r, base))
  for batched, base, label in (
      ("W4/batched", "W4/one_by_one", "one by one"),
      ("W4/batched_files", "W4/one_by_one_files", "one by one"),
      ("W4/batched_files", "W4/one_by_one_cli", "a process per point"),
      ("W4-agg/batched", "W4-agg/one_by_one", "one by one")):
    r = ratio(batched, base, "total_s")
    if r is not None:
      rows[batched].setdefault("vs", []).append(f"{r:.1f}x faster end to end than {label}")
  for row in rows.values():
    if isinstance(row.get("vs"), list):
      row["vs"] = "; ".join(row["vs"])
    notes = []
    if "client_chunk" in row:
      notes.append(f"client_chunk={row['client_chunk']}")
    if "conv_impl" in row:
      notes.append(f"conv_impl={row['conv_impl']}")
    if "total_s" in row:
      notes.append(f"total {row['total_s']:.1f} s")
    if "versions" in row:
      notes.append(row["versions"])
    if "load_1min" in row:
      notes.append(f"load {row['load_1min']:g} -> {row.get('load_1min_end', row['load_1min']):g}")
    if row.get("detail"):
      notes.append(str(row["detail"]))
    if row.get("error"):
      notes.append(row["error"].splitlines()[-1][:120])
    row["note"] = ", ".join(notes)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description="Run all fedjax_dp benchmarks.")
  parser.add_argument("--quick", action="store_true", help="fewer repeats")
  parser.add_argument("--only", default="", help="comma-separated workload prefixes")
  parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
  parser.add_argument("--pfl-python", default="",
                      help="python of pfl's environment: runs W2/pfl (pfl_w2.py) there")
  parser.add_argument("--render", action="store_true",
                      help="only rebuild the table from benchmarks/results/all.csv")
  args = parser.parse_args(argv)
  if args.render:
    return _render_saved()
  have_torch = importlib.util.find_spec("torch") is not None and not args.no_torch
  only = [p for p in args.only.split(",") if p]
  start = time.time()
  # --only re-measures some tasks and keeps the saved rows of the others; rows of
  # tasks this script does not run (W8: bench_w8_stream.py) are always kept.
  saved = _load_saved() if (RESULTS / "all.csv").exists() else {}
  listed = {t for t, _ in TASKS}
  rows: dict[str, dict] = {k: v for k, v in saved.items() if only or k not in listed}
  for task, timeout in TASKS:
    if only and not any(task.startswith(p) for p in only):
      continue
    if args.quick and task in QUICK_SKIP:
      continue
    quick = ["--quick"] if args.quick else []
    in_pfl_env = task == "W2/pfl" or (task == "W2/torch" and not have_torch and args.pfl_python
                                       and not args.no_torch)
    if task == "W2/pfl" and not args.pfl_python:
      rows[task] = {"task": task, "error": "pfl not run (--pfl-python, see pfl_w2.py)"}
      continue
    if task.endswith("/torch") and not have_torch and not in_pfl_env:
      rows[task] = {"task": task, "error": "torch not installed (pip install torch==2.13.0)"}
      continue
    print(f"[{time.time() - start:6.0f} s] {task} ...", flush=True)
    if in_pfl_env:
      out = run_task(PFL_SCRIPT, [task.split("/")[1], *quick], timeout, args.pfl_python)
    else:
      out = run_task(SCRIPT, [task, *quick], timeout)
    out["task"] = task
    rows[task] = out
  _notes(rows)
  order = [t for t, _ in TASKS]
  table = sorted(rows.values(), key=lambda r: order.index(r["task"]) if r["task"] in order
                 else len(order))
  print(f"\nmachine: {machine()}")
  print(f"command: python benchmarks/run_all.py{' '.join([''] + (argv or sys.argv[1:]))}; "
        f"took {time.time() - start:.0f} s\n")
  print_table(table, COLUMNS)
  _write(table)
  return 0


def _load_saved() -> dict[str, dict]:
  """The rows of ``results/all.csv`` by task, without the derived comparisons (rows of
  tasks this script does not run keep theirs: it cannot derive them)."""
  listed = {t for t, _ in TASKS}
  from fedjax_dp.files.results import read_csv

  def number(v):
    try:
      return float(v)
    except (TypeError, ValueError):
      return v

  rows = {}
  for r in read_csv(RESULTS / "all.csv"):
    drop = ("vs", "note", "machine") if r["task"] in listed else ("machine",)
    r = {k: number(v) for k, v in r.items() if v != "" and k not in drop}
    if "client_chunk" in r:
      r["client_chunk"] = int(r["client_chunk"])
    rows[r["task"]] = r
  return rows


def _render_saved() -> int:
  rows = _load_saved()
  _notes(rows)
  table = list(rows.values())
  print_table(table, COLUMNS)
  _write(table)
  return 0


def _write(table: list[dict]) -> None:
  RESULTS.mkdir(parents=True, exist_ok=True)
  from fedjax_dp.files.results import write_csv
  fields = sorted({k for r in table for k in r} - {"task", "machine"})
  write_csv(RESULTS / "all.csv", [dict({"machine": machine()}, **r) for r in table],
            ["task", *fields, "machine"])
  by_workload: dict[str, list] = {}
  for r in table:
    by_workload.setdefault(r["task"].split("/")[0], []).append(r)
  for w, rs in by_workload.items():
    write_csv(RESULTS / f"{w}.csv", rs, ["task", *fields])
  lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  for r in table:
    cells = []
    for c in COLUMNS:
      v = r.get(c)
      cells.append(f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v)))
    lines.append("| " + " | ".join(cells) + " |")
  (RESULTS / "table.md").write_text("\n".join(lines) + "\n")
  print(f"\nwrote {RESULTS}/all.csv, per-workload CSVs and table.md")


if __name__ == "__main__":
  sys.exit(main())
