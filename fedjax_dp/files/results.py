"""Run directories: ``config.json``, ``metrics.csv``, ``summary.json`` and plots.

Every file is written to a temporary name in the same directory and then renamed
(``os.replace`` is atomic on POSIX), so an interrupted run never leaves a file that
looks complete. ``metrics.csv`` has one row per round and loads straight into pandas.
A run directory lists the files it wrote in its manifest (:mod:`fedjax_dp.files.outputs`),
so that ``--overwrite`` removes those and nothing else.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_dp.files import outputs

_atomic_write = outputs.atomic_write


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


def _integral_as_int(text: str) -> float | int:
  value = float(text)
  return int(value) if math.isfinite(value) and value.is_integer() else value


def json_without(config: Mapping[str, Any], fields: Sequence[str], *,
                 integral_floats_as_ints: bool = False) -> dict[str, Any]:
  """``config`` (nested dicts) as JSON types with sorted keys, without the dotted
  ``fields`` (``'server.client_chunk'``); a field that is not there is ignored. With
  ``integral_floats_as_ints``, a finite float that is an integer reads back as an int."""
  parse_float = _integral_as_int if integral_floats_as_ints else float
  out = json.loads(json.dumps(_jsonable(config), sort_keys=True), parse_float=parse_float)
  for field in fields:
    *parents, leaf = field.split(".")
    node = out
    for p in parents:
      node = node.get(p, {})
    node.pop(leaf, None)
  return out


def write_json(path: str | os.PathLike, obj: Any, *, owned: bool = False) -> None:
  """Writes ``obj`` as indented JSON, atomically (``owned``: see
  :func:`fedjax_dp.files.outputs.atomic_write`)."""
  _atomic_write(Path(path), (json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")
                .encode(), owned=owned)


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]],
              columns: Sequence[str] | None = None, *, owned: bool = False) -> None:
  """Writes ``rows`` (dicts) as CSV with a header, atomically (``owned``: see
  :func:`fedjax_dp.files.outputs.atomic_write`)."""
  columns = list(columns or (rows[0].keys() if rows else []))
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: _jsonable(v) for k, v in row.items()})
  _atomic_write(Path(path), buf.getvalue().encode(), owned=owned)


def read_csv(path: str | os.PathLike) -> list[dict[str, str]]:
  """Reads a CSV written by :func:`write_csv` (strings; pandas reads it too)."""
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def plot_metrics(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]],
                 title: str = "", *, owned: bool = False) -> None:
  """Saves a PNG of test loss and accuracy (test MSE for a regression) and the
  certified and claimed epsilon against rounds (:mod:`fedjax_dp.plotting`)."""
  from fedjax_dp import plotting  # matplotlib loads only when a plot is written

  _atomic_write(Path(path), plotting.plot_rows(rows, title), owned=owned)


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
  """A run directory. ``metrics.csv`` is rewritten (atomically) as rounds finish.

  Opening one claims it (:func:`fedjax_dp.files.outputs.claim`): a new directory gets a
  manifest of kind ``'run'``; an existing one must be a run directory (or a sweep's
  point, an ``optimal_t`` candidate). Every file written through it is listed there.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = outputs.claim(path, "run", accept=outputs.RUN_KINDS)

  def write_config(self, config: Mapping[str, Any]) -> None:
    write_json(self.path / "config.json", config, owned=True)

  def write_metrics(self, rows: Sequence[Mapping[str, Any]], columns: Iterable[str]) -> None:
    write_csv(self.path / "metrics.csv", rows, list(columns), owned=True)

  def write_summary(self, summary: Mapping[str, Any]) -> None:
    write_json(self.path / "summary.json", summary, owned=True)

  def write_plot(self, rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
    plot_metrics(self.path / "metrics.png", rows, title, owned=True)
