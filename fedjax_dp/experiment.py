"""From configs to finished runs: build the pieces, run the thin round loop, save.

``run(config, out_dir)`` is what ``fedjax-dp run`` calls; notebooks call it too and
get a :class:`RunResult` back (metrics rows load into ``pandas.DataFrame(rows)``).

One loop serves single runs and sweeps (:mod:`fedjax_dp.sweep`): :func:`run_group`
drives P runs whose configs share every array shape as ONE vmapped, jitted program
per round (a single run is a group of one). Each run keeps its own host side -- the
schedule, client selection, accountant, stop rules and metric rows -- in a
:class:`RunLoop`; numpy is cheap, so only the device part is batched::

  per round:  for each run: args_p = loop_p.plan_round()        (host, numpy)
              params, metrics = round_fn(params, data, stack(args), active)  (device)
              [loss, acc] = eval_fn(params, test set)            (device, if wanted)
              for each run: loop_p.record(metrics[p], ...)       (host: accountant,
                                                                   schedule.observe)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import checkpoint as ckpt_lib
from fedjax_dp import client as client_lib
from fedjax_dp import config as config_lib
from fedjax_dp import engine, noise_identity, optimal_t, reporting, sharding
from fedjax_dp import selection as selection_lib
from fedjax_dp.data import build_federated_data, load_dataset, partition
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.data.partition import adpfl_skews
from fedjax_dp.models import get_model
from fedjax_dp.privacy.plan import (
  PrivacyPlan,
  make_privacy_plan,
  private_median_split,
  selection_probability,
  validation_sensitivity,
)
from fedjax_dp.results import METRIC_COLUMNS, RunDir, RunResult
from fedjax_dp.schedules import NoiseContext, get_schedule

CLIENT_CHUNK_AUTO = -1  # server.client_chunk: choose from the free memory


@dataclasses.dataclass
class Setup:
  """Everything a run needs, built from a config (host and device objects)."""

  config: Any
  model: Any
  data: Any                 # FederatedData on the device
  x_test: jax.Array
  y_test: jax.Array
  round_cfg: engine.RoundConfig
  privacy: PrivacyPlan
  num_clients: int
  k_slots: int
  selection_weights: np.ndarray | None = None  # [U] SelectionRule.weights, if the rule has
  data_source: dict | None = None  # Dataset.source: the files read and their SHA-256


def _skews(cfg):
  """``data.s`` for label_skew: one value, or one per client (``data.skews`` or a scheme)."""
  d = cfg.data
  scheme = d.get("skew_scheme", "constant")
  if scheme != "constant":
    return adpfl_skews(d.num_clients, cfg.seed, evenly_spaced=scheme == "adpfl_even")
  skews = tuple(d.get("skews", ()))
  if skews and len(skews) != d.num_clients:
    raise config_lib.ConfigError(f"data.skews holds {len(skews)} values, but "
                                 f"data.num_clients is {d.num_clients}")
  return np.asarray(skews, np.float64) if skews else d.skew


def _partition(cfg, labels, groups=None):
  d = cfg.data
  kwargs: dict[str, Any] = {}
  if d.partition == "iid":
    kwargs = {"samples_per_client": d.samples_per_client}
  elif d.partition == "k_classes":
    kwargs = {"k": d.classes_per_client, "samples_per_client": d.samples_per_client}
  elif d.partition == "dirichlet":
    kwargs = {"alpha": d.alpha, "samples_per_client": d.samples_per_client or None}
  elif d.partition == "unbalanced":
    sizes = list(d.group_sizes)
    if d.num_clients % len(sizes):
      raise config_lib.ConfigError(
          f"data.num_clients ({d.num_clients}) must be a multiple of the number of "
          f"data.group_sizes ({len(sizes)})")
    per = d.num_clients // len(sizes)
    return partition(labels, "unbalanced", d.num_clients, cfg.seed,
                     sizes=[s for s in sizes for _ in range(per)])
  elif d.partition == "label_skew":
    kwargs = {"s": _skews(cfg), "samples_per_client": d.samples_per_client,
              "remainder": d.get("skew_remainder", "others")}
  elif d.partition == "sorted":
    kwargs = {"samples_per_client": d.samples_per_client}
  elif d.partition == "writer_like":
    kwargs = {"samples_per_client": d.samples_per_client, "size_sigma": d.size_sigma,
              "classes_per_client": d.classes_per_client, "dominance": d.dominance}
  elif d.partition == "natural":
    kwargs = {"groups": groups}
  return partition(labels, d.partition, d.num_clients, cfg.seed, **kwargs)


def data_key(cfg) -> str:
  """Runs with equal keys have equal client data: the ``data`` fields and the seed
  (every partitioner is seeded with ``cfg.seed``)."""
  return json.dumps([cfg.data.to_dict(), int(cfg.seed)], sort_keys=True, default=str)


def _client_round_config(cfg, client_chunk: int = 0) -> engine.RoundConfig:
  ccfg = client_lib.ClientConfig(
      local_steps=cfg.client.local_steps, batch_size=cfg.client.batch_size,
      clip_mode=cfg.client.clip_mode, noise_placement=cfg.privacy.placement,
      mechanism=cfg.privacy.mechanism, l2_reg=cfg.client.l2_reg,
      chunk_size=cfg.client.chunk_size, minibatch=cfg.client.get("minibatch", "shuffle"))
  fraction = 1.0
  if cfg.server.aggregation == "fixed":  # the expected share of examples in a round
    fraction = selection_probability(cfg)
  return engine.RoundConfig(ccfg, cfg.server.aggregation, client_chunk,
                            aggregate_upload_noise=cfg.privacy.noise_sampling == "aggregate",
                            expected_fraction=fraction,
                            conv_impl=cfg.server.get("conv_impl", "auto"),
                            clip_rule=cfg.server.get("clip_rule", "fixed"))


def build(cfg, *, cache: dict | None = None) -> Setup:
  """Validates ``cfg`` and builds data, model and privacy plan (before any training).

  Args:
    cfg: the run's config.
    cache: optional dict shared by several builds (a sweep): runs with the same
      :func:`data_key` share one device copy of the client data, and runs of the
      same dataset share the test set.
  """
  config_lib.validate(cfg)
  # The partitioners, the model zoo and the privacy plan check the values they are
  # given and raise ValueError naming the field: here that is the user's config.
  with config_lib.as_config_errors():
    return _build(cfg, cache)


def _build(cfg, cache: dict | None) -> Setup:
  if cfg.server.selection not in engine.SELECTIONS:
    raise config_lib.ConfigError(f"server.selection: unknown {cfg.server.selection!r}; "
                                 f"known: {engine.SELECTIONS}")
  cache = {} if cache is None else cache
  ds = load_dataset(cfg.data.name, cfg.data.dir)
  model = get_model(cfg.model.name, ds.x_train.shape[1:], ds.num_classes)
  if model.is_regression != ds.is_regression:
    kinds = ("a classifier", "a regressor")
    raise config_lib.ConfigError(
        f"model.name={cfg.model.name!r} is {kinds[model.is_regression]}, but data.name="
        f"{cfg.data.name!r} has {'float regression targets' if ds.is_regression else 'labels'}")
  key = data_key(cfg)
  if ("clients", key) not in cache:
    clients = _partition(cfg, np.asarray(ds.y_train), ds.train_groups)
    cache["clients", key] = (clients, build_federated_data(ds.x_train, ds.y_train, clients))
  clients, data = cache["clients", key]
  n_test = int(cfg.data.get("test_samples", 0))
  test_key = (cfg.data.name, cfg.data.dir, n_test)
  if ("test", test_key) not in cache:
    x_t, y_t = np.asarray(ds.x_test), np.asarray(ds.y_test)
    if 0 < n_test < len(y_t):
      # The same subset for every run and seed (seed 0), so runs stay comparable.
      keep = np.sort(np.random.default_rng(0).permutation(len(y_t))[:n_test])
      x_t, y_t = x_t[keep], y_t[keep]
    cache["test", test_key] = (jnp.asarray(x_t), jnp.asarray(y_t))
  x_test, y_test = cache["test", test_key]
  u = len(clients)
  k_slots = engine.cohort_size(cfg.server.selection, u, cfg.server.clients_per_round,
                               cfg.server.q)
  round_cfg = _client_round_config(cfg)
  chunk = int(cfg.server.client_chunk)
  if chunk < CLIENT_CHUNK_AUTO:
    raise config_lib.ConfigError(f"server.client_chunk must be >= 0 (0 = all at once) or "
                                 f"{CLIENT_CHUNK_AUTO} (from free memory), got {chunk}")
  counts = np.asarray([len(c) for c in clients])
  n_eps = len(cfg.privacy.client_epsilons)
  if n_eps and n_eps != u:  # (natural partitions: U comes from the data)
    raise config_lib.ConfigError(f"privacy.client_epsilons holds {n_eps} values, but the "
                                 f"partition has {u} clients (give one per client)")
  privacy = make_privacy_plan(cfg, counts, num_params=model.num_params())
  if privacy.validation == "clients" and model.is_regression:
    raise config_lib.ConfigError("schedule.validation='clients' scores accuracy, which a "
                                 "regressor does not have; use schedule.validation='server'")
  weights = None
  rule = selection_lib.get_rule(cfg.server.selection)
  if rule.weights is not None:  # side information of the rule, from the partition (once)
    try:
      weights = rule.weights(np.asarray(ds.y_train), clients, ds.num_classes, cfg.server)
    except ValueError as e:
      raise config_lib.ConfigError(str(e)) from e
  if chunk == CLIENT_CHUNK_AUTO:  # compiles the round: only once every check has passed
    chunk = engine.client_chunk_for_memory(model, round_cfg, data, k_slots)
  round_cfg = dataclasses.replace(round_cfg, client_chunk=chunk)
  return Setup(cfg, model, data, x_test, y_test, round_cfg, privacy, u, k_slots, weights,
               ds.source)


def _lr_steps(cfg, scale: float) -> np.ndarray:
  steps = np.arange(cfg.client.local_steps)
  return (cfg.client.lr * scale * cfg.client.lr_decay ** steps).astype(np.float32)


def noise_context(cfg, privacy: PrivacyPlan) -> NoiseContext:
  """The :class:`NoiseContext` a run's schedule is initialised with."""
  return NoiseContext(privacy.epsilon, privacy.delta, privacy.q, privacy.sensitivity,
                      int(cfg.rounds), privacy.noise_scale, float(cfg.client.lr),
                      params=dict(cfg.schedule))


