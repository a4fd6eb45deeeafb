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

The canary is a client-level one on the quietest input feature
(:func:`fedjax_dp.audit.audit.quietest_feature`), steady (one label, input scale 10,
so its update keeps one direction from round to round): no other client's gradient
touches that feature's first-layer weights at any model, so each round's model
increment on those weights moves by the target's own (clipped) contribution, when
its cohort draws it, and by the noise -- whatever the other clients did
(inclusion-aware across rounds). The adversary takes the increment about the
midpoint of the target's two noiseless contributions at the model the round starts
from (the previous release, which it sees), scaled by the target's aggregation
weight and the server's step (:func:`_gain`, public). The attacks
(:func:`fedjax_dp.audit.estimators.best_of`):

* ``whitened``: ``sum_ab (Sigma^{-1})_ab <w_a - w_{a-1}, m_b>`` with ``m_b`` round b's
  noiseless in-minus-out update (``d_b`` its unit direction) and ``Sigma`` the rounds'
  noise covariance as the run plans it, ``diag(sigma) L L^T diag(sigma)``, ``L`` the
  correlated mechanism's own decoder (its ``C^+``; the identity for independent
  noise): the likelihood ratio of the T rounds, the evidence of all of them
  (:func:`whitened_scores`). Weighting the rounds as independent
  (``sum_t <w_t - w_{t-1}, d_t> / sigma_t^2``, the attack before) missed a tenth of
  tree aggregation's noise: its rounds share the tree's nodes;
* ``whitened from round s`` (s = 2 .. T): the same statistic over rounds s .. T only:
  a fault from round s on is not diluted by the earlier rounds' noise (tree
  aggregation's late fault: rounds 3 and 4 of 4 at a tenth of the noise, which the
  whole-run statistic, weighted as planned, reads mostly as rounds 1 and 2);
* ``round t`` (one attack per round): ``<w_t - w_{t-1}, d_t>``: a single round whose
  noise is too small stands out, whatever the others (a late fault).

so ``2 T`` attacks share the significance (Bonferroni).

