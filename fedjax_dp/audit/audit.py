"""Empirical privacy audit: canaries in, an empirical lower bound on epsilon out.

The audit runs the engine's own code on pairs of neighbouring datasets and asks how
well an adversary tells them apart from what the mechanism releases. Each trial is
one lane of a vmapped, jitted program: a fair coin decides whether the lane's target
client holds the canary pair's ``in`` or ``out`` dataset, the lane draws its own
noise (its own run seed, keys derived as in every run), and the adversary scores the
release. Lanes are independent trials, so the score distributions of in- and
out-lanes feed the estimators of :mod:`fedjax_dp.audit.estimators` exactly as they
assume.

What is released and which canaries (the privacy unit the accountant charges):

=================  ================================  =====================================
placement          release seen by the adversary     canary pair (target client t)
=================  ================================  =====================================
upload, step       every selected client's upload    per-example clipping: ONE example of
                   (the server sees them; the         t, input x scaled by canary_scale,
                   accountant charges each one)       ``in`` = (x, y), ``out`` = (-x, y):
                                                      example-level canaries, replace-one
                                                      (Steinke, Nasr & Jagielski 2023)
central            the new global model (round_step  update/param clipping: ALL of t's
                   with the server's noise)           examples changed so: client-level
                                                      canaries, replace-one client
                                                      (Andrew et al. 2024)
=================  ================================  =====================================

Flipping the input makes the two clipped gradients (nearly) opposite, so the pair
uses most of the 2C a replace-one pair may move a clipped sum; the scale makes the
gradients reach the clip, so a mechanism without clipping moves much further.

Upload/step placements run :func:`fedjax_dp.client.client_update` for the target and
one reference client with the engine's keys (:func:`fedjax_dp.engine.client_keys`);
central placement runs :func:`fedjax_dp.engine.round_step` itself, with the config's
selection drawn per lane by :func:`fedjax_dp.engine.select_clients`.

The attack is white-box and knows everything but the coin: it computes the noiseless
releases of both datasets (the mechanism run with zero noise) and projects the
observed release on their difference ``v`` -- the Neyman-Pearson test for Gaussian
noise, so a correct Gaussian mechanism is audited nearly tightly. For client
releases a second attack projects the target's upload minus the reference client's
(it cancels noise shared between clients); the two attacks share the significance
(Bonferroni).

What is compared: the release of ONE round (the first, from the initial model) at
the per-round noise the configured run would add, against the certified epsilon of
that one round (:class:`fedjax_dp.privacy.plan.PrivacyPlan`, worst client). The
certified epsilon of the whole run (``rounds`` rounds) is reported beside it. A
correct mechanism keeps ``epsilon_lower <= epsilon_certified`` with probability at
least ``1 - significance``; a broken one (noise too small, clipping off, noise
shared between clients, a sensitivity that does not hold) shows up as a lower bound
above the certified epsilon once enough trials are run (with perfect separation
the bound is about 4.5 at 1000 trials; it grows like ``log(trials)``).

Variants (:data:`VARIANTS`) break the mechanism on purpose, while the certified
epsilon stays that of the correct configuration, to show that the audit catches
them: ``noise_div10`` (the engine adds a tenth of the planned noise), ``no_clip``
(clipping threshold 1e6), ``shared_noise_key`` (every client draws its noise with
the same key). ``noise_scale`` and ``claimed_sensitivity`` run a mechanism with an
explicitly given (possibly wrong) noise scale and certify it with an explicitly
given sensitivity, to audit a sensitivity claim independently of
:mod:`fedjax_dp.privacy.plan`'s current numbers; with central noise, ``aggregation``
and ``cohort`` run another server aggregation on one fixed cohort (certified without
selection amplification), which audits B3's claim for a small Poisson draw.
Deterministic selection (round robin) is certified from the realised cohorts, which
are public: a central adversary reads them too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import client as client_lib
from fedjax_dp import engine
from fedjax_dp.audit import estimators
from fedjax_dp.data.federated import FederatedData

PyTree = Any
VARIANTS = ("none", "noise_div10", "no_clip", "shared_noise_key")
NO_CLIP = 1e6  # the 'no_clip' variant's threshold: no gradient here comes near it
AUDIT_SEED_TAG = 0xA0D17  # the coins' host RNG: default_rng([seed, AUDIT_SEED_TAG])


@dataclasses.dataclass(frozen=True)
class AuditOptions:
  """How to audit.

  Attributes:
    trials: lanes (independent trials); each is in or out by a fair coin.
    significance: failure probability of the lower bound (``1 - confidence``).
    seed: seeds the coins and the lanes' run seeds.
    variant: one of :data:`VARIANTS`.
    noise_scale: run the mechanism with this noise scale (std, or Laplace b) instead
      of the plan's (every client for upload/step, the server's for central).
    claimed_sensitivity: certify with this sensitivity instead of the plan's.
    canary_scale: factor on the canary inputs, so their gradients reach the clip.
    target: the client holding the canary.
    sparse_canary: canary inputs on one feature (:func:`canary_pair` ``sparse``), so
      the pair's gradient difference is concentrated in few coordinates; the default
      for the Laplace mechanism, whose test needs that concentration.
    lanes_per_call: trials per compiled call (memory); 0 chooses from the data size.
    aggregation: central placement only: run the server's aggregation with this rule
      instead of the config's, certified with ``noise_scale`` and
      ``claimed_sensitivity`` (both required): audits a combination the plan refuses,
      e.g. B3 (Poisson selection, central noise, ``'normalized'`` aggregation) with the
      certificate the plan gave it before the fix.
    cohort: central placement only: every lane selects exactly these client ids (they
      must include ``target``) instead of drawing the config's selection. The
      adversary then knows the cohort, so the certificate is that of one round
      WITHOUT selection amplification (``sampling='full'``): this audits the
      sensitivity claim for one cohort the rule can draw (a claim the plan makes
      for every cohort).
  """

  trials: int = 1000
  significance: float = 0.05
  seed: int = 0
  variant: str = "none"
  noise_scale: float | None = None
  claimed_sensitivity: float | None = None
  canary_scale: float = 100.0
  target: int = 0
  sparse_canary: bool | None = None
  lanes_per_call: int = 0
  aggregation: str | None = None
  cohort: tuple[int, ...] | None = None

  def validate(self) -> None:
    """Raises ValueError naming the bad option."""
    if int(self.trials) < 10:
      raise ValueError(f"audit.trials must be >= 10, got {self.trials}")
    if not 0.0 < float(self.significance) < 0.5:
      raise ValueError(f"audit.significance must be in (0, 0.5), got {self.significance}")
    if self.variant not in VARIANTS:
      raise ValueError(f"audit.variant: unknown {self.variant!r}; known: {VARIANTS}")
    if self.noise_scale is not None and not float(self.noise_scale) >= 0:
      raise ValueError(f"audit.noise_scale must be >= 0, got {self.noise_scale}")
    if self.claimed_sensitivity is not None and not float(self.claimed_sensitivity) > 0:
      raise ValueError(f"audit.claimed_sensitivity must be > 0, got {self.claimed_sensitivity}")
    if not float(self.canary_scale) > 0:
      raise ValueError(f"audit.canary_scale must be > 0, got {self.canary_scale}")
    if int(self.lanes_per_call) < 0:
      raise ValueError(f"audit.lanes_per_call must be >= 0, got {self.lanes_per_call}")
    if self.aggregation is not None:
      if self.aggregation not in engine.AGGREGATIONS:
        raise ValueError(f"audit.aggregation: unknown {self.aggregation!r}; known: "
                         f"{engine.AGGREGATIONS}")
      if self.noise_scale is None or self.claimed_sensitivity is None:
        raise ValueError("audit.aggregation needs audit.noise_scale and "
                         "audit.claimed_sensitivity: the plan certifies the config's "
                         "aggregation, not this one")
    if self.cohort is not None and int(self.target) not in tuple(self.cohort):
      raise ValueError(f"audit.cohort {tuple(self.cohort)} must include audit.target "
                       f"{self.target}")


class AuditResult(NamedTuple):
  """What an audit measured (all epsilons at ``delta``).

  Attributes:
    epsilon_lower: empirical lower bound (Clopper-Pearson, the best attack), valid
      with confidence ``1 - significance``.
    epsilon_one_run: Steinke et al.'s one-run lower bound on the same trials.
    epsilon_gdp: Andrew et al.'s Gaussian-DP estimate (assumes a Gaussian trade-off).
    epsilon_certified: certified epsilon of the audited release (one round).
    epsilon_certified_run: certified epsilon of the configured run (``rounds``).
    ratio: ``epsilon_lower / epsilon_certified``; above 1 the certificate is broken.
  """

  epsilon_lower: float
  epsilon_one_run: float
  epsilon_gdp: float
  epsilon_certified: float
  epsilon_certified_run: float
  ratio: float
  delta: float
  significance: float
  trials: int
  trials_in: int
  level: str
  placement: str
  mechanism: str
  clip_mode: str
  variant: str
  noise_scale: float
  sensitivity: float
  rounds: int
  wall_s: float

  def to_dict(self) -> dict[str, Any]:
    return dict(self._asdict())


def _flat(tree: PyTree) -> jax.Array:
  return jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


def canary_pair(data: FederatedData, target: int, level: str, num_classes: int,
                scale: float, flip_input: bool = True, sparse: bool = False) -> FederatedData:
  """``[2, U, ...]`` data: index 0 holds the ``out`` canary, index 1 the ``in`` one.

  Example level: example 0 of ``target`` has its input x scaled by ``scale``; ``in``
  holds (x, y), ``out`` (-x, y) (or, without ``flip_input``, (x, y + 1 mod classes)):
  a replace-one pair of examples. Client level: every example of ``target`` is
  changed so: a replace-one pair of clients.

  ``sparse``: the canary inputs are ``scale`` times the first basis vector instead
  of scaled data. The first layer's weight gradient ``x (dL/dz)^T`` is then one row,
  so for a linear model the two clipped gradients differ in ``num_classes``
  coordinates only (the bias gradients are equal): the whole L1 budget 2 C of the
  pair lies in a few coordinates, where the Laplace likelihood-ratio test sees it
  (an L1-bounded difference spread over many coordinates is hidden by Laplace
  noise far better than its L1 norm says).
  """
  x, y = np.array(data.x), np.array(data.y)
  n = int(data.counts[target])
  if n < 1:
    raise ValueError(f"audit.target: client {target} holds no examples")
  rows = slice(0, 1) if level == "example" else slice(0, n)
  if sparse:
    basis = np.zeros(x.shape[2:], x.dtype)
    basis.flat[0] = 1.0
    x[target, rows] = basis
  x[target, rows] *= scale
  x_out, y_out = x.copy(), y.copy()
  if flip_input:
    x_out[target, rows] = -x[target, rows]
  else:
    y_out[target, rows] = (y[target, rows] + 1) % num_classes
  stack = lambda a, b: jnp.stack([jnp.asarray(a), jnp.asarray(b)])
  return FederatedData(x=stack(x_out, x), y=stack(y_out, y),
                       counts=stack(data.counts, data.counts), mask=stack(data.mask, data.mask))


def _lanes_per_call(pair: FederatedData, clients: int, requested: int, trials: int) -> int:
  """Lanes per compiled call so that their gathered client data stays near 256 MB."""
  if requested:
    return min(requested, trials)
  per_lane = clients * 4 * int(np.prod(pair.x.shape[2:])) * 4  # data and a few temporaries
  return int(max(1, min(trials, 256e6 // max(per_lane, 1))))


@functools.lru_cache(maxsize=16)
def _client_fn(model, ccfg: client_lib.ClientConfig, ids: tuple[int, ...]):
  """Jitted ``fn(params, pair, lr, clip, noise, seeds [L], bits [L], v, c_in, c_out,
  shared_key) -> scores [L, A]``
  of lanes whose clients ``ids`` release their uploads (cached on the static parts,
  so audits of the same shapes share one compiled program)."""
  ids_arr = np.asarray(ids)

  def lane(params, pair, lr, clip, noise, seed, bit, v, c_in, c_out, shared_key):
    d = jax.tree_util.tree_map(lambda a: a[bit, ids_arr], pair)
    keys = engine.client_keys(seed, jnp.int32(0), jnp.asarray(ids_arr))
    # The broken variant (traced, so it shares the compiled program): one key for all.
    keys = jnp.where(shared_key, jnp.broadcast_to(keys[0], keys.shape), keys)
    hp = client_lib.ClientHParams(lr=jnp.broadcast_to(lr, (len(ids),) + lr.shape),
                                  clip=jnp.broadcast_to(clip, (len(ids),)),
                                  step_noise=noise, upload_noise=noise)
    out = jax.vmap(client_lib.client_update, in_axes=(None, None, None, 0, 0, 0, 0, 0))(
        model, ccfg, params, d.x, d.y, d.mask, keys, hp)
    ups = jax.vmap(_flat)(out.params)
    if ccfg.mechanism == "laplace":
      # Laplace noise: the log-likelihood ratio (times b) of the two noiseless uploads,
      # the Neyman-Pearson test; a projection would see the L2 norm of an L1-bounded
      # difference only.
      scores = [jnp.sum(jnp.abs(ups[0] - c_out) - jnp.abs(ups[0] - c_in))]
    else:
      scores = [jnp.dot(ups[0], v)]
    if len(ids) > 1:  # the target minus a reference client: cancels shared noise
      scores.append(jnp.dot(ups[0] - ups[1], v))
    return jnp.stack(scores)

  return jax.jit(jax.vmap(lane, in_axes=(None, None, None, None, None, 0, 0, None, None,
                                           None, None)))


@functools.lru_cache(maxsize=16)
def _central_fn(model, rcfg: engine.RoundConfig):
  """Jitted ``fn(params, pair, args [L], v) -> scores [L, 1]`` of lanes whose release
  is the new global model of :func:`fedjax_dp.engine.round_step`."""
  def lane(params, pair, args, v):
    new, _ = engine.round_step(model, rcfg, params, pair, args)
    return jnp.dot(_flat(new), v)[None]
  return jax.jit(jax.vmap(lane, in_axes=(None, None, 0, None)))


@functools.lru_cache(maxsize=16)
def _clean_fn(model, ccfg: client_lib.ClientConfig):
  """Jitted ``fn(params, pair, bit, target, lr, clip) -> [P]``: the target's noiseless
  upload on dataset ``bit`` (the adversary's reference)."""
  quiet = dataclasses.replace(ccfg, noise_placement="none")

  def fn(params, pair, bit, target, lr, clip):
    d = jax.tree_util.tree_map(lambda a: a[bit, target], pair)
    key = engine.client_keys(jnp.uint32(0), jnp.int32(0), target[None])[0]
    zero = jnp.zeros((), jnp.float32)
    hp = client_lib.ClientHParams(lr=lr, clip=clip, step_noise=zero, upload_noise=zero)
    return _flat(client_lib.client_update(model, quiet, params, d.x, d.y, d.mask, key,
                                          hp).params)
  return jax.jit(fn)


def audit(cfg, options: AuditOptions = AuditOptions(), *, params: PyTree | None = None,
          pair: FederatedData | None = None) -> AuditResult:
  """Audits one round of the mechanism ``cfg`` configures (see the module docstring).

  Args:
    cfg: a run config (:func:`fedjax_dp.config.base_config` fields).
    options: :class:`AuditOptions`.
    params: the global model the round starts from; default the run's initial model.
    pair: ``[2, U, ...]`` client data, index 0 the ``out`` dataset and 1 the ``in``
      one; default :func:`canary_pair` of the config's data.

  Returns:
    :class:`AuditResult`.

  Raises:
    ValueError: a bad option or a config without noise to audit, naming the field.
    ImportError: jax_privacy is not installed (the message says what to install).
  """
  from fedjax_dp import experiment

  options.validate()
  if not estimators.available():
    raise ImportError(estimators.INSTALL_HINT)
  t0 = time.time()
  setup = experiment.build(cfg)
  plan, model, u = setup.privacy, setup.model, setup.num_clients
  placement = plan.placement
  if placement == "none":
    raise ValueError("privacy.placement='none': no mechanism to audit")
  if options.noise_scale is None and plan.noiseless:
    raise ValueError(f"privacy.epsilon={cfg.privacy.epsilon}: the run adds no noise, "
                     "nothing to audit (set a finite epsilon or audit.noise_scale)")
  if not 0 <= options.target < u:
    raise ValueError(f"audit.target must be in [0, {u}), got {options.target}")
  central = placement == "central"
  for name in ("aggregation", "cohort"):
    if getattr(options, name) is not None and not central:
      raise ValueError(f"audit.{name} needs privacy.placement='central', got {placement!r}")
  if options.cohort is not None:
    fixed_ids = np.unique(np.asarray(options.cohort, np.int64))
    if fixed_ids.min() < 0 or fixed_ids.max() >= u or fixed_ids.size > setup.k_slots:
      raise ValueError(f"audit.cohort {tuple(options.cohort)}: ids must be in [0, {u}) and "
                       f"at most {setup.k_slots} of them")
  if central and options.variant == "shared_noise_key":
    raise ValueError("audit.variant='shared_noise_key' needs client noise "
                     "(privacy.placement upload or step), got 'central'")
  level = "example" if cfg.client.clip_mode in ("per_example_l2", "per_example_l1") else "client"

  # Per-round noise of the configured run (constant schedule over `rounds`), or the
  # explicitly given one; the certificate is for this noise, before any variant.
  client_noise, central_noise = plan.device_noise(plan.noise_scale(int(cfg.rounds)))
  if options.noise_scale is not None:
    client_noise = np.full(u, 0.0 if central else float(options.noise_scale))
    central_noise = float(options.noise_scale) if central else 0.0
  certifier = plan
  if options.claimed_sensitivity is not None:
    certifier = dataclasses.replace(plan, sensitivity=np.full(u, options.claimed_sensitivity))
  if options.cohort is not None:
    # A known cohort: no selection amplification.
    certifier = dataclasses.replace(certifier, selection="all", q=1.0)
  rule = plan.rule
  k_cfg, q_cfg = int(cfg.server.clients_per_round), float(cfg.server.q)

  def cohort(t: int) -> np.ndarray | None:
    # A deterministic rule (round robin) is accounted from the realised cohort; a random
    # rule's draw is part of its amplification and is not passed.
    return rule.sample(u, k_cfg, q_cfg, int(cfg.seed), t) if rule.deterministic else None

  # The audited round is charged as for a client that takes part (the worst client).
  acct = certifier.accountant_step(certifier.accountant_init(), client_noise, central_noise,
                                   selected=np.arange(u) if rule.deterministic else None)
  eps_round = certifier.certified_epsilon(acct)
  acct = certifier.accountant_init()
  for t in range(int(cfg.rounds)):
    acct = certifier.accountant_step(acct, client_noise, central_noise, selected=cohort(t))
  eps_run = certifier.certified_epsilon(acct)

  divide = 10.0 if options.variant == "noise_div10" else 1.0
  engine_client_noise = np.asarray(client_noise, np.float32) / divide
  engine_central_noise = np.float32(central_noise / divide)
  clip = np.float32(NO_CLIP if options.variant == "no_clip" else cfg.client.clip)
  lr = (cfg.client.lr * cfg.client.lr_decay ** np.arange(cfg.client.local_steps)
        ).astype(np.float32)
  if params is None:
    params = model.init(jax.random.PRNGKey(int(cfg.seed)))
  if pair is None:
    sparse = options.sparse_canary
    if sparse is None:
      sparse = plan.mechanism == "laplace"
    pair = canary_pair(setup.data, options.target, level, model.num_classes,
                       options.canary_scale, sparse=bool(sparse))

  # The adversary's direction: the difference of the noiseless releases of the target.
  ccfg = setup.round_cfg.client
  clean = _clean_fn(model, ccfg)
  tid = jnp.int32(options.target)
  c_in, c_out = clean(params, pair, 1, tid, lr, clip), clean(params, pair, 0, tid, lr, clip)
  v = c_in - c_out
  norm = float(jnp.linalg.norm(v))
  if not norm > 0:
    raise ValueError("the canary pair leaves the target's release unchanged: nothing to "
                     "audit (audit.canary_scale or the data)")
  v = v / norm

  rng = np.random.default_rng([int(options.seed), AUDIT_SEED_TAG])
  n = int(options.trials)
  bits = (rng.random(n) < 0.5).astype(np.int32)
  seeds = (np.arange(n, dtype=np.uint64) + np.uint64(n) * np.uint64(options.seed)
           + np.uint64(1)).astype(np.uint32)
  ids = np.asarray([options.target] + ([(options.target + 1) % u] if u > 1 else []))
  rcfg = setup.round_cfg
  if options.aggregation is not None:
    rcfg = dataclasses.replace(rcfg, aggregation=options.aggregation,
                               expected_fraction=float(plan.q))
  if central:
    k_slots = setup.k_slots
    fn = _central_fn(model, rcfg)
    clients = k_slots
  else:
    fn = _client_fn(model, ccfg, tuple(int(i) for i in ids))
    clients = ids.size
  step = _lanes_per_call(pair, clients, int(options.lanes_per_call), n)
  out = []
  for start in range(0, n, step):
    sl = slice(start, min(n, start + step))
    # A constant lane count per call: the last call is padded (and its padding dropped).
    lane_seeds = np.resize(seeds[sl], step)
    lane_bits = np.resize(bits[sl], step)
    if central:
      if options.cohort is not None:
        idx = np.full(k_slots, fixed_ids[0], np.int32)
        idx[:fixed_ids.size] = fixed_ids
        mask = (np.arange(k_slots) < fixed_ids.size).astype(np.float32)
        sel = [(idx, mask)] * step
      else:
        sel = [engine.select_clients(cfg.server.selection, u, cfg.server.clients_per_round,
                                     cfg.server.q, int(s), 0) for s in lane_seeds]
      args = engine.RoundArgs(
          idx=np.stack([s[0] for s in sel]), sel_mask=np.stack([s[1] for s in sel]),
          lr=np.broadcast_to(lr, (step,) + lr.shape), clip=np.full(step, clip, np.float32),
          noise=np.zeros((step, k_slots), np.float32),
          central_noise=np.full(step, engine_central_noise, np.float32),
          server_lr=np.full(step, cfg.server.lr, np.float32),
          round=np.zeros(step, np.int32), seed=lane_seeds, data_id=lane_bits,
          stream=np.zeros(step, np.int32))
      scores = fn(params, pair, args, v)
    else:
      scores = fn(params, pair, lr, clip, engine_client_noise[ids], lane_seeds, lane_bits, v,
                  c_in, c_out, options.variant == "shared_noise_key")
    out.append(np.asarray(scores)[: sl.stop - sl.start])
  scores = np.concatenate(out).T  # [attacks, trials]
  if not central or rule.deterministic:
    # A client outside the lane's cohort releases nothing (the accountant's selection
    # event charges q): the adversary sees the same 'no upload' in and out. A
    # deterministic rule's cohort is public (it is accounted without amplification), so
    # a central adversary may read it too; a random rule's central draw stays hidden.
    chosen = np.zeros((ids.size, n), bool)
    for lane, s in enumerate(seeds):
      idx, sel = engine.select_clients(cfg.server.selection, u, cfg.server.clients_per_round,
                                       cfg.server.q, int(s), 0)
      chosen[:, lane] = [bool(np.any((idx == i) & (sel > 0))) for i in ids]
    visible = np.stack([chosen[0], chosen[0] & chosen[-1]][:scores.shape[0]])
    scores = np.where(visible, scores, np.min(scores) - 1.0)
  inside = bits.astype(bool)
  est = estimators.best_of(scores[:, inside], scores[:, ~inside], plan.delta,
                           float(options.significance))
  noise_scale = float(central_noise if central else np.max(client_noise))
  sens = float(np.max(certifier.sensitivity))
  ratio = est.clopper_pearson / eps_round if eps_round > 0 else math.inf
  return AuditResult(
      epsilon_lower=est.clopper_pearson, epsilon_one_run=est.one_run, epsilon_gdp=est.gdp,
      epsilon_certified=float(eps_round), epsilon_certified_run=float(eps_run),
      ratio=float(ratio), delta=float(plan.delta), significance=float(options.significance),
      trials=n, trials_in=int(inside.sum()), level=level, placement=placement,
      mechanism=plan.mechanism, clip_mode=cfg.client.clip_mode, variant=options.variant,
      noise_scale=noise_scale, sensitivity=sens, rounds=int(cfg.rounds),
      wall_s=time.time() - t0)
