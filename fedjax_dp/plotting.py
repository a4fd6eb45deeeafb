"""Plots of run and sweep directories (``fedjax-dp plot``, each run's ``metrics.png``).

::

  fedjax-dp plot runs/quickstart runs/eps_sweep --out curves.png

Each argument is a run directory (``metrics.csv``) or a sweep directory
(``sweep.json`` and ``points/<name>/metrics.csv``). A sweep gives one line per
grid point, labelled by its grid values; when ``seed`` is a grid axis the points
that differ only in seed are one line, their mean, with a band from the lowest to
the highest seed. Run directories are labelled by the config fields in which they
differ; runs of one config that differ only in seed are averaged the same way, and
two directories of the same run (same config, same seed) keep a line each,
labelled by directory name (their paths where the names collide). Panels: test loss (test MSE for a regression), test accuracy (when some run
is a classifier) and epsilon against rounds (certified solid, claimed dashed). The
title gives the certified epsilon reached and the unit of privacy; the legend sits
outside the axes, and past 10 lines the colours repeat with another line style and
marker, so no two lines look alike.

The module reads CSV and JSON only (no pandas) and draws on a bare
:class:`matplotlib.figure.Figure`, so it never switches the user's pyplot backend.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.errors import UserError, unreadable

# Keys that never distinguish two runs' results (labels skip them).
_IGNORED_KEYS = ("name", "progress", "checkpoint.", "data.dir", "privacy.noise_stream")
_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
            "tab:pink", "tab:gray", "tab:olive", "tab:cyan")
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = (None, "o", "s", "^", "D", "v", "P", "X")


class Member(NamedTuple):
  """One run to plot: its distinguishing values and its ``metrics.csv`` rows.

  Attributes:
    values: ``{config key: value}`` telling it apart from the other runs (a sweep's
      grid values, or the fields in which run directories differ).
    rows: the metric rows (CSV text or Python numbers; ``''`` where not evaluated).
    name: a fallback label (the directory name).
    summary: its ``summary.json`` (None while unfinished).
  """

  values: dict[str, Any]
  rows: list[Mapping[str, Any]]
  name: str
  summary: dict[str, Any] | None = None


class Band(NamedTuple):
  """A metric against rounds over ``n`` runs: ``mean``, ``lo`` and ``hi`` (all ``[R]``)."""

  x: np.ndarray
  mean: np.ndarray
  lo: np.ndarray
  hi: np.ndarray


class Curve(NamedTuple):
  """One line of the plot: a label, the runs averaged and each metric's band."""

  label: str
  seeds: int
  series: dict[str, Band]
  regression: bool
  units: tuple[str, ...]
  warnings: int
  final_certified: float
  final_claimed: float


def _float(v: Any) -> float | None:
  if v is None or v == "":
    return None
  try:
    f = float(v)
  except (TypeError, ValueError):
    return None
  return f if math.isfinite(f) else None


def _band(members: Sequence[Member], key: str) -> Band:
  """The mean and min-max of ``key`` per round over ``members`` (finite values only)."""
  per_round: dict[int, list[float]] = {}
  for m in members:
    for r in m.rows:
      v = _float(r.get(key))
      if v is not None:
        per_round.setdefault(int(float(r["round"])), []).append(v)
  x = np.array(sorted(per_round), dtype=np.int64)
  vals = [np.asarray(per_round[t]) for t in x]
  return Band(x, np.array([v.mean() for v in vals]), np.array([v.min() for v in vals]),
              np.array([v.max() for v in vals]))


def _is_regression(rows: Sequence[Mapping[str, Any]]) -> bool:
  """A run with evaluated rounds but no accuracy anywhere: its test loss is the MSE."""
  return (any(_float(r.get("test_loss")) is not None for r in rows)
          and not any(_float(r.get("test_accuracy")) is not None for r in rows))


def _format(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:g}"
  if isinstance(v, (list, tuple)):
    return ",".join(map(_format, v))
  return str(v)


def _label(values: Mapping[str, Any]) -> str:
  """``{'privacy.epsilon': 2.0, 'client.lr': 0.5}`` -> ``'epsilon=2, lr=0.5'`` (leaf
  names where they are unique)."""
  leaves = [k.split(".")[-1] for k in values]
  return ", ".join(f"{leaf if leaves.count(leaf) == 1 else k}={_format(v)}"
                   for (k, v), leaf in zip(values.items(), leaves))


