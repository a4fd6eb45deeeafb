"""The whole-run audit: a canary inserted once and observed in every round's release.

:func:`fedjax_dp.audit.audit` audits ONE round (the first) against the certificate
after it. The run certifies all T rounds, and a fault in a later round (a schedule
that lowers the noise late, a correlated mechanism whose later rows are wrong) is
invisible to it. :func:`audit_run` audits the T-round mechanism: each trial (lane) is
a whole run of T rounds of :func:`fedjax_dp.training.engine.round_step` -- the run's
own noise schedule, clip, learning rates and correlated-noise state carried from
round to round -- on the ``in`` or the ``out`` dataset (a fair coin), with its own
seed, so its own cohorts and noise. The adversary sees every round's release and
scores the run: the global model under central placement; under upload and step
placement each client's noisy upload, of which the attack reads the target's own
(recomputed with the keys the engine gives that client in that round, at the model
the round starts from), in the rounds whose cohort holds it. Its lower bound is
compared with the run's certified epsilon after T rounds (worst client, the run's own
accountant). The rounds are planned by the run's own pure host functions
(:mod:`fedjax_dp.audit.run_host`): once for an open-loop run with a fixed clip, or,
where the plan follows the releases (the private median's clip bound, a schedule
reading the clients' validation score), lane by lane from each trial's own releases.

The canary is the plan's unit (one example under an example-level bound, all of the
target's examples under a client-level one; add/remove for Poisson minibatches) on
the quietest input feature (:func:`fedjax_dp.audit.audit.quietest_feature`), steady
(one label, input scale 10, so its update keeps one direction from round to round):
no other client's gradient touches that feature's first-layer weights at any model,
so each round's release on those weights moves by the target's own (clipped)
contribution, when its cohort (or minibatch) draws it, and by the noise -- whatever
the other clients did (inclusion-aware across rounds). The adversary takes the
release about the midpoint of the target's two noiseless contributions at the model
the round starts from (the previous release, which it sees), for central placement
scaled by the target's aggregation
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
  noise is too small stands out, whatever the others (a late fault);
* ``mixture from round s`` (central noise under a random rule, independent Gaussian
  noise): the exact likelihood ratio of rounds s .. T when the adversary does not see
  whether a round's cohort holds the target (:func:`mixture_scores`). The projection
  weighs a round that left the target out like one that holds it, so where the
  rounds' noise differs by orders of magnitude (the private median's bound under its
  count noise) the quietest rounds' noise drowns every other trial's evidence.

so ``2 T`` attacks share the significance (``3 T`` with the mixtures; Bonferroni).

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

Laplace noise replaces each round's projection by its exact log-likelihood ratio
(:func:`_scores`). Scope: every mechanism the registries accept but those without a
claim to test (no noise; ``server.clip_rule='median'``, certified inf) and a schedule
that reads the test metrics (the audit does not compute them), each refused in one
line. Under a closed loop the trials' runs may certify different epsilons: the
lower bound is compared with the largest.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.audit import estimators, run_host
from fedjax_dp.audit.run_host import late_start
from fedjax_dp.host import server
from fedjax_dp.privacy import clip_modes, correlated
from fedjax_dp.privacy.schedules import get_schedule
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine
from fedjax_dp.training import rounds as rounds_lib

_audit = importlib.import_module("fedjax_dp.audit.audit")

RUN_VARIANTS = ("none", "noise_div10", "no_clip", "late_noise_div10", "band_state_dropped")
LOCAL = ("upload", "step")
REGRESSION_LABEL = 1e8  # a regression canary's label (audit_run: it keeps the canary pulling)  # placements whose release is each client's noisy upload
__all__ = ["RUN_VARIANTS", "Releases", "audit_run", "dropped_round", "late_start",
           "mixture_scores", "noise_covariance", "whitened_scores"]


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


def _check(cfg, setup, options) -> None:
  privacy = setup.privacy
  if options.variant not in RUN_VARIANTS:
    raise ValueError(f"audit.variant: unknown {options.variant!r} for the whole-run "
                     f"audit; known: {RUN_VARIANTS}")
  if privacy.placement == "none" or privacy.noiseless:
    raise ValueError("the run adds no noise: nothing to audit")
  if privacy.uncertifiable:
    raise ValueError("server.clip_rule='median' has certified epsilon inf (no sensitivity "
                     "bound): there is no certificate to audit")
  if (privacy.validation != "clients"
      and not get_schedule(cfg.schedule.name).open_loop(dict(cfg.schedule))):
    raise ValueError(f"schedule.name={cfg.schedule.name!r} reads the test metrics, which "
                     "the whole-run audit does not compute: it needs an open-loop schedule "
                     "or schedule.validation='clients'")
  for name in ("noise_scale", "claimed_sensitivity", "aggregation", "cohort"):
    if getattr(options, name) is not None:
      raise ValueError(f"audit.{name} is a per-round option (fedjax_dp.audit.audit)")


def _clean_config(ccfg: client_lib.ClientConfig, n_max: int) -> client_lib.ClientConfig:
  """The adversary's noiseless client: Poisson minibatches take every example, so the
  canary's direction does not hang on one draw (the per-round audit's rule)."""
  quiet = dataclasses.replace(ccfg, noise_placement="none")
  if ccfg.minibatch == "poisson":
    quiet = dataclasses.replace(quiet, batch_size=int(n_max))
  return quiet


def _client(model, ccfg):
  """``fn(w, pair, a, noise, target) -> [P]``: client ``target``'s upload in round ``a``
  on dataset ``a.data_id`` with its noise, keyed as the engine keys it in that round
  (``client_keys(seed, round, id, stream)``)."""
  def fn(w, pair, a, noise, target):
    d = jax.tree_util.tree_map(lambda x: x[a.data_id, target], pair)
    key = engine.client_keys(a.seed, a.round, jnp.reshape(target, (1,)), a.stream)[0]
    hp = client_lib.ClientHParams(lr=a.lr, clip=a.clip, step_noise=noise,
                                  upload_noise=noise, count=d.mask.sum())
    return _audit._flat(client_lib.client_update(model, ccfg, w, d.x, d.y, d.mask, key,  # pylint: disable=protected-access
                                                 hp).params)
  return fn


@functools.lru_cache(maxsize=8)
def _round_fn(model, rcfg, target: int, n_max: int, drop_at: int = -1):
  """Jitted ``fn(state [L], pair, args [L], cols, gain, val_std [L])``: one round of
  every lane, returning ``(state, x [L, M], m [L, M], rest [L, M], seen [L], metrics,
  val [L])``.

  ``m`` is the target's noiseless ``in`` minus ``out`` upload at the model the round
  starts from (the previous release, which the adversary sees) on the coordinates
  ``cols`` that no other client moves; ``rest`` the release's mean about that
  midpoint in a round whose cohort leaves the target out (central placement;
  zeros for upload and step placement); ``x`` the release about the midpoint of the
  two: central placement, the new global model's increment minus ``gain`` times the
  midpoint's (the target's aggregation weight and the server's step); upload and step
  placement, the target's own noisy upload (keyed as the engine keys it) minus the
  midpoint. ``seen``: the target is in the lane's cohort. ``val`` is the round's
  released validation score (std ``val_std``). ``drop_at >= 0``
  (``band_state_dropped``): the carried noise state is zeroed before that round."""
  clean = functools.partial(_client(model, _clean_config(rcfg.client, n_max)),
                            target=jnp.int32(target))
  upload = functools.partial(_client(model, rcfg.client), target=jnp.int32(target))
  local = rcfg.client.noise_placement in LOCAL

  def lane(state, pair, a, cols, gain, val_std):
    if drop_at >= 0:  # the fault: BandMF's w_{t-1} .. w_{t-b+1} lost at round b + 1
      state = state._replace(noise=jax.tree_util.tree_map(
          lambda x: jnp.where(a.round == drop_at, jnp.zeros_like(x), x), state.noise))
    w = rounds_lib.model_params(state)
    prev = _audit._flat(w)  # pylint: disable=protected-access
    zero = jnp.zeros((), jnp.float32)
    c_in = clean(w, pair, a._replace(data_id=jnp.int32(1)), zero)
    c_out = clean(w, pair, a._replace(data_id=jnp.int32(0)), zero)
    mid = 0.5 * (c_in + c_out)
    on = (a.idx == target) & (a.sel_mask > 0)
    new, metrics = engine.round_step(model, rcfg, state, pair, a)
    if local:
      x = upload(w, pair, a, a.noise[jnp.argmax(on)]) - mid
    else:
      x = _audit._flat(rounds_lib.model_params(new)) - prev - gain * (mid - prev)  # pylint: disable=protected-access
    val = engine.selected_accuracy(model, rounds_lib.model_params(new), pair, a, val_std)[0]
    # Where the cohort leaves the target out, x is the noise about -gain (mid - prev):
    # not 0 once the model has learned one side of the pair (its update vanishes).
    rest = jnp.zeros_like(prev) if local else -gain * (mid - prev)
    return (new, x[cols], (c_in - c_out)[cols], rest[cols], jnp.any(on), metrics._asdict(),
            val)
  return jax.jit(jax.vmap(lane, in_axes=(0, None, 0, None, None, 0)))


@functools.lru_cache(maxsize=8)
def _clean_fn(model, ccfg, n_max: int):
  """Jitted :func:`_client` of the adversary's noiseless client (:func:`_clean_config`)."""
  return jax.jit(_client(model, _clean_config(ccfg, n_max)))


