"""Time to result: seconds from process start to the end of round 1, ours beside pfl.

  PYTHONPATH=$PWD python benchmarks/startup.py --pfl-python /tmp/pflvenv/bin/python
  PYTHONPATH=$PWD python benchmarks/startup.py --profile quickstart   # phase breakdown

One command for the rows ``startup/<workload>/{ours_first, ours_second, pfl}`` (the
quickstart and W2) and ``W2/{ours, pfl}`` of ``benchmarks/results/all.csv``:

* **As a user meets it.** Ours is the command line a user types, ``python -m
  fedjax_dp.cli run quickstart --out DIR`` and ``... run benchmarks/w2_config.py --set
  data.dir=DIR`` (W2 reads CIFAR-10 python batches of random images that this script
  writes once), with nothing set: no ``FEDJAX_DP_COMPILATION_CACHE``, no JAX cache
  variable, the default cache location. ``ours_first`` runs with an empty user cache
  directory (``XDG_CACHE_HOME`` pointed at a fresh temporary folder, as for a new
  user; matplotlib keeps its own), ``ours_second`` is the next process on the same
  folder. pfl runs ``benchmarks/pfl_w2.py`` in its own environment (``--pfl-python``;
  pfl 0.6.0 with torch's CPU wheel at its default two threads): W2 from the same
  CIFAR-10 files, the quickstart from the same digits (see pfl_w2.py).
* **Timed from outside.** Each process is started here and its output read as it
  comes: our progress bar's ``k/T`` and pfl's ``round k`` lines are stamped with this
  process's clock, so ``total_s`` runs from the start of the child process to the end
  of its round 1 (everything: interpreter, imports, data, building, compiling, the
  round). After ``--rounds`` rounds the child is stopped.
* **Interleaved.** W2 alternates ours and pfl, ``--turns`` processes of each (ours
  first with the cold cache, then warm); ``W2/ours`` and ``W2/pfl`` are the medians of
  the round-to-round intervals after round 1 over all of a method's processes. The
  1-minute load average is read at each process's start and end and written beside
  every number (``load_1min``, ``load_1min_end``): the machine is shared.

``--profile quickstart|w2`` runs ``startup_profile.py`` twice in fresh processes (cold
and warm cache) and prints where the time before round 1 goes (docs/scaling.md).
``--no-csv`` prints without writing ``all.csv``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pickle
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

# Our progress bar: "name:  1%|...| 1/100 [00:03<...]"; pfl_w2.py: "round 1".
_OURS_RE = re.compile(r"(?<![\d/])(\d+)/(\d+) \[")
_PFL_RE = re.compile(r"^round (\d+)\s*$", re.MULTILINE)
# Variables that would change where (or whether) the cache lives: never the user's.
_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "JAX_ENABLE_COMPILATION_CACHE",
               "FEDJAX_DP_COMPILATION_CACHE", "FEDJAX_DP_TEST_COMPILATION_CACHE")


def load() -> float:
  return round(os.getloadavg()[0], 2)


def write_cifar10(folder: Path, seed: int = 0) -> Path:
  """Random images in CIFAR-10's python format (``data_batch_1..5``, ``test_batch``):
  50,000 + 10,000 uint8 images and labels, what ``data.name=cifar10`` reads."""
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  for name, n in [(f"data_batch_{i}", 10000) for i in range(1, 6)] + [("test_batch", 10000)]:
    batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             "labels": rng.integers(0, 10, n).tolist()}
    with open(folder / name, "wb") as f:
      pickle.dump(batch, f, protocol=4)
  return folder


def write_quickstart_npz(path: Path) -> Path:
  """The quickstart's clients and test set (fedjax_dp's own digits split and IID
  partition, as the quickstart builds them), for pfl's process."""
  from fedjax_dp import config as config_lib
  from fedjax_dp.data import load_dataset, partition_clients
  cfg = config_lib.load_config("quickstart")
  ds = load_dataset(cfg.data.name)
  clients = partition_clients(cfg, np.asarray(ds.y_train), ds.train_groups)
  x = np.asarray(ds.x_train).reshape(len(ds.y_train), -1)
  np.savez(path, x=np.stack([x[c] for c in clients]).astype(np.float32),
           y=np.stack([np.asarray(ds.y_train)[c] for c in clients]),
           x_test=np.asarray(ds.x_test).reshape(len(ds.y_test), -1).astype(np.float32),
           y_test=np.asarray(ds.y_test))
  return path


