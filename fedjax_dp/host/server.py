"""The server's round-to-round decisions, as pure functions of its host state.

In the style of the accountants and the schedules: a run's static description
(:class:`ServerSpec`, built once by :func:`spec`) and its host state
(:class:`ServerState`, a NamedTuple of Python and NumPy values), with::

  state = init(spec)                                   # a fresh run
  state = restored(spec, saved, rows)                  # a checkpoint's run
  state, args = plan_round(spec, state)                # round t's RoundArgs, or None: stop
  state, row = record(spec, state, metrics, test, wall, val)   # its results observed

:func:`plan_round` draws the cohort, asks the schedule for the round's noise (and
horizon, and whether to stop), charges the accountant for the round's release (and
the validation score's), stops before a round that would pass the budget
(``privacy.enforce_budget``, or a formula that promises the target:
:attr:`fedjax_dp.privacy.formulas.registry.Formula.meets_target`, whose open-loop
schedule :func:`spec` first fits to the certified accountant,
:mod:`fedjax_dp.host.schedule_fit`), and sets the private-median clip bound's split;
:func:`record` turns the device's metrics into the round's metric row, stops a run
whose loss is not finite, lets the schedule observe the row, and moves the adaptive
clip bound. Nothing here reads a file or a device array:
:class:`fedjax_dp.host.run_loop.RunLoop` keeps the I/O (run directory, checkpoints,
progress) around these functions. The device half of the server's state (the model,
a correlated mechanism's noise state, the server optimizer's state) is the round's
:class:`fedjax_dp.training.rounds.CarriedParams`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.config import ConfigError
from fedjax_dp.host import schedule_fit
from fedjax_dp.privacy import reporting
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.formulas import registry as formulas
from fedjax_dp.privacy.plan import PrivacyPlan, private_median_split, validation_sensitivity
from fedjax_dp.privacy.schedules import SCHEDULES, NoiseContext, Schedule, get_schedule
from fedjax_dp.training.rounds import RoundArgs


class Planned(NamedTuple):
  """What :func:`plan_round` decided for the round it planned, for :func:`record`.

  Attributes:
    plan: the schedule's :class:`fedjax_dp.privacy.schedules.RoundPlan`.
    acct: the accountant's state after the round's release.
    certified: the certified epsilon after it.
    idx, sel: the cohort, ``[K]`` ids and mask.
    evaluate: whether the round ends with a test-set evaluation.
    val_std: std of the validation release; < 0: no release this round.
  """

  plan: Any
  acct: Any
  certified: float
  idx: np.ndarray
  sel: np.ndarray
  evaluate: bool
  val_std: float = -1.0


class ServerState(NamedTuple):
  """The host state of one run between rounds.

  Attributes:
    t: rounds recorded (the next round's index).
    horizon: the schedule's planned number of rounds.
    status: ``'completed'`` (also while running), ``'diverged'``,
      ``'budget_exhausted'`` or ``'interrupted'``.
    running: whether the run plans further rounds.
    diverged_round: the round whose loss was not finite, or None.
    test: the last evaluated ``(test_loss, test_accuracy)``.
    schedule: the schedule's state.
    acct: the accountant's state after the last recorded round.
    clip_bound: the update clip bound S_t of the next round
      (``server.clip_rule='private_median'``; ``client.clip`` otherwise).
    planned: the planned round awaiting :func:`record`, or None.
    stop_reason: why the run stopped (``'rounds'``, ``'schedule_horizon'``,
      ``'budget_exhausted'``, ``'diverged'``, ``'interrupted'``), None while it runs.
    stop_detail: the same in one sentence (the CLI prints it; ``summary.json``).
  """

  t: int
  horizon: int
  status: str
  running: bool
  diverged_round: int | None
  test: tuple[float, float]
  schedule: Any
  acct: Any
  clip_bound: float
  planned: Planned | None = None
  stop_reason: str | None = None
  stop_detail: str | None = None

  def stopped(self, reason: str, detail: str, **changes: Any) -> ServerState:
    """The state stopped for ``reason`` (:attr:`stop_reason`), with ``changes``."""
    return self._replace(running=False, stop_reason=reason, stop_detail=detail, **changes)


class ServerSpec(NamedTuple):
  """What the decisions read of a run, fixed for its whole length (:func:`spec`).

  Attributes:
    privacy: the run's privacy plan (accountant, noise on the device, budget).
    schedule: the noise schedule's pure functions.
    context: the :class:`NoiseContext` the schedule starts from (:func:`init`).
    rounds: the configured T (a schedule may only shorten it).
    max_rounds: a guard against a schedule that never stops (``4 T + 10``).
    seed: the run seed (the cohort of round t is drawn from ``(seed, t)``).
    stream: ``uint32 [2]`` the run's noise stream (:attr:`RoundArgs.stream`), from
      the noise identity of its config and data
      (:func:`fedjax_dp.config.noise_identity.stream`; the run loop sets it).
    num_clients: U.
    selection, clients_per_round, q, selection_weights: the selection rule and its
      parameters (:func:`fedjax_dp.privacy.selection.select_clients`).
    lr, lr_decay, local_steps: the local steps' rates ``lr * scale * lr_decay**s``
      (``lr`` 1 for a client optimizer that carries its own rate).
    server_lr: the server's step size (1 for a server optimizer with its own rate).
    clip: C, the configured clip bound.
    clip_rule, clip_quantile, clip_lr, count_std: the server's clip rule (Andrew et
      al. 2021's gamma, eta_C and sigma_b for ``private_median``).
    eval_every: rounds between test-set evaluations.
    enforce_budget: stop before a round that passes a client's target.
    validate_every: rounds between validation releases (0: none; A-DPFL's
      ``schedule.validation='clients'``).
    counts: ``[U]`` the clients' example counts (validation's sensitivity), or None.
    regression: the model is a regressor (no accuracy column).
    meets_target: the formula promises the run certifies at most the target
      (:attr:`Formula.meets_target`, a noisy plan): stop before a round that passes it.
    noise_fit: the factor :func:`fedjax_dp.host.schedule_fit.fitted_context` raised an
      open-loop schedule's noise by so its planned rounds meet the target (1: none).
    schedule_name: ``schedule.name`` (for the stop's sentence).
  """

  privacy: PrivacyPlan
  schedule: Schedule
  context: NoiseContext
  rounds: int
  max_rounds: int
  seed: int
  stream: np.ndarray | None
  num_clients: int
  selection: str
  clients_per_round: int
  q: float
  selection_weights: np.ndarray | None
  lr: float
  lr_decay: float
  local_steps: int
  server_lr: float
  clip: float
  clip_rule: str = "fixed"
  clip_quantile: float = 0.5
  clip_lr: float = 0.2
  count_std: float = 0.0
  eval_every: int = 1
  enforce_budget: bool = False
  validate_every: int = 0
  counts: np.ndarray | None = None
  regression: bool = False
  meets_target: bool = False
  noise_fit: float = 1.0
  schedule_name: str = ""


def noise_context(cfg, privacy: PrivacyPlan) -> NoiseContext:
  """The :class:`NoiseContext` a run's schedule is initialised with."""
  return NoiseContext(privacy.epsilon, privacy.delta, privacy.q, privacy.sensitivity,
                      int(cfg.rounds), privacy.noise_scale, float(cfg.client.lr),
                      params=dict(cfg.schedule))


def count_std(cfg, q: float, num_clients: int) -> float:
  """sigma_b of ``server.clip_rule='private_median'``'s noisy count
  (``server.clip_count_std``; < 0: Andrew et al.'s default m / 20, m = max(q U, 1))."""
  std = float(cfg.server.get("clip_count_std", -1.0))
  return max(q * num_clients, 1.0) / 20.0 if std < 0 else std


def spec(cfg, setup, stream: np.ndarray | None = None) -> ServerSpec:
  """The :class:`ServerSpec` of a run config and its
  :class:`fedjax_dp.host.building.Setup` (whose privacy plan, federation and round
  config it reads), with the noise ``stream`` (None: the caller sets it,
  ``spec._replace(stream=...)``; :class:`fedjax_dp.host.run_loop.RunLoop` does)."""
  privacy, u, round_cfg = setup.privacy, int(setup.num_clients), setup.round_cfg
  validate = privacy.validation == "clients"
  s = ServerSpec(
      # (the registry's own entry; an unknown name is refused, naming the field)
      privacy=privacy, schedule=SCHEDULES.get(cfg.schedule.name) or get_schedule(
          cfg.schedule.name),
      context=noise_context(cfg, privacy), rounds=int(cfg.rounds),
      max_rounds=int(cfg.rounds) * 4 + 10, seed=int(cfg.seed), stream=stream,
      num_clients=u, selection=cfg.server.selection,
      clients_per_round=int(cfg.server.clients_per_round), q=float(cfg.server.q),
      selection_weights=setup.selection_weights,
      lr=1.0 if round_cfg.client.optimizer.own_lr else float(cfg.client.lr),
      lr_decay=float(cfg.client.lr_decay), local_steps=int(cfg.client.local_steps),
      server_lr=1.0 if round_cfg.server_optimizer.own_lr else float(cfg.server.lr),
      clip=float(cfg.client.clip), clip_rule=cfg.server.get("clip_rule", "fixed"),
      clip_quantile=float(cfg.server.get("clip_quantile", 0.5)),
      clip_lr=float(cfg.server.get("clip_lr", 0.2)), count_std=count_std(cfg, privacy.q, u),
      eval_every=int(cfg.eval.every), enforce_budget=bool(cfg.privacy.enforce_budget),
      validate_every=int(float(cfg.schedule.get("adjust_every", 1))) if validate else 0,
      counts=np.asarray(setup.data.counts) if validate else None,
      regression=bool(setup.model.is_regression), schedule_name=str(cfg.schedule.name),
      meets_target=formulas.get_formula(privacy.formula).meets_target
      and not privacy.noiseless)
  if s.meets_target and s.schedule.open_loop(s.context.params):
    # Play the planned rounds through the certified accountant with the run's own
    # cohorts; raise the noise by the smallest factor that fits (1: ctx unchanged).
    context, fit = schedule_fit.fitted_context(
        s.schedule, s.context, privacy, lambda t: cohort(s, t), s.max_rounds,
        lambda t: _validates(s, t))
    s = s._replace(context=context, noise_fit=fit)
  return s


def _validates(spec: ServerSpec, t: int) -> bool:
  """Whether round ``t`` releases the validation score (A-DPFL, every
  :attr:`ServerSpec.validate_every` rounds)."""
  return bool(spec.validate_every) and (t + 1) % spec.validate_every == 0


def init(spec: ServerSpec) -> ServerState:
  """The state of a fresh run: round 0, the schedule's and the accountant's initial
  states, the configured clip bound."""
  return ServerState(t=0, horizon=spec.rounds, status="completed", running=True,
                     diverged_round=None, test=(math.nan, math.nan),
                     schedule=spec.schedule.init(spec.context),
                     acct=spec.privacy.accountant_init(), clip_bound=spec.clip)


def restored(spec: ServerSpec, saved, rows) -> ServerState:
  """The state of a run resumed from a checkpoint's ``saved``
  (:class:`fedjax_dp.host.checkpoint.RunState`) and metric ``rows``: the private
  median's S_t follows from the last row."""
  clip = spec.clip
  if spec.clip_rule == "private_median" and rows:
    clip = next_clip(spec, float(rows[-1]["clip_bound"]), float(rows[-1]["clip_count"]))
  return ServerState(t=saved.t, horizon=saved.horizon, status=saved.status,
                     running=saved.running, diverged_round=saved.diverged_round,
                     test=saved.test, schedule=saved.schedule_state, acct=saved.acct,
                     clip_bound=clip)


def next_clip(spec: ServerSpec, bound: float, count: float) -> float:
  """Andrew et al. (2021) geometric update toward the ``gamma`` quantile of the
  update norms: ``S_{t+1} = S_t exp(-eta_C (b_t - gamma))`` with ``b_t`` the noisy
  count of unclipped updates divided by the expected cohort size ``m = max(q U, 1)``."""
  expected = max(spec.privacy.q * spec.num_clients, 1.0)
  return bound * math.exp(-spec.clip_lr * (count / expected - spec.clip_quantile))


def cohort(spec: ServerSpec, t: int) -> tuple[np.ndarray, np.ndarray]:
  """Round ``t``'s selection ``(idx [K], mask [K])``; it depends only on (seed, t),
  so the round after the planned one is known ahead (streamed data prefetches it)."""
  return selection_lib.select_clients(spec.selection, spec.num_clients,
                                      spec.clients_per_round, spec.q, spec.seed, t,
                                      weights=spec.selection_weights)


def local_lrs(spec: ServerSpec, scale: float) -> np.ndarray:
  """``[E]`` float32 local step sizes ``lr * scale * lr_decay**s``."""
  steps = np.arange(spec.local_steps)
  return (spec.lr * scale * spec.lr_decay ** steps).astype(np.float32)


def plan_round(spec: ServerSpec, state: ServerState) -> tuple[ServerState, RoundArgs | None]:
  """Plans round ``state.t``: the state with it planned and its device inputs (numpy),
  or the state stopped and None (the schedule's horizon or stop, the budget)."""
  if not state.running:
    return state, None
  privacy, t = spec.privacy, state.t
  # The cohort depends only on (seed, t): drawn first, it is unused if the run stops.
  idx, sel = cohort(spec, t)
  plan = spec.schedule.plan(state.schedule, t) if t < spec.max_rounds else None
  if plan is None or plan.stop:
    if t >= spec.rounds:
      return state.stopped("rounds", f"ran its {t} configured rounds"), None
    return state.stopped(
        "schedule_horizon", f"schedule.name={spec.schedule_name!r} stopped after {t} of "
        f"rounds={spec.rounds} (the schedule's own horizon: its budget rule)"), None
  state = state._replace(horizon=plan.horizon)
  client_noise, central_noise = privacy.device_noise(plan.noise, plan.central_noise)
  # The validation score (A-DPFL) is released after every adjustment round.
  validate = _validates(spec, t)
  val_std = -1.0
  if validate:
    val_std = 0.0 if privacy.noiseless else (
        privacy.val_noise_multiplier * validation_sensitivity(spec.counts[idx[sel > 0]]))
  # Deterministic rules (round robin) are charged for the clients that take part.
  acct = privacy.accountant_step(state.acct, client_noise, central_noise,
                                 selected=idx[sel > 0], validate=validate)
  certified = privacy.certified_epsilon(acct)
  # Each client against its own target (privacy.client_epsilons).
  if spec.meets_target and t == 0 and privacy.over_budget(acct):
    # Not one round fits: refuse rather than run nothing (before any training).
    raise ConfigError(
        f"privacy.formula={privacy.formula!r}: round 1 alone certifies epsilon "
        f"{certified:.3f} > privacy.epsilon={privacy.target_epsilon:g} (the releases the "
        f"formula does not size, e.g. schedule.validation={privacy.validation!r} at "
        f"privacy.val_noise_multiplier={privacy.val_noise_multiplier:g}, take it all): "
        "raise privacy.epsilon or the validation noise")
  if (spec.enforce_budget or spec.meets_target) and privacy.over_budget(acct):
    why = ("privacy.enforce_budget" if spec.enforce_budget else
           f"privacy.formula={privacy.formula!r} never certifies more than it asks")
    return state.stopped(
        "budget_exhausted", f"stopped after {t} of rounds={spec.rounds}: round {t + 1} "
        f"would certify epsilon {certified:.3f} > privacy.epsilon="
        f"{privacy.target_epsilon:g} ({why})", status="budget_exhausted"), None
  evaluate = (t + 1) % spec.eval_every == 0 or t + 1 >= plan.horizon
  clip, count_noise = spec.clip, 0.0
  if spec.clip_rule == "private_median":
    # The accountant charged multiplier z = central_noise / Delta(C); the device
    # splits it between the sum (z_sum, at the bound S_t) and the count
    # (plan.private_median_split), so the joint release is that z.
    clip, central_noise, count_noise = private_median_noise(
        privacy, central_noise, state.clip_bound, spec.clip, spec.count_std)
  args = RoundArgs(
      idx=idx, sel_mask=sel, lr=local_lrs(spec, plan.lr_scale),
      clip=np.float32(clip), noise=np.asarray(client_noise[idx], np.float32),
      central_noise=np.float32(central_noise), server_lr=np.float32(spec.server_lr),
      round=np.int32(t), seed=np.uint32(spec.seed), data_id=np.int32(0),
      stream=spec.stream, count_noise=np.float32(count_noise))
  planned = Planned(plan, acct, certified, idx, sel, evaluate, val_std)
  return state._replace(planned=planned), args


def _row(spec: ServerSpec, state: ServerState, p: Planned, metrics: Mapping[str, float],
         wall: float, val: float | None) -> dict[str, Any]:
  """The planned round's metric row (``state.test``: the last evaluation)."""
  test_loss, test_acc = state.test
  row = {
      "round": state.t + 1, "test_loss": test_loss if p.evaluate else "",
      # A regressor has no accuracy: the column stays empty, test_loss is the test MSE.
      "test_accuracy": test_acc if p.evaluate and not spec.regression else "",
      "train_loss": float(metrics["train_loss"]), "grad_norm": float(metrics["grad_norm"]),
      "update_norm": float(metrics["update_norm"]), "num_selected": int(metrics["num_selected"]),
      "noise_mean": float(np.mean(p.plan.noise[p.idx][p.sel > 0])) if p.sel.any() else 0.0,
      "horizon": p.plan.horizon, "epsilon_claimed": spec.privacy.claimed_epsilon(p.acct),
      "epsilon_certified": p.certified, "privacy_unit": reporting.privacy_unit(spec.privacy),
      "wall_s": round(wall, 3)}
  if spec.validate_every:
    # The schedule reads S_t from here: only the released (noisy) score, never the
    # test accuracy, on the rounds it was released.
    row["val_accuracy"] = float(val) if p.val_std >= 0 else ""
  if spec.clip_rule != "fixed":
    row["clip_bound"] = float(metrics["clip_bound"])
    row["clip_count"] = float(metrics["clip_count"])
  return row


def record(spec: ServerSpec, state: ServerState, metrics: Mapping[str, float],
           test: tuple[float, float] | None, wall: float, val: float | None = None
           ) -> tuple[ServerState, dict[str, Any]]:
  """Records the planned round: ``metrics`` (the round's
  :class:`fedjax_dp.training.rounds.RoundMetrics` as floats), ``test = (loss,
  accuracy)`` if it was evaluated, ``val`` (the released validation score) if it
  released one. Returns the state after it (the schedule has observed the row; a
  non-finite loss stops the run as ``diverged``) and the round's metric row."""
  p = state.planned
  state = state._replace(planned=None, acct=p.acct)
  if p.evaluate:
    state = state._replace(test=tuple(float(v) for v in test))
  row = _row(spec, state, p, metrics, wall, val)
  if spec.clip_rule == "private_median":
    state = state._replace(clip_bound=next_clip(spec, row["clip_bound"], row["clip_count"]))
  if not (math.isfinite(row["train_loss"])
          and (not p.evaluate or math.isfinite(state.test[0]))):
    return state.stopped("diverged", f"non-finite loss in round {state.t + 1}",
                         status="diverged", diverged_round=state.t + 1), row
  observed = {k: v for k, v in row.items() if isinstance(v, (int, float))}
  if spec.validate_every:
    observed.pop("test_accuracy", None)
  schedule = spec.schedule.observe(state.schedule, state.t, observed)
  return state._replace(schedule=schedule, t=state.t + 1), row


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
