"""Batched running: many runs that share one compiled round, as one program per round.

Runs whose configs share every array shape (:func:`fedjax_dp.host.building.group_key`)
form a group. Runs that select the same clients form a cohort (:func:`cohort_key`)
that reads the clients' data once; :func:`lane_layout` arranges the runs as ``[G][L]``
lanes of G cohorts, each lane a queue of runs. :func:`run_group` then drives the
group: each run keeps its own host side in a :class:`fedjax_dp.host.run_loop.RunLoop`, and
only the device part is batched (and Ctrl-C stops it between rounds,
:func:`interruptible`)::

  per round:  for each run: args_p = loop_p.plan_round()        (host, numpy)
              params, metrics = round_fn(params, data, stack(args), active)  (device)
              [loss, acc] = eval_fn(params, test set)            (device, if wanted;
                                                                   each run its own set)
              for each run: loop_p.record(metrics[p], ...)       (host: accountant,
                                                                   schedule.observe)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import sharding
from fedjax_dp.data import streaming
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.files.results import RunResult
from fedjax_dp.host.building import CLIENT_CHUNK_AUTO, Setup, data_key, same_program
from fedjax_dp.host.run_loop import RunLoop
from fedjax_dp.training import evaluation, memory, program
from fedjax_dp.training.rounds import RoundArgs, carried_params

# Ctrl-C between rounds: within :func:`interruptible`, SIGINT only sets a flag that
# :func:`run_group` reads between rounds (:func:`requested`).


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


def requested() -> bool:
  """Whether a SIGINT arrived within :func:`interruptible` (the loop stops now)."""
  return _SIGINT.requested


@functools.lru_cache(maxsize=32)
def _jit_init(model):
  return jax.jit(model.init)


def _pad_ids(idx: np.ndarray, k: int) -> np.ndarray:
  """Client ids padded to ``k`` slots with copies of the first."""
  extra = k - idx.shape[0]
  return idx if not extra else np.concatenate([idx, np.full(extra, idx[0], idx.dtype)])


def _cohort_of(args: RoundArgs) -> tuple[int, bytes]:
  """A round's cohort as a key: its dataset and its padded client ids."""
  return int(args.data_id), np.asarray(args.idx, np.int32).tobytes()


