"""Helpers shared by the paper reproductions under ``experiments/<paper>/``.

Sweeps write one row per point and round (:func:`fedjax_dp.sweep.run_sweep`); a
figure wants the final row of every point, averaged over seeds with its spread, a
CSV and a PNG under the reproduction's ``results/`` and the wall time of the command
that made them. These are those steps, written once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
  """The last evaluated row of every sweep point (its final test metrics).

  Args:
    df: sweep rows (``pandas.DataFrame(run_sweep(...))``), a ``point`` column.

  Returns:
    One row per point, with ``rounds_used``: the last round the point ran.
  """
  ev = df[df["test_loss"].notna()]
  fin = ev.groupby("point", sort=False).tail(1).reset_index(drop=True)
  fin["rounds_used"] = df.groupby("point", sort=False)["round"].max().reindex(
      fin["point"]).to_numpy()
  return fin


def mean_std(df: pd.DataFrame, by: Sequence[str], cols: Sequence[str]) -> pd.DataFrame:
  """Mean, std and count of ``cols`` per ``by`` group (over seeds): ``<col>_mean``,
  ``<col>_std``, ``<col>_count``."""
  agg = df.groupby(list(by))[list(cols)].agg(["mean", "std", "count"])
  agg.columns = [f"{c}_{s}" for c, s in agg.columns]
  return agg.reset_index()


def errorbar_plot(ax, table: pd.DataFrame, x: str, y: str, label: str, **kw) -> None:
  """``y_mean`` against ``x`` with ``y_std`` error bars (a single seed: no bars)."""
  ax.errorbar(table[x], table[f"{y}_mean"], yerr=np.nan_to_num(table[f"{y}_std"]),
              marker="o", capsize=3, label=label, **kw)


def write_csv(results_dir: Path, df: pd.DataFrame, name: str) -> Path:
  """Writes ``results_dir/<name>.csv`` (6 significant digits)."""
  results_dir.mkdir(parents=True, exist_ok=True)
  path = results_dir / f"{name}.csv"
  df.to_csv(path, index=False, float_format="%.6g")
  return path


def save_meta(results_dir: Path, name: str, start: float, **extra) -> dict:
  """Records the wall time, machine and command of a figure's run in
  ``results_dir/<name>_meta.json``."""
  import jax
  results_dir.mkdir(parents=True, exist_ok=True)
  meta = dict(wall_seconds=round(time.time() - start, 1), device=str(jax.devices()[0]),
              cpu_count=os.cpu_count(), command=" ".join(["python"] + sys.argv), **extra)
  (results_dir / f"{name}_meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
  print(f"{name}: {meta['wall_seconds']} s")
  return meta


def pyplot():
  """``matplotlib.pyplot`` on the file-only Agg backend (scripts write PNGs; no display)."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  return plt