@functools.lru_cache(maxsize=8)
def _moved_fn(model, rcfg, target: int, n_max: int):
  """Jitted ``fn(params, pair, a) -> (w [P], u [P])``: the global model after one
  round ``a`` from ``params`` and the target's noiseless update in it (:func:`_gain`)."""
  clean = _client(model, _clean_config(rcfg.client, n_max))

  @jax.jit
  def moved(params, pair, a):
    new, _ = engine.round_step(model, rcfg, rounds_lib.carried_params(rcfg, params), pair, a)
    return (_audit._flat(rounds_lib.model_params(new)),  # pylint: disable=protected-access
            clean(params, pair, a, jnp.float32(0.0), jnp.int32(target)))
  return moved


def _columns(setup, params, pair, target: int, a) -> np.ndarray:
  """The coordinates the attack reads (at the initial model). Central placement: those
  the canary moves and no other client's update does: there the aggregate moves by
  the target's own contribution and the noise, whatever the other clients (or a
  hidden cohort) did. Upload and step placement release the target's own upload,
  which no other client touches: every coordinate the canary moves (Poisson
  minibatches: those the target's other examples leave alone, so that which of them
  a step drew does not move the projection, as in the per-round audit)."""
  n_max = int(pair.x.shape[2])
  clean = _clean_fn(setup.model, setup.round_cfg.client, n_max)
  zero = jnp.zeros((), jnp.float32)
  one, out = a._replace(data_id=np.int32(1)), a._replace(data_id=np.int32(0))
  c_out = np.asarray(clean(params, pair, out, zero, np.int32(target)))
  v = np.asarray(clean(params, pair, one, zero, np.int32(target))) - c_out
  flat = np.asarray(_audit._flat(params))  # pylint: disable=protected-access
  moved = np.zeros(flat.shape, bool)
  if setup.round_cfg.client.noise_placement not in LOCAL:
    for i in range(int(pair.counts.shape[1])):
      if i != int(target) and int(pair.counts[0, i]) > 0:
        moved |= np.asarray(clean(params, pair, out, zero, np.int32(i))) != flat
  elif setup.privacy.poisson_steps and np.any((v != 0) & (c_out == flat)):
    moved = c_out != flat
  cols = np.flatnonzero((v != 0) & ~moved)
  if cols.size == 0:
    raise ValueError("the canary moves no coordinate that the other clients leave alone: "
                     "nothing to audit (the data has no unused input feature)")
  return cols


