"""Where a ``fedjax-dp run`` process spends its time before the end of round 1.

  PYTHONPATH=$PWD python benchmarks/startup_profile.py quickstart
  PYTHONPATH=$PWD python benchmarks/startup_profile.py w2 --data-dir DIR   # CIFAR-10 files
  ... [--cache off|DIR] [--set key=value ...] [--json]

Runs the command line's ``run`` in this (fresh) process with the phases of a run
timed, stops at the end of round 1 and prints one line per phase: its wall seconds,
and how much of them JAX spent tracing (jaxpr), lowering (StableHLO), compiling or
loading from the persistent cache (XLA), the rest being host work and device time.
``benchmarks/startup.py --profile`` runs it in a fresh process twice (cold and warm
cache). The phases are the engine's own functions, wrapped here (nothing in the
package is changed): ``imports`` is the time from the process's start to the end of
importing the command line and the engine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def process_start_time() -> float:
  """This process's start as a ``time.time()`` value (Linux ``/proc``), else now."""
  try:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                 if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, StopIteration, ValueError, IndexError):
    return time.time()


T0 = float(os.environ.get("STARTUP_T0") or process_start_time())

import jax  # (timed as part of the imports)

from fedjax_dp import cli, experiment
from fedjax_dp.host import building, groups
from fedjax_dp.training import memory

IMPORTED = time.time()

JAX_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
# (owner, attribute, phase): the engine's functions timed as phases, outermost first.
PHASES = [
    (experiment, "run", "run"),
    (building, "build", "build"),
    (building, "_data", "build: dataset, partition, device copy"),
    (building, "get_model", "build: model"),
    (building, "make_privacy_plan", "build: privacy plan (calibration)"),
    (memory, "client_chunk_for_memory", "client chunk (memory probe)"),
    (groups, "_compile", "program (device data, mesh)"),
    (groups._Lanes, "__init__", "run loops, initial model"),
    (groups._Lanes, "plan", "round 1: host plan"),
    (groups._Lanes, "train", "round 1: train"),
    (groups._Lanes, "validate", "round 1: validation"),
    (groups._Lanes, "evaluate", "round 1: evaluation"),
    (groups._Lanes, "record", "round 1: record"),
]


class _Stop(Exception):
  """Raised after round 1 is recorded."""


class Profile:
  """Wall time per phase (self time: nested phases subtracted) and JAX's durations."""

  def __init__(self):
    self.stack: list[str] = []
    self.rows: dict[str, dict[str, float]] = {}
    self.cache_hits = 0

  def row(self, name):
    return self.rows.setdefault(name, {"wall": 0.0, "trace": 0.0, "lower": 0.0,
                                       "compile": 0.0, "calls": 0})

  def on_event(self, event, duration, **kw):
    del kw
    kind = JAX_EVENTS.get(event)
    if kind:
      self.row(self.stack[-1] if self.stack else "outside the phases")[kind] += duration

  def on_count(self, event, **kw):
    del kw
    if event == "/jax/compilation_cache/cache_hits":
      self.cache_hits += 1

  def wrap(self, owner, attr, name, stop_after=False):
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
      if self.stack and self.stack[-1] == name:  # a recursive call: one phase
        return fn(*args, **kwargs)
      self.stack.append(name)
      start = time.time()
      try:
        return fn(*args, **kwargs)
      finally:
        self.stack.pop()
        wall = time.time() - start
        self.row(name)["wall"] += wall
        self.row(name)["calls"] += 1
        if self.stack:
          self.row(self.stack[-1])["wall"] -= wall  # self time of the parent
        if stop_after and name == "round 1: record":
          raise _Stop

    setattr(owner, attr, timed)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workload", choices=["quickstart", "w2"])
  parser.add_argument("--data-dir", default=None, help="w2: directory of CIFAR-10 batches")
  parser.add_argument("--cache", default=None, help="compilation_cache (default: the config's)")
  parser.add_argument("--set", action="append", default=[])
  parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
  parser.add_argument("--json", action="store_true", help="print one JSON line")
  args = parser.parse_args(argv)
  import tempfile
  prof = Profile()
  jax.monitoring.register_event_duration_secs_listener(prof.on_event)
  jax.monitoring.register_event_listener(prof.on_count)
  for owner, attr, name in PHASES:
    prof.wrap(owner, attr, name, stop_after=True)
  config = "quickstart" if args.workload == "quickstart" else str(ROOT / "benchmarks/w2_config.py")
  sets = list(args.set)
  if args.workload == "w2":
    sets.append(f"data.dir={args.data_dir}")
  if args.cache:
    sets.append(f"compilation_cache={args.cache}")
  with tempfile.TemporaryDirectory() as tmp:
    out = args.out or str(Path(tmp) / "run")
    argv = ["run", config, "--out", out, "--no-progress"] + [a for s in sets for a in ("--set", s)]
    start = time.time()
    try:
      cli.main(argv)
    except _Stop:
      pass
    end = time.time()
  phases = {"imports (process start to engine imported)": {
      "wall": IMPORTED - T0, "trace": 0.0, "lower": 0.0, "compile": 0.0, "calls": 1},
      "command line (config, checks)": {"wall": 0.0, "trace": 0.0, "lower": 0.0,
                                        "compile": 0.0, "calls": 1}}
  phases.update(prof.rows)
  inside = sum(r["wall"] for n, r in prof.rows.items())
  phases["command line (config, checks)"]["wall"] = (end - start) - inside
  phases["between imports and the command"] = {"wall": start - IMPORTED, "trace": 0.0,
                                               "lower": 0.0, "compile": 0.0, "calls": 1}
  total = end - T0
  if args.json:
    print(json.dumps({"workload": args.workload, "total_s": total, "phases": phases,
                      "cache_hits": prof.cache_hits,
                      "cache_dir": jax.config.jax_compilation_cache_dir}))
    return 0
  print(f"{args.workload}: {total:.2f} s from process start to the end of round 1 "
        f"(persistent cache {jax.config.jax_compilation_cache_dir}, {prof.cache_hits} hits)")
  print(f"{'phase':<46} {'wall s':>7} {'trace':>6} {'lower':>6} {'XLA':>6} {'rest':>6}")
  for name, r in phases.items():
    rest = r["wall"] - r["trace"] - r["lower"] - r["compile"]
    print(f"{name:<46} {r['wall']:7.2f} {r['trace']:6.2f} {r['lower']:6.2f} "
          f"{r['compile']:6.2f} {rest:6.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