class _Pending(NamedTuple):
  """What :meth:`RunLoop.plan_round` decided, for :meth:`RunLoop.record`."""

  plan: Any
  acct: Any
  certified: float
  idx: np.ndarray
  sel: np.ndarray
  evaluate: bool
  val_std: float = -1.0  # std of the validation release; < 0: no release this round


class RunLoop:
  """The host side of one run (ARCHITECTURE.md, data flow of one round).

  The schedule plans noise, the sampler draws the cohort, the accountant composes
  the round's event, and the schedule observes the metrics; all numpy, all here.
  The device round is the caller's: per round it calls :meth:`plan_round`, runs the
  returned :class:`engine.RoundArgs` (alone, or stacked with other runs' in a sweep),
  then calls :meth:`record` with this run's metrics. :meth:`finish` writes the run
  directory and returns the :class:`RunResult`.

  A run stops at the schedule's horizon, on a non-finite loss (``diverged``), or --
  with ``privacy.enforce_budget`` -- before a round whose release would push the
  certified epsilon past the target (``budget_exhausted``).

  With a run directory and ``checkpoint.every = N > 0``, the caller saves a
  checkpoint (:mod:`fedjax_dp.checkpoint`) whenever :attr:`checkpoint_due` (every N
  rounds) and :meth:`finish` saves the last one. A loop whose run directory holds a
  checkpoint starts from it: :attr:`restored_params` is the model to continue from
  (None for a fresh run) and the rounds run on as if never stopped.

  Raises:
    config_lib.ConfigError: the directory's checkpoint belongs to another config.
    checkpoint.CheckpointError: the checkpoint is corrupt (named, not loaded).
  """

  def __init__(self, cfg, setup: Setup, out_dir: str | None = None):
    self.cfg = cfg
    self.setup = setup
    self.privacy = setup.privacy
    # In a multi-host job every process runs this loop; one writes.
    self.run_dir = RunDir(out_dir) if out_dir and sharding.is_primary() else None
    # Every process reads the checkpoint and takes part in gathering the params to
    # save (a collective across hosts); only process 0 writes.
    self.out_dir = out_dir
    self.checkpoint_every = int(cfg.checkpoint.every) if "checkpoint" in cfg else 0
    self.schedule = get_schedule(cfg.schedule.name)
    self.state = self.schedule.init(noise_context(cfg, setup.privacy))
    # The noise stream: a hash of the release's config (fedjax_dp.noise_identity).
    self.stream = noise_identity.stream(cfg)
    self.acct = self.privacy.accountant_init()
    self.rows: list[dict[str, Any]] = []
    self.status, self.diverged_round = "completed", None
    self.running = True
    self.t = 0
    self.horizon = int(cfg.rounds)
    self.unit = reporting.privacy_unit(self.privacy)  # metrics.csv's privacy_unit column
    self.test = (float("nan"), float("nan"))
    # Schedules may only shorten T; guard against one that never stops anyway.
    self._max_rounds = int(cfg.rounds) * 4 + 10
    self._pending: _Pending | None = None
    self.wall_offset = 0.0  # wall seconds spent before a resume
    self.restored_params = None
    # server.clip_rule: the adaptive clip bound S_t (private_median: Andrew et al. 2021,
    # updated on the host from each round's released noisy count).
    self.clip_rule = cfg.server.get("clip_rule", "fixed")
    self.clip_bound = float(cfg.client.clip)
    # schedule.validation='clients' (A-DPFL): a noisy accuracy on the selected clients'
    # data after every adjustment round, charged by the accountant (plan.event).
    self.validate_clients = self.privacy.validation == "clients"
    self.adjust_every = int(float(cfg.schedule.get("adjust_every", 1)))
    self._counts = np.asarray(setup.data.counts) if self.validate_clients else None
    self.columns = METRIC_COLUMNS + (("clip_bound", "clip_count")
                                     if self.clip_rule != "fixed" else ()) + (
                                         ("val_accuracy",) if self.validate_clients else ())
    ckpt = Path(out_dir) / ckpt_lib.FILENAME if out_dir else None
    if ckpt is not None and ckpt.exists():
      self._restore(ckpt)
    if self.run_dir:
      self.run_dir.write_config(cfg.to_dict())

  def _restore(self, path) -> None:
    template = jax.eval_shape(self.setup.model.init, jax.random.PRNGKey(0))
    st, params, config = ckpt_lib.load(path, schedule_template=self.state,
                                       acct_template=self.acct, params_template=template)
    diff = ckpt_lib.config_diff(config, self.cfg.to_dict())
    if diff:
      raise config_lib.ConfigError(
          f"{path} is a checkpoint of a different config ({'; '.join(diff[:4])}"
          f"{'; ...' if len(diff) > 4 else ''}); use --overwrite or another --out")
    self.t, self.horizon, self.status, self.running = st.t, st.horizon, st.status, st.running
    self.diverged_round, self.test = st.diverged_round, st.test
    self.state, self.acct, self.rows, self.wall_offset = (st.schedule_state, st.acct, st.rows,
                                                          st.wall)
    self.restored_params = params
    if self.clip_rule == "private_median" and self.rows:  # S_t follows from the last row
      last = self.rows[-1]
      self.clip_bound = self._next_clip(float(last["clip_bound"]), float(last["clip_count"]))

  def _expected_cohort(self) -> float:
    """m: the expected number of clients per round (K, or q U)."""
    return max(self.privacy.q * self.setup.num_clients, 1.0)

  def _count_std(self) -> float:
    return count_std(self.cfg, self.privacy.q, self.setup.num_clients)

  def _next_clip(self, bound: float, count: float) -> float:
    """Andrew et al. (2021) geometric update toward the ``gamma`` quantile of the
    update norms: ``S_{t+1} = S_t exp(-eta_C (b_t - gamma))`` with ``b_t`` the noisy
    count of unclipped updates divided by the expected cohort size m."""
    gamma = float(self.cfg.server.get("clip_quantile", 0.5))
    eta = float(self.cfg.server.get("clip_lr", 0.2))
    return bound * math.exp(-eta * (count / self._expected_cohort() - gamma))

  @property
  def checkpoint_due(self) -> bool:
    """Whether a checkpoint is to be saved now (after :meth:`record`)."""
    return bool(self.out_dir and self.checkpoint_every and self.running
                and self._pending is None and self.t % self.checkpoint_every == 0)

  def save_checkpoint(self, params: Any, wall: float) -> None:
    """Saves the state after the last recorded round with the model ``params``
    (this run's, on the host) and ``wall`` seconds spent."""
    if not self.run_dir:
      return
    state = ckpt_lib.RunState(self.t, self.horizon, self.status, self.running,
                              self.diverged_round, self.test, self.state, self.acct,
                              self.rows, wall)
    ckpt_lib.save(self.run_dir.path / ckpt_lib.FILENAME, state, params, self.cfg.to_dict())
    # metrics.csv follows the checkpoint (a partial file, still written atomically).
    self.run_dir.write_metrics(self.rows, self.columns)

  def interrupt(self, wall: float, params: Any, **extra: Any) -> RunResult:
    """Stops between rounds (SIGINT): saves a checkpoint to resume from, then writes
    the run directory with ``status = 'interrupted'``."""
    self._pending = None
    if self.checkpoint_every:
      self.save_checkpoint(params, wall)
    self.status, self.running = "interrupted", False
    return self.finish(wall, params, **extra)

  @property
  def wants_validation(self) -> bool:
    """Whether the planned round releases the validation score on its selected clients."""
    return self._pending is not None and self._pending.val_std >= 0

  @property
  def val_std(self) -> float:
    """The planned round's validation noise std (``z_val / N_sel``; < 0: none)."""
    return self._pending.val_std if self._pending is not None else -1.0

  @property
  def planned(self) -> _Pending | None:
    """What :meth:`plan_round` decided for the round it planned last (its noise plan,
    the accountant state after it and its certified epsilon, the cohort), or None."""
    return self._pending

  @property
  def wants_eval(self) -> bool:
    """Whether the planned round ends with a test-set evaluation."""
    return self._pending is not None and self._pending.evaluate

  def plan_round(self) -> engine.RoundArgs | None:
    """Plans round ``t``: its device inputs (numpy), or None when the run stops."""
    if not self.running:
      return None
    cfg, privacy, t = self.cfg, self.privacy, self.t
    plan = self.schedule.plan(self.state, t) if t < self._max_rounds else None
    if plan is None or plan.stop:
      self.running = False
      return None
    self.horizon = plan.horizon
    client_noise, central_noise = privacy.device_noise(plan.noise, plan.central_noise)
    idx, sel = engine.select_clients(cfg.server.selection, self.setup.num_clients,
                                     cfg.server.clients_per_round, cfg.server.q, cfg.seed, t,
                                     weights=self.setup.selection_weights)
    # Deterministic rules (round robin) are charged for the clients that take part.
    validate = self.validate_clients and (t + 1) % self.adjust_every == 0
    new_acct = privacy.accountant_step(self.acct, client_noise, central_noise,
                                       selected=idx[sel > 0], validate=validate)
    val_std = -1.0
    if validate:
      counts = self._counts[idx[sel > 0]]
      val_std = 0.0 if privacy.noiseless else (
          privacy.val_noise_multiplier * validation_sensitivity(counts))
    certified = privacy.certified_epsilon(new_acct)
    # Each client against its own target (privacy.client_epsilons).
    if cfg.privacy.enforce_budget and privacy.over_budget(new_acct):
      self.status, self.running = "budget_exhausted", False
      return None
    evaluate = (t + 1) % cfg.eval.every == 0 or t + 1 >= plan.horizon
    self._pending = _Pending(plan, new_acct, certified, idx, sel, evaluate, val_std)
    clip, count_noise = float(cfg.client.clip), 0.0
    if self.clip_rule == "private_median":
      # The accountant charged multiplier z = central_noise / Delta(C); the device
      # splits it between the sum (z_sum, at the bound S_t) and the count
      # (plan.private_median_split), so the joint release is that z.
      clip, central_noise, count_noise = private_median_noise(
          privacy, central_noise, self.clip_bound, float(cfg.client.clip), self._count_std())
    return engine.RoundArgs(
        idx=idx, sel_mask=sel, lr=_lr_steps(cfg, plan.lr_scale),
        clip=np.float32(clip), noise=np.asarray(client_noise[idx], np.float32),
        central_noise=np.float32(central_noise), server_lr=np.float32(cfg.server.lr),
        round=np.int32(t), seed=np.uint32(cfg.seed), data_id=np.int32(0),
        stream=self.stream, count_noise=np.float32(count_noise))

  def record(self, metrics: Mapping[str, float], test: tuple[float, float] | None,
             wall: float, val: float | None = None) -> None:
    """Records the planned round's results: ``metrics`` (this run's
    :class:`engine.RoundMetrics` as floats), ``test = (loss, accuracy)`` if it
    was evaluated and ``val`` (the released validation score) if
    :attr:`wants_validation`; then the schedule observes them."""
    p, self._pending = self._pending, None
    self.acct = p.acct
    if p.evaluate:
      self.test = tuple(float(v) for v in test)
    test_loss, test_acc = self.test
    row = {
        "round": self.t + 1, "test_loss": test_loss if p.evaluate else "",
        # A regressor has no accuracy: the column stays empty, test_loss is the test MSE.
        "test_accuracy": test_acc if p.evaluate and not self.setup.model.is_regression else "",
        "train_loss": float(metrics["train_loss"]), "grad_norm": float(metrics["grad_norm"]),
        "update_norm": float(metrics["update_norm"]), "num_selected": int(metrics["num_selected"]),
        "noise_mean": float(np.mean(p.plan.noise[p.idx][p.sel > 0])) if p.sel.any() else 0.0,
        "horizon": p.plan.horizon, "epsilon_claimed": self.privacy.claimed_epsilon(self.acct),
        "epsilon_certified": p.certified, "privacy_unit": self.unit, "wall_s": round(wall, 3)}
    if self.validate_clients:
      # The schedule reads S_t from here: only the released (noisy) score, never the
      # test accuracy, on the rounds it was released.
      row["val_accuracy"] = float(val) if p.val_std >= 0 else ""
    if self.clip_rule != "fixed":
      row["clip_bound"] = float(metrics["clip_bound"])
      row["clip_count"] = float(metrics["clip_count"])
      if self.clip_rule == "private_median":
        self.clip_bound = self._next_clip(row["clip_bound"], row["clip_count"])
    self.rows.append(row)
    if not (math.isfinite(row["train_loss"]) and (not p.evaluate or math.isfinite(test_loss))):
      self.status, self.diverged_round, self.running = "diverged", self.t + 1, False
      return
    observed = {k: v for k, v in row.items() if isinstance(v, (int, float))}
    if self.validate_clients:
      observed.pop("test_accuracy", None)
    self.state = self.schedule.observe(self.state, self.t, observed)
    self.t += 1
    if self.run_dir and self.t % 25 == 0 and not self.checkpoint_due:
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
        accountant=self._worst_client_accountant(), data_source=self.setup.data_source,
        **reporting.summary_fields(privacy, self.acct, rows[-1]["epsilon_certified"]
                                   if rows else 0.0),
        **extra)
    if self.run_dir:
      if self.status != "interrupted" and params is not None:
        if self.checkpoint_every:
          self.save_checkpoint(params, wall)
        ckpt_lib.save_model(self.run_dir.path / ckpt_lib.MODEL_FILENAME, params)
      self.run_dir.write_metrics(rows, self.columns)
      # The plot's second title line gives the certified epsilon and the unit of privacy.
      over = (f"; certified exceeds the requested epsilon {privacy.target_epsilon:g}"
              if summary["epsilon_warning"] else "")
      self.run_dir.write_plot(
          rows, title=f"{cfg.name}: {cfg.model.name} on {cfg.data.name}{over}")
      self.run_dir.write_summary(summary)
    return RunResult(rows, summary, params)


