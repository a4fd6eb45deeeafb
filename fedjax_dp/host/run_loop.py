"""The host side of one run: plan a round, record its results, save, finish.

:class:`RunLoop` holds everything of a run that lives on the host (numpy): the
schedule's state, client selection, the accountant, the stop rules, the metric rows,
checkpoints and the run directory. The device round is the caller's
(:func:`fedjax_dp.host.groups.run_group`, which batches many loops into one program)::

  per round:  args = loop.plan_round()                  (host, numpy)
              params, metrics = round_fn(params, data, args)   (device)
              loop.record(metrics, test, wall)          (host: accountant, schedule.observe)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp import sharding
from fedjax_dp.config import noise_identity, schema
from fedjax_dp.files.results import METRIC_COLUMNS, RunDir, RunResult
from fedjax_dp.host import checkpoint as ckpt_lib
from fedjax_dp.host import schedule_fit
from fedjax_dp.host.building import Setup
from fedjax_dp.privacy import reporting
from fedjax_dp.privacy.formulas import registry as formulas
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.plan import PrivacyPlan, private_median_split, validation_sensitivity
from fedjax_dp.privacy.schedules import NoiseContext, get_schedule
from fedjax_dp.training import rounds
from fedjax_dp.training.rounds import RoundArgs


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
  returned :class:`RoundArgs` (alone, or stacked with other runs' in a sweep),
  then calls :meth:`record` with this run's metrics. :meth:`finish` writes the run
  directory and returns the :class:`RunResult`.

  A run stops at the schedule's horizon, on a non-finite loss (``diverged``), or --
  with ``privacy.enforce_budget``, or a formula that promises the target
  (``privacy.formula='calibrated'``, :attr:`Formula.meets_target`) -- before a round
  whose release would push the certified epsilon past the target
  (``budget_exhausted``). Under such a formula an open-loop schedule's noise is first
  fitted to the certified accountant (:func:`fedjax_dp.host.schedule_fit.fit`), so its
  planned rounds fit. Why the run stopped is :attr:`stop_reason` (a code) and
  :attr:`stop_detail` (a sentence), both in ``summary.json``.

  With a run directory and ``checkpoint.every = N > 0``, the caller saves a
  checkpoint (:mod:`fedjax_dp.host.checkpoint`) whenever :attr:`checkpoint_due` (every N
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
    # The schedule and the accountant, the config's noise stream and stored form,
    # then the run directory (none depends on another).
    ctx = noise_context(cfg, setup.privacy)
    self.schedule = get_schedule(cfg.schedule.name)
    self.acct = self.privacy.accountant_init()
    self.unit = reporting.privacy_unit(self.privacy)  # metrics.csv's privacy_unit column
    stored = schema.stamped(cfg.to_dict())  # config.json, written once restored
    # The noise stream: a hash of the release's config and of its data's content
    # (fedjax_dp.config.noise_identity).
    self.stream = noise_identity.stream(cfg, setup.data_fingerprint)
    # In a multi-host job every process runs this loop; one writes.
    self.run_dir = RunDir(out_dir) if out_dir and sharding.is_primary() else None
    # Every process reads the checkpoint and takes part in gathering the params to
    # save (a collective across hosts); only process 0 writes.
    self.out_dir = out_dir
    self.checkpoint_every = int(cfg.checkpoint.every) if "checkpoint" in cfg else 0
    self.rows: list[dict[str, Any]] = []
    self.status, self.diverged_round = "completed", None
    self.stop_reason, self.stop_detail = None, None
    self.running = True
    self.t = 0
    self.horizon = int(cfg.rounds)
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
    # A formula that promises the target: fit an open-loop schedule's planned noise to
    # the certified accountant (schedule_fit), and stop before any overspend (plan_round).
    self.meets_target = (formulas.get_formula(self.privacy.formula).meets_target
                         and not self.privacy.noiseless)
    self.noise_fit = 1.0
    if self.meets_target and self.schedule.open_loop(ctx.params):
      self.state, self.noise_fit = schedule_fit.fit(self.schedule, ctx, self.privacy,
                                                    self.cohort, self._max_rounds,
                                                    self._validates)
    else:
      self.state = self.schedule.init(ctx)
    ckpt = Path(out_dir) / ckpt_lib.FILENAME if out_dir else None
    if ckpt is not None and ckpt.exists():
      self._restore(ckpt)
    if self.run_dir:
      self.run_dir.write_config(stored)

  def _restore(self, path) -> None:
    round_cfg = self.setup.round_cfg
    template = jax.eval_shape(lambda k: rounds.carried_params(round_cfg, self.setup.model.init(k)),
                              jax.random.PRNGKey(0))
    st, params, config = ckpt_lib.load(path, schedule_template=self.state,
                                       acct_template=self.acct, params_template=template)
    diff = ckpt_lib.config_diff(config, self.cfg.to_dict())
    had = ckpt_lib.recorded_fingerprint(path)
    if had is not None and had != self.setup.data_fingerprint:
      diff = [f"the data's content (fingerprint {had} -> {self.setup.data_fingerprint}): "
              "the files read changed since"] + diff
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

  def _validates(self, t: int) -> bool:
    """Whether round ``t`` releases the validation score (``schedule.validation``)."""
    return self.validate_clients and (t + 1) % self.adjust_every == 0

  def _stop(self, reason: str, detail: str) -> None:
    self.stop_reason, self.stop_detail = reason, detail

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
    ckpt_lib.save(self.run_dir.path / ckpt_lib.FILENAME, state, params, self.cfg.to_dict(),
                  self.setup.data_fingerprint)
    # metrics.csv follows the checkpoint (a partial file, still written atomically).
    self.run_dir.write_metrics(self.rows, self.columns)

  def interrupt(self, wall: float, params: Any, **extra: Any) -> RunResult:
    """Stops between rounds (SIGINT): saves a checkpoint to resume from, then writes
    the run directory with ``status = 'interrupted'``."""
    self._pending = None
    if self.checkpoint_every:
      self.save_checkpoint(params, wall)
    self.status, self.running = "interrupted", False
    self._stop("interrupted", f"interrupted after {self.t} rounds")
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

  def cohort(self, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Round ``t``'s selection ``(idx [K], mask [K])``; it depends only on (seed, t),
    so the round after the planned one is known ahead (streamed data prefetches it)."""
    cfg = self.cfg
    return selection_lib.select_clients(cfg.server.selection, self.setup.num_clients,
                                        cfg.server.clients_per_round, cfg.server.q, cfg.seed,
                                        t, weights=self.setup.selection_weights)

  def plan_round(self) -> RoundArgs | None:
    """Plans round ``t``: its device inputs (numpy), or None when the run stops."""
    if not self.running:
      return None
    cfg, privacy, t = self.cfg, self.privacy, self.t
    # The cohort depends only on (seed, t): drawn first, it is unused if the run stops.
    idx, sel = self.cohort(t)
    plan = self.schedule.plan(self.state, t) if t < self._max_rounds else None
    if plan is None or plan.stop:
      self.running = False
      if t >= int(cfg.rounds):
        self._stop("rounds", f"ran its {t} configured rounds")
      else:
        self._stop("schedule_horizon",
                   f"schedule.name={cfg.schedule.name!r} stopped after {t} of rounds="
                   f"{int(cfg.rounds)} (the schedule's own horizon: its budget rule)")
      return None
    self.horizon = plan.horizon
    client_noise, central_noise = privacy.device_noise(plan.noise, plan.central_noise)
    # Deterministic rules (round robin) are charged for the clients that take part.
    validate = self._validates(t)
    new_acct = privacy.accountant_step(self.acct, client_noise, central_noise,
                                       selected=idx[sel > 0], validate=validate)
    val_std = -1.0
    if validate:
      counts = self._counts[idx[sel > 0]]
      val_std = 0.0 if privacy.noiseless else (
          privacy.val_noise_multiplier * validation_sensitivity(counts))
    certified = privacy.certified_epsilon(new_acct)
    # Each client against its own target (privacy.client_epsilons).
    if self.meets_target and t == 0 and privacy.over_budget(new_acct):
      # Not one round fits: refuse rather than run nothing (before any training).
      raise config_lib.ConfigError(
          f"privacy.formula={privacy.formula!r}: round 1 alone certifies epsilon "
          f"{certified:.3f} > privacy.epsilon={privacy.target_epsilon:g} (the releases "
          f"the formula does not size, e.g. schedule.validation={privacy.validation!r} "
          f"at privacy.val_noise_multiplier={privacy.val_noise_multiplier:g}, take it "
          "all): raise privacy.epsilon or the validation noise")
    if (cfg.privacy.enforce_budget or self.meets_target) and privacy.over_budget(new_acct):
      self.status, self.running = "budget_exhausted", False
      why = ("privacy.enforce_budget" if cfg.privacy.enforce_budget else
             f"privacy.formula={privacy.formula!r} never certifies more than it asks")
      self._stop("budget_exhausted",
                 f"stopped after {t} of rounds={int(cfg.rounds)}: round {t + 1} would "
                 f"certify epsilon {certified:.3f} > privacy.epsilon="
                 f"{privacy.target_epsilon:g} ({why})")
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
    return RoundArgs(
        idx=idx, sel_mask=sel, lr=_lr_steps(cfg, plan.lr_scale),
        clip=np.float32(clip), noise=np.asarray(client_noise[idx], np.float32),
        central_noise=np.float32(central_noise), server_lr=np.float32(cfg.server.lr),
        round=np.int32(t), seed=np.uint32(cfg.seed), data_id=np.int32(0),
        stream=self.stream, count_noise=np.float32(count_noise))

  def record(self, metrics: Mapping[str, float], test: tuple[float, float] | None,
             wall: float, val: float | None = None) -> None:
    """Records the planned round's results: ``metrics`` (this run's
    :class:`fedjax_dp.training.rounds.RoundMetrics` as floats), ``test = (loss, accuracy)`` if it
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
      self._stop("diverged", f"non-finite loss in round {self.t + 1}")
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
    # The checkpoint keeps a correlated mechanism's noise state (a resume needs it); the
    # model file and the result hold the model only (the state is the server's secret).
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
        stop_reason=self.stop_reason, stop_detail=self.stop_detail,
        noise_fit=self.noise_fit,
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
  :class:`RoundArgs` (the run loop, the audit) uses it."""
  sens = float(plan.sensitivity[0])
  z = central_noise / sens if central_noise > 0 else math.inf
  z_sum = private_median_split(z, count_noise)
  noise = 0.0 if math.isinf(z_sum) else z_sum * sens * clip_bound / base_clip
  return clip_bound, noise, count_noise