def _gain(setup, params, pair, a, target: int, cols: np.ndarray) -> float:
  """The factor ``gamma`` by which the target's own update moves the global model on
  the canary's coordinates (its aggregation weight times the server's step): from
  one noiseless round of a lane whose cohort holds the target, in and out
  (``gamma = <w_in - w_out, u_in - u_out> / ||u_in - u_out||^2``, ``u`` the target's
  updates). Public: the aggregation rule and the server step are the mechanism's.
  Upload and step placement release the target's upload itself: 1."""
  rcfg = setup.round_cfg
  if rcfg.client.noise_placement in LOCAL:
    return 1.0
  has = np.flatnonzero(np.any((np.asarray(a.idx) == target) & (np.asarray(a.sel_mask) > 0),
                              axis=1))
  if has.size == 0:
    raise ValueError("no trial's first round selects the canary's client: nothing to audit")
  one = jax.tree_util.tree_map(lambda x: None if x is None else np.asarray(x)[has[0]], a)
  one = one._replace(central_noise=np.float32(0.0), count_noise=(
      None if one.count_noise is None else np.float32(0.0)))
  moved = _moved_fn(setup.model, rcfg, target, int(pair.x.shape[2]))
  (w1, u1), (w0, u0) = (moved(params, pair, one._replace(data_id=np.int32(bit)))
                        for bit in (1, 0))
  du = np.asarray(u1 - u0, np.float64)[cols]
  dw = np.asarray(w1 - w0, np.float64)[cols]
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


