"""The whole-run audit's host side: each trial's rounds as its own run plans them.

Every trial (lane) of :func:`fedjax_dp.audit.audit_run` is a run of the audited config
with its own seed. Its host decisions -- noise, clip bound, count noise, learning
rates, cohorts, the validation release, when to stop -- come from the run's own pure
host functions (:mod:`fedjax_dp.host.server`: ``plan_round`` / ``record``), so the
audited mechanism is the one the run certifies:

* :class:`SharedPlan`: an open-loop schedule with a fixed clip plans the same noise
  for every trial (it reads no metric): the run's host loop is played once (every
  metric zero) and each lane gets those rounds with its own cohorts, drawn by the
  config's rule from the lane's seed as a run with that seed draws them.
* :class:`LanePlans`: a closed loop -- the private median's clip bound (it follows
  the round's released noisy count), a schedule that reads the clients' released
  validation score (A-DPFL) -- plans each lane from its own releases: one
  :class:`fedjax_dp.host.server.ServerState` per lane, recording the lane's own device
  metrics and released score after each round. A lane whose run stops (its budget)
  idles: no client is selected and no noise is added, and its later rounds are not
  scored.

Both hand out ``[L]`` :class:`fedjax_dp.training.engine.RoundArgs` per round with each
lane's coin in ``data_id``, the variant applied (:func:`broken`), and the planned
(correct) noise beside them, which the attack's weights read.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from fedjax_dp.audit.audit import NO_CLIP  # the per-round audit's threshold
from fedjax_dp.config import noise_identity
from fedjax_dp.host import server
from fedjax_dp.privacy.schedules import get_schedule
from fedjax_dp.training import engine


def late_start(rounds: int) -> int:
  """The first (0-based) round ``late_noise_div10`` weakens: ``floor(T / 2)``."""
  return max(1, int(rounds) // 2)


def closed_loop(cfg, setup) -> bool:
  """Whether the run's noise or clip follows its releases (one plan per lane)."""
  return (setup.privacy.clip_rule != "fixed"
          or not get_schedule(cfg.schedule.name).open_loop(dict(cfg.schedule)))


class Round(NamedTuple):
  """One round of ``L`` lanes, as the device gets it and as the attack weighs it."""

  args: engine.RoundArgs   # [L] what the engine runs (the variant applied)
  sigma: np.ndarray        # [L, U] planned noise per client (central: every entry)
  val_std: np.ndarray      # [L] the validation release's noise std (0: none)
  active: np.ndarray       # [L] bool: the lane's run plays this round


def broken(variant: str, t: int, rounds: int, args: engine.RoundArgs,
           val_std: np.ndarray) -> tuple[engine.RoundArgs, np.ndarray]:
  """``args`` and ``val_std`` with the variant's fault in round ``t`` of ``rounds``:
  a tenth of every noise (``noise_div10``; ``late_noise_div10`` from
  :func:`late_start` on) or the clipping threshold :data:`NO_CLIP` (``no_clip``)."""
  if variant == "noise_div10" or (variant == "late_noise_div10" and t >= late_start(rounds)):
    f = np.float32(0.1)
    args = args._replace(noise=args.noise * f, central_noise=args.central_noise * f,
                         count_noise=None if args.count_noise is None
                         else args.count_noise * f)
    val_std = val_std * f
  if variant == "no_clip":
    args = args._replace(clip=np.full_like(args.clip, NO_CLIP))
  return args, val_std


def _stack(rows: list[engine.RoundArgs]) -> engine.RoundArgs:
  """``[L]`` RoundArgs of one round's lanes (a field None in all stays None)."""
  def field(f):
    values = [getattr(a, f) for a in rows]
    return None if values[0] is None else np.stack([np.asarray(v) for v in values])
  return engine.RoundArgs(*(field(f) for f in engine.RoundArgs._fields))


def _idle(a: engine.RoundArgs) -> engine.RoundArgs:
  """A round that selects no client and adds no noise (a stopped lane's)."""
  return a._replace(sel_mask=np.zeros_like(a.sel_mask), noise=np.zeros_like(a.noise),
                    central_noise=np.float32(0.0), count_noise=np.float32(0.0))


