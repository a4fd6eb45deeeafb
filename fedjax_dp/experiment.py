"""From configs to finished runs: the entry points ``run`` and ``run_batched``.

``run(config, out_dir)`` is what ``fedjax-dp run`` calls; notebooks call it too and
get a :class:`RunResult` back (metrics rows load into ``pandas.DataFrame(rows)``).
:func:`run_batched` runs many configs (:mod:`fedjax_dp.sweep`, ``optimal_t``), each
group of them that shares a compiled round as one program.

A run goes down the layers once (docs/architecture.md): this module checks the
output directory, then :mod:`fedjax_dp.host.building` builds the run,
:mod:`fedjax_dp.host.groups` drives the compiled round (:mod:`fedjax_dp.training.program`) and
each run's host loop (:mod:`fedjax_dp.host.run_loop`). The names those modules own are
re-exported here for callers of ``experiment.build``, ``experiment.RunLoop`` and
the like.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from fedjax_dp import config as config_lib
from fedjax_dp import optimal_t, sharding
from fedjax_dp.config import noise_identity, schema
from fedjax_dp.data import load_dataset
from fedjax_dp.files.results import METRIC_COLUMNS, RunDir, RunResult
from fedjax_dp.host import checkpoint as ckpt_lib
from fedjax_dp.host.building import (
  CLIENT_CHUNK_AUTO,
  Setup,
  build,
  data_key,
  group_key,
  partition_clients,
  round_config,
  same_program,
)
from fedjax_dp.host.groups import cohort_key, interruptible, lane_layout, run_group
from fedjax_dp.host.run_loop import RunLoop, count_std, noise_context, private_median_noise

__all__ = [
  "CLIENT_CHUNK_AUTO",
  "METRIC_COLUMNS",
  "RunLoop",
  "RunResult",
  "Setup",
  "build",
  "cohort_key",
  "count_std",
  "data_key",
  "group_key",
  "interruptible",
  "lane_layout",
  "load_dataset",
  "noise_context",
  "partition_clients",
  "private_median_noise",
  "round_config",
  "run",
  "run_batched",
  "run_group",
  "same_program",
]

def run(cfg, out_dir: str | None = None, setup: Setup | None = None, *,
        overwrite: bool | str = False, build_kwargs: dict | None = None) -> RunResult:
  """Runs one experiment and (if ``out_dir``) writes its run directory.

  The loop is thin: per round, the schedule plans noise on the host, one jitted call
  trains the cohort, one jitted call evaluates, and the accountant composes the
  round's event (see :class:`RunLoop` for the stop rules). A run is a sweep of one
  point: :func:`run_group` with one config, so with several devices its clients are
  sharded over all of them.

  Running again into the same ``out_dir`` with the same config resumes from its
  last checkpoint (``checkpoint.every``); the finished files equal those of an
  uninterrupted run except for wall-clock times. SIGINT (Ctrl-C) stops between
  rounds, saves a checkpoint, writes the directory with status ``'interrupted'``
  and raises ``KeyboardInterrupt``.

  With ``overwrite``, only the files the project wrote in ``out_dir`` are removed
  first, and none if one of them was changed since it wrote it (``overwrite=
  outputs.EDITED`` removes those too; :mod:`fedjax_dp.files.outputs`). ``build_kwargs``
  go to :func:`build` (the objects given from Python: ``federation``, ``model``;
  :mod:`fedjax_dp.api`).

  Raises:
    config_lib.ConfigError: ``out_dir`` holds a run of another config (the message
      names the differing fields) and not ``overwrite``.
    outputs.OutputError: ``out_dir`` is not a run directory of the project's (a
      stranger's, a sweep's), holds files the project did not write and
      ``overwrite`` would remove, or cannot be written. Raised before any compute.
  """
  from tqdm.auto import tqdm

  config_lib.validate(cfg)  # cheap value checks before the directory is touched
  optimal = config_lib.is_optimal_t(cfg)
  # privacy.noise_seed='os': fresh entropy, or the one this directory recorded.
  cfg = noise_identity.resolve(
      cfg, None if overwrite else noise_identity.recorded_config(out_dir))
  if out_dir:
    ckpt_lib.claim_run_dir(out_dir, cfg.to_dict(), overwrite=overwrite)
  if out_dir and (Path(out_dir) / ckpt_lib.FILENAME).is_file():
    ckpt_lib.verified_payload(Path(out_dir) / ckpt_lib.FILENAME)  # before building anything
  if optimal:
    if out_dir and sharding.is_primary():
      # Recorded now (its candidates' noise follows from it), so a resume finds it.
      RunDir(out_dir).write_config(schema.stamped(cfg.to_dict()))
    grid = optimal_t.t_grid(cfg)
    bar = tqdm(total=sum(grid), disable=not cfg.progress, desc=f"{cfg.name} (optimal T)",
               unit="round")
    try:
      with interruptible():
        return _run_optimal_t(cfg, out_dir, bar=bar, build_kwargs=build_kwargs)
    finally:
      bar.close()
  setup = setup or build(cfg, **(build_kwargs or {}))
  bar = tqdm(total=int(cfg.rounds), disable=not cfg.progress, desc=cfg.name, unit="round")
  try:
    with interruptible():
      (result,) = run_group([cfg], [setup], [out_dir], bar=bar)
  finally:
    bar.close()
  return result


def _run_optimal_t(cfg, out_dir: str | None, *, bar=None,
                   build_kwargs: dict | None = None) -> RunResult:
  """Runs an ``optimal_t`` config's candidates as one batched sweep and keeps the best
  (:mod:`fedjax_dp.optimal_t`)."""
  cands = optimal_t.candidates(cfg)
  dirs = [optimal_t.claim_candidate(out_dir, t) for t, _ in cands]
  res = run_batched([c for _, c in cands], dirs, bar=bar, build_kwargs=build_kwargs)
  return optimal_t.select(cfg, [(t, r) for (t, _), r in zip(cands, res)], out_dir)


def run_batched(cfgs: Sequence[Any], out_dirs: Sequence[str | os.PathLike | None], *,
                bar=None, devices: Sequence[jax.Device] | None = None,
                cache: dict | None = None,
                build_kwargs: dict | None = None) -> list[RunResult]:
  """Runs many configs: builds each, groups those that share a compiled round
  (:func:`group_key`) and runs every group as one vmapped program
  (:func:`run_group`).

  Args:
    cfgs: the runs' configs (plain schedules; ``optimal_t`` is expanded by callers).
    out_dirs: one run directory (or None) per config.
    bar: a tqdm bar advanced by one per run-round.
    devices: devices to lay each group over (default: all).
    cache: shared :func:`build` cache (datasets, partitions).
    build_kwargs: given to every :func:`build` (objects from Python, :mod:`fedjax_dp.api`).

  Returns:
    One :class:`RunResult` per config, in order.
  """
  cache = {} if cache is None else cache
  cfgs = [noise_identity.resolve(c, noise_identity.recorded_config(d))
          for c, d in zip(cfgs, out_dirs)]
  setups = [build(c, cache=cache, **(build_kwargs or {})) for c in cfgs]
  groups: dict[tuple, list[int]] = {}
  for i, s in enumerate(setups):
    # Runs that evaluate every round (CRD) go apart: a group evaluates all of its
    # lanes whenever one of them asks.
    groups.setdefault((group_key(s), int(cfgs[i].eval.every)), []).append(i)
  out: dict[int, RunResult] = {}
  for members in groups.values():
    if bar is not None:
      bar.set_description(f"{cfgs[members[0]].name.split('/')[0]} ({len(members)} runs)")
    res = run_group([cfgs[i] for i in members], [setups[i] for i in members],
                    [None if out_dirs[i] is None else str(out_dirs[i]) for i in members],
                    bar=bar, devices=devices)
    out.update(zip(members, res))
  return [out[i] for i in range(len(cfgs))]
