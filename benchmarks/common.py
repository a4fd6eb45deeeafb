"""Shared benchmark helpers: timing, machine description, result tables."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Callable, Sequence

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


def matmul_gflops(n: int = 1024, repeats: int = 10) -> float:
  """This machine's fp32 matmul throughput (the roofline), measured now."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  sec = time_fn(lambda: f(a), repeats)
  return 2 * n ** 3 / sec / 1e9


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
