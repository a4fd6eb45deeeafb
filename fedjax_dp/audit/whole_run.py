"""The whole-run audit: a canary inserted once and observed in every round's release.

:func:`fedjax_dp.audit.audit` audits ONE round (the first) against the certificate
after it. The run certifies all T rounds, and a fault in a later round (a schedule
that lowers the noise late, a correlated mechanism whose later rows are wrong) is
invisible to it. :func:`audit_run` audits the T-round mechanism: each trial (lane) is
a whole run of T rounds of :func:`fedjax_dp.training.engine.round_step` -- the run's
own noise schedule, clip, learning rates and correlated-noise state carried from
round to round -- on the ``in`` or the ``out`` dataset (a fair coin), with its own
seed, so its own cohorts and noise. The adversary sees every round's global model
(the releases of central placement) and scores the run; its lower bound is compared
with the run's certified epsilon after T rounds (worst client, the run's own
accountant, :class:`fedjax_dp.host.run_loop.RunLoop`).

The canary is the per-round audit's client-level one, on the quietest input feature
(:func:`fedjax_dp.audit.audit.quietest_feature`): no other client's gradient touches
that feature's first-layer weights at any model, so the projection of each round's
model increment on those weights moves by the target's own (clipped) contribution,
when its cohort draws it, and by the noise -- whatever the other clients did
(inclusion-aware across rounds). The direction ``d_t`` of round t is the target's
noiseless in-minus-out update at the model the round starts from (the previous
release, which the adversary sees). The attacks
(:func:`fedjax_dp.audit.estimators.best_of`):

* ``sum``: ``sum_t <w_t - w_{t-1}, d_t> / sigma_t^2`` with ``sigma_t`` the run's planned
  noise of round t: the likelihood ratio of the T rounds, the evidence of all of them;
* ``round t`` (one attack per round): ``<w_t - w_{t-1}, d_t>``: a single round whose
  noise is too small stands out, whatever the others (a late fault).

so ``T + 1`` attacks share the significance (Bonferroni).

Variants: ``none``, ``noise_div10`` and ``no_clip`` (as the per-round audit), and
``late_noise_div10``: a tenth of the planned noise from round ``floor(T / 2) + 1`` on
(for correlated noise, those rounds' rows of ``C^+ Z``): round 1 is untouched, so the
per-round audit cannot see it. This is the one-canary-per-trial form of a whole-run
audit (Andrew et al. 2024 audit the final model of one run; Steinke, Nasr & Jagielski
2023 insert many canaries in one run); with independent trials the estimators'
assumptions hold exactly.

Scope: central placement (where the correlated mechanisms live) with a fixed clip
and an open-loop schedule (its noise does not depend on the metrics, so every
trial's run plans the same noise); anything else is refused in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.audit import estimators
from fedjax_dp.privacy.schedules import get_schedule
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine
from fedjax_dp.training import rounds as rounds_lib

_audit = importlib.import_module("fedjax_dp.audit.audit")

RUN_VARIANTS = ("none", "noise_div10", "no_clip", "late_noise_div10")


def late_start(rounds: int) -> int:
  """The first (0-based) round ``late_noise_div10`` weakens: ``floor(T / 2)``."""
  return max(1, int(rounds) // 2)


def _check(cfg, setup, options) -> None:
  privacy = setup.privacy
  if options.variant not in RUN_VARIANTS:
    raise ValueError(f"audit.variant: unknown {options.variant!r} for the whole-run "
                     f"audit; known: {RUN_VARIANTS}")
  if privacy.placement != "central":
    raise ValueError("the whole-run audit needs privacy.placement='central' (every "
                     f"round's global model is the release), got {privacy.placement!r}")
  if privacy.noiseless:
    raise ValueError("the run adds no noise: nothing to audit")
  if privacy.clip_rule != "fixed" or privacy.validation == "clients":
    raise ValueError("the whole-run audit needs server.clip_rule='fixed' and no "
                     "schedule.validation='clients' release")
  if not get_schedule(cfg.schedule.name).open_loop(dict(cfg.schedule)):
    raise ValueError(f"schedule.name={cfg.schedule.name!r} reads the metrics: every "
                     "trial would plan other noise; the whole-run audit needs an "
                     "open-loop schedule")
  for name in ("noise_scale", "claimed_sensitivity", "aggregation", "cohort"):
    if getattr(options, name) is not None:
      raise ValueError(f"audit.{name} is a per-round option (fedjax_dp.audit.audit)")


def _planned_rounds(cfg, setup):
  """``([T] RoundArgs of the run, certified epsilon after T rounds)`` from the run's
  own host loop, its schedule observing zero metrics (an open-loop schedule ignores
  them)."""
  from fedjax_dp import experiment

  loop = experiment.RunLoop(cfg, setup)
  planned = []
  while (args := loop.plan_round()) is not None:
    planned.append(args)
    zero = {"train_loss": 0.0, "grad_norm": 0.0, "update_norm": 0.0, "num_selected": 1}
    loop.record(zero, (0.0, 0.0), 0.0)
  if not planned:
    raise ValueError("the run plans no round: nothing to audit")
  return planned, float(loop.rows[-1]["epsilon_certified"])


def _target_direction(setup, params, pair, target, lr, clip) -> jax.Array:
  """Unit ``v``: the target's in-minus-out noiseless update on the coordinates that no
  other client's update moves (the canary's feature rows)."""
  clean = _audit._clean_fn(setup.model, setup.round_cfg.client)  # pylint: disable=protected-access
  flat = _audit._flat(params)  # pylint: disable=protected-access
  tid = jnp.int32(target)
  count = jnp.float32(pair.counts[0, target])
  v = clean(params, pair, 1, tid, lr, clip, count) - clean(params, pair, 0, tid, lr, clip,
                                                             count)
  moved = jnp.zeros(flat.shape, bool)
  for i in range(int(pair.counts.shape[1])):
    if i != int(target) and int(pair.counts[0, i]) > 0:
      c = clean(params, pair, 0, jnp.int32(i), lr, clip, jnp.float32(pair.counts[0, i]))
      moved = moved | (c != flat)
  v = jnp.where(moved, 0.0, v)
  norm = float(jnp.linalg.norm(v))
  if not norm > 0:
    raise ValueError("the canary moves no coordinate that the other clients leave alone: "
                     "nothing to audit (the data has no unused input feature)")
  return v / norm


@functools.lru_cache(maxsize=8)
def _run_fn(model, rcfg, target: int):
  """Jitted ``fn(params, pair, args [L, T], mask) -> [L, T]``: each lane's T rounds and,
  per round, the projection of the model increment on ``d_t``: the unit difference of
  the target's noiseless ``in`` and ``out`` updates AT THE MODEL THE ROUND STARTS FROM
  (the adversary sees it: it is the previous release), on the coordinates ``mask``
  that no other client moves. A canary's gradient changes as the model learns it, so
  a direction fixed at the initial model would lose it after a round or two."""
  quiet = dataclasses.replace(rcfg.client, noise_placement="none")
  tid = jnp.asarray([target])

  def clean(w, pair, bit, a):
    d = jax.tree_util.tree_map(lambda x: x[bit, target], pair)
    key = engine.client_keys(jnp.uint32(0), jnp.int32(0), tid)[0]
    zero = jnp.zeros((), jnp.float32)
    hp = client_lib.ClientHParams(lr=a.lr, clip=a.clip, step_noise=zero, upload_noise=zero,
                                  count=d.mask.sum())
    return _audit._flat(client_lib.client_update(model, quiet, w, d.x, d.y, d.mask, key,  # pylint: disable=protected-access
                                                 hp).params)

  def lane(params, pair, args, mask):
    def body(carry, a):
      state, prev = carry
      w0 = rounds_lib.model_params(state)
      diff = jnp.where(mask, clean(w0, pair, 1, a) - clean(w0, pair, 0, a), 0.0)
      d = diff / jnp.maximum(jnp.linalg.norm(diff), 1e-30)
      new, _ = engine.round_step(model, rcfg, state, pair, a)
      w = _audit._flat(rounds_lib.model_params(new))  # pylint: disable=protected-access
      return (new, w), jnp.dot(w - prev, d)
    start = (rounds_lib.carried_params(rcfg, params), _audit._flat(params))  # pylint: disable=protected-access
    _, inc = jax.lax.scan(body, start, args)
    return inc
  return jax.jit(jax.vmap(lane, in_axes=(None, None, 0, None)))


def _lane_args(cfg, setup, planned, seeds, bits, noise, clip) -> engine.RoundArgs:
  """``[L, T]`` RoundArgs: the run's planned rounds with each lane's seed, coin and
  cohorts (drawn by the config's rule from the lane's seed, as a run with that seed)."""
  u, k = setup.num_clients, setup.k_slots
  lanes, t_max = seeds.size, len(planned)
  idx = np.zeros((lanes, t_max, k), np.int32)
  sel = np.zeros((lanes, t_max, k), np.float32)
  for i, s in enumerate(seeds):
    for t in range(t_max):
      idx[i, t], sel[i, t] = engine.select_clients(
          cfg.server.selection, u, cfg.server.clients_per_round, cfg.server.q, int(s), t,
          weights=setup.selection_weights)
  stack = lambda f: np.broadcast_to(np.stack([np.asarray(getattr(a, f)) for a in planned]),
                                    (lanes, t_max) + np.shape(getattr(planned[0], f)))
  full = lambda x, dtype=np.float32: np.broadcast_to(np.asarray(x, dtype), (lanes, t_max))
  return engine.RoundArgs(
      idx=idx, sel_mask=sel, lr=stack("lr"), clip=full(clip),
      noise=np.zeros((lanes, t_max, k), np.float32), central_noise=full(noise),
      server_lr=stack("server_lr"), round=full(np.arange(t_max), np.int32),
      seed=np.broadcast_to(seeds[:, None], (lanes, t_max)).astype(np.uint32),
      data_id=np.broadcast_to(bits[:, None], (lanes, t_max)).astype(np.int32),
      stream=stack("stream"), count_noise=full(0.0))


def audit_run(cfg, options=None) -> _audit.AuditResult:
  """Audits the whole T-round run ``cfg`` configures (module docstring).

  Args:
    cfg: a run config.
    options: :class:`fedjax_dp.audit.AuditOptions` (``variant`` one of
      :data:`RUN_VARIANTS`; ``trials``, ``significance``, ``seed``, ``target``,
      ``canary_scale``, ``lanes_per_call`` as for the per-round audit).

  Returns:
    :class:`fedjax_dp.audit.AuditResult` with ``epsilon_certified`` the run's
    certified epsilon after its T rounds and ``rounds`` = T.

  Raises:
    ValueError: a config or option the whole-run audit does not cover, in one line.
  """
  from fedjax_dp import experiment

  options = options or _audit.AuditOptions()
  if not estimators.available():
    raise ImportError(estimators.INSTALL_HINT)
  t0 = time.time()
  setup = experiment.build(cfg)
  _check(cfg, setup, options)
  if options.target is not None and not 0 <= options.target < setup.num_clients:
    raise ValueError(f"audit.target must be in [0, {setup.num_clients}), got "
                     f"{options.target}")
  planned, certified = _planned_rounds(cfg, setup)
  privacy = setup.privacy
  target = options.target if options.target is not None else (
      int(np.flatnonzero(np.asarray(privacy.groups) == 0)[0])
      if privacy.groups is not None else 0)
  options = dataclasses.replace(options, target=target, sparse_canary=True)
  params = setup.model.init(jax.random.PRNGKey(int(cfg.seed)))
  pair = _audit._canary(setup, options, "client", "replace_one", None)  # pylint: disable=protected-access
  clip = _audit.NO_CLIP if options.variant == "no_clip" else float(planned[0].clip)
  v = _target_direction(setup, params, pair, target, np.asarray(planned[0].lr, np.float32),
                        np.float32(clip))
  sigma = np.asarray([float(a.central_noise) for a in planned], np.float64)
  noise = sigma.copy()
  if options.variant == "noise_div10":
    noise /= 10.0
  elif options.variant == "late_noise_div10":
    noise[late_start(len(planned)):] /= 10.0
  seeds, bits = _audit._trials(options.seed, int(options.trials))  # pylint: disable=protected-access
  fn = _run_fn(setup.model, setup.round_cfg, int(target))
  mask = v != 0
  step = int(options.lanes_per_call) or max(1, min(seeds.size, 256))
  inc = []
  for idx, kept in _audit._chunks(seeds.size, step):  # pylint: disable=protected-access
    args = _lane_args(cfg, setup, planned, seeds[idx], bits[idx], noise, clip)
    inc.append(np.asarray(fn(params, pair, args, mask))[:kept])
  inc = np.concatenate(inc).astype(np.float64)                       # [n, T]
  # The whole-run likelihood ratio of independent Gaussian rounds (each round's
  # projection weighted by its planned 1 / sigma_t^2), then each round on its own.
  weights = 1.0 / np.square(np.where(sigma > 0, sigma, 1.0))
  scores = np.concatenate([(inc * weights).sum(1)[None], inc.T])
  inside = bits.astype(bool)
  est = estimators.best_of(scores[:, inside], scores[:, ~inside], privacy.delta,
                           float(options.significance))
  return _audit.AuditResult(
      epsilon_lower=est.clopper_pearson, epsilon_one_run=est.one_run, epsilon_gdp=est.gdp,
      epsilon_certified=certified, epsilon_certified_run=certified,
      ratio=est.clopper_pearson / certified if certified > 0 else math.inf,
      delta=float(privacy.delta), significance=float(options.significance),
      trials=int(options.trials), trials_in=int(inside.sum()), level="client",
      placement=privacy.placement, mechanism=privacy.mechanism,
      clip_mode=cfg.client.clip_mode, variant=options.variant,
      noise_scale=float(np.max(noise)), sensitivity=float(np.max(privacy.sensitivity)),
      rounds=len(planned), wall_s=time.time() - t0)
