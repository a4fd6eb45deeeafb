"""Run directories: ``config.json``, ``metrics.csv``, ``summary.json`` and plots.

Every file is written to a temporary name in the same directory and then renamed
(``os.replace`` is atomic on POSIX), so an interrupted run never leaves a file that
looks complete. ``metrics.csv`` has one row per round and loads straight into pandas.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def _atomic_write(path: Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def _jsonable(x: Any) -> Any:
  """Converts numpy scalars/arrays, tuples and non-finite floats for JSON."""
  if isinstance(x, Mapping):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "tolist"):
    return _jsonable(x.tolist())
  if isinstance(x, float) and not math.isfinite(x):
    return str(x)  # "inf" / "nan": valid JSON, and float("inf") reads it back
  return x


def write_json(path: str | os.PathLike, obj: Any) -> None:
  """Writes ``obj`` as indented JSON, atomically."""
  _atomic_write(Path(path), (json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")
                .encode())


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]],
              columns: Sequence[str] | None = None) -> None:
  """Writes ``rows`` (dicts) as CSV with a header, atomically."""
  columns = list(columns or (rows[0].keys() if rows else []))
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: _jsonable(v) for k, v in row.items()})
  _atomic_write(Path(path), buf.getvalue().encode())


def read_csv(path: str | os.PathLike) -> list[dict[str, str]]:
  """Reads a CSV written by :func:`write_csv` (strings; pandas reads it too)."""
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def plot_metrics(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]],
                 title: str = "") -> None:
  """Saves a PNG of test loss and accuracy (test MSE for a regression) and the
  certified and claimed epsilon against rounds (:mod:`fedjax_dp.plotting`)."""
  from fedjax_dp import plotting  # matplotlib loads only when a plot is written

  _atomic_write(Path(path), plotting.plot_rows(rows, title))


# metrics.csv: one row per round.
METRIC_COLUMNS = (
    "round", "test_loss", "test_accuracy", "train_loss", "grad_norm", "update_norm",
    "num_selected", "noise_mean", "horizon", "epsilon_claimed", "epsilon_certified",
    "privacy_unit", "wall_s")


@dataclasses.dataclass
class RunResult:
  """A finished run: its ``metrics.csv`` rows, ``summary.json`` and final model."""

  rows: list[dict[str, Any]]
  summary: dict[str, Any]
  params: Any


class RunDir:
  """A run directory. ``metrics.csv`` is rewritten (atomically) as rounds finish."""

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    self.path.mkdir(parents=True, exist_ok=True)

  def write_config(self, config: Mapping[str, Any]) -> None:
    write_json(self.path / "config.json", config)

  def write_metrics(self, rows: Sequence[Mapping[str, Any]], columns: Iterable[str]) -> None:
    write_csv(self.path / "metrics.csv", rows, list(columns))

  def write_summary(self, summary: Mapping[str, Any]) -> None:
    write_json(self.path / "summary.json", summary)

  def write_plot(self, rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
    plot_metrics(self.path / "metrics.png", rows, title)
