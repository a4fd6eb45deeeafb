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

Upload/step placements run :func:`fedjax_dp.training.client.client_update` for the target and
one reference client with the engine's keys (:func:`fedjax_dp.training.engine.client_keys`);
central placement runs :func:`fedjax_dp.training.engine.round_step` itself, with the config's
selection drawn per lane by :func:`fedjax_dp.training.engine.select_clients`.

The attack is white-box and knows everything but the coin: it computes the noiseless
releases of both datasets (the mechanism run with zero noise) and projects the
observed release on their difference ``v`` -- the Neyman-Pearson test for Gaussian
noise, so a correct Gaussian mechanism is audited nearly tightly. For client
releases a second attack projects the target's upload minus the reference client's
(it cancels noise shared between clients); the two attacks share the significance
(Bonferroni).

What is compared: the release of ONE round (the first, from the initial model) as the
configured run plans it -- its noise, clip bound, count noise and learning rates come
from the run's own host loop (:class:`fedjax_dp.experiment.RunLoop`), and so does the
certificate: the run's accountant after that round (``epsilon_certified`` of the
run's first metrics row), validation-score and clip-count releases included, for the
worst client (a client that takes part). With ``certify_run`` the run itself is run
(no files) and its summary's certified epsilon is reported beside it. Both come from
the same code path as the run's, so they cannot differ. A correct mechanism keeps
``epsilon_lower <= epsilon_certified`` with probability at least
``1 - significance``; a broken one (noise too small, clipping off, noise shared
between clients, a sensitivity that does not hold) shows up as a lower bound above
the certified epsilon once enough trials are run (with perfect separation the bound
is about 4.5 at 1000 trials; it grows like ``log(trials)``).

Canaries per mechanism. Poisson minibatches (``client.minibatch='poisson'``, add/remove
adjacency): the ``in`` dataset holds one more example than ``out`` (same public
count), on the input feature no other example uses (:func:`quietest_feature`); the
attack projects on that feature's first-layer coordinates only, which move by the
canary's clipped gradient in the steps that sample it and by noise otherwise, whatever
else the batch drew (inclusion-aware). Laplace: a sparse canary, so the pair's L1
difference sits in few coordinates, scored by the exact likelihood ratio. A round
that releases the validation score (``schedule.validation='clients'``) is attacked
through it as well: the canary's label is the class the initial model gives its
``in`` input, so the score moves by its whole sensitivity ``1 / N_sel``.

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

The client optimizer (``client.optimizer``, :mod:`fedjax_dp.optimizers`) enters the
audited round as the run's own: the clients step with it (its state fresh each
round). Where a clip mode's bound counts the local steps (per-example and per-step
gradient clipping with upload noise, :attr:`fedjax_dp.privacy.clip_modes.Proof.step_weighted`)
it counts the optimizer's step weights ``A_j`` (heavy-ball momentum: ``A_j = sum_{s>=j}
eta_s beta^(s-j)``), and an optimizer without them (Adam, a transformation from
Python) is refused there. The variant ``sgd_step_weights`` breaks that argument: the
plan (noise and certificate) is the one of the same config with
``client.optimizer='sgd'``, whose bound counts the learning rates ``eta_j``, while the
clients step with the configured optimizer -- a momentum bound computed as if it were
SGD (its noise ``sum_j eta_j / sum_j A_j`` of the right one), or Adam admitted with
SGD's bound (its normalised steps move each coordinate by about ``eta`` whatever C).
It is refused where it is no fault: a placement whose bound does not count the steps
(the optimizer is post-processing there) or an optimizer whose step weights are the
learning rates (SGD, one local step).
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

from fedjax_dp.audit import estimators
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.privacy import clip_modes
from fedjax_dp.privacy import plan as plan_lib
from fedjax_dp.privacy.clip_modes import base as clip_base
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

PyTree = Any
VARIANTS = ("none", "noise_div10", "no_clip", "shared_noise_key", "sgd_step_weights")
NO_CLIP = 1e6  # the 'no_clip' variant's threshold: no gradient here comes near it
STEADY_SCALE = 10.0  # the input scale of a client-level canary for a step-weighted bound
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
    canary_scale: factor on the canary inputs, so their gradients reach the clip; None:
      100, or 1e4 for one example of a ``param_l2``/``update_l2`` client, whose
      sensitivity 2 C is not divided by the client's example count, so the canary must
      dominate the client's update to reach it (and to exceed it without clipping).
    target: the client holding the canary; None: client 0, or under a deterministic
      rule (without ``cohort``) the first client the run selects in round 1 (top-K
      may never select 0).
    sparse_canary: canary inputs on one feature (:func:`canary_pair` ``sparse``), so
      the pair's gradient difference is concentrated in few coordinates; the default
      for the Laplace mechanism, whose test needs that concentration, and for Poisson
      minibatches, whose attack reads the canary's own coordinates.
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
    certify_run: also run the configured run (its own training and accountant, no
      files written) to report the certificate of the whole run from its summary
      (``fedjax-dp audit`` does unless ``--no-run-certificate``); ``False`` leaves
      ``epsilon_certified_run`` NaN (the per-round certificate, the run's own first
      round, needs no training).
  """

  trials: int = 1000
  significance: float = 0.05
  seed: int = 0
  variant: str = "none"
  noise_scale: float | None = None
  claimed_sensitivity: float | None = None
  canary_scale: float | None = None
  target: int | None = None
  sparse_canary: bool | None = None
  lanes_per_call: int = 0
  aggregation: str | None = None
  cohort: tuple[int, ...] | None = None
  certify_run: bool = False

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
    if self.canary_scale is not None and not float(self.canary_scale) > 0:
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
    if self.cohort is not None and int(self.target or 0) not in tuple(self.cohort):
      raise ValueError(f"audit.cohort {tuple(self.cohort)} must include audit.target "
                       f"{self.target}")


class AuditResult(NamedTuple):
  """What an audit measured (all epsilons at ``delta``).

  Attributes:
    epsilon_lower: empirical lower bound (Clopper-Pearson, the best attack), valid
      with confidence ``1 - significance``.
    epsilon_one_run: Steinke et al.'s one-run lower bound on the same trials.
    epsilon_gdp: Andrew et al.'s Gaussian-DP estimate (assumes a Gaussian trade-off).
    epsilon_certified: certified epsilon of the audited release: the run's own
      accountant after its first round (``epsilon_certified`` of the run's first
      metrics row), validation-score and clip-count releases included.
    epsilon_certified_run: certified epsilon of the configured run, from the run's
      own summary (NaN without ``certify_run``).
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
  relation: str = "replace_one"
  count_noise: float = 0.0

  def to_dict(self) -> dict[str, Any]:
    return dict(self._asdict())



