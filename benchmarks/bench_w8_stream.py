"""W8: cohorts streamed from a memory-mapped federation vs the device-resident path.

  python benchmarks/bench_w8_stream.py                  # the W8 rows of results/all.csv
  python benchmarks/bench_w8_stream.py --clients 2000 --resident-clients 1000 \
      --k 100 --rounds 4 --no-csv                        # a quick smoke run

Writes a synthetic federation of ``--clients`` x ``--per-client`` 28x28x1 uint8 images
(default 200,000 x 32: 5.02 GB) as ``.npy`` files under a temporary directory, then
runs, each in a fresh process (its own peak memory):

* ``streamed``: the whole federation memory-mapped (``data.placement='host'``'s
  source, :func:`fedjax_dp.data.streaming.open_federation`); each round's K clients
  are gathered on the host and moved to the device, the next round's prefetched on
  a background thread while the round computes (:class:`~fedjax_dp.data.streaming.CohortStream`);
* ``resident``: the first ``--resident-clients`` clients (default 20,000, 2.0 GB as
  float32: the full federation is 20 GB as float32 and does not fit this machine's
  memory) put on the device once, the round gathering its K clients there -- the
  same K, the same round program. This process then streams the same subset for the
  same rounds and checks that the final models are equal bit for bit.

The round: ``mlp_784_256_10``, one full-batch local step (W7's DP-FedAvg: update
clipping, central Gaussian noise), K = ``--k`` (default 1,000) uniformly selected
clients, all at once. Seconds per round: median of ``--rounds`` rounds after two
warm-up rounds (compilation). Peak memory: the process's peak RSS (``getrusage``;
on a CPU the device is the host, and memory-mapped pages read count too) and the
live device arrays' bytes (``jax.live_arrays``) at their largest. The federation is
deleted afterwards. Rows ``W8/streamed`` and ``W8/resident`` replace any earlier W8
rows of ``benchmarks/results/all.csv`` (and ``results/W8.csv``).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import numpy as np
from common import RESULTS, ROOT, machine, peak_rss_mb

from fedjax_dp.data import streaming
from fedjax_dp.models import get_model
from fedjax_dp.privacy import selection
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import program, rounds

SHAPE = (28, 28, 1)
CLASSES = 10


def write_federation(path: Path, clients: int, per_client: int, seed: int = 0,
                     block: int = 5000) -> float:
  """Writes ``x.npy`` (uint8), ``y.npy``, ``counts.npy`` block by block (never the
  whole federation in memory); returns the size of ``x.npy`` in GB."""
  path.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  shape = (clients, per_client) + SHAPE
  with open(path / "x.npy", "wb") as f:
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
            "fortran_order": False, "shape": shape})
    for start in range(0, clients, block):
      n = min(block, clients - start)
      f.write(rng.integers(0, 256, (n,) + shape[1:], dtype=np.uint8).tobytes())
  np.save(path / "y.npy", rng.integers(0, CLASSES, (clients, per_client)).astype(np.int32))
  # Between half and all of n_max real examples per client (the rest is padding).
  np.save(path / "counts.npy",
          rng.integers(per_client // 2, per_client + 1, clients).astype(np.int32))
  return (path / "x.npy").stat().st_size / 1e9


def _setup(k: int):
  model = get_model("mlp_784_256_10", SHAPE, CLASSES)
  ccfg = client_lib.ClientConfig(local_steps=1, batch_size=0, clip_mode="update_l2",
                                 noise_placement="central", mechanism="gaussian")
  rcfg = rounds.RoundConfig(ccfg, "normalized", client_chunk=0)
  round_fn, _ = program.make_sweep_fns(model, rcfg)
  params = jax.tree_util.tree_map(lambda a: a[None, None],
                                  jax.jit(model.init)(jax.random.PRNGKey(0)))
  return model, round_fn, params


def _args(u: int, k: int, t: int, rows: bool) -> rounds.RoundArgs:
  """Round t's inputs, stacked ``[1, 1, ...]`` (one cohort, one point)."""
  idx, sel = selection.select_clients("uniform", u, k, 0.0, 0, t)
  a = rounds.RoundArgs(
      idx=idx, sel_mask=sel, lr=np.full((1,), 0.1, np.float32), clip=np.float32(1.0),
      noise=np.zeros(k, np.float32), central_noise=np.float32(0.01),
      server_lr=np.float32(1.0), round=np.int32(t), seed=np.uint32(0), data_id=np.int32(0),
      stream=np.zeros(2, np.uint32), count_noise=np.float32(0.0),
      rows=np.arange(k, dtype=np.int32) if rows else None)
  return jax.tree_util.tree_map(lambda v: np.asarray(v)[None, None], a)