def curves(members: Sequence[Member]) -> list[Curve]:
  """Groups ``members`` that differ only in ``seed`` into one curve each (in order).

  Only replicates are averaged: :func:`load` gives two directories of the same run
  (same config, same seed) distinct ``run`` values, and two sweeps distinct
  ``sweep`` values (their paths where their names collide)."""
  groups: dict[tuple, list[Member]] = {}
  for m in members:
    key = tuple((k, repr(v)) for k, v in m.values.items() if k != "seed")
    groups.setdefault(key, []).append(m)
  out = []
  for group in groups.values():
    rest = {k: v for k, v in group[0].values.items() if k != "seed" or len(group) == 1}
    label = _label(rest) or group[0].name
    if len(group) > 1:
      label += f" (mean of {len(group)} seeds)"
    rows = [r for m in group for r in m.rows]
    units = sorted({str(r["privacy_unit"]) for r in rows if r.get("privacy_unit")})
    finals = [m.rows[-1] for m in group if m.rows]
    out.append(Curve(
        label, len(group),
        {k: _band(group, k) for k in ("test_loss", "test_accuracy", "epsilon_certified",
                                      "epsilon_claimed")},
        _is_regression(rows), tuple(units),
        sum(bool(m.summary and m.summary.get("epsilon_warning")) for m in group),
        max((_final(r, "epsilon_certified") for r in finals), default=math.nan),
        max((_final(r, "epsilon_claimed") for r in finals), default=math.nan)))
  if len({c.units for c in out}) > 1:  # say which line certifies which unit
    out = [c._replace(label=f"{c.label} [{'; '.join(c.units) or 'no unit'}]") for c in out]
  return out


def _final(row: Mapping[str, Any], key: str) -> float:
  """``row[key]`` as a float, ``inf`` kept (a certified epsilon may be infinite)."""
  try:
    return float(row.get(key))
  except (TypeError, ValueError):
    return math.nan