def _flat(tree: PyTree) -> jax.Array:
  return jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


def quietest_feature(data: FederatedData) -> int:
  """The input feature with the least total magnitude over every client's examples.

  A canary input on it (``sparse``) changes first-layer weights that the other
  examples' gradients leave (nearly) untouched: ``x (dL/dz)^T`` is zero in the rows of
  features that are zero (on ``digits`` and MNIST, feature 0, a corner pixel, always is).
  """
  x = np.abs(np.asarray(data.x, np.float32)) * np.asarray(data.mask, np.float32)[
      (...,) + (None,) * (data.x.ndim - 2)]
  return int(np.argmin(x.reshape(-1, int(np.prod(data.x.shape[2:]))).sum(0)))


def canary_pair(data: FederatedData, target: int, level: str, num_classes: int,
                scale: float, flip_input: bool = True, sparse: bool = False,
                relation: str = "replace_one", input_fn=None,
                one_label: bool = False) -> FederatedData:
  """``[2, U, ...]`` data: index 0 holds the ``out`` canary, index 1 the ``in`` one.

  Example level: example 0 of ``target`` has its input x scaled by ``scale``; ``in``
  holds (x, y), ``out`` (-x, y) (or, without ``flip_input``, (x, y + 1 mod classes)):
  a replace-one pair of examples. Client level: every example of ``target`` is
  changed so: a replace-one pair of clients. ``relation='add_remove'`` (example level,
  the adjacency of Poisson minibatches): ``in`` holds the canary, ``out`` does not
  (its mask is 0); the client's count stays, as the mechanism treats it as public.

  ``one_label``: every changed example takes the label of the first (a client-level
  canary whose examples pull one way, so its clipped step gradients add up over the
  local steps instead of cancelling).

  ``input_fn``: ``(rows, feature) -> rows``, the canary's input rows before the scale
  (a clip mode's :attr:`fedjax_dp.privacy.clip_modes.Canary.input`, with ``feature``
  the :func:`quietest_feature`); default the client's own examples.

  ``sparse`` (:func:`fedjax_dp.privacy.clip_modes.base.sparse_input`): the canary inputs
  are ``scale`` times the basis vector of :func:`quietest_feature` instead of scaled
  data. The first layer's weight gradient
  ``x (dL/dz)^T`` is then one row, so for a linear model the two clipped gradients
  differ in ``num_classes`` coordinates only (the bias gradients are equal): the whole
  L1 budget 2 C of the pair lies in a few coordinates, where the Laplace
  likelihood-ratio test sees it (an L1-bounded difference spread over many
  coordinates is hidden by Laplace noise far better than its L1 norm says), and the
  other examples' gradients do not reach that row.
  """
  if relation not in ("replace_one", "add_remove"):
    raise ValueError(f"canary relation: unknown {relation!r}")
  if relation == "add_remove" and level != "example":
    raise ValueError("an add/remove canary is one example (level 'example')")
  x, y, mask = np.array(data.x), np.array(data.y), np.array(data.mask)
  n = int(data.counts[target])
  if n < 1:
    raise ValueError(f"audit.target: client {target} holds no examples")
  rows = slice(0, 1) if level == "example" else slice(0, n)
  make = clip_base.sparse_input if sparse else input_fn
  if make is not None:
    x[target, rows] = make(x[target, rows], quietest_feature(data))
  x[target, rows] *= scale
  if one_label:
    y[target, rows] = y[target, 0]
  x_out, y_out, mask_out = x.copy(), y.copy(), mask.copy()
  if relation == "add_remove":
    mask_out[target, rows] = 0.0
  elif flip_input:
    x_out[target, rows] = -x[target, rows]
  else:
    y_out[target, rows] = (y[target, rows] + 1) % num_classes
  stack = lambda a, b: jnp.stack([jnp.asarray(a), jnp.asarray(b)])
  return FederatedData(x=stack(x_out, x), y=stack(y_out, y),
                       counts=stack(data.counts, data.counts), mask=stack(mask_out, mask))