def _weights_sigma(setup, rnd: run_host.Round, target: int) -> np.ndarray:
  """``[L]`` the planned noise scale of the target's release in this round (the
  attack's weights; the variant's fault is not in them): the server's noise (central),
  the target's upload noise (upload), times the local steps' learning rates' norm
  (step placement: each step adds the noise, scaled by its rate)."""
  sigma = rnd.sigma[:, target].astype(np.float64)
  if setup.privacy.placement == "step":
    sigma = sigma * np.linalg.norm(np.asarray(rnd.args.lr, np.float64), axis=-1)
  return np.where(sigma > 0, sigma, 1.0)


class Releases(NamedTuple):
  """What the adversary reads of ``n`` trials' T rounds (:func:`_lanes`)."""

  x: np.ndarray      # [n, T, M] the release about the midpoint of the target's two
  m: np.ndarray      # [n, T, M] the target's noiseless in-minus-out update
  rest: np.ndarray   # [n, T, M] the release's mean when the cohort leaves it out
  seen: np.ndarray   # [n, T] which rounds the adversary sees the target's release in
  sigma: np.ndarray  # [n, T] the planned noise
  gain: float        # the target's aggregation weight times the server's step


def _hidden(setup) -> bool:
  """Central noise under a random rule: the adversary never sees the cohort."""
  return setup.privacy.placement == "central" and not setup.privacy.rule.deterministic


def _inclusion(setup, target: int, rounds: int) -> np.ndarray:
  """``[T]`` the probability that round t's (hidden) cohort holds the target: the
  rule's per-round rate (``privacy.q``); under a rule with groups (``cyclic_poisson``)
  its rate in the target's eligible rounds ``t % period == g_target`` and 0 in the
  others. Public: the rule's, drawn without data."""
  privacy = setup.privacy
  if privacy.groups is None:
    return np.full(rounds, float(privacy.q))
  eligible = np.arange(rounds) % int(privacy.period) == int(privacy.groups[target])
  return np.where(eligible, float(privacy.rule_rate), 0.0)


def mixture_scores(rel: Releases, q: np.ndarray) -> np.ndarray:
  """``[n, T]`` each round's exact log-likelihood ratio, in against out, of a central
  release under a hidden cohort with independent Gaussian noise: the round holds the
  target with probability ``q_t``, and then moves by ``+gain m / 2`` (in) or
  ``-gain m / 2`` (out) about the midpoint, else by ``rest``, plus noise of std
  ``sigma`` per coordinate:
  ``log(q N(x; +g m/2) + (1 - q) N(x; rest)) - log(q N(x; -g m/2) + (1 - q) N(x; rest))``.

  The projection ``<x, m> / sigma^2`` is this ratio only when the target is in every
  round: a round that leaves it out adds noise of scale ``|m| / sigma`` to it, and
  where the rounds' noise differs by orders of magnitude (the private median's count
  noise moves its bound ``S_t`` by factors of 10^3), the quietest rounds' noise
  outweighs every other trial's evidence. Here a left-out round scores about 0
  whatever its noise."""
  def log_gauss(mu):  # log N(x; mu) + |x|^2 / (2 sigma^2): the |x|^2 terms cancel
    return (2.0 * np.sum(rel.x * mu, 2) - np.sum(mu * mu, 2)) / (2.0 * rel.sigma ** 2)
  half = 0.5 * rel.gain * rel.m
  with np.errstate(divide="ignore"):
    lq, l1 = np.log(q)[None], np.log1p(-q)[None]
  absent = l1 + log_gauss(rel.rest)
  out = (np.logaddexp(lq + log_gauss(half), absent)
         - np.logaddexp(lq + log_gauss(-half), absent))
  return np.where(rel.seen & (q[None] > 0), out, 0.0)


