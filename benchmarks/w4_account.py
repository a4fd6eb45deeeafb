"""Where W4's end-to-end time goes: build, compile, device rounds, evaluation, host.

  python benchmarks/w4_account.py batched          # the 32-point sweep, one program
  python benchmarks/w4_account.py one_by_one [N]   # the first N points one by one

Wraps the engine's round and evaluation functions (blocking on each call, which the
run loop does anyway: it reads every round's metrics) and the host loop's
``plan_round`` (schedule, accountant, client sampling) and ``record``; prints one
JSON line of seconds. ``*_first`` is each program's first call (compilation);
``other`` is the rest of the wall time (model init, result assembly, imports done
lazily).
"""

from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import workloads

from fedjax_dp import experiment, sweep
from fedjax_dp.training import engine

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def _timed(name, fn, block=True):
  def wrapped(*args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    if block:
      out = jax.block_until_ready(out)
    key = name + ("_first" if block and CALLS[name] == 0 else "")
    SECONDS[key] += time.perf_counter() - start
    CALLS[name] += 1
    return out
  return wrapped


def _instrument():
  make_sweep_fns = engine.make_sweep_fns

  def timed_fns(*args, **kwargs):
    round_fn, eval_fn = make_sweep_fns(*args, **kwargs)
    CALLS["round"] = CALLS["eval"] = 0  # a new program: its first call compiles
    return _timed("round", round_fn), _timed("eval", eval_fn)

  engine.make_sweep_fns = timed_fns
  for name in ("plan_round", "record", "finish"):
    setattr(experiment.RunLoop, name,
            _timed("host_" + name, getattr(experiment.RunLoop, name), block=False))
  experiment.build = _timed("build", experiment.build, block=False)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  method = argv[0]
  _instrument()
  cfg = workloads.w4_config()
  grid = {"privacy.epsilon": list(workloads.W4_EPSILONS), "seed": list(workloads.W4_SEEDS)}
  points = sweep.expand(cfg, grid)
  start = time.perf_counter()
  if method == "batched":
    sweep.run_sweep(cfg, grid, None)
    n = len(points)
  else:
    n = int(argv[1]) if len(argv) > 1 else len(points)
    for p in points[:n]:
      experiment.run(p.config, None)
  total = time.perf_counter() - start
  out = {k: round(v, 2) for k, v in SECONDS.items()}
  out["other"] = round(total - sum(SECONDS.values()), 2)
  out["total"] = round(total, 2)
  print(json.dumps({"method": method, "points": n, "seconds": out}))


if __name__ == "__main__":
  main()