def _lanes_per_call(pair: FederatedData, clients: int, requested: int, trials: int) -> int:
  """Lanes per compiled call so that their gathered client data stays near 256 MB."""
  if requested:
    return min(requested, trials)
  per_lane = clients * 4 * int(np.prod(pair.x.shape[2:])) * 4  # data and a few temporaries
  return int(max(1, min(trials, 256e6 // max(per_lane, 1))))


@functools.lru_cache(maxsize=16)
def _client_fn(model, ccfg: client_lib.ClientConfig, ids: tuple[int, ...]):
  """Jitted ``fn(params, pair, lr, clip, noise, count, seeds [L], bits [L], v, c_in,
  c_out, stream, shared_key) -> scores [L, A]`` of lanes whose clients ``ids`` release
  their uploads (cached on the static parts, so audits of the same shapes share one
  compiled program)."""
  ids_arr = np.asarray(ids)

  def lane(params, pair, lr, clip, noise, count, seed, bit, v, c_in, c_out, stream,
           shared_key):
    d = jax.tree_util.tree_map(lambda a: a[bit, ids_arr], pair)
    keys = engine.client_keys(seed, jnp.int32(0), jnp.asarray(ids_arr), stream)
    # The broken variant (traced, so it shares the compiled program): one key for all.
    keys = jnp.where(shared_key, jnp.broadcast_to(keys[0], keys.shape), keys)
    hp = client_lib.ClientHParams(lr=jnp.broadcast_to(lr, (len(ids),) + lr.shape),
                                  clip=jnp.broadcast_to(clip, (len(ids),)),
                                  step_noise=noise, upload_noise=noise, count=count)
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

  return jax.jit(jax.vmap(lane, in_axes=(None, None, None, None, None, None, 0, 0, None,
                                           None, None, None, None)))


@functools.lru_cache(maxsize=16)
def _central_fn(model, rcfg: engine.RoundConfig):
  """Jitted ``fn(params, pair, args [L], v) -> scores [L, 1]`` of lanes whose release
  is the new global model of :func:`fedjax_dp.training.engine.round_step`."""
  def lane(params, pair, args, v):
    new, _ = engine.round_step(model, rcfg, params, pair, args)
    return jnp.dot(_flat(new), v)[None]
  return jax.jit(jax.vmap(lane, in_axes=(None, None, 0, None)))


@functools.lru_cache(maxsize=16)
def _clean_fn(model, ccfg: client_lib.ClientConfig):
  """Jitted ``fn(params, pair, bit, target, lr, clip, count) -> [P]``: the target's
  noiseless upload on dataset ``bit`` (the adversary's reference)."""
  quiet = dataclasses.replace(ccfg, noise_placement="none")

  def fn(params, pair, bit, target, lr, clip, count):
    d = jax.tree_util.tree_map(lambda a: a[bit, target], pair)
    key = engine.client_keys(jnp.uint32(0), jnp.int32(0), target[None])[0]
    zero = jnp.zeros((), jnp.float32)
    hp = client_lib.ClientHParams(lr=lr, clip=clip, step_noise=zero, upload_noise=zero,
                                  count=count)
    return _flat(client_lib.client_update(model, quiet, params, d.x, d.y, d.mask, key,
                                          hp).params)
  return jax.jit(fn)


class _Plan(NamedTuple):
  """The audited round as the run plans it, and the certificates compared with it."""

  args: engine.RoundArgs      # round 0's device inputs (RunLoop.plan_round)
  client_noise: np.ndarray    # [U] per-client noise of that round
  central_noise: float        # the server's noise (central placement)
  eps_round: float            # certified epsilon after round 0
  eps_run: float              # certified epsilon of the run (NaN: not computed)
  sensitivity: float
  validates: bool = False     # round 0 also releases the validation score (A-DPFL)


def _run_plan(cfg, setup, certify_run: bool) -> _Plan:
  """Round 0 planned by the run's own host loop (:class:`fedjax_dp.experiment.RunLoop`):
  its noise, clip bound, count noise and learning rates, and the certified epsilon its
  accountant reports after it (validation-score events included). With
  ``certify_run`` the run itself is run (no files) and its summary's certified
  epsilon is the run's certificate: the same accountant path, so they cannot differ."""
  from fedjax_dp import config as config_lib
  from fedjax_dp import experiment

  loop = experiment.RunLoop(cfg, setup)
  args = loop.plan_round()
  if args is None:
    raise ValueError("the run plans no round (its schedule stops before round 1): "
                     "nothing to audit")
  planned = loop.planned
  client_noise, central_noise = setup.privacy.device_noise(planned.plan.noise,
                                                           planned.plan.central_noise)
  eps_run = math.nan
  if certify_run:
    quiet = config_lib.override(cfg, ["progress=false"])
    eps_run = float(experiment.run(quiet, setup=setup).summary["epsilon_certified"])
  return _Plan(args, np.asarray(client_noise, np.float64), float(central_noise),
               float(planned.certified), eps_run, float(np.max(setup.privacy.sensitivity)),
               planned.val_std >= 0)


def _claimed_plan(cfg, setup, options: AuditOptions, base: _Plan) -> _Plan:
  """An explicitly given noise (``noise_scale``), sensitivity claim or known cohort:
  certified by the plan's events for that claim (not the run's, which it replaces)."""
  plan, u = setup.privacy, setup.num_clients
  central = plan.placement == "central"
  client_noise, central_noise, args = base.client_noise, base.central_noise, base.args
  if options.noise_scale is not None:
    client_noise = np.full(u, 0.0 if central else float(options.noise_scale))
    central_noise = float(options.noise_scale) if central else 0.0
    args = args._replace(central_noise=np.float32(central_noise))
  certifier = plan
  if options.claimed_sensitivity is not None:
    certifier = dataclasses.replace(plan, sensitivity=np.full(u, options.claimed_sensitivity))
  if options.cohort is not None:  # a known cohort: no selection amplification
    # (nor eligibility groups; a correlated mechanism is then charged as every client
    # in every round, its unamplified matrix accounting)
    certifier = dataclasses.replace(
        certifier, selection="all", q=1.0, rate=None, groups=None,
        patterns=np.ones((u, plan.rounds), bool)
        if plan.correlated is not None and plan.patterns is None else plan.patterns)
  per_client = plan.rule.deterministic or plan.poisson_steps
  k_cfg, q_cfg = int(cfg.server.clients_per_round), float(cfg.server.q)

  def cohort(t: int) -> np.ndarray | None:
    return plan.rule.sample(u, k_cfg, q_cfg, int(cfg.seed), t,
                            weights=setup.selection_weights) if per_client else None

  # The audited round is charged as for a client that takes part (the worst client).
  acct = certifier.accountant_step(certifier.accountant_init(), client_noise, central_noise,
                                   selected=np.arange(u) if per_client else None)
  eps_round = certifier.certified_epsilon(acct)
  acct = certifier.accountant_init()
  for t in range(int(cfg.rounds)):
    acct = certifier.accountant_step(acct, client_noise, central_noise, selected=cohort(t))
  return _Plan(args, client_noise, central_noise, float(eps_round),
               float(certifier.certified_epsilon(acct)),
               float(np.max(certifier.sensitivity)), base.validates)


def _trials(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """``(run seeds [n] uint32, coins [n] int32)`` of the trials, each from
  ``fold_in(fold_in(PRNGKey(seed), AUDIT_SEED_TAG), trial)``: the audit's own seed,
  whatever the run derives its noise streams from."""
  base = jax.random.fold_in(jax.random.PRNGKey(int(seed)), AUDIT_SEED_TAG)
  bits = jax.vmap(lambda i: jax.random.bits(jax.random.fold_in(base, i), (2,), jnp.uint32))(
      jnp.arange(n))
  bits = np.asarray(bits)
  return bits[:, 0].astype(np.uint32), (bits[:, 1] & 1).astype(np.int32)


def _canary(setup, options: AuditOptions, level: str, relation: str,
            params: PyTree | None, steady: bool = False) -> FederatedData:
  """The mechanism's canary pair. ``params``: the round also releases the validation
  score, so the canary's label is the class the initial model gives its ``in`` input:
  the ``in`` canary is then classified correctly and (flipped) the ``out`` one not, and
  the score moves by its whole sensitivity ``1 / N_sel`` between them. ``steady``: the
  canary must pull one way over many steps (the whole-run audit's rounds), as a
  step-weighted bound's over several local steps does (below)."""
  plan = setup.privacy
  mode = clip_modes.get(setup.round_cfg.client.clip_mode)
  hint = mode.canary
  sparse = options.sparse_canary
  # A bound proved step by step over several local steps (2 C sum_j A_j; per-example
  # clipping: the canary example's share of it) is reached by a canary whose clipped
  # gradient is 2 C apart between in and out at EVERY step, in ONE direction: on the
  # quietest feature, all its examples with one label (the in and out runs then stay
  # mirror images, p(+x) = p(-x), step after step; the optimizer's weights A_j add up).
  steady = steady or (plan.placement in mode.proof.step_weighted
                      and int(setup.round_cfg.client.local_steps) > 1)
  if steady and sparse is None:
    sparse = True
  if sparse is None:
    # L1 clipping bounds the L2 norm by C only for a gradient on one axis (the L1
    # ball's vertices), so L1 clip modes get the sparse canary whatever the noise.
    # A hidden cohort (central noise, random rule) needs coordinates no other client
    # moves: a sparse canary on the quietest feature (:func:`_direction`).
    sparse = (plan.mechanism == "laplace" or plan.poisson_steps or hint.sparse
              or _hidden_cohort(plan, options))
  scale = options.canary_scale
  if scale is None:
    # (steady: at 10 the canary's gradient, of norm about 10 |p - y| ~ 9.5, still
    # reaches a clip of 1, and the model learns it slowly enough that it keeps doing
    # so over the local steps; at 100 its logits saturate and the last steps' clipped
    # gradients shrink.)
    scale = STEADY_SCALE if steady else (hint.example_scale if level == "example" else 100.0)
  # The mode's own canary input (a geometry's corner), unless the options ask otherwise.
  own = None if options.sparse_canary is not None or hint.sparse else hint.input
  flip = hint.flip_input or relation == "add_remove"
  pair = canary_pair(setup.data, options.target, level, setup.model.num_classes,
                     float(scale), flip_input=flip, sparse=bool(sparse), relation=relation,
                     input_fn=own, one_label=steady)
  if params is None or setup.model.is_regression or not flip:
    return pair  # (a label-flip canary keeps its two labels)
  rows = 1 if level == "example" else int(setup.data.counts[options.target])
  label = jnp.argmax(setup.model.apply(params, pair.x[1, options.target, :rows]), -1)
  return pair._replace(y=pair.y.at[:, options.target, :rows].set(label.astype(pair.y.dtype)))


def _others_span(clean, params, pair, target, lr, clip) -> np.ndarray:
  """``[P, r]`` an orthonormal basis of the span of every other client's noiseless
  update (``update - params``, on the data both datasets share)."""
  flat = np.asarray(_flat(params), np.float64)
  cols = [np.asarray(clean(params, pair, 0, jnp.int32(i), lr, clip,
                           jnp.float32(pair.counts[0, i])), np.float64) - flat
          for i in range(int(pair.counts.shape[1]))
          if i != int(target) and int(pair.counts[0, i]) > 0]
  if not cols:
    return np.zeros((flat.size, 0))
  q, r = np.linalg.qr(np.stack(cols, axis=1))
  return q[:, np.abs(np.diag(r)) > 1e-9 * max(np.abs(np.diag(r)).max(), 1e-30)]


def _direction(setup, params, pair, target, lr, clip, restrict: bool,
               restrict_clients: bool = False):
  """``(v, c_in, c_out)``: the unit difference of the target's noiseless releases and
  the releases themselves. Poisson minibatches take every example (``q = 1``) for
  them, and (``restrict``) ``v`` keeps the coordinates that the other examples leave
  unchanged: there the release moves only by the canary's own (sampled or not)
  gradient and the noise, not by which other examples the lane's batch drew.

  ``restrict_clients`` (central noise under a random selection rule, inclusion-aware
  as for Poisson minibatches): ``v`` is made orthogonal to every other client's
  noiseless update (the adversary computes them, as it computes the target's), so the
  projection of the aggregate sees the target's contribution (when it is drawn) and
  the noise, not which other clients the lane's hidden cohort drew (their spread
  would otherwise drown noise/10)."""
  ccfg = setup.round_cfg.client
  if ccfg.minibatch == "poisson":
    ccfg = dataclasses.replace(ccfg, batch_size=int(pair.x.shape[2]))
  clean = _clean_fn(setup.model, ccfg)
  tid = jnp.int32(target)
  count = jnp.float32(pair.counts[0, target])
  c_in = clean(params, pair, 1, tid, lr, clip, count)
  c_out = clean(params, pair, 0, tid, lr, clip, count)
  v = c_in - c_out
  if restrict:
    untouched = c_out == _flat(params)
    if float(jnp.linalg.norm(jnp.where(untouched, v, 0.0))) > 0:
      v = jnp.where(untouched, v, 0.0)
  if restrict_clients:
    basis = _others_span(clean, params, pair, target, lr, clip)
    v64 = np.asarray(v, np.float64)
    v64 = v64 - basis @ (basis.T @ v64)
    if np.linalg.norm(v64) > 1e-6 * float(jnp.linalg.norm(v)):
      v = jnp.asarray(v64, jnp.float32)
  norm = float(jnp.linalg.norm(v))
  if not norm > 0:
    raise ValueError("the canary pair leaves the target's release unchanged: nothing to "
                     "audit (audit.canary_scale or the data)")
  return v / norm, c_in, c_out


class _Lanes(NamedTuple):
  """What the trials share: the variant's engine inputs and each trial's draw."""

  seeds: np.ndarray         # [n] uint32 run seeds
  bits: np.ndarray          # [n] int32 coins (1: the canary is in)
  sels: list                # [n] (idx [K], mask [K]) each trial's cohort
  client_noise: np.ndarray  # [U] float32 what the engine adds (after the variant)
  central_noise: float
  count_noise: float
  clip: float


def _lane_args(setup, plan: _Plan, lanes: _Lanes, idx: np.ndarray, fixed_ids,
               client_slots: bool) -> engine.RoundArgs:
  """``[L]`` :class:`engine.RoundArgs` of the trials ``idx``: the run's round 0 with
  each trial's cohort, seed and coin (``data_id``). ``client_slots``: each slot adds
  its client's noise (upload/step placement); else the server's (central)."""
  a0, k, step = plan.args, setup.k_slots, idx.size
  if fixed_ids is not None:
    ids = np.full(k, fixed_ids[0], np.int32)
    ids[:fixed_ids.size] = fixed_ids
    sel = [(ids, (np.arange(k) < fixed_ids.size).astype(np.float32))] * step
  else:
    sel = [lanes.sels[i] for i in idx]
  cohort = np.stack([s[0] for s in sel])
  full = lambda value, dtype=np.float32: np.full(step, value, dtype)
  return engine.RoundArgs(
      idx=cohort, sel_mask=np.stack([s[1] for s in sel]),
      lr=np.broadcast_to(np.asarray(a0.lr, np.float32), (step,) + np.shape(a0.lr)),
      clip=full(lanes.clip),
      noise=(lanes.client_noise[cohort] if client_slots else np.zeros((step, k))
             ).astype(np.float32),
      central_noise=full(0.0 if client_slots else lanes.central_noise),
      server_lr=full(float(a0.server_lr)), round=full(0, np.int32),
      seed=lanes.seeds[idx], data_id=lanes.bits[idx], stream=np.broadcast_to(np.asarray(a0.stream, np.uint32),
                                                         (step,) + np.shape(a0.stream)),
      count_noise=full(lanes.count_noise))


def _chunks(n: int, step: int):
  """``(trials [step], kept)`` per compiled call: a constant lane count, the last call
  padded (its padding dropped)."""
  for start in range(0, n, step):
    stop = min(n, start + step)
    yield np.resize(np.arange(start, stop), step), stop - start


def _central_scores(setup, rcfg, params, pair, plan: _Plan, lanes: _Lanes, v, step,
                    fixed_ids) -> np.ndarray:
  """``[1, n]`` projections of each trial's new global model (central placement)."""
  fn = _central_fn(setup.model, rcfg)
  out = [np.asarray(fn(params, pair, _lane_args(setup, plan, lanes, idx, fixed_ids, False),
                       v))[:kept] for idx, kept in _chunks(lanes.seeds.size, step)]
  return np.concatenate(out).T


@functools.lru_cache(maxsize=16)
def _validation_fn(model, rcfg: engine.RoundConfig):
  """Jitted ``fn(params, pair, args [L], std [L]) -> scores [L]``: the attack on the
  round's released validation score (``schedule.validation='clients'``).

  The adversary sees the new global model w and the score ``S(w) + N(0, std^2)`` on
  the selected clients' data; it computes the exact scores ``S_in(w)``, ``S_out(w)``
  of both datasets and scores the release by the Gaussian likelihood ratio given w,
  ``(S - (S_in + S_out) / 2) (S_in - S_out)``."""
  def lane(params, pair, args, std):
    new, _ = engine.round_step(model, rcfg, params, pair, args)
    released, _ = engine.selected_accuracy(model, new, pair, args, std)
    s_in = engine.selected_accuracy(model, new, pair, args._replace(data_id=1), 0.0)[1]
    s_out = engine.selected_accuracy(model, new, pair, args._replace(data_id=0), 0.0)[1]
    return (released - 0.5 * (s_in + s_out)) * (s_in - s_out)
  return jax.jit(jax.vmap(lane, in_axes=(None, None, 0, 0)))


def _validation_scores(setup, params, pair, plan: _Plan, lanes: _Lanes, step,
                       divide: float) -> np.ndarray:
  """``[1, n]`` validation-score attack of each trial (its noise std
  ``z_val / N_sel`` of the trial's cohort, over ``divide`` for ``noise_div10``)."""
  fn = _validation_fn(setup.model, setup.round_cfg)
  counts = np.asarray(setup.data.counts, np.float64)
  z_val = setup.privacy.val_noise_multiplier
  out = []
  for idx, kept in _chunks(lanes.seeds.size, step):
    args = _lane_args(setup, plan, lanes, idx, None, True)
    std = np.asarray([z_val * plan_lib.validation_sensitivity(counts[i[m > 0]])
                      for i, m in zip(args.idx, args.sel_mask)], np.float32) / divide
    out.append(np.asarray(fn(params, pair, args, std))[:kept])
  return np.concatenate(out)[None]


def _client_scores(setup, params, pair, plan: _Plan, lanes: _Lanes, ids, direction, step,
                   shared_key: bool) -> np.ndarray:
  """``[A, n]`` attack scores of each trial's target upload (upload/step placement)."""
  v, c_in, c_out = direction
  fn = _client_fn(setup.model, setup.round_cfg.client, tuple(int(i) for i in ids))
  a0 = plan.args
  lr = np.asarray(a0.lr, np.float32)
  count = np.asarray(pair.counts[0], np.float32)[ids]
  noise = lanes.client_noise[ids]
  out = []
  for idx, kept in _chunks(lanes.seeds.size, step):
    scores = fn(params, pair, lr, np.float32(lanes.clip), noise, count, lanes.seeds[idx],
                lanes.bits[idx], v, c_in, c_out, jnp.asarray(a0.stream, jnp.uint32), shared_key)
    out.append(np.asarray(scores)[:kept])
  return np.concatenate(out).T


def _make_lanes(cfg, setup, options: AuditOptions, plan: _Plan) -> _Lanes:
  seeds, bits = _trials(options.seed, int(options.trials))
  u = setup.num_clients
  sels = [engine.select_clients(cfg.server.selection, u, cfg.server.clients_per_round,
                                cfg.server.q, int(s), 0, weights=setup.selection_weights)
          for s in seeds]
  divide = 10.0 if options.variant == "noise_div10" else 1.0
  clip = NO_CLIP if options.variant == "no_clip" else float(plan.args.clip)
  count_noise = float(plan.args.count_noise if plan.args.count_noise is not None else 0.0)
  return _Lanes(seeds, bits, sels, (plan.client_noise / divide).astype(np.float32),
                plan.central_noise / divide, count_noise / divide, clip)


def _check(cfg, setup, options: AuditOptions) -> np.ndarray | None:
  """Refuses what cannot be audited; returns the fixed cohort's ids (or None)."""
  plan, u = setup.privacy, setup.num_clients
  if plan.placement == "none":
    raise ValueError("privacy.placement='none': no mechanism to audit")
  if options.noise_scale is None and plan.noiseless:
    raise ValueError(f"privacy.epsilon={cfg.privacy.epsilon}: the run adds no noise, "
                     "nothing to audit (set a finite epsilon or audit.noise_scale)")
  if plan.uncertifiable:
    raise ValueError("server.clip_rule='median' has certified epsilon inf (no sensitivity "
                     "bound): there is no certificate to audit")
  if options.target is not None and not 0 <= options.target < u:
    raise ValueError(f"audit.target must be in [0, {u}), got {options.target}")
  central = plan.placement == "central"
  for name in ("aggregation", "cohort"):
    if getattr(options, name) is not None and not central:
      raise ValueError(f"audit.{name} needs privacy.placement='central', got "
                       f"{plan.placement!r}")
  if central and options.variant == "shared_noise_key":
    raise ValueError("audit.variant='shared_noise_key' needs client noise "
                     "(privacy.placement upload or step), got 'central'")
  if options.cohort is None:
    return None
  fixed_ids = np.unique(np.asarray(options.cohort, np.int64))
  if fixed_ids.min() < 0 or fixed_ids.max() >= u or fixed_ids.size > setup.k_slots:
    raise ValueError(f"audit.cohort {tuple(options.cohort)}: ids must be in [0, {u}) and "
                     f"at most {setup.k_slots} of them")
  return fixed_ids


def _hidden_cohort(privacy, options: AuditOptions) -> bool:
  """Central noise whose cohort the adversary does not see (a random rule's draw, no
  fixed ``cohort``): the canary must be inclusion-aware (:func:`_direction`)."""
  return (privacy.placement == "central" and not privacy.rule.deterministic
          and options.cohort is None)


def _default_target(privacy, plan: _Plan, options: AuditOptions) -> int:
  """The canary's client: under a deterministic rule (without ``cohort``) the first
  client the run selects in round 1 (top-K may never select 0); under a rule with
  eligibility groups (cyclic_poisson) the first client eligible in round 1 (client 0
  may not be, and a canary never drawn shows nothing); else client 0."""
  if privacy.rule.deterministic and options.cohort is None:
    return int(np.asarray(plan.args.idx)[np.asarray(plan.args.sel_mask) > 0][0])
  if privacy.groups is not None and options.cohort is None:
    return int(np.flatnonzero(np.asarray(privacy.groups) == 0)[0])
  return 0


def _scores(setup, options: AuditOptions, params, pair, plan: _Plan, lanes: _Lanes,
            fixed_ids) -> np.ndarray:
  """``[A, n]`` every attack's score of every trial; a trial in which the attacked
  release is not seen scores below all others (the same in and out)."""
  privacy, u, n = setup.privacy, setup.num_clients, int(options.trials)
  t = options.target
  direction = _direction(setup, params, pair, t, np.asarray(plan.args.lr, np.float32),
                         np.float32(lanes.clip), restrict=privacy.poisson_steps,
                         restrict_clients=_hidden_cohort(privacy, options))
  ids = np.asarray([t] + ([(t + 1) % u] if u > 1 else []))
  if privacy.placement == "central":
    rcfg = setup.round_cfg
    if options.aggregation is not None:
      rcfg = dataclasses.replace(rcfg, aggregation=options.aggregation,
                                 expected_fraction=float(privacy.q))
    step = _lanes_per_call(pair, setup.k_slots, int(options.lanes_per_call), n)
    scores = _central_scores(setup, rcfg, params, pair, plan, lanes, direction[0], step,
                             fixed_ids)
    if not privacy.rule.deterministic:
      return scores  # a random rule's central draw stays hidden from the adversary
    seen = [(t,)]
  else:
    step = _lanes_per_call(pair, ids.size, int(options.lanes_per_call), n)
    scores = _client_scores(setup, params, pair, plan, lanes, ids, direction, step,
                            options.variant == "shared_noise_key")
    seen = [(t,), tuple(ids)][:scores.shape[0]]
    if plan.validates and options.variant != "shared_noise_key":
      step = _lanes_per_call(pair, setup.k_slots, int(options.lanes_per_call), n)
      val = _validation_scores(setup, params, pair, plan, lanes, step,
                               10.0 if options.variant == "noise_div10" else 1.0)
      scores = np.concatenate([scores, val])
      seen.append((t,))  # the score reads the target's data when it is selected
  # A client outside the trial's cohort releases nothing (the accountant's selection
  # event charges q): the adversary sees the same 'no upload' in and out. A
  # deterministic rule's cohort is public (it is accounted without amplification), so
  # a central adversary may read it too.
  chosen = {int(i): np.array([bool(np.any((idx == i) & (sel > 0))) for idx, sel in lanes.sels])
            for i in ids}
  visible = np.stack([np.all([chosen[i] for i in need], axis=0) for need in seen])
  return np.where(visible, scores, np.min(scores) - 1.0)


def _setup(cfg, options: AuditOptions, client_optimizer=None):
  """The run's setup; under ``sgd_step_weights`` (module docstring) the setup of the
  config with ``client.optimizer='sgd'`` (its plan: noise, certificate) whose clients
  step with the configured (or given) optimizer.

  Raises:
    ValueError: ``sgd_step_weights`` where it is no fault, in one line: the bound at
      the config's placement does not count the local steps, or the optimizer is SGD.
  """
  from fedjax_dp import config as config_lib
  from fedjax_dp import experiment, optimizers

  if options.variant != "sgd_step_weights":
    return experiment.build(cfg, client_optimizer=client_optimizer)
  stepping = client_optimizer or optimizers.client_optimizer(cfg.client)
  where = (f"client.clip_mode={cfg.client.clip_mode!r} at privacy.placement="
           f"{cfg.privacy.placement!r}")
  if cfg.privacy.placement not in clip_modes.get(cfg.client.clip_mode).proof.step_weighted:
    raise ValueError(f"audit.variant='sgd_step_weights': the bound of {where} does not "
                     "count the local steps (the client optimizer is post-processing "
                     "there): nothing to break")
  if stepping.name == optimizers.SGD.name and stepping.transformation is None:
    raise ValueError("audit.variant='sgd_step_weights' needs client.optimizer other than "
                     "'sgd' (whose step weights are the learning rates)")
  setup = experiment.build(config_lib.override(cfg, [f"client.optimizer={optimizers.SGD.name}"]))
  rcfg = setup.round_cfg
  return dataclasses.replace(setup, round_cfg=dataclasses.replace(
      rcfg, client=dataclasses.replace(rcfg.client, optimizer=stepping)))


def _check_step_weights(setup, plan: _Plan) -> None:
  """``sgd_step_weights`` on an optimizer whose step weights over the planned local
  steps ARE the learning rates (momentum over one step): the correct mechanism."""
  opt, lrs = setup.round_cfg.client.optimizer, np.asarray(plan.args.lr, np.float64)
  weights = opt.step_weights(lrs)
  if weights is not None and np.allclose(weights, lrs, rtol=1e-12, atol=0.0):
    raise ValueError(f"audit.variant='sgd_step_weights': client.optimizer={opt.name!r} over "
                     f"client.local_steps={lrs.size} has SGD's step weights (the learning "
                     "rates): the variant is the correct mechanism")


def audit(cfg, options: AuditOptions = AuditOptions(), *, params: PyTree | None = None,
          pair: FederatedData | None = None, client_optimizer=None) -> AuditResult:
  """Audits the first round of the mechanism ``cfg`` configures (module docstring).

  Args:
    cfg: a run config (:func:`fedjax_dp.config.base_config` fields).
    options: :class:`AuditOptions`.
    params: the global model the round starts from; default the run's initial model.
    pair: ``[2, U, ...]`` client data, index 0 the ``out`` dataset and 1 the ``in``
      one; default the mechanism's canary (:func:`canary_pair`).
    client_optimizer: the local steps' optimizer given from Python
      (:func:`fedjax_dp.optimizers.from_transformation`), as
      :func:`fedjax_dp.experiment.build` takes it, in place of ``client.optimizer``.

  Returns:
    :class:`AuditResult`.

  Raises:
    ValueError: a bad option or a config without noise to audit, naming the field.
    ImportError: jax_privacy is not installed (the message says what to install).
  """

  options.validate()
  if not estimators.available():
    raise ImportError(estimators.INSTALL_HINT)
  t0 = time.time()
  setup = _setup(cfg, options, client_optimizer)
  cfg = setup.config  # (sgd_step_weights: the config whose plan is SGD's)
  fixed_ids = _check(cfg, setup, options)
  privacy = setup.privacy
  central = privacy.placement == "central"
  # The canary changes what the plan's adjacency changes: one example, or (central
  # placement, step_grad_*) one client's data.
  level = "client" if privacy.placement == "central" or privacy.level == "client" \
      else "example"
  relation = "add_remove" if privacy.poisson_steps else "replace_one"
  claimed = any(getattr(options, f) is not None
                for f in ("noise_scale", "claimed_sensitivity", "cohort"))
  plan = _run_plan(cfg, setup, options.certify_run and not claimed)
  if options.variant == "sgd_step_weights":
    _check_step_weights(setup, plan)
  if options.target is None:
    options = dataclasses.replace(options, target=_default_target(privacy, plan, options))
    options.validate()
  if claimed:
    plan = _claimed_plan(cfg, setup, options, plan)
  if params is None:
    params = setup.model.init(jax.random.PRNGKey(int(cfg.seed)))
  if pair is None:
    pair = _canary(setup, options, level, relation, params if plan.validates else None)
  lanes = _make_lanes(cfg, setup, options, plan)
  scores = _scores(setup, options, params, pair, plan, lanes, fixed_ids)
  inside = lanes.bits.astype(bool)
  est = estimators.best_of(scores[:, inside], scores[:, ~inside], privacy.delta,
                           float(options.significance))
  ratio = est.clopper_pearson / plan.eps_round if plan.eps_round > 0 else math.inf
  return AuditResult(
      epsilon_lower=est.clopper_pearson, epsilon_one_run=est.one_run, epsilon_gdp=est.gdp,
      epsilon_certified=plan.eps_round, epsilon_certified_run=plan.eps_run,
      ratio=float(ratio), delta=float(privacy.delta), significance=float(options.significance),
      trials=int(options.trials), trials_in=int(inside.sum()), level=level, placement=privacy.placement,
      mechanism=privacy.mechanism, clip_mode=cfg.client.clip_mode, variant=options.variant,
      noise_scale=float(plan.central_noise if central else np.max(plan.client_noise)),
      sensitivity=plan.sensitivity, rounds=int(cfg.rounds), wall_s=time.time() - t0,
      relation=relation, count_noise=lanes.count_noise * (
          10.0 if options.variant == "noise_div10" else 1.0))