def _sigma(privacy, plan, args: engine.RoundArgs) -> np.ndarray:
  """``[U]`` the noise each client's release gets as the engine gets it (central: the
  server's, to all). Central noise is read from the round's ``args``, not the plan:
  the private median scales the sum's noise with the round's bound ``S_t`` (and gives
  part of the multiplier to the count), so each lane's sum gets its own scale."""
  client, _ = privacy.device_noise(plan.noise, plan.central_noise)
  if privacy.placement == "central":
    return np.full(client.shape, float(args.central_noise))
  return client


def spec_of(cfg, setup) -> server.ServerSpec:
  """The run's :class:`fedjax_dp.host.server.ServerSpec` with its noise stream (as
  :class:`fedjax_dp.host.run_loop.RunLoop` makes it; each lane varies the seed)."""
  stream = noise_identity.stream(cfg, setup.data_fingerprint)
  return server.spec(cfg, setup)._replace(stream=stream)


_ZERO = {"train_loss": 0.0, "grad_norm": 0.0, "update_norm": 0.0, "num_selected": 1}


class SharedPlan:
  """An open-loop run's rounds, planned once and given each lane's cohorts."""

  def __init__(self, cfg, setup, seeds: np.ndarray, bits: np.ndarray, variant: str):
    spec = spec_of(cfg, setup)
    state, self.rounds, self.sigmas, self.client_noise = server.init(spec), [], [], []
    while True:
      state, args = server.plan_round(spec, state)
      if args is None:
        break
      self.rounds.append(args)
      self.sigmas.append(_sigma(setup.privacy, state.planned.plan, args))
      self.client_noise.append(setup.privacy.device_noise(state.planned.plan.noise,
                                                          state.planned.plan.central_noise)[0])
      state, row = server.record(spec, state, _ZERO, (0.0, 0.0), 0.0)
      self.certified = float(row["epsilon_certified"])
    if not self.rounds:
      raise ValueError("the run plans no round: nothing to audit")
    self.spec, self.seeds, self.bits, self.variant = spec, seeds, bits, variant
    self.num_rounds = len(self.rounds)

  def plan(self, t: int) -> Round:
    a, sigma, client = self.rounds[t], self.sigmas[t], self.client_noise[t]
    rows = []
    for s, b in zip(self.seeds, self.bits):
      idx, sel = server.cohort(self.spec._replace(seed=int(s)), t)
      rows.append(a._replace(idx=idx, sel_mask=sel, noise=client[idx].astype(np.float32),
                             seed=np.uint32(s), data_id=np.int32(b)))
    lanes = len(rows)
    args, val = broken(self.variant, t, self.num_rounds, _stack(rows), np.zeros(lanes))
    return Round(args, np.broadcast_to(sigma, (lanes, sigma.size)), val,
                 np.ones(lanes, bool))

  def record(self, t: int, metrics: dict, val: np.ndarray) -> None:
    del t, metrics, val  # open loop: the plan reads no metric

  def certified_epsilon(self) -> float:
    """The run's certified epsilon after its rounds (worst client)."""
    return self.certified


class _SharedAccountant:
  """The run's privacy plan with its accountant's pure functions memoized across the
  lanes: lanes whose runs reach the same accountant state with the same round get the
  same next state (the same object), so a thousand lanes compose each distinct round
  once. Exact: the functions are pure and the key holds every input they read (the
  selected ids only where the participation reads them: deterministic rules, Poisson
  steps, correlated noise)."""

  def __init__(self, plan):
    self._plan, self._cache = plan, {}
    self._reads_selected = (plan.rule.deterministic or plan.poisson_steps
                            or plan.correlated is not None)

  def __getattr__(self, name):
    return getattr(self._plan, name)

  def _memo(self, key, acct, fn):
    hit = self._cache.get(key)
    if hit is None or hit[0] is not acct:  # (the state is kept: its id stays its own)
      hit = self._cache[key] = (acct, fn())
    return hit[1]

  def accountant_step(self, acct, noise, central_noise=0.0, selected=None, validate=False):
    sel = (np.asarray(selected).tobytes()
           if self._reads_selected and selected is not None else None)
    key = ("step", id(acct), np.asarray(noise, np.float64).tobytes(), float(central_noise),
           sel, bool(validate))
    return self._memo(key, acct, lambda: self._plan.accountant_step(
        acct, noise, central_noise, selected=selected, validate=validate))

  def certified_epsilon(self, acct):
    return self._memo(("eps", id(acct)), acct, lambda: self._plan.certified_epsilon(acct))

  def claimed_epsilon(self, acct):
    return self._memo(("claimed", id(acct)), acct, lambda: self._plan.claimed_epsilon(acct))

  def over_budget(self, acct):
    return self._memo(("over", id(acct)), acct, lambda: self._plan.over_budget(acct))