def timed_child(cmd: list[str], env: dict, pattern: re.Pattern, rounds: int,
                timeout: float) -> dict:
  """Starts ``cmd``, stamps each round marker of its output, stops it after ``rounds``.

  Returns ``{'stamps': {k: seconds since start}, 'load_1min', 'load_1min_end',
  'returncode', 'tail'}``.
  """
  load_start = load()
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          cwd=ROOT, start_new_session=True)
  sel = selectors.DefaultSelector()
  sel.register(proc.stdout, selectors.EVENT_READ)
  text, stamps = "", {}
  try:
    while time.perf_counter() - start < timeout:
      if not sel.select(timeout=1.0):
        if proc.poll() is not None:
          break
        continue
      chunk = os.read(proc.stdout.fileno(), 65536)
      now = time.perf_counter() - start
      if not chunk:
        break
      text = (text + chunk.decode(errors="replace"))[-20000:]
      for m in pattern.finditer(text):
        stamps.setdefault(int(m.group(1)), now)
      if max(stamps, default=0) >= rounds:
        break
  finally:
    if proc.poll() is None:  # stop the whole process group (the run's threads too)
      os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    sel.close()
  stamps.pop(0, None)
  return {"stamps": stamps, "load_1min": load_start, "load_1min_end": load(),
          "returncode": proc.returncode, "tail": text[-600:]}


def child_env(xdg: Path) -> dict:
  """This environment without cache settings, the user cache directory at ``xdg``."""
  env = {k: v for k, v in os.environ.items() if k not in _CACHE_VARS}
  env["XDG_CACHE_HOME"] = str(xdg)
  env.setdefault("PYTHONPATH", str(ROOT))
  try:
    import matplotlib
    env.setdefault("MPLCONFIGDIR", matplotlib.get_cachedir())  # its font cache as usual
  except ImportError:
    pass
  return env


def _row(task: str, res: dict, **extra) -> dict:
  stamps = res["stamps"]
  row = {"task": task, "load_1min": res["load_1min"], "load_1min_end": res["load_1min_end"],
         **extra}
  if 1 not in stamps:
    row["error"] = f"no round 1 (exit {res['returncode']}): {res['tail'][-300:]}"
    return row
  row["total_s"] = stamps[1]
  return row


def intervals(res: dict) -> list[float]:
  """Round-to-round seconds after round 1."""
  s = res["stamps"]
  return [s[k] - s[k - 1] for k in sorted(s) if k >= 2 and k - 1 in s]


def quickstart(tmp: Path, pfl_python: str | None, rounds: int) -> list[dict]:
  xdg = tmp / "user_cache_quickstart"
  env = child_env(xdg)
  cmd = lambda i: [sys.executable, "-m", "fedjax_dp.cli", "run", "quickstart", "--out",
                   str(tmp / f"quickstart_{i}")]
  rows = []
  for i, label in enumerate(("ours_first", "ours_second")):
    print(f"quickstart {label} ...", flush=True)
    res = timed_child(cmd(i), env, _OURS_RE, rounds, 900)
    rows.append(_row(f"startup/quickstart/{label}", res, method=label,
                     workload="quickstart: fedjax-dp run quickstart (10 x 140 digits, MLP, "
                              "per-example clip, upload noise)",
                     detail="process start to the end of round 1"))
  if pfl_python:
    print("quickstart pfl ...", flush=True)
    npz = write_quickstart_npz(tmp / "quickstart_digits.npz")
    res = timed_child([pfl_python, str(HERE / "pfl_w2.py"), "quickstart", "--npz", str(npz),
                       "--stream", "--rounds", str(rounds)], env, _PFL_RE, rounds, 900)
    rows.append(_row("startup/quickstart/pfl", res, method="pfl",
                     workload="quickstart in pfl (10 x 140 digits, MLP, update clip, local "
                              "Gaussian)", detail="process start to the end of round 1"))
  return rows


