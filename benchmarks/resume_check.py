"""Kill a run at a random round, resume it, and compare with an uninterrupted run.

  python benchmarks/resume_check.py experiments/configs/wei_mnist_mlp.py \
      --set data.dir=../shared/datasets/mnist --root runs/resume_check [--seed 0]

Runs ``fedjax-dp run CONFIG`` three times: once uninterrupted into ROOT/full; once
into ROOT/resumed, SIGKILLed (from outside, like a lost machine) at a random round
after the first checkpoint; and once more with the same command, which resumes from
the last checkpoint. Prints the SHA-256 of each directory's ``metrics.csv`` without
its ``wall_s`` column, of ``summary.json`` without ``wall_seconds`` and
``seconds_per_round``, and of the final model ``model.msgpack``; exits 1 if any
differ.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

WALL_COLUMNS = ("wall_s",)
WALL_SUMMARY_FIELDS = ("wall_seconds", "seconds_per_round")


def digests(run_dir: Path) -> dict[str, str]:
  """SHA-256 of a run directory's results, wall-clock fields left out."""
  with open(run_dir / "metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  buf = io.StringIO()
  writer = csv.DictWriter(buf, [c for c in rows[0] if c not in WALL_COLUMNS],
                          extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  summary = json.loads((run_dir / "summary.json").read_text())
  for field in WALL_SUMMARY_FIELDS:
    summary.pop(field, None)

  def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

  return {"metrics.csv (no wall_s)": sha(buf.getvalue().encode()),
          "summary.json (no wall times)": sha(json.dumps(summary, sort_keys=True).encode()),
          "model.msgpack": sha((run_dir / "model.msgpack").read_bytes())}


def _rows_on_disk(run_dir: Path) -> int:
  try:
    with open(run_dir / "metrics.csv") as f:
      return sum(1 for _ in f) - 1
  except OSError:
    return 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("config")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--root", required=True, help="directory for full/ and resumed/")
  parser.add_argument("--seed", type=int, default=0, help="draws the round to kill at")
  args = parser.parse_args()
  root = Path(args.root)
  shutil.rmtree(root, ignore_errors=True)
  cmd = [sys.executable, "-m", "fedjax_dp.cli", "run", args.config, "--no-progress",
         *[a for s in args.set for a in ("--set", s)]]
  start = time.time()
  subprocess.run([*cmd, "--out", str(root / "full")], check=True, stdout=subprocess.DEVNULL)
  print(f"uninterrupted: {time.time() - start:.1f} s")
  rounds = _rows_on_disk(root / "full")
  kill_after = random.Random(args.seed).randint(rounds // 10, rounds * 3 // 4)
  resumed = root / "resumed"
  proc = subprocess.Popen([*cmd, "--out", str(resumed)], stdout=subprocess.DEVNULL)
  while proc.poll() is None and _rows_on_disk(resumed) < kill_after:
    time.sleep(0.2)
  time.sleep(random.Random(args.seed + 1).uniform(0, 2))  # land mid-way between checkpoints
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  print(f"killed (exit {proc.returncode}) with {_rows_on_disk(resumed)} checkpointed rows "
        f"on disk (waited for >= {kill_after})")
  start = time.time()
  subprocess.run([*cmd, "--out", str(resumed)], check=True, stdout=subprocess.DEVNULL)
  print(f"resumed: {time.time() - start:.1f} s")
  a, b = digests(root / "full"), digests(resumed)
  for key in a:
    print(f"{key:30} {a[key]}  {b[key]}  {'equal' if a[key] == b[key] else 'DIFFERENT'}")
  return 0 if a == b else 1


if __name__ == "__main__":
  sys.exit(main())