def _scores(setup, rel: Releases, q: np.ndarray) -> np.ndarray:
  """``[A, n]`` the attacks' scores of the trials (:class:`Releases`; ``q [T]`` the
  target's inclusion probability per round, :func:`_inclusion`).

  Gaussian noise: the whole-run likelihood ratio, whitened by the noise's covariance
  across rounds (correlated mechanisms: the decoder's, :func:`noise_covariance`;
  independent noise: each round weighted by ``1 / sigma^2``), the same from each later
  round on (a fault from round s on: the rounds before it only add their noise), then
  each round on its own (projected on its unit direction); under a hidden cohort with
  independent noise also the exact mixture ratio (:func:`mixture_scores`) from each
  round s on. Laplace noise: the same with each round's exact log-likelihood ratio
  ``sum_j |x_j + m_j/2| - |x_j - m_j/2|`` (times its scale) in place of the projection."""
  x = np.where(rel.seen[:, :, None], rel.x, 0.0)
  m, sigma = rel.m, rel.sigma
  norms = np.maximum(np.linalg.norm(m, axis=2), 1e-30)
  rounds = x.shape[1]
  if setup.privacy.mechanism == "laplace":
    own = np.sum(np.abs(x + 0.5 * m) - np.abs(x - 0.5 * m), axis=2)
    whole = [np.sum(own[:, s:] / sigma[:, s:], axis=1) for s in range(rounds)]
    return np.concatenate([np.stack(whole), own.T])
  cross = np.einsum("nam,nbm->nab", x, m)
  own = np.diagonal(cross, axis1=1, axis2=2)
  if setup.round_cfg.correlated is not None:
    cov = noise_covariance(setup.round_cfg, sigma[0])
    whole = [whitened_scores(cross, cov, s) for s in range(rounds)]
  else:
    whole = [np.sum(own[:, s:] / sigma[:, s:] ** 2, axis=1) for s in range(rounds)]
    if _hidden(setup):
      mix = mixture_scores(rel, q)
      whole += [np.sum(mix[:, s:], axis=1) for s in range(rounds)]
  return np.concatenate([np.stack(whole), (own / norms).T])


def _target(cfg, setup, options) -> int:
  """The canary's client: ``options.target``; else the first client of eligibility
  group 0 (``cyclic_poisson``), or under a deterministic rule the first client the
  run's first round selects, or client 0."""
  privacy = setup.privacy
  if options.target is not None:
    if not 0 <= options.target < setup.num_clients:
      raise ValueError(f"audit.target must be in [0, {setup.num_clients}), got "
                       f"{options.target}")
    return int(options.target)
  if privacy.rule.deterministic:  # top-K may never select client 0
    idx, sel = server.cohort(run_host.spec_of(cfg, setup), 0)
    return int(np.asarray(idx)[np.asarray(sel) > 0][0])
  if privacy.groups is not None:
    return int(np.flatnonzero(np.asarray(privacy.groups) == 0)[0])
  return 0


def _probe(setup, params, pair, target: int, first: run_host.Round):
  """``(cols, gain)``: the attack's coordinates (:func:`_columns`) and the target's
  gain (:func:`_gain`), read from the first chunk's round 1 and kept for the others
  (both are the mechanism's, not a trial's: each new chunk would only compile them
  again)."""
  cols = _columns(setup, params, pair, target, jax.tree_util.tree_map(
      lambda v: None if v is None else np.asarray(v)[0], first.args))
  return cols, np.float32(_gain(setup, params, pair, first.args, target, cols))


def _lanes(setup, plans, pair, params, target, drop_at, probe=None):
  """Runs the lanes' T rounds; returns ``(Releases, the largest planned noise scale of
  round 1, probe)`` (``probe``: :func:`_probe`'s, computed here when not given)."""
  rcfg, lanes = setup.round_cfg, int(plans.bits.size)
  first = plans.plan(0)
  cols, gain = probe if probe is not None else _probe(setup, params, pair, target, first)
  fn = _round_fn(setup.model, rcfg, target, int(pair.x.shape[2]), drop_at)
  state = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (lanes,) + jnp.shape(v)),
                                 rounds_lib.carried_params(rcfg, params))
  # A deterministic rule's cohorts are public, and upload/step placement releases the
  # target's upload only when it is selected; a random rule's central draw stays
  # hidden (inclusion-aware: the increment is scored every round).
  hidden = _hidden(setup)
  xs, ms, rests, seen, sigma, rnd = [], [], [], [], [], first
  for t in range(plans.num_rounds):
    rnd = rnd if t == 0 else plans.plan(t)
    if rnd is None:  # every trial's run has stopped (a closed loop's budget)
      break
    state, x, m, r, on, metrics, val = fn(state, pair, rnd.args, jnp.asarray(cols), gain,
                                          jnp.asarray(rnd.val_std, jnp.float32))
    plans.record(t, jax.device_get(metrics), np.asarray(val))
    seen.append(rnd.active & (True if hidden else np.asarray(on)))
    xs.append(np.asarray(x, np.float64))
    ms.append(np.asarray(m, np.float64))
    rests.append(np.asarray(r, np.float64))
    sigma.append(_weights_sigma(setup, rnd, target))
  rel = Releases(np.stack(xs, 1), np.stack(ms, 1), np.stack(rests, 1), np.stack(seen, 1),
                 np.stack(sigma, 1), float(gain))
  return rel, float(np.max(first.sigma)), (cols, gain)


