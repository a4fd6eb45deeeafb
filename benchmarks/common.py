"""Shared benchmark helpers: timing, machine description, result tables."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MNIST_DIR = ROOT / ".." / "shared" / "datasets" / "mnist"


def block(x):
  return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready")
                                else a, x)


def time_fn(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
  """Median wall seconds of ``fn()`` (results blocked on) after ``warmup`` calls."""
  for _ in range(warmup):
    block(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def matmul_gflops(n: int = 2048, repeats: int = 10) -> float:
  """This machine's fp32 matmul throughput (the roofline), measured now."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  sec = time_fn(lambda: f(a), repeats)
  return 2 * n ** 3 / sec / 1e9


def peak_rss_mb() -> float:
  """This process's peak resident memory (MB): host RAM, which on CPU is the device's."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def device_peak_mb() -> float | None:
  """Peak device memory (MB) where the backend reports it (GPU/TPU), else None."""
  stats = jax.local_devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / 2**20


def forward_flops_per_example(model, params, n: int = 64) -> float:
  """FLOPs of one example's forward pass, from XLA's cost analysis of ``model.apply``."""
  x = jnp.zeros((n,) + tuple(model.input_shape), jnp.float32)
  cost = jax.jit(model.apply).lower(params, x).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"]) / n


def training_gflop(model, params, examples: int) -> float:
  """Model training FLOPs (forward + backward = 3x forward) of ``examples``, in GFLOP.

  The "effective" FLOPs: the work a non-private step needs, whatever the engine
  spends beyond it (clipping, noise, copies) counts as overhead.
  """
  return 3.0 * forward_flops_per_example(model, params) * examples / 1e9


def run_task(script: Path, args: Sequence[str], timeout: float,
             python: str | None = None) -> dict:
  """Runs ``script args --json`` in a fresh process (clean peak memory and compile
  caches) and returns the JSON dict it prints last, or an error record. ``python``:
  the interpreter (default this one; pfl's rows run in pfl's own environment)."""
  start = time.time()
  try:
    # check=False: a failed workload becomes an error record, not an exception.
    proc = subprocess.run([python or sys.executable, str(script), *args], capture_output=True,
                          text=True,
                          timeout=timeout, cwd=ROOT, check=False)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr or proc.stdout)[-800:]
    return {"error": f"exit {proc.returncode}: {tail}"}
  out = json.loads(lines[-1])
  out["task_wall_s"] = round(time.time() - start, 1)
  return out


def machine() -> str:
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", dev.platform)
  return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"jax {jax.__version__} on {dev.platform} ({kind}, {len(jax.devices())} device(s))")


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
  widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
  print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
  for r in rows:
    print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.4g}"
  return "" if v is None else str(v)