def run(cfg, out_dir: str | None = None, setup: Setup | None = None, *,
        overwrite: bool = False) -> RunResult:
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
  first (:mod:`fedjax_dp.outputs`).

  Raises:
    config_lib.ConfigError: ``out_dir`` holds a run of another config (the message
      names the differing fields) and not ``overwrite``.
    outputs.OutputError: ``out_dir`` is not a run directory of the project's (a
      stranger's, a sweep's), holds files the project did not write and
      ``overwrite`` would remove, or cannot be written. Raised before any compute.
  """
  from tqdm.auto import tqdm

  config_lib.validate(cfg)  # cheap value checks before the directory is touched
  # privacy.noise_seed='os': fresh entropy, or the one this directory recorded.
  cfg = noise_identity.resolve(
      cfg, None if overwrite else noise_identity.recorded_config(out_dir))
  if out_dir and sharding.is_primary():
    ckpt_lib.claim_run_dir(out_dir, cfg.to_dict(), overwrite=overwrite)
  if out_dir and (Path(out_dir) / ckpt_lib.FILENAME).is_file():
    ckpt_lib.verified_payload(Path(out_dir) / ckpt_lib.FILENAME)  # before building anything
  if optimal_t.is_optimal_t(cfg):
    if out_dir and sharding.is_primary():
      # Recorded now (its candidates' noise follows from it), so a resume finds it.
      RunDir(out_dir).write_config(cfg.to_dict())
    grid = optimal_t.t_grid(cfg)
    bar = tqdm(total=sum(grid), disable=not cfg.progress, desc=f"{cfg.name} (optimal T)",
               unit="round")
    try:
      with interruptible():
        return _run_optimal_t(cfg, out_dir, bar=bar)
    finally:
      bar.close()
  setup = setup or build(cfg)
  bar = tqdm(total=int(cfg.rounds), disable=not cfg.progress, desc=cfg.name, unit="round")
  try:
    with interruptible():
      (result,) = run_group([cfg], [setup], [out_dir], bar=bar)
  finally:
    bar.close()
  return result


class _SigintState:
  requested = False


_SIGINT = _SigintState()


@contextlib.contextmanager
def interruptible():
  """Within this context, SIGINT (Ctrl-C) asks :func:`run_group` to stop after the
  current round instead of raising at once: it checkpoints its runs, writes their
  directories with status ``'interrupted'`` and raises ``KeyboardInterrupt``. A
  second SIGINT raises at once. Outside the main thread, or where SIGINT is ignored
  (a background job), this does nothing."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
    yield
    return

  def handler(signum, frame):
    if _SIGINT.requested:
      raise KeyboardInterrupt
    _SIGINT.requested = True

  previous = signal.signal(signal.SIGINT, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    _SIGINT.requested = False


def _run_optimal_t(cfg, out_dir: str | None, *, bar=None) -> RunResult:
  """Runs an ``optimal_t`` config's candidates as one batched sweep and keeps the best
  (:mod:`fedjax_dp.optimal_t`)."""
  cands = optimal_t.candidates(cfg)
  dirs = [optimal_t.claim_candidate(out_dir, t) for t, _ in cands]
  res = run_batched([c for _, c in cands], dirs, bar=bar)
  return optimal_t.select(cfg, [(t, r) for (t, _), r in zip(cands, res)], out_dir)


def run_batched(cfgs: Sequence[Any], out_dirs: Sequence[str | os.PathLike | None], *,
                bar=None, devices: Sequence[jax.Device] | None = None,
                cache: dict | None = None) -> list[RunResult]:
  """Runs many configs: builds each, groups those that share a compiled round
  (:func:`group_key`) and runs every group as one vmapped program
  (:func:`run_group`).

  Args:
    cfgs: the runs' configs (plain schedules; ``optimal_t`` is expanded by callers).
    out_dirs: one run directory (or None) per config.
    bar: a tqdm bar advanced by one per run-round.
    devices: devices to lay each group over (default: all).
    cache: shared :func:`build` cache (datasets, partitions).

  Returns:
    One :class:`RunResult` per config, in order.
  """
  cache = {} if cache is None else cache
  cfgs = [noise_identity.resolve(c, noise_identity.recorded_config(d))
          for c, d in zip(cfgs, out_dirs)]
  setups = [build(c, cache=cache) for c in cfgs]
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


def same_program(a: Setup, b: Setup) -> bool:
  """Whether two runs can share one compiled round (all static parts and shapes)."""
  return group_key(a) == group_key(b)


def group_key(s: Setup) -> tuple:
  """What fixes a run's compiled round: model, static round config, cohort slots,
  data and test-set shapes, evaluation batch. Everything else (seed, epsilon,
  learning rates, clip norm, schedules, T) is a traced value or host-side."""
  return (s.model, s.round_cfg, s.k_slots, s.data.x.shape, s.data.y.shape,
          s.x_test.shape, int(s.config.eval.batch_size))


@functools.lru_cache(maxsize=32)
def _jit_init(model):
  return jax.jit(model.init)


def count_std(cfg, q: float, num_clients: int) -> float:
  """sigma_b of ``server.clip_rule='private_median'``'s noisy count
  (``server.clip_count_std``; < 0: Andrew et al.'s default m / 20, m = max(q U, 1))."""
  std = float(cfg.server.get("clip_count_std", -1.0))
  return max(q * num_clients, 1.0) / 20.0 if std < 0 else std


def private_median_noise(plan: PrivacyPlan, central_noise: float, clip_bound: float,
                         base_clip: float, count_noise: float) -> tuple[float, float, float]:
  """``(clip, central_noise, count_noise)`` the engine gets for a ``private_median``
  round whose plan charged ``central_noise`` (a multiplier z against the
  sensitivity at ``base_clip``): the sum at the bound ``clip_bound`` S_t gets
  ``z_sum`` (:func:`private_median_split`) and the count ``count_noise``, so the
  joint release is z. Every caller that builds such a round's
  :class:`engine.RoundArgs` (the run loop, the audit) uses it."""
  sens = float(plan.sensitivity[0])
  z = central_noise / sens if central_noise > 0 else math.inf
  z_sum = private_median_split(z, count_noise)
  noise = 0.0 if math.isinf(z_sum) else z_sum * sens * clip_bound / base_clip
  return clip_bound, noise, count_noise


def _pad_clients(args: engine.RoundArgs, k: int) -> engine.RoundArgs:
  """Pads the client slots to ``k`` (a multiple of the mesh's 'clients' axis) with
  masked copies of the first slot."""
  extra = k - args.idx.shape[0]
  if not extra:
    return args
  return args._replace(
      idx=np.concatenate([args.idx, np.full(extra, args.idx[0], args.idx.dtype)]),
      sel_mask=np.concatenate([args.sel_mask, np.zeros(extra, np.float32)]),
      noise=np.concatenate([args.noise, np.zeros(extra, np.float32)]))


def cohort_key(cfg) -> str:
  """Runs with equal keys select the same clients from the same data every round:
  the sampler depends only on (selection, U, K, q, seed, round) and, for A-DPFL's
  rules, the partition's scores under ``server.wasserstein_metric``."""
  return json.dumps([data_key(cfg), cfg.server.selection, int(cfg.server.clients_per_round),
                     float(cfg.server.q), cfg.server.get("wasserstein_metric", "zero_one")])


def lane_layout(keys: Sequence[Any], rounds: Sequence[int] | None = None
                ) -> list[list[list[int | None]]]:
  """Arranges runs as ``[G][L]`` lanes, each a queue of runs run one after another.

  Runs with equal ``keys`` select the same clients (a cohort) and share a row, so
  their clients' data is read once per round for the whole row. A row runs its
  cohort in waves of L runs that start together (so its lanes stay at the same
  round index, which the shared cohort needs); the next wave starts when the
  row's longest run of the wave stops, in the same compiled program. Runs are
  sorted by T, longest first, so a wave holds runs of similar T and a sweep over T
  costs about the sum of its T's instead of (number of runs) x (largest T). L is
  chosen to minimise the lane-rounds computed, ``G (L + 1/2) makespan`` (the 1/2
  stands for a round's fixed cost), over one lane per run of the largest cohort
  down to one lane, and against every run in its own row.

  Args:
    keys: a cohort key per run.
    rounds: each run's planned number of rounds (default: all equal).

  Returns:
    ``layout[g][lane]``: the queue of that lane, one entry per wave of row ``g``
    (a run index, or None where the wave leaves the lane idle).
  """
  n = len(keys)
  rounds = [1] * n if rounds is None else [max(int(r), 1) for r in rounds]
  cohorts: dict[Any, list[int]] = {}
  for i, key in enumerate(keys):
    cohorts.setdefault(key, []).append(i)
  best = ([[[i]] for i in range(n)], n * 1.5 * max(rounds))  # every run its own row
  for lanes in range(max(len(v) for v in cohorts.values()), 0, -1):
    layout, makespan = [], 0
    for runs in cohorts.values():
      runs = sorted(runs, key=lambda i: -rounds[i])
      waves = [runs[w:w + lanes] for w in range(0, len(runs), lanes)]
      makespan = max(makespan, sum(rounds[w[0]] for w in waves))
      layout.append([[w[j] if j < len(w) else None for w in waves] for j in range(lanes)])
    cost = len(layout) * (lanes + 0.5) * makespan
    if cost < best[1]:
      best = (layout, cost)
  return best[0]


def run_group(cfgs: Sequence[Any], setups: Sequence[Setup],
              out_dirs: Sequence[str | None] | None = None, *, bar=None,
              devices: Sequence[jax.Device] | None = None) -> list[RunResult]:
  """Runs configs that share one compiled round as one vmapped program per round.

  Runs that select the same clients (same partition, seed and sampler) form a
  cohort that reads the clients' data once for all its runs; cohorts form the
  leading axis, laid out over ``devices`` (:mod:`fedjax_dp.sharding`). Each lane
  holds a queue of runs (:func:`lane_layout`): when its run stops, the next one
  starts in the same lane of the same compiled round, so a sweep over T costs about
  the sum of its T's, not (number of runs) x (largest T).

  Args:
    cfgs: the runs' configs.
    setups: their :func:`build` results; all must have the same :func:`group_key`.
      Runs whose client data are the same object share it; otherwise the datasets
      are stacked ``[D, U, ...]`` and each run reads its own.
    out_dirs: a run directory per run (or None entries / None: write nothing).
    bar: a tqdm bar to advance by one per run-round (its total follows the runs'
      horizons).
    devices: devices to lay the runs and clients over (default: all).

  Returns:
    One :class:`RunResult` per config, in order.
  """
  num = len(cfgs)
  if not num:
    return []
  out_dirs = list(out_dirs) if out_dirs is not None else [None] * num
  first = setups[0]
  for s in setups[1:]:
    if not same_program(first, s):
      raise ValueError("run_group: runs differ in static config or shapes; group them "
                       "with experiment.group_key")
  model, round_cfg = first.model, first.round_cfg

  # Client data: one copy per distinct dataset; runs index theirs by data_id.
  datasets: list[FederatedData] = []
  data_ids = []
  for s in setups:
    found = next((i for i, d in enumerate(datasets) if d is s.data), None)
    if found is None:
      datasets.append(s.data)
      found = len(datasets) - 1
    data_ids.append(found)
  data = datasets[0] if len(datasets) == 1 else jax.tree_util.tree_map(
      lambda *a: jnp.stack(a), *datasets)

  layout = lane_layout([(cohort_key(c), d) for c, d in zip(cfgs, data_ids)],
                       [int(c.rounds) for c in cfgs])
  num_cohorts, num_lanes = len(layout), len(layout[0])
  mesh = sharding.make_mesh(num_cohorts, devices)
  n_sweep, n_clients = mesh.shape[sharding.SWEEP], mesh.shape[sharding.CLIENTS]
  k_slots = -(-first.k_slots // n_clients) * n_clients
  if int(cfgs[0].server.client_chunk) == CLIENT_CHUNK_AUTO:
    # Resolve again for this group: each device holds num_cohorts / n_sweep cohorts'
    # lanes and k_slots / n_clients of their clients.
    # One dataset's shapes: a client costs the same in stacked [D, U, ...] data, and
    # build() already measured (and cached) these shapes.
    per_device = engine.client_chunk_for_memory(
        model, round_cfg, datasets[0], k_slots // n_clients, lanes=num_lanes,
        cohorts=1 if engine.cohorts_in_sequence() else num_cohorts // n_sweep)
    round_cfg = dataclasses.replace(round_cfg, client_chunk=per_device * n_clients)
  elif round_cfg.client_chunk and n_clients > 1:
    # Chunks hold whole rows of the 'clients' axis, so they shard with it.
    round_cfg = dataclasses.replace(
        round_cfg, client_chunk=-(-round_cfg.client_chunk // n_clients) * n_clients)
  trivial = sharding.is_trivial(mesh)
  round_fn, eval_fn = engine.make_sweep_fns(model, round_cfg, int(cfgs[0].eval.batch_size),
                                            None if trivial else mesh)
  val_fn = engine.make_validation_fn(model, round_cfg)
  if trivial:
    pts = rep = args_sharding = None
    x_test, y_test = first.x_test, first.y_test
  else:
    pts, rep = sharding.points(mesh), sharding.replicated(mesh)
    args_sharding = engine.round_args_sharding(mesh)
    data, x_test, y_test = sharding.put((data, first.x_test, first.y_test), rep)

  def stack2(rows):
    return jax.tree_util.tree_map(lambda *a: np.stack(a).reshape(
        (num_cohorts, num_lanes) + np.shape(a[0])), *[x for row in rows for x in row])

  init = _jit_init(model)
  inits: dict[int, Any] = {}
  # Loops resume from their run directories' checkpoints (if any) before params exist.
  loops = [RunLoop(c, s, d) for c, s, d in zip(cfgs, setups, out_dirs)]

  def init_of(i):
    if loops[i].restored_params is not None:
      return loops[i].restored_params
    seed = int(cfgs[i].seed)
    if seed not in inits:
      inits[seed] = jax.device_get(init(jax.random.PRNGKey(seed)))
    return inits[seed]

  # Each row runs its waves one after another; ``current[g][lane]`` is the run the
  # lane holds in the row's current wave (None: idle in this wave).
  queues = [[list(q) for q in row] for row in layout]
  current = [[q.pop(0) for q in row] for row in queues]
  params = sharding.put(stack2([[init_of(i if i is not None else next(
      j for j in row if j is not None)) for i in row] for row in current]), pts)

  horizons = [loop.horizon for loop in loops]
  if bar is not None:
    bar.update(sum(loop.t for loop in loops))  # rounds restored from checkpoints
  started = {i: time.time() - loops[i].wall_offset for row in current for i in row
             if i is not None}
  finished: dict[int, RunResult] = {}
  template = None

  def lane_params(g, lane):
    host = params if jax.process_count() == 1 else sharding.to_host(params)
    return jax.device_get(jax.tree_util.tree_map(lambda a: a[g, lane], host))

  while True:
    if _SIGINT.requested:
      # Between rounds every loop has recorded its last round and ``params`` match
      # them: checkpoint the runs in the lanes, mark them interrupted, stop.
      for g, row in enumerate(current):
        for lane, i in enumerate(row):
          if i is not None and i not in finished:
            finished[i] = loops[i].interrupt(time.time() - started[i], lane_params(g, lane),
                                             group_size=num)
      raise KeyboardInterrupt
    planned: dict[tuple[int, int], tuple[int, engine.RoundArgs]] = {}
    for g, row in enumerate(current):
      while True:
        for lane in range(num_lanes):
          i = row[lane]
          if i is None:
            continue
          a = loops[i].plan_round()
          if a is not None:
            planned[g, lane] = (i, _pad_clients(a._replace(data_id=np.int32(data_ids[i])),
                                                k_slots))
            continue
          # Run i is over: keep its model; its lane idles until the wave ends.
          finished[i] = loops[i].finish(time.time() - started[i], lane_params(g, lane),
                                       group_size=num)
          row[lane] = None
        if any(lane_run is not None for lane_run in row) or not queues[g][0]:
          break
        # The wave is over: the row starts its next wave (fresh models).
        row[:] = [q.pop(0) for q in queues[g]]
        for lane, i in enumerate(row):
          if i is not None:
            started[i] = time.time() - loops[i].wall_offset
            params = jax.tree_util.tree_map(lambda p, v, g=g, lane=lane: p.at[g, lane].set(v),
                                            params, init_of(i))
        params = params if trivial else sharding.put(params, pts)
    if bar is not None and [loop.horizon for loop in loops] != horizons:
      bar.total += sum(loop.horizon for loop in loops) - sum(horizons)
      horizons = [loop.horizon for loop in loops]
      bar.refresh()
    if not planned:
      break
    if template is None:
      # Idle lanes compute on zeros (client 0, no weight) and are frozen.
      template = jax.tree_util.tree_map(np.zeros_like, next(iter(planned.values()))[1])
    # The round reads a row's clients, seed and round index from ONE lane (a cohort
    # shares them). Waves keep a row's active lanes at the same round index; as a
    # guard, lanes that ever differ in (round, seed, data) run in separate calls
    # ("phases"), each with only its lanes active (the others stay frozen).
    phases = []
    for g in range(num_cohorts):
      by_key: dict[tuple, list[int]] = {}
      for lane in range(num_lanes):
        if (g, lane) in planned:
          a = planned[g, lane][1]
          by_key.setdefault((int(a.round), int(a.seed), int(a.data_id)), []).append(lane)
      phases.append(list(by_key.values()))
    metrics = {}
    for c in range(max(len(p) for p in phases)):
      rows, active = [], np.zeros((num_cohorts, num_lanes), bool)
      ons = [phases[g][c] if c < len(phases[g]) else [] for g in range(num_cohorts)]
      for g, on in enumerate(ons):
        active[g, on] = True
        # A cohort's lanes share its clients: idle lanes copy an active lane's inputs.
        ref = planned[g, on[0]][1] if on else template
        rows.append([planned[g, lane][1] if lane in on else ref for lane in range(num_lanes)])
      params, m = round_fn(params, data, sharding.put(stack2(rows), args_sharding),
                           sharding.put(active, pts))
      m = jax.device_get(m)._asdict()
      for g, on in enumerate(ons):
        for lane in on:
          metrics[g, lane] = {k: v[g, lane] for k, v in m.items()}
    val = None
    if any(loops[i].wants_validation for i, _ in planned.values()):
      # Every lane's own cohort (idle lanes: the template, std 0, result unused).
      rows = [[planned[g, lane][1] if (g, lane) in planned else template
               for lane in range(num_lanes)] for g in range(num_cohorts)]
      stds = np.array([[max(loops[planned[g, lane][0]].val_std, 0.0)
                        if (g, lane) in planned else 0.0 for lane in range(num_lanes)]
                       for g in range(num_cohorts)], np.float32)
      val = np.asarray(jax.device_get(val_fn(params, data, stack2(rows), stds)[0]))
    test = None
    if any(loops[i].wants_eval for i, _ in planned.values()):
      test = np.stack(jax.device_get(eval_fn(params, x_test, y_test)), axis=-1)  # [G, L, 2]
    now = time.time()
    for (g, lane), (i, _) in planned.items():
      loop = loops[i]
      loop.record(metrics[g, lane],
                  None if test is None else test[g, lane], now - started[i],
                  None if val is None else float(val[g, lane]))
      if loop.checkpoint_due:
        loop.save_checkpoint(lane_params(g, lane), now - started[i])
      if loop.status == "diverged" and bar is not None:
        bar.write(f"[{loop.cfg.name}] loss became non-finite at round "
                  f"{loop.diverged_round}: stopping (diverged)")
    if bar is not None:
      bar.update(len(planned))
      if num == 1:
        bar.set_postfix(acc=f"{loops[0].test[1]:.3f}",
                        eps=f"{loops[0].rows[-1]['epsilon_certified']:.2f}")
      else:
        bar.set_postfix(running=len(planned))
  return [finished[i] for i in range(num)]