def style(i: int) -> dict[str, Any]:
  """The ``i``-th line's colour, marker and line style, distinct for every ``i`` below
  320: colours repeat every 10 lines with the next marker (which the epsilon panel,
  whose line styles say certified or claimed, keeps too), markers every 80 lines
  with the next line style."""
  cycle = i // len(_COLOURS)
  return {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[cycle % len(_MARKERS)],
          "linestyle": _LINESTYLES[(cycle // len(_MARKERS)) % len(_LINESTYLES)]}


# ----------------------------------------------------------------------------- loading


def _read_rows(path: Path) -> list[dict[str, str]]:
  """The rows of a run's metrics.csv; a file of another shape is a UserError naming it
  (and the first value that is not what a run writes)."""
  try:
    with open(path, newline="") as f:
      rows = list(csv.DictReader(f))
  except (UnicodeDecodeError, csv.Error) as e:
    raise UserError(f"{path} is not a metrics.csv of a run ({unreadable(e)})") from None
  for i, r in enumerate(rows, start=2):  # line 1 is the header
    for key, kind in (("round", int), ("test_loss", float)):
      value = r.get(key)
      try:
        kind(value if value != "" or kind is int else "nan")
      except (TypeError, ValueError):
        why = f"no {key} column" if value is None else f"line {i}: {key} {value!r} is not a number"
        raise UserError(f"{path} is not a metrics.csv of a run ({why})") from None
  return rows


def _read_json(path: Path) -> Any:
  return json.loads(path.read_text()) if path.is_file() else None


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in d.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _load_run(path: Path) -> tuple[Member, dict[str, Any]]:
  """A run directory as a member (no values yet) and its flattened config."""
  rows = _read_rows(path / "metrics.csv")
  if not rows:
    raise UserError(f"{path / 'metrics.csv'} has a header but no rows: the run has not "
                     "finished a round yet")
  config = _read_json(path / "config.json") or {}
  name = config.get("name") or path.name
  return Member({}, rows, str(name), _read_json(path / "summary.json")), _flatten(config)


def _load_sweep(path: Path, tag: dict[str, Any]) -> list[Member]:
  """A sweep directory's points that have rows, valued by their grid values."""
  meta = json.loads((path / "sweep.json").read_text())
  members = []
  for point in meta.get("points", []):
    d = path / "points" / point["name"]
    rows = _read_rows(d / "metrics.csv") if (d / "metrics.csv").is_file() else []
    if rows:
      members.append(Member({**tag, **point["values"]}, rows, point["name"],
                            _read_json(d / "summary.json")))
  if not members:
    raise UserError(f"{path}: no point of the sweep has finished a round yet "
                     "(points/*/metrics.csv have no rows)")
  return members


def _result_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
  return [k for k in dict.fromkeys(k for c in configs for k in c)
          if not any(k == i or (i.endswith(".") and k.startswith(i)) for i in _IGNORED_KEYS)]


def _differences(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per config, the fields whose values are not the same in all of ``configs``."""
  keys = _result_keys(configs)
  varying = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
  return [{k: c.get(k) for k in varying} for c in configs]


def _names(paths: Sequence[Path]) -> list[str]:
  """Each directory's name, or the path as given where two names collide."""
  names = [p.name for p in paths]
  return [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths)]


def _same_run(configs: Sequence[dict[str, Any]]) -> list[bool]:
  """Per config, whether another one is the same run (every field, the seed too): a
  copy, not a replicate, so it is never averaged with it."""
  keys = _result_keys(configs)
  ids = [tuple(repr(c.get(k)) for k in keys) for c in configs]
  return [ids.count(i) > 1 for i in ids]


def load(paths: Sequence[str | Path]) -> list[Member]:
  """The members of run and sweep directories, in argument order.

  Raises:
    ValueError: a path that is neither (one line saying what it lacks), or one
      without any recorded round.
  """
  loaded: list[Any] = []
  names = _names(list(map(Path, paths)))
  for p, name in zip(map(Path, paths), names):
    if (p / "sweep.json").is_file():
      loaded.append(_load_sweep(p, {"sweep": name} if len(paths) > 1 else {}))
    elif (p / "metrics.csv").is_file():
      loaded.append(_load_run(p))
    elif not p.is_dir():
      raise UserError(f"{p}: no such directory")
    else:
      raise UserError(f"{p} is neither a run directory (no metrics.csv) nor a sweep "
                       "directory (no sweep.json)")
  runs = [x for x in loaded if isinstance(x, tuple)]
  diffs = iter(_differences([c for _, c in runs]))
  copies = iter(_same_run([c for _, c in runs]))
  members: list[Member] = []
  for x, name in zip(loaded, names):
    if isinstance(x, list):
      members.extend(x)
      continue
    values = next(diffs)
    if next(copies):  # the same config and seed: the directory tells them apart
      values = {**values, "run": name}
    members.append(x[0]._replace(values=values))
  return members


# ----------------------------------------------------------------------------- drawing


def _panels(cs: Sequence[Curve]) -> list[tuple[str, str]]:
  regression = [c.regression for c in cs]
  loss = ("test MSE" if all(regression) else
          "test loss (MSE for regressions)" if any(regression) else "test loss")
  panels = [("test_loss", loss)]
  if not all(regression):
    panels.append(("test_accuracy", "test accuracy"))
  return panels + [("epsilon", "epsilon")]


def _draw_metric(ax, c: Curve, key: str, st: dict[str, Any]) -> None:
  b = c.series[key]
  if not len(b.x):
    return
  ax.plot(b.x, b.mean, label=c.label, markevery=max(1, len(b.x) // 8), markersize=4, **st)
  if c.seeds > 1:
    ax.fill_between(b.x, b.lo, b.hi, color=st["color"], alpha=0.18, linewidth=0)


def _draw_epsilon(ax, c: Curve, st: dict[str, Any]) -> None:
  for key, linestyle in (("epsilon_certified", "-"), ("epsilon_claimed", "--")):
    b = c.series[key]
    if len(b.x):
      ax.plot(b.x, b.mean, color=st["color"], marker=st["marker"], linestyle=linestyle,
              markevery=max(1, len(b.x) // 8), markersize=4)
  ys = np.concatenate([c.series[k].mean for k in ("epsilon_certified", "epsilon_claimed")])
  if ys.size and ys.min() > 0 and ys.max() / ys.min() > 100:
    ax.set_yscale("log")  # Yuan's certified 1e7 beside a claimed 10


def _range(values: Sequence[float]) -> str:
  lo, hi = min(values), max(values)
  return f"{lo:.4g}" if lo == hi else f"{lo:.4g} to {hi:.4g}"


def title_line(cs: Sequence[Curve]) -> str:
  """The certified (and claimed) epsilon reached, the unit of privacy, and how many
  runs certify more than they requested."""
  cert = [c.final_certified for c in cs if not math.isnan(c.final_certified)]
  claimed = [c.final_claimed for c in cs if not math.isnan(c.final_claimed)]
  parts = []
  if cert:
    parts.append(f"certified epsilon {_range(cert)}"
                 + (f" (claimed {_range(claimed)})" if claimed else ""))
  units = sorted({u for c in cs for u in c.units})
  if units:
    parts.append("privacy unit: " + "; ".join(units))
  over = sum(c.warnings for c in cs)
  if over:
    parts.append(f"certified exceeds the requested epsilon in {over} of "
                 f"{sum(c.seeds for c in cs)} runs")
  return "; ".join(parts)


def _legend(fig, ax, cs: Sequence[Curve]) -> None:
  """One legend for all panels, right of the axes (never over the lines)."""
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch

  handles, labels = ax.get_legend_handles_labels()
  handles += [Line2D([], [], color="black", linestyle="-"),
              Line2D([], [], color="black", linestyle="--")]
  labels += ["epsilon certified (solid)", "epsilon claimed (dashed)"]
  if any(c.seeds > 1 for c in cs):
    handles.append(Patch(color="gray", alpha=0.3))
    labels.append("band: lowest to highest seed")
  fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.93), fontsize=8,
             frameon=False)


def render(cs: Sequence[Curve], title: str = ""):
  """A :class:`matplotlib.figure.Figure` of ``cs`` (see the module docstring)."""
  from matplotlib.figure import Figure

  panels = _panels(cs)
  fig = Figure(figsize=(3.9 * len(panels), 3.6))
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for i, c in enumerate(cs):
    st = style(i)
    for ax, (key, _) in zip(axes, panels):
      if key == "epsilon":
        _draw_epsilon(ax, c, st)
      else:
        _draw_metric(ax, c, key, st)
  for ax, (_, label) in zip(axes, panels):
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  # The loss panel holds every curve that has a test loss; the epsilon panel the rest.
  _legend(fig, axes[0] if axes[0].lines else axes[-1], cs)
  fig.suptitle("\n".join(filter(None, [title, title_line(cs)])), fontsize=9)
  fig.tight_layout()
  return fig


def png_bytes(fig, fmt: str = "png") -> bytes:
  """``fig`` as PNG bytes, or another format matplotlib writes (``'svg'``, ``'pdf'``);
  the legend outside the axes included."""
  buf = io.BytesIO()
  fig.savefig(buf, format=fmt, dpi=110, bbox_inches="tight")
  return buf.getvalue()


def plot_rows(rows: Sequence[Mapping[str, Any]], title: str = "",
              name: str = "this run") -> bytes:
  """The PNG of one run's metric rows (a run directory's ``metrics.png``)."""
  return png_bytes(render(curves([Member({}, list(rows), name)]), title))


def _source_title(path: Path) -> str:
  """``'quickstart: mlp_784_256_10 on digits'``, or for a sweep ``'quickstart: sweep
  over privacy.epsilon, seed'``."""
  sweep = _read_json(path / "sweep.json")
  if sweep is not None:
    name = sweep.get("config", {}).get("name") or path.name
    return f"{name}: sweep over {', '.join(sweep.get('grid', {}))}"
  config = _read_json(path / "config.json") or {}
  try:
    return f"{config['name']}: {config['model']['name']} on {config['data']['name']}"
  except (KeyError, TypeError):
    return path.name


class Plot(NamedTuple):
  """What ``fedjax-dp plot`` drew: the image (PNG unless asked otherwise) and a
  one-line description."""

  png: bytes
  description: str


def plot_dirs(paths: Sequence[str | Path], title: str = "", fmt: str = "png") -> Plot:
  """Plots run and sweep directories (the ``fedjax-dp plot`` command).

  Raises:
    ValueError: a path is neither kind of directory, or nothing has been recorded.
  """
  cs = curves(load(paths))
  if not any(len(b.x) for c in cs for b in c.series.values()):
    raise UserError("nothing to plot: no round has a finite test loss or epsilon")
  fig = render(cs, title or ", ".join(dict.fromkeys(_source_title(Path(p)) for p in paths)))
  seeds = [c.seeds for c in cs if c.seeds > 1]
  desc = (f"{len(cs)} line{'s' * (len(cs) != 1)}"
          + (f" ({len(seeds)} of them means over seeds, with a min-max band)" if seeds else "")
          + "; panels: " + ", ".join(label for _, label in _panels(cs)))
  return Plot(png_bytes(fig, fmt), desc)
