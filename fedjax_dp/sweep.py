"""Sweeps: the product of config grids, run as a few batched, compiled programs.

::

  fedjax-dp sweep CONFIG --grid privacy.epsilon=1,4,16 --grid seed=0,1,2 --out DIR

or, from a notebook::

  rows = run_sweep(cfg, {"privacy.epsilon": [1, 4, 16], "seed": [0, 1, 2]}, "runs/eps")
  df = pandas.DataFrame(rows)

Every point of the grid is a full run (its own schedule, client selection and
accountant in the host loop). Points whose configs share every array shape and
static setting (:func:`fedjax_dp.experiment.group_key`) form a group that runs as
ONE vmapped, jitted round per round index: a leading sweep axis over the round's
params and :class:`fedjax_dp.training.engine.RoundArgs`, with the client data shared (points
with different partitions, e.g. seeds, index a stacked copy per partition). Seeds,
epsilon, learning rates, clip norms, schedule parameters and T are all traced or
host-side, so they never split a group or recompile; points of different T run to
the largest T with finished points frozen. Points that change shapes (number of
clients, model, local steps, ...) run as separate groups. Groups are laid out over
all devices (:mod:`fedjax_dp.sharding`).

Output directory::

  DIR/sweep.json          the grid, the --set overrides and the points
  DIR/sweep.csv           one row per point and round, grid values as columns
  DIR/points/<name>/      each point's run directory (config.json, metrics.csv,
                          summary.json, metrics.png), as ``fedjax-dp run`` writes it

Re-running the same command resumes: a point whose ``summary.json`` exists (and is
not ``interrupted``) is finished and skipped, an unfinished point continues from its
last checkpoint (``checkpoint.every``), and ``sweep.csv`` is rebuilt from the points' ``metrics.csv``
files, so it equals the uninterrupted sweep's in every column but ``wall_s`` (each
round's wall-clock seconds). ``sweep.csv`` always has a ``seed`` column (the
point's seed, a grid axis or not) and ``privacy_unit`` (the unit of privacy and the
neighbouring relation its epsilon is certified for).

The directory and every point's are project directories (:mod:`fedjax_dp.files.outputs`),
claimed before any compute: a sweep of another grid, base config or ``--set`` into
the same ``DIR`` is refused naming what differs (``overwrite`` replaces it, removing
only what the project wrote), and so is a ``DIR`` that is a run directory or a
stranger's.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax

from fedjax_dp import config as config_lib
from fedjax_dp import experiment, optimal_t, sharding
from fedjax_dp.config import noise_identity
from fedjax_dp.errors import unreadable
from fedjax_dp.files import outputs, results
from fedjax_dp.host import checkpoint

SWEEP_COLUMNS = experiment.METRIC_COLUMNS


class Point(NamedTuple):
  """One grid point.

  Attributes:
    index: position in the grid's product order.
    name: directory name under ``points/`` (index and values, file-system safe).
    values: ``{grid key: value}`` as parsed into the config.
    config: the point's full config.
  """

  index: int
  name: str
  values: dict[str, Any]
  config: Any


def split_values(raw: str) -> list[str]:
  """Splits ``'1,2,(3,4)'`` at top-level commas: ``['1', '2', '(3,4)']`` (an empty
  value, as in ``'1,,2'`` or ``'2,'``, stays: :func:`parse_grid` refuses it)."""
  out, depth, cur = [], 0, ""
  for ch in raw:
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    if ch == "," and depth == 0:
      out.append(cur.strip())
      cur = ""
    else:
      cur += ch
  out.append(cur.strip())
  return out if any(out) else []


def parse_grid(args: Sequence[str]) -> dict[str, list[str]]:
  """``['key=v1,v2', ...]`` (the CLI's ``--grid``) -> ``{key: [v1, v2]}``.

  Raises:
    config_lib.ConfigError: malformed argument or a key given twice.
  """
  grid: dict[str, list[str]] = {}
  for a in args:
    if "=" not in a:
      raise config_lib.ConfigError(f"--grid expects key=v1,v2,..., got {a!r}")
    key, raw = (s.strip() for s in a.split("=", 1))
    if key in grid:
      raise config_lib.ConfigError(f"--grid {key} given twice")
    values = split_values(raw)
    if not values:
      raise config_lib.ConfigError(f"--grid {key}= has no values")
    if "" in values:
      raise config_lib.ConfigError(f"--grid {key}={raw}: value {values.index('') + 1} is "
                                   "empty (a stray comma?)")
    grid[key] = values
  return grid


def _label(value: Any) -> str:
  text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
  return re.sub(r"[^A-Za-z0-9.+=_-]", "_", text)


def expand(cfg, grid: Mapping[str, Sequence[Any]], sets: Sequence[str] = (), *,
           as_given=None) -> list[Point]:
  """The grid's points: ``cfg`` with ``sets`` applied, then each product assignment.

  Args:
    cfg: the base config.
    grid: ``{dotted key: values}``; values are Python values or ``--set`` text. The
      product runs in the given key order, the last key fastest.
    sets: ``key=value`` overrides applied to every point first.
    as_given: the config as its file gave it (before ``--set``): a field that does
      nothing in every point (:func:`fedjax_dp.config.unread_fields`) is refused; a
      field read by some points (a grid over ``schedule.name`` with
      ``schedule.beta`` set) is not.

  Raises:
    config_lib.ConfigError: unknown keys (with suggestions), unparsable or repeated
      values, or a point whose config does not validate (before anything runs).
  """
  base = config_lib.override(cfg, list(sets))
  keys = list(grid)
  for key in keys:
    if not len(grid[key]):
      raise config_lib.ConfigError(f"grid {key!r} has no values")
    _check_distinct(base, key, grid[key])
  leaves = [k.split(".")[-1] for k in keys]
  labels = [leaf if leaves.count(leaf) == 1 else key for key, leaf in zip(keys, leaves)]
  points = []
  for index, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
    point_cfg = config_lib.override(base, [f"{k}={config_lib.as_set_text(v)}" for k, v in zip(keys, combo)])
    values = {k: config_lib.get_field(point_cfg, k) for k in keys}
    name = f"{index:03d}" + "".join(f"-{lab}={_label(values[k])}"
                                     for lab, k in zip(labels, keys))
    point_cfg.name = f"{base.name}/{name}"
    point_cfg.progress = False  # the sweep has one bar over all points
    # Each point's noise follows from its own config (fedjax_dp.config.noise_identity): points
    # differ in their grid values, so they draw independent noise unless they opt in
    # to privacy.common_random_numbers, and a point re-run alone draws the same.
    config_lib.validate(point_cfg)
    points.append(Point(index, name, values, point_cfg))
  if as_given is not None:
    unread = [config_lib.unread_fields(p.config, as_given) for p in points]
    fields = {m.split("=", 1)[0] for m in unread[0]}
    for u in unread[1:]:
      fields &= {m.split("=", 1)[0] for m in u}
    first = next((m for m in unread[0] if m.split("=", 1)[0] in fields), None)
    if first is not None:
      raise config_lib.ConfigError(f"{first}{' (in every point of the sweep)' * (len(points) > 1)}")
  return points


def _check_distinct(base, key: str, raw: Sequence[Any]) -> None:
  """Refuses a grid that gives one value twice (``seed=0,0``: two identical runs)."""
  seen: list[Any] = []
  for v in raw:
    value = config_lib.get_field(config_lib.override(base, [f"{key}={config_lib.as_set_text(v)}"]), key)
    if value in seen:
      raise config_lib.ConfigError(f"--grid {key}: value {config_lib.as_set_text(v)} is given twice")
    seen.append(value)


def _coerce(value: Any) -> Any:
  """CSV text -> number where it is one ('' -> None), so fresh and resumed rows agree."""
  if value is None or value == "":
    return None
  if not isinstance(value, str):
    return value
  try:
    return int(value)
  except ValueError:
    pass
  try:
    return float(value)
  except ValueError:
    return value


def _sweep_rows(point: Point, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  # ``seed`` is a column whether or not it is a grid axis (the point's own seed).
  head = {"point": point.name, **point.values, "seed": config_lib.get_field(point.config, "seed")}
  return [{**head, **{c: _coerce(r.get(c)) for c in SWEEP_COLUMNS}} for r in rows]


def _finished(cfg, point_dir: Path) -> bool:
  """Whether ``point_dir`` holds the finished run of ``cfg`` (its summary.json).

  Raises:
    config_lib.ConfigError: the directory holds a run of a different config.
  """
  if not (point_dir / "summary.json").exists():
    return False
  if json.loads((point_dir / "summary.json").read_text()).get("status") == "interrupted":
    return False  # stopped by SIGINT: resumes from its checkpoint
  have = json.loads((point_dir / "config.json").read_text())
  if checkpoint.config_diff(have, cfg.to_dict()):  # (older schemas: fedjax_dp.config.schema)
    raise config_lib.ConfigError(f"{point_dir} holds a finished run of a different config; "
                                 "use a new --out directory (or delete it) to run this sweep")
  return True


def _load_result(run_dir: Path) -> experiment.RunResult:
  """A finished run directory read back (rows as CSV text, no parameters)."""
  return experiment.RunResult(results.read_csv(run_dir / "metrics.csv"),
                              json.loads((run_dir / "summary.json").read_text()), None)


def _draw_noise_seed(points: list[Point], out_dir: str | None) -> list[Point]:
  """Points with ``privacy.noise_seed='os'`` get one fresh entropy for the sweep (their
  grid values keep their noise apart), or the one ``out_dir/sweep.json`` recorded."""
  if not any(p.config.privacy.get("noise_seed", "") == noise_identity.OS for p in points):
    return points
  recorded = None
  if out_dir and (Path(out_dir) / "sweep.json").exists():
    recorded = json.loads((Path(out_dir) / "sweep.json").read_text()).get("noise_seed")
  seed = noise_identity.agree(recorded or noise_identity.draw())
  return [p._replace(config=config_lib.override(p.config, [f"privacy.noise_seed={seed}"]))
          if p.config.privacy.noise_seed == noise_identity.OS else p for p in points]


def _noise_seed(points: list[Point]) -> dict[str, str]:
  """``{'noise_seed': entropy}`` for sweep.json when the points drew one, else {}."""
  seeds = {p.config.privacy.get("noise_seed", "") for p in points} - {""}
  return {"noise_seed": seeds.pop()} if len(seeds) == 1 else {}


def _as_json(x: Any) -> Any:
  return json.loads(json.dumps(results._jsonable(x), sort_keys=True))


def _grid_values(points: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
  """``{key: distinct values in order}`` of points' ``values`` dicts (JSON types)."""
  out: dict[str, list[Any]] = {}
  for p in points:
    for k, v in p["values"].items():
      if v not in out.setdefault(k, []):
        out[k].append(v)
  return out


def check_same_sweep(out: Path, cfg, sets: Sequence[str], points: Sequence[Point]) -> None:
  """Refuses to resume the sweep in ``out`` with another grid, base config or ``sets``.

  Raises:
    config_lib.ConfigError: names the differing grid keys (old -> new values) or
      config fields.
  """
  path = out / "sweep.json"
  if not path.exists():
    return
  try:
    have = json.loads(path.read_text())
    old = _grid_values(have["points"])
  except (ValueError, KeyError, TypeError) as e:
    raise config_lib.ConfigError(f"--out {out}: unreadable {path} ({unreadable(e)}); use "
                                 "--overwrite to replace it, or another --out") from None
  new = _grid_values(_as_json([{"values": p.values} for p in points]))
  diff = [f"{k}: {old.get(k, '(not in grid)')} -> {new.get(k, '(not in grid)')}"
          for k in [*old, *(k for k in new if k not in old)] if old.get(k) != new.get(k)]
  if not diff and list(old) != list(new):  # the same values, other point names and order
    diff = [f"key order: {list(old)} -> {list(new)}"]
  what = "grid"
  if not diff:
    what = "config"
    diff = checkpoint.config_diff(have.get("config", {}), cfg.to_dict())
  if not diff and list(have.get("sets", [])) != list(sets):
    what, diff = "--set", [f"{have.get('sets', [])} -> {list(sets)}"]
  if diff:
    raise config_lib.ConfigError(
        f"--out {out} holds a sweep of a different {what} ({'; '.join(diff[:4])}"
        f"{'; ...' if len(diff) > 4 else ''}); use --overwrite to replace it, or another --out")


def _claim_dirs(out: Path, cfg, sets: Sequence[str], points: Sequence[Point],
                overwrite: bool | str) -> None:
  """Claims the sweep directory and every point's (and ``optimal_t`` candidate's)
  before any compute (:func:`fedjax_dp.files.outputs.claim`)."""
  outputs.claim(out, "sweep", overwrite=overwrite,
                check=lambda path: check_same_sweep(path, cfg, sets, points))
  for p in points:
    point_dir = outputs.claim(out / "points" / p.name, "sweep-point", parent=out)
    if optimal_t.is_optimal_t(p.config):
      for t, _ in optimal_t.candidates(p.config):
        optimal_t.claim_candidate(point_dir, t)


def run_sweep(cfg, grid: Mapping[str, Sequence[Any]], out_dir: str | None = None, *,
              sets: Sequence[str] = (), progress: bool | None = None,
              devices: Sequence[jax.Device] | None = None,
              overwrite: bool | str = False, as_given=None) -> list[dict[str, Any]]:
  """Runs every point of ``grid`` over ``cfg``, batching points that share shapes.

  Args:
    cfg: the base config (a ConfigDict, e.g. ``config.load_config(path)``).
    grid: ``{dotted key: [values]}``, e.g. ``{"privacy.epsilon": [1, 4], "seed": [0, 1]}``.
    out_dir: where to write (see the module docstring); None keeps results in memory.
      Finished points found there are skipped.
    sets: ``key=value`` overrides applied to every point.
    progress: show a progress bar over the whole sweep; default ``cfg.progress``.
    devices: devices to lay the sweep over (default: all, on all hosts).
    as_given: the config as its file gave it, before ``--set``: see :func:`expand`.
    overwrite: replace what an earlier sweep wrote in ``out_dir`` (only that: a
      directory holding anything else, or a file of the sweep's changed since, is
      refused, named; ``outputs.EDITED`` removes the changed files too).

  Returns:
    One dict per point and round, in grid order: the point's name, its grid values
    and the metric columns (``pandas.DataFrame(rows)``; the same rows as
    ``sweep.csv``).

  Raises:
    config_lib.ConfigError: a bad grid or value; ``out_dir`` holds a sweep of another
      grid, config or ``sets`` (and not ``overwrite``).
    outputs.OutputError: ``out_dir`` is not a sweep directory of the project's, or
      cannot be written. Both before any compute.
  """
  from tqdm.auto import tqdm

  points = expand(cfg, grid, sets, as_given=as_given)
  for p in points:
    config_lib.validate(p.config)  # cheap value checks before the directory is touched
  points = _draw_noise_seed(points, out_dir)
  progress = bool(cfg.progress) if progress is None else progress
  out = Path(out_dir) if out_dir else None
  if out and sharding.is_primary():
    _claim_dirs(out, cfg, sets, points, overwrite)
  point_dirs = [out / "points" / p.name if out else None for p in points]
  done = [bool(out) and _finished(p.config, d) for p, d in zip(points, point_dirs)]
  if out and sharding.is_primary():
    results.write_json(out / "sweep.json", _sweep_json(cfg, grid, sets, points), owned=True)

  jobs = _jobs(points, point_dirs, done)
  bar = tqdm(total=sum(int(c.rounds) for _, c, _ in jobs), disable=not progress,
             desc=f"sweep {cfg.name}", unit="round")
  start = time.time()
  try:
    with experiment.interruptible():
      res = experiment.run_batched([c for _, c, _ in jobs], [d for _, _, d in jobs], bar=bar,
                                   devices=devices)
  finally:
    bar.close()
  fresh = _fresh_rows(points, point_dirs, done, dict(zip([key for key, _, _ in jobs], res)),
                      bool(out))
  pending = [p for p in points if not done[p.index]]

  rows: list[dict[str, Any]] = []
  for p, d in zip(points, point_dirs):
    # Resumed and fresh points both come from metrics.csv when there is a directory,
    # so sweep.csv does not depend on which points ran in this invocation.
    # (Only process 0 writes files in a multi-host job; the others use their rows.)
    on_disk = out and (sharding.is_primary() or p.index not in fresh)
    source = results.read_csv(d / "metrics.csv") if on_disk else fresh[p.index]
    rows.extend(_sweep_rows(p, source))
  if out and sharding.is_primary():
    results.write_csv(out / "sweep.csv", rows,
                      ["point", *grid, *(() if "seed" in grid else ("seed",)), *SWEEP_COLUMNS], owned=True)
    results.write_json(out / "sweep.json", {
        **_sweep_json(cfg, grid, sets, points),
        "last_invocation": {"ran": len(pending), "skipped": len(points) - len(pending),
                            "wall_seconds": round(time.time() - start, 3)}}, owned=True)
  return rows


def _sweep_json(cfg, grid: Mapping[str, Sequence[Any]], sets: Sequence[str],
                points: Sequence[Point]) -> dict[str, Any]:
  """What ``sweep.json`` records of the sweep (its resume is checked against it)."""
  return {"config": cfg.to_dict(), "grid": {k: list(v) for k, v in grid.items()},
          "sets": list(sets), "points": [{"name": p.name, "values": p.values} for p in points],
          **_noise_seed(points)}


def _jobs(points: Sequence[Point], point_dirs, done) -> list[tuple[tuple[int, int | None],
                                                                   Any, Path | None]]:
  """Every pending run: plain points, and each optimal_t point's candidates (one
  constant-schedule run per T; finished candidates of an interrupted sweep are read
  back). All of them are built, grouped by compiled program and run batched."""
  jobs: list[tuple[tuple[int, int | None], Any, Path | None]] = []
  for p, d in zip(points, point_dirs):
    if done[p.index]:
      continue
    if optimal_t.is_optimal_t(p.config):
      for t, c in optimal_t.candidates(p.config):
        cdir = optimal_t.candidate_dir(d, t)
        if not (cdir and _finished(c, cdir)):
          jobs.append(((p.index, t), c, cdir))
    else:
      jobs.append(((p.index, None), p.config, d))
  return jobs


def _fresh_rows(points: Sequence[Point], point_dirs, done, ran, write: bool
                ) -> dict[int, list[dict[str, Any]]]:
  """The rows of each point run now (an optimal_t point's: its chosen T's, written to
  its directory when ``write``), from the runs ``ran[(point, T or None)]``."""
  fresh: dict[int, list[dict[str, Any]]] = {}
  for p, d in zip(points, point_dirs):
    if done[p.index]:
      continue
    if optimal_t.is_optimal_t(p.config):
      cands = []
      for t, c in optimal_t.candidates(p.config):
        r = ran.get((p.index, t)) or _load_result(optimal_t.candidate_dir(d, t))
        cands.append((t, r))
      fresh[p.index] = optimal_t.select(
          p.config, cands, d if write and sharding.is_primary() else None).rows
    else:
      fresh[p.index] = ran[(p.index, None)].rows
  return fresh


class _Module(types.ModuleType):
  """``fedjax_dp.sweep(...)`` is the Python API's sweep (:func:`fedjax_dp.api.sweep`):
  the package exports that name, which this module's name would otherwise shadow."""

  def __call__(self, *args, **kwargs):
    from fedjax_dp import api  # (the API sits on this module's floor and imports it)
    return api.sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _Module
