"""The host side of one run: its I/O around the server's pure decisions.

:class:`RunLoop` holds what of a run lives on the host and touches files: the run
directory, checkpoints, the metric rows and the wall clock. The round-to-round
decisions (the cohort, the schedule's noise and horizon, the accountant, the
budget, validation, the adaptive clip bound, stopping on a non-finite loss) are the
pure functions of :mod:`fedjax_dp.host.server`, applied to the loop's
:class:`~fedjax_dp.host.server.ServerState`. The device round is the caller's
(:func:`fedjax_dp.host.groups.run_group`, which batches many loops into one program)::

  per round:  args = loop.plan_round()                  (host: server.plan_round)
              params, metrics = round_fn(params, data, args)   (device)
              loop.record(metrics, test, wall)          (host: server.record, rows, files)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp import sharding
from fedjax_dp.config import noise_identity, schema
from fedjax_dp.files.results import METRIC_COLUMNS, RunDir, RunResult
from fedjax_dp.host import checkpoint as ckpt_lib
from fedjax_dp.host import server
from fedjax_dp.host.building import Setup
from fedjax_dp.host.server import count_std, noise_context, private_median_noise
from fedjax_dp.privacy import reporting
from fedjax_dp.training import rounds
from fedjax_dp.training.rounds import RoundArgs

__all__ = ["RunLoop", "count_std", "noise_context", "private_median_noise"]


class RunLoop:
  """The host side of one run (ARCHITECTURE.md, data flow of one round).

  Per round the caller calls :meth:`plan_round` (:func:`fedjax_dp.host.server.plan_round`:
  the cohort, the schedule's noise, the accountant's charge), runs the returned
  :class:`RoundArgs` on the device (alone, or stacked with other runs' in a sweep),
  then calls :meth:`record` with this run's metrics
  (:func:`fedjax_dp.host.server.record`: the metric row, the schedule's observation).
  :meth:`finish` writes the run directory and returns the :class:`RunResult`.

  A run stops at the schedule's horizon, on a non-finite loss (``diverged``), or --
  with ``privacy.enforce_budget`` -- before a round whose release would push the
  certified epsilon past the target (``budget_exhausted``).

  With a run directory and ``checkpoint.every = N > 0``, the caller saves a
  checkpoint (:mod:`fedjax_dp.host.checkpoint`) whenever :attr:`checkpoint_due` (every N
  rounds) and :meth:`finish` saves the last one. A loop whose run directory holds a
  checkpoint starts from it: :attr:`restored_params` is the model to continue from
  (with the server's carried states; None for a fresh run) and the rounds run on as
  if never stopped.

  Raises:
    config_lib.ConfigError: the directory's checkpoint belongs to another config.
    checkpoint.CheckpointError: the checkpoint is corrupt (named, not loaded).
  """

  def __init__(self, cfg, setup: Setup, out_dir: str | None = None):
    self.cfg = cfg
    self.setup = setup
    self.privacy = setup.privacy
    # What the decisions read and the fresh state (the schedule's, the accountant's),
    # the config's stored form and noise stream, then the run directory.
    spec = server.spec(cfg, setup)
    self.state = server.init(spec)
    stored = schema.stamped(cfg.to_dict())  # config.json, written once restored
    # The noise stream: a hash of the release's config and of its data's content
    # (fedjax_dp.config.noise_identity).
    self.stream = noise_identity.stream(cfg, setup.data_fingerprint)
    self.spec = spec._replace(stream=self.stream)
    # In a multi-host job every process runs this loop; one writes.
    self.run_dir = RunDir(out_dir) if out_dir and sharding.is_primary() else None
    # Every process reads the checkpoint and takes part in gathering the params to
    # save (a collective across hosts); only process 0 writes.
    self.out_dir = out_dir
    self.checkpoint_every = int(cfg.checkpoint.every) if "checkpoint" in cfg else 0
    self.rows: list[dict[str, Any]] = []
    self.wall_offset = 0.0  # wall seconds spent before a resume
    self.restored_params = None
    self.columns = METRIC_COLUMNS + (("clip_bound", "clip_count")
                                     if self.spec.clip_rule != "fixed" else ()) + (
                                         ("val_accuracy",) if self.spec.validate_every
                                         else ())
    ckpt = Path(out_dir) / ckpt_lib.FILENAME if out_dir else None
    if ckpt is not None and ckpt.exists():
      self._restore(ckpt)
    if self.run_dir:
      self.run_dir.write_config(stored)

  def _restore(self, path) -> None:
    round_cfg = self.setup.round_cfg
    template = jax.eval_shape(lambda k: rounds.carried_params(round_cfg, self.setup.model.init(k)),
                              jax.random.PRNGKey(0))
    st, params, config = ckpt_lib.load(path, schedule_template=self.state.schedule,
                                       acct_template=self.state.acct, params_template=template)
    diff = ckpt_lib.config_diff(config, self.cfg.to_dict())
    had = ckpt_lib.recorded_fingerprint(path)
    if had is not None and had != self.setup.data_fingerprint:
      diff = [f"the data's content (fingerprint {had} -> {self.setup.data_fingerprint}): "
              "the files read changed since"] + diff
    if diff:
      raise config_lib.ConfigError(
          f"{path} is a checkpoint of a different config ({'; '.join(diff[:4])}"
          f"{'; ...' if len(diff) > 4 else ''}); use --overwrite or another --out")
    self.rows, self.wall_offset = st.rows, st.wall
    self.state = server.restored(self.spec, st, self.rows)
    self.restored_params = params

  # The server state's fields, read by the group driver, the CLI's progress and tests.
  t = property(lambda self: self.state.t)
  horizon = property(lambda self: self.state.horizon)
  status = property(lambda self: self.state.status)
  running = property(lambda self: self.state.running)
  diverged_round = property(lambda self: self.state.diverged_round)
  test = property(lambda self: self.state.test)
  acct = property(lambda self: self.state.acct)
  clip_bound = property(lambda self: self.state.clip_bound)

  @property
  def checkpoint_due(self) -> bool:
    """Whether a checkpoint is to be saved now (after :meth:`record`)."""
    return bool(self.out_dir and self.checkpoint_every and self.running
                and self.state.planned is None and self.t % self.checkpoint_every == 0)

  def save_checkpoint(self, params: Any, wall: float) -> None:
    """Saves the state after the last recorded round with the model ``params``
    (this run's, on the host, with the server's carried states) and ``wall`` seconds
    spent."""
    if not self.run_dir:
      return
    s = self.state
    state = ckpt_lib.RunState(s.t, s.horizon, s.status, s.running, s.diverged_round, s.test,
                              s.schedule, s.acct, self.rows, wall)
    ckpt_lib.save(self.run_dir.path / ckpt_lib.FILENAME, state, params, self.cfg.to_dict(),
                  self.setup.data_fingerprint)
    # metrics.csv follows the checkpoint (a partial file, still written atomically).
    self.run_dir.write_metrics(self.rows, self.columns)

  def interrupt(self, wall: float, params: Any, **extra: Any) -> RunResult:
    """Stops between rounds (SIGINT): saves a checkpoint to resume from, then writes
    the run directory with ``status = 'interrupted'``."""
    self.state = self.state._replace(planned=None)
    if self.checkpoint_every:
      self.save_checkpoint(params, wall)
    self.state = self.state._replace(status="interrupted", running=False)
    return self.finish(wall, params, **extra)

  @property
  def wants_validation(self) -> bool:
    """Whether the planned round releases the validation score on its selected clients."""
    return self.state.planned is not None and self.state.planned.val_std >= 0

  @property
  def val_std(self) -> float:
    """The planned round's validation noise std (``z_val / N_sel``; < 0: none)."""
    return self.state.planned.val_std if self.state.planned is not None else -1.0

  @property
  def planned(self) -> server.Planned | None:
    """What :meth:`plan_round` decided for the round it planned last (its noise plan,
    the accountant state after it and its certified epsilon, the cohort), or None."""
    return self.state.planned

  @property
  def wants_eval(self) -> bool:
    """Whether the planned round ends with a test-set evaluation."""
    return self.state.planned is not None and self.state.planned.evaluate

  def cohort(self, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Round ``t``'s selection ``(idx [K], mask [K])`` (:func:`fedjax_dp.host.server.cohort`)."""
    return server.cohort(self.spec, t)

  def plan_round(self) -> RoundArgs | None:
    """Plans round ``t``: its device inputs (numpy), or None when the run stops."""
    self.state, args = server.plan_round(self.spec, self.state)
    return args

  def record(self, metrics: Mapping[str, float], test: tuple[float, float] | None,
             wall: float, val: float | None = None) -> None:
    """Records the planned round's results: ``metrics`` (this run's
    :class:`fedjax_dp.training.rounds.RoundMetrics` as floats), ``test = (loss, accuracy)`` if it
    was evaluated and ``val`` (the released validation score) if
    :attr:`wants_validation`; then the schedule observes them."""
    self.state, row = server.record(self.spec, self.state, metrics, test, wall, val)
    self.rows.append(row)
    if self.run_dir and self.running and self.t % 25 == 0 and not self.checkpoint_due:
      self.run_dir.write_metrics(self.rows, self.columns)  # partial progress, still atomic

  def _worst_client_accountant(self) -> dict[str, Any]:
    """The run's RDP curve for its worst client at every order (an upper bound on
    each client's curve) and its worst pure epsilon (``inf`` unless every round was
    a pure Laplace release), so that independent runs on the same data can be
    composed from their summaries (:func:`fedjax_dp.optimal_t.composed_epsilon`)."""
    rdp = self.acct.rdp
    pure = (float(np.max(self.acct.pure_eps, initial=0.0)) if self.privacy.pure_composition
            else math.inf)
    return {"orders": rdp.orders, "rdp_worst_client": np.max(rdp.rdp, axis=0),
            "pure_epsilon_worst_client": pure}

  def finish(self, wall: float, params: Any, **extra: Any) -> RunResult:
    """Writes ``model.msgpack`` (the final ``params``), the last checkpoint,
    ``metrics.csv``, ``metrics.png`` and ``summary.json`` (last, so a run directory
    with a summary is complete) and returns the result."""
    cfg, privacy, rows = self.cfg, self.privacy, self.rows
    # The checkpoint keeps the server's carried states (a correlated mechanism's noise
    # state, the server optimizer's: a resume needs them); the model file and the
    # result hold the model only (the states are the server's own).
    carried, params = params, rounds.model_params(params)
    last_eval = next((r for r in reversed(rows) if r["test_loss"] != ""), None)
    summary = dict(
        name=cfg.name, status=self.status, diverged=self.status == "diverged",
        diverged_round=self.diverged_round, rounds_run=len(rows),
        final_test_loss=last_eval["test_loss"] if last_eval else None,
        final_test_accuracy=(last_eval["test_accuracy"] or None) if last_eval else None,
        task="regression" if self.setup.model.is_regression else "classification",
        epsilon_target=privacy.target_epsilon, delta=privacy.delta,
        epsilon_claimed=rows[-1]["epsilon_claimed"] if rows else 0.0,
        epsilon_certified=rows[-1]["epsilon_certified"] if rows else 0.0,
        privacy=privacy.describe(), wall_seconds=round(wall, 3),
        seconds_per_round=round(wall / max(len(rows), 1), 5),
        device=str(jax.devices()[0].platform), num_params=self.setup.model.num_params(),
        noise_stream_id=noise_identity.stream_hex(self.stream),
        noise_seed=cfg.privacy.get("noise_seed", ""),
        data_fingerprint=self.setup.data_fingerprint,
        accountant=self._worst_client_accountant(), data_source=self.setup.data_source,
        **reporting.summary_fields(privacy, self.acct, rows[-1]["epsilon_certified"]
                                   if rows else 0.0),
        **extra)
    if self.run_dir:
      if self.status != "interrupted" and params is not None:
        if self.checkpoint_every:
          self.save_checkpoint(carried, wall)
        ckpt_lib.save_model(self.run_dir.path / ckpt_lib.MODEL_FILENAME, params)
      self.run_dir.write_metrics(rows, self.columns)
      # The plot's second title line gives the certified epsilon and the unit of privacy.
      over = (f"; certified exceeds the requested epsilon {privacy.target_epsilon:g}"
              if summary["epsilon_warning"] else "")
      self.run_dir.write_plot(
          rows, title=f"{cfg.name}: {cfg.model.name} on {cfg.data.name}{over}")
      self.run_dir.write_summary(summary)
    return RunResult(rows, summary, params)