def _pad_clients(args: RoundArgs, k: int) -> RoundArgs:
  """Pads the client slots to ``k`` (a multiple of the mesh's 'clients' axis) with
  masked copies of the first slot."""
  extra = k - args.idx.shape[0]
  if not extra:
    return args
  return args._replace(
      idx=_pad_ids(args.idx, k),
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


class _Program(NamedTuple):
  """A group's compiled round on its mesh, and the device copies it reads."""

  round_fn: Any            # (params, data, args, active) -> (params, metrics), [G, L]
  eval_fn: Any             # (params, x, y) -> (loss, acc), [G, L]; with several
                           # evaluation sets (params, x, y, which)
  val_fn: Any              # (params, data, args, std) -> (released, exact), [G, L]
  data: Any                # client data (stacked [D, U, ...] for several datasets);
                           # None when streamed from the host
  x_test: jax.Array
  y_test: jax.Array
  pts: Any                 # sharding of per-point arrays (None: one device)
  args_sharding: Any       # sharding of stacked RoundArgs (None: one device)
  trivial: bool            # one device: no shardings
  k_slots: int             # client slots, a multiple of the mesh's 'clients' axis
  num_cohorts: int         # G
  num_lanes: int           # L
  stream: Any = None       # streaming.CohortStream (data.placement='host'), else None
  eval_sets: int = 1       # E: x_test [E, N, ...] when > 1 (each run scores on its own)


def _distinct(setups: Sequence[Setup], key) -> tuple[list[Setup], list[int]]:
  """The first run of each distinct ``key(setup)``, and each run's index into them."""
  firsts: dict[Any, int] = {}
  ids = [firsts.setdefault(key(s), len(firsts)) for s in setups]
  holders = {i: s for s, i in reversed(list(zip(setups, ids)))}
  return [holders[i] for i in range(len(firsts))], ids


def _datasets(setups: Sequence[Setup]) -> tuple[list[FederatedData], list[int]]:
  """One copy per distinct dataset, and each run's index into them (its data_id)."""
  holders, data_ids = _distinct(setups, lambda s: id(s.data))
  return [s.data for s in holders], data_ids


def _eval_sets(setups: Sequence[Setup]) -> tuple[list[Setup], list[int]]:
  """The runs holding each distinct evaluation set (by ``Setup.eval_key``: a seed's or
  fold's unassigned examples differ, the test split is one), and each run's index
  into them."""
  return _distinct(setups, lambda s: s.eval_key)


def _row_sets(layout: list, eval_ids: Sequence[int]) -> np.ndarray | None:
  """``[G]`` the evaluation set of each row when all runs of the row, over all its
  waves, share one (a row is a cohort: one partition, so one seed's unassigned
  examples), else None (points then name their sets one by one)."""
  rows = [{eval_ids[i] for lane in row for i in lane if i is not None} for row in layout]
  if any(len(r) > 1 for r in rows):
    return None
  return np.array([min(r, default=0) for r in rows], np.int32)


def _device_data(datasets: list[FederatedData]) -> Any:
  """The data the round reads: the one dataset, all of them stacked ``[D, U, ...]``,
  or None when they stay on the host (streamed cohort by cohort, _Lanes.feed)."""
  if streaming.is_host(datasets[0]):
    return None
  return datasets[0] if len(datasets) == 1 else jax.tree_util.tree_map(
      lambda *a: jnp.stack(a), *datasets)


def _compile(cfgs: Sequence[Any], first: Setup, datasets: list[FederatedData],
             layout: list, devices, evals: Sequence[Setup] = ()) -> _Program:
  """The device data, the mesh, the client chunk of this group, and the jitted sweep
  functions; ``evals`` holds a run per distinct evaluation set (:func:`_eval_sets`),
  stacked ``[E, N, ...]`` when there are several."""
  model, round_cfg = first.model, first.round_cfg
  data = _device_data(datasets)
  evals = list(evals) or [first]
  x_test, y_test = ((first.x_test, first.y_test) if len(evals) == 1 else
                    (np.stack([e.x_test for e in evals]), np.stack([e.y_test for e in evals])))
  num_cohorts, num_lanes = len(layout), len(layout[0])
  mesh = sharding.make_mesh(num_cohorts, devices)
  trivial = sharding.is_trivial(mesh)
  if trivial:  # one device: no shardings (put leaves the arrays where they are)
    pts = rep = args_sharding = None
  else:
    pts, rep = sharding.points(mesh), sharding.replicated(mesh)
    args_sharding = program.round_args_sharding(mesh)
  data, x_test, y_test = sharding.put((data, x_test, y_test), rep)
  n_sweep, n_clients = mesh.shape[sharding.SWEEP], mesh.shape[sharding.CLIENTS]
  k_slots = -(-first.k_slots // n_clients) * n_clients
  if int(cfgs[0].server.client_chunk) == CLIENT_CHUNK_AUTO:
    # Resolve again for this group: each device holds num_cohorts / n_sweep cohorts'
    # lanes and k_slots / n_clients of their clients.
    # One dataset's shapes: a client costs the same in stacked [D, U, ...] data, and
    # build() already measured (and cached) these shapes.
    per_device = memory.client_chunk_for_memory(
        model, round_cfg, datasets[0], k_slots // n_clients, lanes=num_lanes,
        cohorts=1 if program.cohorts_in_sequence() else num_cohorts // n_sweep)
    round_cfg = dataclasses.replace(round_cfg, client_chunk=per_device * n_clients)
  elif round_cfg.client_chunk and n_clients > 1:
    # Chunks hold whole rows of the 'clients' axis, so they shard with it.
    round_cfg = dataclasses.replace(
        round_cfg, client_chunk=-(-round_cfg.client_chunk // n_clients) * n_clients)
  stream = None
  if data is None:  # data.placement='host': each round's cohort is moved here (_Lanes.feed)
    stream = streaming.CohortStream(
        datasets, put=jax.device_put if trivial else lambda t: sharding.put(t, rep))
  round_fn, eval_fn = program.make_sweep_fns(model, round_cfg,
                                             int(cfgs[0].eval.batch_size),
                                             None if trivial else mesh)
  if len(evals) > 1:
    eval_fn = program.make_sets_eval_fn(model, int(cfgs[0].eval.batch_size),
                                        None if trivial else mesh)
  val_fn = evaluation.make_validation_fn(model, round_cfg)
  return _Program(round_fn, eval_fn, val_fn, data, x_test, y_test, pts, args_sharding,
                  trivial, k_slots, num_cohorts, num_lanes, stream, len(evals))


class _Lanes:
  """The host side of a running group: each lane's current run, the runs' loops,
  their stacked device models ``[G, L, ...]`` and what each round planned."""

  def __init__(self, prog: _Program, model, cfgs, setups, out_dirs, layout, data_ids,
               eval_ids, bar):
    self.prog, self.cfgs, self.data_ids, self.bar = prog, cfgs, data_ids, bar
    self.eval_ids = eval_ids  # each run's index into the group's evaluation sets
    rows = _row_sets(layout, eval_ids) if prog.eval_sets > 1 else None
    # Each row's set, fixed for the group's life, so placed once (None: per point).
    self.row_sets = None if rows is None else sharding.put(rows, prog.pts)
    self.num = len(cfgs)
    init = _jit_init(model)
    self._init, self._inits = init, {}
    # Loops resume from their run directories' checkpoints (if any) before params exist.
    self.loops = [RunLoop(c, s, d) for c, s, d in zip(cfgs, setups, out_dirs)]
    # Each row runs its waves one after another; ``current[g][lane]`` is the run the
    # lane holds in the row's current wave (None: idle in this wave).
    self.queues = [[list(q) for q in row] for row in layout]
    self.current = [[q.pop(0) for q in row] for row in self.queues]
    self.params = sharding.put(self.stack([[self.init_of(i if i is not None else next(
        j for j in row if j is not None)) for i in row] for row in self.current]), prog.pts)
    self.horizons = [loop.horizon for loop in self.loops]
    if bar is not None:
      bar.update(sum(loop.t for loop in self.loops))  # rounds restored from checkpoints
    self.started = {i: time.time() - self.loops[i].wall_offset for row in self.current
                    for i in row if i is not None}
    self.finished: dict[int, RunResult] = {}
    self.template = None

  def stack(self, rows):
    """``[G][L]`` pytrees -> one pytree with leading ``[G, L]`` numpy axes."""
    g, lanes = self.prog.num_cohorts, self.prog.num_lanes
    return jax.tree_util.tree_map(lambda *a: np.stack(a).reshape(
        (g, lanes) + np.shape(a[0])), *[x for row in rows for x in row])

  def init_of(self, i):
    """Run i's starting model: its checkpoint's, or its seed's initialisation."""
    if self.loops[i].restored_params is not None:
      return self.loops[i].restored_params
    seed = int(self.cfgs[i].seed)
    if seed not in self._inits:
      self._inits[seed] = jax.device_get(self._init(jax.random.PRNGKey(seed)))
    # A correlated mechanism's carried noise state starts with the run (CarriedParams).
    return carried_params(self.loops[i].setup.round_cfg, self._inits[seed])

  def lane_params(self, g, lane):
    host = self.params if jax.process_count() == 1 else sharding.to_host(self.params)
    return jax.device_get(jax.tree_util.tree_map(lambda a: a[g, lane], host))

  def interrupt(self) -> None:
    """Between rounds every loop has recorded its last round and ``params`` match
    them: checkpoint the runs in the lanes, mark them interrupted."""
    for g, row in enumerate(self.current):
      for lane, i in enumerate(row):
        if i is not None and i not in self.finished:
          self.finished[i] = self.loops[i].interrupt(
              time.time() - self.started[i], self.lane_params(g, lane), group_size=self.num)

  def plan(self) -> dict[tuple[int, int], tuple[int, RoundArgs]]:
    """Each active lane's next round ``{(g, lane): (run, args)}``; finished runs are
    finished, and a row whose wave is over starts its next wave (fresh models)."""
    planned: dict[tuple[int, int], tuple[int, RoundArgs]] = {}
    for g, row in enumerate(self.current):
      while True:
        for lane in range(self.prog.num_lanes):
          i = row[lane]
          if i is None:
            continue
          a = self.loops[i].plan_round()
          if a is not None:
            planned[g, lane] = (i, _pad_clients(a._replace(data_id=np.int32(self.data_ids[i])),
                                                self.prog.k_slots))
            continue
          # Run i is over: keep its model; its lane idles until the wave ends.
          self.finished[i] = self.loops[i].finish(time.time() - self.started[i],
                                                  self.lane_params(g, lane),
                                                  group_size=self.num)
          row[lane] = None
        if any(lane_run is not None for lane_run in row) or not self.queues[g][0]:
          break
        self._next_wave(g, row)
    return planned

  def _next_wave(self, g, row) -> None:
    row[:] = [q.pop(0) for q in self.queues[g]]
    for lane, i in enumerate(row):
      if i is not None:
        self.started[i] = time.time() - self.loops[i].wall_offset
        self.params = jax.tree_util.tree_map(
            lambda p, v, g=g, lane=lane: p.at[g, lane].set(v), self.params, self.init_of(i))
    self.params = self.params if self.prog.trivial else sharding.put(self.params,
                                                                     self.prog.pts)

  def follow_horizons(self) -> None:
    """Moves the bar's total with the runs' horizons (schedules may change T)."""
    if self.bar is not None and [loop.horizon for loop in self.loops] != self.horizons:
      self.bar.total += sum(loop.horizon for loop in self.loops) - sum(self.horizons)
      self.horizons = [loop.horizon for loop in self.loops]
      self.bar.refresh()

  def train(self, planned) -> dict[tuple[int, int], dict[str, Any]]:
    """Runs the planned round on the device: ``{(g, lane): metrics}``.

    The round reads a row's clients, seed and round index from ONE lane (a cohort
    shares them). Waves keep a row's active lanes at the same round index; as a
    guard, lanes that ever differ in (round, seed, data) run in separate calls
    ("phases"), each with only its lanes active (the others stay frozen).
    """
    prog = self.prog
    if self.template is None:
      # Idle lanes compute on zeros (client 0, no weight) and are frozen.
      self.template = jax.tree_util.tree_map(np.zeros_like, next(iter(planned.values()))[1])
    phases = []
    for g in range(prog.num_cohorts):
      by_key: dict[tuple, list[int]] = {}
      for lane in range(prog.num_lanes):
        if (g, lane) in planned:
          a = planned[g, lane][1]
          by_key.setdefault((int(a.round), int(a.seed), int(a.data_id)), []).append(lane)
      phases.append(list(by_key.values()))
    metrics, pending = {}, []
    if prog.stream is not None:
      prog.stream.begin_round()
    for c in range(max(len(p) for p in phases)):
      rows, active = [], np.zeros((prog.num_cohorts, prog.num_lanes), bool)
      ons = [phases[g][c] if c < len(phases[g]) else [] for g in range(prog.num_cohorts)]
      for g, on in enumerate(ons):
        active[g, on] = True
        # A cohort's lanes share its clients: idle lanes copy an active lane's inputs.
        ref = planned[g, on[0]][1] if on else self.template
        rows.append([planned[g, lane][1] if lane in on else ref
                     for lane in range(prog.num_lanes)])
      data, rows = self.feed(rows)
      self.params, m = prog.round_fn(self.params, data,
                                     sharding.put(self.stack(rows), prog.args_sharding),
                                     sharding.put(active, prog.pts))
      pending.append((m, ons))
    if prog.stream is not None:
      # The round is dispatched: gather the next round's cohorts while it computes.
      prog.stream.prefetch(self.next_cohorts(planned))
    for m, ons in pending:
      m = jax.device_get(m)._asdict()
      for g, on in enumerate(ons):
        for lane in on:
          metrics[g, lane] = {k: v[g, lane] for k, v in m.items()}
    return metrics

  def feed(self, rows: list[list[RoundArgs]]) -> tuple[Any, list[list[RoundArgs]]]:
    """The client data one device call reads, and its ``[G][L]`` args.

    Resident data: the program's, args unchanged. Streamed (``data.placement='host'``):
    the distinct cohorts of the call, moved to the device one after another, and each
    lane's ``RoundArgs.rows`` pointing at its cohort's rows (the idle template's at
    row 0: its lanes are frozen and read nothing that matters).
    """
    stream = self.prog.stream
    if stream is None:
      return self.prog.data, rows
    cohorts: dict[tuple, int] = {}
    for row in rows:
      for a in row:
        if a is not self.template:
          cohorts.setdefault(_cohort_of(a), len(cohorts))
    order = list(cohorts)
    data, offsets = stream.take([(d, np.frombuffer(raw, np.int32)) for d, raw in order])
    k = self.prog.k_slots
    fed = [[a._replace(rows=np.zeros(k, np.int32) if a is self.template else
                       (offsets[cohorts[_cohort_of(a)]]
                        + np.arange(k, dtype=np.int32)))
            for a in row] for row in rows]
    return data, fed

  def next_cohorts(self, planned) -> list[tuple[int, np.ndarray]]:
    """The cohorts the runs of ``planned`` will select next round, as ``(data_id,
    ids [k_slots])`` (selection depends only on (seed, round): known ahead; a run that
    stops or a wave that changes merely misses its prefetch)."""
    out = {}
    for i, a in planned.values():
      loop = self.loops[i]
      if loop.t + 1 >= loop.horizon:
        continue
      ids = _pad_ids(loop.cohort(loop.t + 1)[0], self.prog.k_slots)
      out.setdefault((int(a.data_id), ids.tobytes()), ids)
    return [(d, ids) for (d, _), ids in out.items()]

  def validate(self, planned) -> np.ndarray | None:
    """The released validation scores ``[G, L]``, if a planned round releases one."""
    if not any(self.loops[i].wants_validation for i, _ in planned.values()):
      return None
    prog = self.prog
    # Every lane's own cohort (idle lanes: the template, std 0, result unused).
    rows = [[planned[g, lane][1] if (g, lane) in planned else self.template
             for lane in range(prog.num_lanes)] for g in range(prog.num_cohorts)]
    data, rows = self.feed(rows)
    stds = np.array([[max(self.loops[planned[g, lane][0]].val_std, 0.0)
                      if (g, lane) in planned else 0.0 for lane in range(prog.num_lanes)]
                     for g in range(prog.num_cohorts)], np.float32)
    return np.asarray(jax.device_get(prog.val_fn(self.params, data, self.stack(rows),
                                                 stds)[0]))

  def evaluate(self, planned) -> np.ndarray | None:
    """``[G, L, 2]`` test (loss, accuracy), if a planned round ends with one."""
    if not any(self.loops[i].wants_eval for i, _ in planned.values()):
      return None
    prog = self.prog
    if prog.eval_sets == 1:
      sets = ()
    elif self.row_sets is not None:  # each row's lanes share its set
      sets = (self.row_sets,)
    else:
      sets = (sharding.put(np.array(
          [[self.eval_ids[i] if i is not None else 0 for i in row] for row in self.current],
          np.int32), prog.pts),)
    return np.stack(jax.device_get(prog.eval_fn(self.params, prog.x_test, prog.y_test,
                                                *sets)), axis=-1)

  def record(self, planned, metrics, val, test) -> None:
    """Each run records its round (and saves a checkpoint when due); the bar moves."""
    now, bar = time.time(), self.bar
    for (g, lane), (i, _) in planned.items():
      loop = self.loops[i]
      loop.record(metrics[g, lane],
                  None if test is None else test[g, lane], now - self.started[i],
                  None if val is None else float(val[g, lane]))
      if loop.checkpoint_due:
        loop.save_checkpoint(self.lane_params(g, lane), now - self.started[i])
      if loop.status == "diverged" and bar is not None:
        bar.write(f"[{loop.cfg.name}] loss became non-finite at round "
                  f"{loop.diverged_round}: stopping (diverged)")
    if bar is not None:
      bar.update(len(planned))
      if self.num == 1:
        bar.set_postfix(acc=f"{self.loops[0].test[1]:.3f}",
                        eps=f"{self.loops[0].rows[-1]['epsilon_certified']:.2f}")
      else:
        bar.set_postfix(running=len(planned))


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
    setups: their :func:`fedjax_dp.host.building.build` results; all must have the same
      :func:`fedjax_dp.host.building.group_key`. Runs whose client data are the same
      object share it; otherwise the datasets are stacked ``[D, U, ...]`` and each
      run reads its own.
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
  datasets, data_ids = _datasets(setups)
  evals, eval_ids = _eval_sets(setups)
  layout = lane_layout([(cohort_key(c), d) for c, d in zip(cfgs, data_ids)],
                       [int(c.rounds) for c in cfgs])
  prog = _compile(cfgs, first, datasets, layout, devices, evals)
  try:
    lanes = _Lanes(prog, first.model, cfgs, setups, out_dirs, layout, data_ids, eval_ids,
                   bar)
    while True:
      if requested():
        lanes.interrupt()
        raise KeyboardInterrupt
      planned = lanes.plan()
      lanes.follow_horizons()
      if not planned:
        break
      metrics = lanes.train(planned)
      val = lanes.validate(planned)
      test = lanes.evaluate(planned)
      lanes.record(planned, metrics, val, test)
  finally:
    if prog.stream is not None:
      prog.stream.close()
  return [lanes.finished[i] for i in range(num)]