def w2(tmp: Path, pfl_python: str | None, rounds: int, turns: int) -> list[dict]:
  cifar = write_cifar10(tmp / "cifar10")
  xdg = tmp / "user_cache_w2"
  env = child_env(xdg)
  ours = lambda i: [sys.executable, "-m", "fedjax_dp.cli", "run",
                    str(HERE / "w2_config.py"), "--out", str(tmp / f"w2_{i}"),
                    "--set", f"data.dir={cifar}"]
  pfl = [pfl_python, str(HERE / "pfl_w2.py"), "pfl", "--cifar-dir", str(cifar), "--stream",
         "--rounds", str(rounds)] if pfl_python else None
  runs: dict[str, list[dict]] = {"ours": [], "pfl": []}
  for turn in range(turns):
    print(f"W2 turn {turn + 1}/{turns}: ours ...", flush=True)
    runs["ours"].append(timed_child(ours(turn), env, _OURS_RE, rounds, 1500))
    if pfl:
      print(f"W2 turn {turn + 1}/{turns}: pfl ...", flush=True)
      runs["pfl"].append(timed_child(pfl, env, _PFL_RE, rounds, 1500))
  workload = "W2 pfl CIFAR-10 (50 of 1000 x 50, CNN, 5 steps x 10, central DP)"
  rows = [_row("startup/W2/ours_first", runs["ours"][0], method="ours_first",
               workload=workload, detail="process start to the end of round 1")]
  if len(runs["ours"]) > 1:
    rows.append(_row("startup/W2/ours_second", runs["ours"][1], method="ours_second",
                     workload=workload, detail="process start to the end of round 1"))
  if runs["pfl"]:
    rows.append(_row("startup/W2/pfl", runs["pfl"][0], method="pfl", workload=workload,
                     detail="process start to the end of round 1"))
  run_id = f"startup.py {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}"
  for method, results in runs.items():
    gaps = [g for r in results for g in intervals(r)]
    if not gaps:
      continue
    sec = float(np.median(gaps))
    loads = [r["load_1min"] for r in results] + [r["load_1min_end"] for r in results]
    rows.append({"task": f"W2/{method}", "method": method, "workload": workload,
                 "seconds_per_round": sec, "client_updates_per_s": 50 / sec,
                 "load_1min": min(loads), "load_1min_end": max(loads), "run_id": run_id,
                 "detail": (f"interleaved with {'pfl' if method == 'ours' else 'ours'}: "
                          f"{len(results)} processes x rounds 2-{rounds}, median of "
                          f"{len(gaps)} intervals (range {min(gaps):.2f}-{max(gaps):.2f} s); "
                          f"load_1min = lowest/highest 1-minute load seen")})
  return rows


def profile(workload: str, tmp: Path) -> None:
  """``startup_profile.py`` in two fresh processes: a cold cache, then a warm one."""
  env = child_env(tmp / "user_cache_profile")
  extra = []
  if workload == "w2":
    extra = ["--data-dir", str(write_cifar10(tmp / "cifar10"))]
  for label in ("first (empty cache)", "second (warm cache)"):
    print(f"--- {workload}, {label}, load {load()}", flush=True)
    subprocess.run([sys.executable, str(HERE / "startup_profile.py"), workload, *extra],
                   env=env, cwd=ROOT, check=False)
  print(f"--- load {load()}")


def save(rows: list[dict]) -> None:
  """Merges the rows into ``results/all.csv`` (the other rows kept) via run_all."""
  import run_all
  saved = run_all._load_saved() if (run_all.RESULTS / "all.csv").exists() else {}
  for r in rows:
    saved[r["task"]] = r
  run_all._notes(saved)
  order = [t for t, _ in run_all.TASKS]
  table = sorted(saved.values(), key=lambda r: (order.index(r["task"]) if r["task"] in order
                                                else len(order), r["task"]))
  run_all._write(table)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pfl-python", default="", help="python of pfl's environment")
  parser.add_argument("--only", default="quickstart,W2", help="quickstart, W2 or both")
  parser.add_argument("--turns", type=int, default=3, help="W2: processes of each method")
  parser.add_argument("--rounds", type=int, default=6, help="W2: rounds per process")
  parser.add_argument("--profile", choices=["quickstart", "w2"], default=None)
  parser.add_argument("--no-csv", action="store_true", help="print only")
  args = parser.parse_args(argv)
  pfl_python = args.pfl_python or None
  with tempfile.TemporaryDirectory(prefix="fedjax_dp_startup_") as tmp:
    tmp = Path(tmp)
    if args.profile:
      profile(args.profile, tmp)
      return 0
    start, rows = time.time(), []
    only = {w.strip().lower() for w in args.only.split(",")}
    if "quickstart" in only:
      rows += quickstart(tmp, pfl_python, 3)
    if "w2" in only:
      rows += w2(tmp, pfl_python, args.rounds, args.turns)
  for r in rows:
    value = r.get("total_s", r.get("seconds_per_round"))
    shown = "-" if value is None else f"{value:.2f} s"
    print(f"{r['task']:<32} {shown:>9}  load {r['load_1min']:.1f} -> {r['load_1min_end']:.1f}"
          f"  {r.get('error', '')}")
  by = {r["task"]: r for r in rows}
  for w in ("quickstart", "W2"):
    a, b = by.get(f"startup/{w}/ours_first", {}), by.get(f"startup/{w}/ours_second", {})
    if "total_s" in a and "total_s" in b:
      print(f"{w}: the second run reaches round 1 in {b['total_s'] / a['total_s']:.2f} of the "
            f"first's time")
  print(f"took {time.time() - start:.0f} s")
  if not args.no_csv:
    save(rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