def _live_mb() -> float:
  return sum(a.nbytes for a in jax.live_arrays()) / 1e6


def _stream_rounds(fed, u, k, round_fn, params, ts, times=None, live=None):
  """Runs rounds ``ts`` fed by a CohortStream (the next round prefetched while one
  computes); returns the final params."""
  stream = streaming.CohortStream([fed])
  active = np.ones((1, 1), bool)
  try:
    for j, t in enumerate(ts):
      start = time.perf_counter()
      stream.begin_round()
      a = _args(u, k, t, rows=True)
      data, _ = stream.take([(0, a.idx[0, 0])])
      params, m = round_fn(params, data, a, active)
      if j + 1 < len(ts):
        stream.prefetch([(0, selection.select_clients("uniform", u, k, 0.0, 0, ts[j + 1])[0])])
      jax.block_until_ready(m)
      if times is not None:
        times.append(time.perf_counter() - start)
      if live is not None:
        live.append(_live_mb())
  finally:
    stream.close()
  return params


def run_mode(mode: str, path: str, k: int, rounds_: int, resident_clients: int) -> dict:
  """One process's measurement (``streamed`` or ``resident``), as a JSON-able dict."""
  fed = streaming.open_federation(path)
  _, round_fn, params0 = _setup(k)
  ts = list(range(rounds_ + 2))
  times, live = [], []
  out = {}
  if mode == "streamed":
    u = fed.x.shape[0]
    _stream_rounds(fed, u, k, round_fn, params0, ts, times, live)
    out.update(prefetch_note="next cohort gathered on a background thread")
  else:
    u = min(resident_clients, fed.x.shape[0])
    sub = streaming.FederatedData(fed.x[:u], fed.y[:u], fed.counts[:u], fed.mask[:u])
    start = time.perf_counter()
    data = jax.block_until_ready(streaming.to_device(sub))
    out["load_s"] = time.perf_counter() - start
    active = np.ones((1, 1), bool)
    params = jax.tree_util.tree_map(np.array, params0)
    for t in ts:
      start = time.perf_counter()
      params, m = round_fn(params, data, _args(u, k, t, rows=False), active)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - start)
      live.append(_live_mb())
    out["peak_rss_mb_before_check"] = peak_rss_mb()
    # The check: the first rounds again, resident then streamed from the same subset.
    check = ts[:3]
    params = jax.tree_util.tree_map(np.array, params0)
    for t in check:
      params, _ = round_fn(params, data, _args(u, k, t, rows=False), active)
    resident_final = jax.device_get(params)
    streamed_final = jax.device_get(_stream_rounds(
        sub, u, k, round_fn, jax.tree_util.tree_map(np.array, params0), check))
    out["bit_identical_to_streamed"] = all(np.array_equal(x, y) for x, y in zip(
        jax.tree_util.tree_leaves(resident_final), jax.tree_util.tree_leaves(streamed_final)))
  timed = times[2:]
  out.update(mode=mode, clients=int(u), k=k, rounds=len(timed),
             seconds_per_round=float(np.median(timed)),
             seconds_per_round_min=float(np.min(timed)),
             seconds_per_round_max=float(np.max(timed)),
             peak_rss_mb=out.get("peak_rss_mb_before_check", peak_rss_mb()),
             device_mb=float(max(live)))
  return out


def _child(mode: str, path: Path, a) -> dict:
  cmd = [sys.executable, __file__, "--child", mode, "--path", str(path), "--k", str(a.k),
         "--rounds", str(a.rounds), "--resident-clients", str(a.resident_clients)]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
  return json.loads(lines[-1])


def _load_avg() -> str:
  try:
    return Path("/proc/loadavg").read_text().split()[0]
  except OSError:
    return "?"