class LanePlans:
  """A closed-loop run: each lane planned by its own server state (module docstring)."""

  def __init__(self, cfg, setup, seeds: np.ndarray, bits: np.ndarray, variant: str):
    spec = spec_of(cfg, setup)
    spec = spec._replace(privacy=_SharedAccountant(spec.privacy))
    self.specs = [spec._replace(seed=int(s)) for s in seeds]
    # A fresh state reads no seed (the schedule's and the accountant's initial states,
    # the configured clip): one, shared until each lane's first round replaces it.
    self.states = [server.init(spec)] * len(seeds)
    self.bits, self.variant, self.privacy = bits, variant, setup.privacy
    self.num_rounds, self.certified = int(cfg.rounds), [math.nan] * len(seeds)

  def plan(self, t: int) -> Round | None:
    """Round ``t`` of every lane (None: no lane's run plays it)."""
    rows, sigmas, vals, active = [], [], [], []
    for i, (spec, state) in enumerate(zip(self.specs, self.states)):
      state, args = server.plan_round(spec, state) if state.running else (state, None)
      self.states[i] = state
      active.append(args is not None)
      if args is None:
        rows.append(None)
        sigmas.append(np.zeros(spec.num_clients))
        vals.append(0.0)
        continue
      rows.append(args._replace(data_id=np.int32(self.bits[i])))
      sigmas.append(_sigma(self.privacy, state.planned.plan, args))
      vals.append(max(state.planned.val_std, 0.0))
    if not any(active):
      if t == 0:
        raise ValueError("no trial's run plays round 1: nothing to audit")
      return None  # every lane's run has stopped (its budget): the runs end here
    # The bound each lane planned (before the variant): the run records it, so a
    # variant's threshold (no_clip's) never becomes the next round's planned bound.
    self.planned_clip = np.asarray([np.nan if a is None else float(a.clip) for a in rows])
    template = _idle(next(a for a in rows if a is not None))
    rows = [a if a is not None else template._replace(
        seed=np.uint32(s.seed), data_id=np.int32(b))
            for a, s, b in zip(rows, self.specs, self.bits)]
    args, val = broken(self.variant, t, self.num_rounds, _stack(rows),
                       np.asarray(vals, np.float32))
    return Round(args, np.stack(sigmas), val, np.asarray(active))

  def record(self, t: int, metrics: dict, val: np.ndarray) -> None:
    """Each playing lane records its round: its device ``metrics`` (``[L]`` arrays)
    and its released validation score ``val [L]`` where it released one."""
    del t
    for i, (spec, state) in enumerate(zip(self.specs, self.states)):
      if state.planned is None:
        continue
      m = {k: float(v[i]) for k, v in metrics.items()}
      if "clip_bound" in m:
        m["clip_bound"] = float(self.planned_clip[i])
      released = float(val[i]) if state.planned.val_std >= 0 else None
      # The test metrics are not computed: no plan here reads them (closed loops read
      # the released clip count or validation score; audit_run refuses the others).
      test = (0.0, 0.0) if state.planned.evaluate else None
      self.states[i], row = server.record(spec, state, m, test, 0.0, released)
      self.certified[i] = float(row["epsilon_certified"])

  def certified_epsilon(self) -> float:
    """The largest certified epsilon of the lanes' runs: each trial's run is certified
    by its own accountant on its own planned noise; the audit compares with the
    weakest claim among them."""
    return float(np.nanmax(self.certified))


def make(cfg, setup, seeds: np.ndarray, bits: np.ndarray, variant: str):
  """:class:`LanePlans` for a closed loop (:func:`closed_loop`), else :class:`SharedPlan`."""
  kind = LanePlans if closed_loop(cfg, setup) else SharedPlan
  return kind(cfg, setup, seeds, bits, variant)