def audit_run(cfg, options=None) -> _audit.AuditResult:
  """Audits the whole T-round run ``cfg`` configures (module docstring).

  Args:
    cfg: a run config.
    options: :class:`fedjax_dp.audit.AuditOptions` (``variant`` one of
      :data:`RUN_VARIANTS`; ``trials``, ``significance``, ``seed``, ``target``,
      ``canary_scale``, ``lanes_per_call`` as for the per-round audit).

  Returns:
    :class:`fedjax_dp.audit.AuditResult` with ``epsilon_certified`` the run's
    certified epsilon after its T rounds (closed loops: the largest of the trials'
    runs) and ``rounds`` = T.

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
  privacy = setup.privacy
  drop_at = dropped_round(setup) if options.variant == "band_state_dropped" else -1
  target = _target(cfg, setup, options)
  level = "client" if privacy.placement == "central" or privacy.level == "client" \
      else "example"
  relation = "add_remove" if privacy.poisson_steps else "replace_one"
  options = dataclasses.replace(options, target=target, sparse_canary=True)
  hint = clip_modes.get(cfg.client.clip_mode).canary
  if (level == "example" and options.canary_scale is None
      and hint.example_scale > clip_modes.Canary().example_scale):
    # A bound on the client's model or update reached by one example (param_l2,
    # update_l2 at upload placement): the canary must dominate the client's update,
    # at the mode's own scale (the per-round audit's), not the steady 10.
    options = dataclasses.replace(options, canary_scale=float(hint.example_scale))
  params = setup.model.init(jax.random.PRNGKey(int(cfg.seed)))
  # A steady canary (one label, input scale 10, on the quietest feature): its update
  # keeps one direction from round to round, so the rounds' evidence adds up and the
  # noise the rounds share (correlated mechanisms) cancels in the whitened statistic.
  pair = _audit._canary(setup, options, level, relation, None, steady=True)  # pylint: disable=protected-access
  if setup.model.is_regression:
    # A regressor fits a steady canary: once the (noisy) model's prediction on the
    # scaled input dwarfs the label, the in (x, y) and out (-x, y) gradients
    # 2 (w.x -+ y) (+-x) point the same way and clip to the same update, so the canary
    # stops moving the release after round 1. A label far beyond any prediction keeps
    # them opposite (-2 y x and 2 y x) in every round.
    rows = 1 if level == "example" else int(setup.data.counts[target])
    pair = pair._replace(y=pair.y.at[:, target, :rows].set(REGRESSION_LABEL))
  seeds, bits = _audit._trials(options.seed, int(options.trials))  # pylint: disable=protected-access
  step = int(options.lanes_per_call) or max(1, min(seeds.size, 256))
  parts, certified, rounds, noise, probe = [], [], 0, 0.0, None
  for idx, kept in _audit._chunks(seeds.size, step):  # pylint: disable=protected-access
    plans = run_host.make(cfg, setup, seeds[idx], bits[idx], options.variant)
    rel, noise, probe = _lanes(setup, plans, pair, params, target, drop_at, probe)
    parts.append(_scores(setup, rel, _inclusion(setup, target, rel.x.shape[1]))[:, :kept])
    certified.append(plans.certified_epsilon())
    rounds = max(rounds, rel.x.shape[1])
  scores = np.concatenate(parts, axis=1)
  eps = float(max(certified))
  inside = bits.astype(bool)
  est = estimators.best_of(scores[:, inside], scores[:, ~inside], privacy.delta,
                           float(options.significance))
  return _audit.AuditResult(
      epsilon_lower=est.clopper_pearson, epsilon_one_run=est.one_run, epsilon_gdp=est.gdp,
      epsilon_certified=eps, epsilon_certified_run=eps,
      ratio=est.clopper_pearson / eps if eps > 0 else math.inf,
      delta=float(privacy.delta), significance=float(options.significance),
      trials=int(options.trials), trials_in=int(inside.sum()), level=level,
      placement=privacy.placement, mechanism=privacy.mechanism,
      clip_mode=cfg.client.clip_mode, variant=options.variant,
      noise_scale=noise, sensitivity=float(np.max(privacy.sensitivity)),
      rounds=rounds, wall_s=time.time() - t0, relation=relation)