def write_rows(rows: list[dict]) -> None:
  """Replaces the W8 rows of results/all.csv (same layout: task, sorted fields,
  machine) and writes results/W8.csv."""
  from fedjax_dp.files.results import write_csv
  path = RESULTS / "all.csv"
  old = list(csv.DictReader(path.open())) if path.exists() else []
  table = [r for r in old if not r["task"].startswith("W8/")] + rows
  fields = sorted({k for r in table for k in r} - {"task", "machine"})
  write_csv(path, table, ["task", *fields, "machine"])
  write_csv(RESULTS / "W8.csv", rows, ["task", *sorted({k for r in rows for k in r}
                                                       - {"task", "machine"})])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", type=int, default=200_000)
  p.add_argument("--per-client", type=int, default=32)
  p.add_argument("--k", type=int, default=1000)
  p.add_argument("--rounds", type=int, default=15, help="timed rounds (after 2 warm-up)")
  p.add_argument("--resident-clients", type=int, default=20_000)
  p.add_argument("--dir", default=None, help="where to write the federation (default /tmp)")
  p.add_argument("--federation", default=None,
                 help="a folder for the federation (reused if it holds one; deleted "
                      "afterwards unless --keep)")
  p.add_argument("--keep", action="store_true", help="keep the federation's files")
  p.add_argument("--no-csv", action="store_true")
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  p.add_argument("--path", default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    print(json.dumps(run_mode(a.child, a.path, a.k, a.rounds, a.resident_clients)))
    return 0
  tmp = Path(a.federation) if a.federation else Path(
      tempfile.mkdtemp(prefix="w8_federation_", dir=a.dir))
  try:
    start = time.time()
    if (tmp / "fed" / "counts.npy").exists():  # --federation: written by an earlier run
      fed = streaming.open_federation(tmp / "fed")
      if fed.x.shape[:2] != (a.clients, a.per_client):
        raise SystemExit(f"{tmp / 'fed'} holds {fed.x.shape[:2]} clients x examples, "
                         f"not {(a.clients, a.per_client)}")
      gb = (tmp / "fed" / "x.npy").stat().st_size / 1e9
      del fed
    else:
      gb = write_federation(tmp / "fed", a.clients, a.per_client)
      print(f"wrote {gb:.2f} GB ({a.clients} clients x {a.per_client} x 28x28 uint8) in "
            f"{time.time() - start:.0f} s to {tmp}", flush=True)
    loads, res = [_load_avg()], {}
    for mode in ("streamed", "resident"):
      res[mode] = _child(mode, tmp / "fed", a)
      loads.append(_load_avg())
      print(json.dumps(res[mode]), flush=True)
  finally:
    if not a.keep:
      shutil.rmtree(tmp, ignore_errors=True)
  s, r = res["streamed"], res["resident"]
  ratio = s["seconds_per_round"] / r["seconds_per_round"]
  workload = (f"W8 streamed cohorts (K={a.k} x {a.per_client} of 28x28 uint8, MLP, update "
              f"clip, central DP; federation {a.clients} clients, {gb:.2f} GB memmap)")
  cmd = "python benchmarks/bench_w8_stream.py" + "".join(f" {x}" for x in (argv or sys.argv[1:]))
  common = {"workload": workload, "machine": machine(), "client_chunk": 0}
  rows = [
      dict(common, task="W8/streamed", method="streamed",
           seconds_per_round=s["seconds_per_round"],
           client_updates_per_s=a.k / s["seconds_per_round"], peak_rss_mb=s["peak_rss_mb"],
           vs=f"{ratio:.2f}x the resident path's time (target <= 1.2x)",
           note=(f"all {s['clients']} clients memory-mapped, cohort gathered on the host + "
                 f"prefetched; device arrays peak {s['device_mb']:.0f} MB; rounds "
                 f"{s['seconds_per_round_min']:.3f}-{s['seconds_per_round_max']:.3f} s; "
                 f"load {loads[0]}->{loads[1]}; {cmd}")),
      dict(common, task="W8/resident", method="resident",
           seconds_per_round=r["seconds_per_round"],
           client_updates_per_s=a.k / r["seconds_per_round"], peak_rss_mb=r["peak_rss_mb"],
           note=(f"subset of {r['clients']} clients on the device (the full federation is "
                 f"{gb * 4:.0f} GB as float32 and does not fit); device arrays peak "
                 f"{r['device_mb']:.0f} MB; load {r['load_s']:.1f} s; streamed == resident "
                 f"bit for bit on this subset: {r['bit_identical_to_streamed']}; rounds "
                 f"{r['seconds_per_round_min']:.3f}-{r['seconds_per_round_max']:.3f} s; "
                 f"load {loads[1]}->{loads[2]}; {cmd}")),
  ]
  for row in rows:
    print(f"{row['task']}: {row['seconds_per_round']:.3f} s/round, peak RSS "
          f"{row['peak_rss_mb']:.0f} MB; {row.get('vs', '')} {row['note']}")
  if not a.no_csv:
    write_rows(rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