Variants: ``none``, ``noise_div10`` and ``no_clip`` (as the per-round audit),
``late_noise_div10``: a tenth of the planned noise from round ``floor(T / 2) + 1`` on
(for correlated noise, those rounds' rows of ``C^+ Z``): round 1 is untouched, so the
per-round audit cannot see it; and ``band_state_dropped`` (BandMF): the carried state
``w_{t-1} .. w_{t-b+1}`` is zeroed at round b + 1, so the noise restarts there as a
second BandMF stream. That fault is no privacy fault: the rounds' noise becomes
``blockdiag(C_b^{-1}, C_{T-b}^{-1}) Z``, whose information about a participation
pattern, ``1_pi^T (C_b^T C_b (+) C_{T-b}^T C_{T-b}) 1_pi``, is at most the certified
``1_pi^T C^T C 1_pi`` when C's coefficients are non-negative (the restarted first block
misses the rows of C below it; T = 4, b = 2: 5.14 against 6.02), so a correct audit
must not flag it (it costs accuracy: the prefix sums' noise no longer telescopes). This is the one-canary-per-trial form of a whole-run
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
from fedjax_dp.privacy import correlated
from fedjax_dp.privacy.schedules import get_schedule
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine
from fedjax_dp.training import rounds as rounds_lib

_audit = importlib.import_module("fedjax_dp.audit.audit")

RUN_VARIANTS = ("none", "noise_div10", "no_clip", "late_noise_div10", "band_state_dropped")


def dropped_round(setup) -> int:
  """The (0-based) round at which ``band_state_dropped`` zeroes the carried noise
  state: ``b``, round b + 1, the first whose noise reads a state the band filled.

  Raises:
    ValueError: the mechanism carries no noise state (independent noise, tree), or the
      run is no longer than the band (nothing to drop).
  """
  s = setup.round_cfg.correlated
  if s is None or len(s.coefs) < 2:
    raise ValueError("audit.variant='band_state_dropped' needs a mechanism that carries "
                     "its noise state (privacy.mechanism='bandmf' with privacy.bands >= 2), "
                     f"got {setup.privacy.mechanism!r}"
                     + (f" with {len(s.coefs)} band" if s is not None else ""))
  if len(s.coefs) >= s.rounds:
    raise ValueError(f"audit.variant='band_state_dropped': privacy.bands={len(s.coefs)} "
                     f"spans the run's {s.rounds} rounds; there is no round b + 1")
  return len(s.coefs)


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
def _run_fn(model, rcfg, target: int, drop_at: int = -1):
  """Jitted ``fn(params, pair, args [L, T], mask) -> [L, T, T]``: each lane's T rounds
  and the projections ``X_ab = <w_a - w_{a-1}, m_b>`` of every round's model increment
  on every round's ``m_b``: the difference of the target's noiseless ``in`` and ``out``
  updates AT THE MODEL ROUND b STARTS FROM (the adversary sees it: it is the previous
  release), on the coordinates ``mask`` that no other client moves. A canary's
  gradient changes as the model learns it, so a direction fixed at the initial model
  would lose it after a round or two; the cross terms ``a != b`` are what a
  whitening by correlated noise reads (:func:`whitened_scores`). ``drop_at >= 0``
  (``band_state_dropped``): the carried noise state is zeroed before that round."""
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

  def lane(params, pair, args, mask, gain):
    def body(carry, a):
      state, prev = carry
      if drop_at >= 0:  # the fault: BandMF's w_{t-1} .. w_{t-b+1} lost at round b + 1
        state = state._replace(noise=jax.tree_util.tree_map(
            lambda x: jnp.where(a.round == drop_at, jnp.zeros_like(x), x), state.noise))
      c_in, c_out = clean(rounds_lib.model_params(state), pair, 1, a), clean(
          rounds_lib.model_params(state), pair, 0, a)
      diff = jnp.where(mask, c_in - c_out, 0.0)
      # The increment about the midpoint of the target's two noiseless contributions:
      # what is left is the +-half difference and the noise (the midpoint moves with
      # the model, so with the earlier rounds' noise).
      mid = jnp.where(mask, 0.5 * (c_in + c_out) - prev, 0.0)
      new, _ = engine.round_step(model, rcfg, state, pair, a)
      w = _audit._flat(rounds_lib.model_params(new))  # pylint: disable=protected-access
      return (new, w), (jnp.where(mask, w - prev, 0.0) - gain * mid, diff)
    start = (rounds_lib.carried_params(rcfg, params), _audit._flat(params))  # pylint: disable=protected-access
    _, (inc, m) = jax.lax.scan(body, start, args)
    return inc @ m.T, jnp.linalg.norm(m, axis=1)
  return jax.jit(jax.vmap(lane, in_axes=(None, None, 0, None, None)))


def _gain(setup, params, pair, args, target: int, mask) -> float:
  """The factor ``gamma`` by which the target's own update moves the global model on
  the canary's coordinates (its aggregation weight times the server's step): from
  one noiseless round of a trial whose cohort holds the target, in and out
  (``gamma = <w_in - w_out, u_in - u_out> / ||u_in - u_out||^2``, ``u`` the target's
  updates). Public: the aggregation rule and the server step are the mechanism's."""
  sel = np.asarray(args.sel_mask[:, 0]) > 0
  has = np.flatnonzero(np.any((np.asarray(args.idx[:, 0]) == target) & sel, axis=1))
  if has.size == 0:
    raise ValueError("no trial's first round selects the canary's client: nothing to audit")
  one = jax.tree_util.tree_map(lambda x: np.asarray(x)[has[0], 0], args)
  one = one._replace(central_noise=np.float32(0.0))
  rcfg = setup.round_cfg

  @jax.jit
  def moved(bit):
    new, _ = engine.round_step(setup.model, rcfg, rounds_lib.carried_params(rcfg, params),
                               pair, one._replace(data_id=bit))
    return _audit._flat(rounds_lib.model_params(new))  # pylint: disable=protected-access

  clean = _audit._clean_fn(setup.model, rcfg.client)  # pylint: disable=protected-access
  tid, count = jnp.int32(target), jnp.float32(pair.counts[0, target])
  u = [clean(params, pair, b, tid, one.lr, one.clip, count) for b in (1, 0)]
  du = np.where(mask, np.asarray(u[0] - u[1], np.float64), 0.0)
  dw = np.where(mask, np.asarray(moved(np.int32(1)) - moved(np.int32(0)), np.float64), 0.0)
  return float(dw @ du / max(du @ du, 1e-300))


def noise_covariance(rcfg, sigma: np.ndarray) -> np.ndarray:
  """``[T, T]`` the covariance of the rounds' central noise (per coordinate) as planned:
  ``diag(sigma) L L^T diag(sigma)`` with ``L`` the correlated mechanism's decoder
  (:attr:`fedjax_dp.privacy.correlated.CorrelatedNoise.decoder`: round t adds
  ``sigma_t (L Z)_t``), ``diag(sigma^2)`` for independent noise."""
  s = rcfg.correlated
  cov = np.eye(sigma.size)
  if s is not None:
    dec = correlated.get(s.name).decoder
    if dec is None:
      raise ValueError(f"privacy.mechanism={s.name!r} has no decoder: the whole-run audit "
                       "cannot whiten its noise")
    lmat = np.asarray(dec(s), np.float64)[:sigma.size]
    cov = lmat @ lmat.T
  return sigma[:, None] * cov * sigma[None, :]


def whitened_scores(cross: np.ndarray, cov: np.ndarray, start: int = 0) -> np.ndarray:
  """``[n]`` the Gaussian likelihood-ratio statistic of each trial's releases from
  round ``start`` on, ``sum_ab (Sigma^{-1})_ab <w_a - w_{a-1}, m_b>`` (a, b >= start)
  from ``cross [n, T, T]`` (:func:`_run_fn`'s ``X``) and the noise covariance
  ``Sigma [T, T]`` (:func:`noise_covariance`) of those rounds.

  Round a's increment is its mean (the target's in-or-out contribution ``+- m_a / 2``
  about the other clients' and the midpoint) plus noise ``sigma_a (L Z)_a``,
  independent across coordinates and correlated across rounds by ``Sigma``. The
  Neyman-Pearson test of the two means whitens by ``Sigma^{-1/2}`` and projects:
  ``<Sigma^{-1/2} X, Sigma^{-1/2} M> = sum_ab (Sigma^{-1})_ab <x_a, m_b>``. For
  independent rounds it is ``sum_a <x_a, m_a> / sigma_a^2``; for tree aggregation,
  whose rounds' noise ``N(n) - N(n-1)`` shares nodes (the sum of rounds 1 and 2 holds
  one node, each round two or more), weighting the rounds as independent reads
  mostly the noise the rounds share and cancel."""
  prec = np.linalg.pinv(cov[start:, start:], hermitian=True)
  return np.einsum("nab,ab->n", cross[:, start:, start:], prec)


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
  # A steady canary (one label, input scale 10): its update keeps one direction from
  # round to round, so the rounds' evidence adds up and the noise the rounds share
  # (correlated mechanisms) cancels in the whitened statistic.
  pair = _audit._canary(setup, options, "client", "replace_one", None, steady=True)  # pylint: disable=protected-access
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
  fn = _run_fn(setup.model, setup.round_cfg, int(target),
               dropped_round(setup) if options.variant == "band_state_dropped" else -1)
  mask = v != 0
  step = int(options.lanes_per_call) or max(1, min(seeds.size, 256))
  cross, norms, gain = [], [], None
  for idx, kept in _audit._chunks(seeds.size, step):  # pylint: disable=protected-access
    args = _lane_args(cfg, setup, planned, seeds[idx], bits[idx], noise, clip)
    if gain is None:
      gain = _gain(setup, params, pair, args, int(target), np.asarray(mask))
    x, m = fn(params, pair, args, mask, np.float32(gain))
    cross.append(np.asarray(x)[:kept])
    norms.append(np.asarray(m)[:kept])
  cross = np.concatenate(cross).astype(np.float64)                   # [n, T, T]
  norms = np.concatenate(norms).astype(np.float64)                   # [n, T]
  # The whole-run likelihood ratio, whitened by the planned noise's covariance across
  # rounds, the same from each later round on (a fault from round s on: the rounds
  # before it only add their noise), then each round on its own (the projection on
  # its unit direction).
  cov = noise_covariance(setup.round_cfg, sigma)
  per_round = np.diagonal(cross, axis1=1, axis2=2) / np.maximum(norms, 1e-30)
  scores = np.concatenate([np.stack([whitened_scores(cross, cov, s) for s in range(len(sigma))]),
                           per_round.T])
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
