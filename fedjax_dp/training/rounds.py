"""The compiled round: one federated round as one traced program.

Data flow of one round (ARCHITECTURE.md)::

  host:   plan = schedule.plan(state, t)       -> noise scale per client, lr, stop
  host:   idx  = select_clients(rng[seed, t])  -> selected ids [K] (padded, masked)
  device: one jitted call of ``round_step``:
            gather the selected clients' data by index      [K, n_max, ...]
            vmap(client_update) (clipping, step/upload noise inside)
            weighted mean (+ central noise), server step

This module owns the round's types (:class:`RoundArgs`, :class:`RoundMetrics`,
:class:`RoundConfig`) and its body: :func:`round_step` for one point,
:func:`cohort_step` for L points that share a cohort. Everything that varies between
rounds or sweep points (selected ids, noise scales, learning rate, clip norm, seed,
round index) is a traced argument, so changing it never recompiles.
``RoundConfig.client_chunk`` runs the K clients as a ``lax.scan`` over vmapped
chunks, so memory is bounded by one chunk (docs/scaling.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import serialization

from fedjax_dp import optimizers
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.models import layers, zoo
from fedjax_dp.models.base import Model
from fedjax_dp.privacy import adaptive_clip, clip_modes, correlated, mechanisms
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import one_step
from fedjax_dp.training.keys import (
  AGGREGATE_NOISE_TAG,
  COUNT_NOISE_TAG,
  client_keys,
  correlated_key,
  server_key,
)

PyTree = Any
AGGREGATIONS = ("normalized", "unnormalized", "fixed")
CONV_IMPLS = ("auto",) + layers.CONV_IMPLS
# server.clip_rule: how the server's update clip bound S is set (central placement, a
# mode whose uploads are clipped updates): fixed (S = client.clip) | median | private_median
# (fedjax_dp.privacy.adaptive_clip, which owns the names and the rule of who may use them).
CLIP_RULES = adaptive_clip.CLIP_RULES


class RoundArgs(NamedTuple):
  """Traced inputs of one round.

  Attributes:
    idx: ``[K]`` int32 ids of the selected clients (padding repeats a valid id).
    sel_mask: ``[K]`` float32, 1 for selected clients, 0 for padding (Poisson).
    lr: ``[E]`` local learning rate of each step.
    clip: clipping threshold C.
    noise: ``[K]`` noise scale of each selected client (step or upload placement).
    central_noise: noise scale added by the server to the aggregate.
    server_lr: server step size: ``w <- w - server_lr * d`` with ``d`` the server
      optimizer's direction of the pseudo-gradient ``w - aggregate`` (``fedavg``:
      ``w + server_lr * (aggregate - w)``).
    round: round index t (for keys).
    seed: run seed (for keys).
    data_id: which dataset of a stacked :class:`FederatedData` (counts ``[D, U]``)
      this round reads; sweeps over seeds stack one partition per seed. Ignored for
      ordinary ``[U, ...]`` data.
    stream: the run's random stream, ``uint32 [2]`` from its config's identity
      (:func:`fedjax_dp.config.noise_identity.stream`; a scalar is one word): runs that
      share a seed, and so a cohort, draw independent noise and minibatches when
      their streams differ. All zeros is the seed's own stream.
    count_noise: ``clip_rule='private_median'``: std of the Gaussian noise on the
      count of selected clients whose update norm is at most ``clip`` (Andrew et al.
      2021, the ``sigma_b`` of their Alg. 1), required then (a round without it is
      refused: the count would go out unnoised); unused (may be None) otherwise.
      ``run_loop.private_median_noise`` gives it with the round's clip and noise.
    rows: ``[K]`` int32 rows of ``data.x``/``y``/``mask`` that hold the selected
      clients' examples, when the round is fed only its cohort's data (streamed
      from the host, :mod:`fedjax_dp.data.streaming`; ``data.counts`` stays the
      whole federation's). None (default): the rows are ``idx`` (device-resident
      ``[U, ...]`` data). Keys and weights always follow ``idx``, so a streamed
      round computes what the resident round computes.
  """

  idx: jax.Array
  sel_mask: jax.Array
  lr: jax.Array
  clip: jax.Array
  noise: jax.Array
  central_noise: jax.Array
  server_lr: jax.Array
  round: jax.Array
  seed: jax.Array
  data_id: jax.Array | int = 0
  stream: jax.Array | int = 0
  count_noise: jax.Array | None = None
  rows: jax.Array | None = None


class RoundMetrics(NamedTuple):
  """Scalars computed on the device each round."""

  train_loss: jax.Array     # mean over selected clients (weighted by |D_i|)
  grad_norm: jax.Array      # mean per-example gradient norm (per-example clipping)
  num_selected: jax.Array
  update_norm: jax.Array    # ||w^{t+1} - w^t||_2
  clip_bound: jax.Array | float = 0.0  # the update clip S the round used (update_l2)
  # private_median: noisy count of selected clients with update norm <= S (released)
  clip_count: jax.Array | float = 0.0


@dataclasses.dataclass(frozen=True)
class RoundConfig:
  """Static description of a round.

  Attributes:
    client: local training config.
    aggregation: ``'normalized'`` (p_i = |D_i| / sum over selected |D_j|, the spec's
      resolution) or ``'unnormalized'`` (p_i = |D_i| / |D|, Wei et al. eq. (2) as
      printed; shrinks the model by about K/U when K < U), or ``'fixed'``: the
      fixed-denominator estimator of DP-FedAvg (McMahan et al. 2018): the global
      model moves by ``sum_i |D_i| (w_i - w) / (f |D|)`` with ``f = expected_fraction``
      (q for Poisson, K/U for K of U), whatever the realised cohort. One client's
      weight is then bounded by ``max |D_i| / (f |D|)`` for every draw, which a
      central-noise sensitivity needs (the normalized weights of a small Poisson
      cohort are not bounded by the planned K).
    client_chunk: clients trained at once (one vmapped chunk); the K slots are
      processed as a ``lax.scan`` over chunks that accumulates the weighted sum, so
      memory holds one chunk of client data and model copies. 0 means all K at once.
      The result does not depend on it (keys are per client id).
    aggregate_upload_noise: Gaussian upload noise only: instead of drawing a
      model-sized N(0, sigma_k^2) for each of the K uploads, draw the noise of their
      weighted sum once, N(0, sum_k p_k^2 sigma_k^2) (a sum of independent Gaussians
      is Gaussian), on the server's key. The new global model has exactly the same
      distribution, the privacy guarantee is that of the per-client mechanism (each
      client's release is still what the accountant charges), and a round draws
      d random numbers instead of K d: the draw dominates a round of a small model
      on a CPU. Individual noisy uploads are then never materialised, and the
      random stream differs from per-client sampling.
    fuse_one_step: when local training is one full-batch step of a model of Dense
      and Conv layers (:func:`fedjax_dp.training.one_step.fusable`), train each block of clients as ONE
      weighted batch (:mod:`fedjax_dp.training.one_step`): per-client work shrinks to norms,
      and the weighted sum of the uploads is one matmul per layer. Same result up to
      float summation order; ``False`` forces the per-client path.
    expected_fraction: ``aggregation='fixed'`` only: the expected share of all
      examples selected in a round (q, or K/U).
    clip_rule: one of :data:`CLIP_RULES` (``update_l2`` clipping with central noise):
      ``'fixed'`` clips every update to ``args.clip``; ``'median'`` first trains the
      cohort once to measure its update norms, sets ``S`` to their median (per
      point), then trains it again (same keys, same updates) clipping to ``S`` and
      scales the central noise by ``S / args.clip`` (Geyer et al. 2017: noise
      ``sigma S``); ``'private_median'`` clips to ``args.clip`` (the host's ``S_t``)
      and also releases the count of unclipped updates plus ``N(0, count_noise^2)``
      in ``RoundMetrics.clip_count``. Both adaptive rules train per client (no
      one-step fusion).
    conv_impl: how a CNN's convolutions compute in the round
      (:class:`fedjax_dp.models.layers.Conv`): ``'conv'`` (XLA convolutions),
      ``'im2col'`` (unfolded input and a matmul) or ``'auto'`` (:func:`conv_impl_for`:
      im2col on CPU, conv elsewhere). Vmapped over clients whose weights differ, a
      convolution becomes a grouped convolution, which XLA:CPU runs slowly; im2col
      turns it into a batched matmul (docs/scaling.md has the measurements). Same
      result up to float summation order; models without convolutions ignore it.
    correlated: the strategy of a correlated mechanism (``privacy.mechanism`` tree or
      bandmf, :mod:`fedjax_dp.privacy.correlated`), None for i.i.d. noise. The server
      then adds ``central_noise * (C^+ Z)_t`` (round t's row of the correlated noise)
      instead of i.i.d. noise; a strategy that carries state (BandMF, b > 1) runs on
      :class:`CarriedParams` (:func:`carried_params`).
    server_optimizer: the server's step (``server.optimizer``,
      :data:`fedjax_dp.optimizers.SERVER_OPTIMIZERS`): its direction of the
      pseudo-gradient ``w - aggregate`` (after the server's noise: post-processing)
      times ``server_lr``. One whose direction has state (``fedavgm``, ``fedadam``,
      ``fedyogi``) runs on :class:`CarriedParams`; ``fedavg`` carries nothing.
  """

  client: client_lib.ClientConfig = client_lib.ClientConfig()
  aggregation: str = "normalized"
  client_chunk: int = 0
  aggregate_upload_noise: bool = False
  fuse_one_step: bool = True
  expected_fraction: float = 1.0
  conv_impl: str = "auto"
  clip_rule: str = "fixed"
  correlated: correlated.Strategy | None = None
  server_optimizer: optimizers.Optimizer = optimizers.FEDAVG

  def __post_init__(self):
    if not 0.0 < self.expected_fraction <= 1.0:
      raise ValueError("RoundConfig.expected_fraction must be in (0, 1], got "
                       f"{self.expected_fraction}")
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"server.aggregation: unknown {self.aggregation!r}; "
                       f"known: {AGGREGATIONS}")
    if self.clip_rule not in CLIP_RULES:
      raise ValueError(f"server.clip_rule: unknown {self.clip_rule!r}; known: {CLIP_RULES}")
    if self.clip_rule != "fixed" and not adaptive_clip.server_clip_ok(
        clip_modes.get(self.client.clip_mode), self.client.noise_placement):
      modes = [n for n, m in clip_modes.CLIP_MODES.items() if m.proof.server_clip]
      raise ValueError(f"server.clip_rule={self.clip_rule!r} clips the clients' updates at "
                       f"the server: it needs client.clip_mode in {', '.join(modes)} and "
                       "privacy.placement='central' (or 'none'); got "
                       f"{self.client.clip_mode!r}, {self.client.noise_placement!r}")
    if self.correlated is not None and (self.client.noise_placement not in ("central", "none")
                                        or self.clip_rule != "fixed"):
      raise ValueError(f"privacy.mechanism={self.correlated.name!r} is central noise on "
                       "fixed-clip updates: it needs privacy.placement='central' and "
                       f"server.clip_rule='fixed' (got {self.client.noise_placement!r}, "
                       f"{self.clip_rule!r})")
    if self.conv_impl not in CONV_IMPLS:
      raise ValueError(f"server.conv_impl: unknown {self.conv_impl!r}; known: {CONV_IMPLS}")
    if self.client_chunk < 0:
      raise ValueError(f"server.client_chunk must be >= 0 (0 = all clients at once) once "
                       f"resolved, got {self.client_chunk}")
    if self.aggregate_upload_noise and (self.client.noise_placement != "upload"
                                        or self.client.mechanism != "gaussian"):
      raise ValueError("privacy.noise_sampling='aggregate' needs Gaussian upload noise "
                       "(a sum of Laplace draws is not Laplace); got placement "
                       f"{self.client.noise_placement!r}, mechanism {self.client.mechanism!r}")


def round_config(cfg, *, client_chunk: int = 0, expected_fraction: float = 1.0,
                 correlated_noise: Any = None,
                 client_optimizer: optimizers.Optimizer | None = None,
                 server_optimizer: optimizers.Optimizer | None = None) -> RoundConfig:
  """The static :class:`RoundConfig` of a run config's round.

  Args:
    cfg: the run's config (``client``, ``privacy``, ``server`` fields are read).
    client_chunk: :attr:`RoundConfig.client_chunk`.
    expected_fraction: :attr:`RoundConfig.expected_fraction` (``aggregation='fixed'``:
      the privacy plan's expected share of examples in a round).
    correlated_noise: :attr:`RoundConfig.correlated`, the privacy plan's strategy.
    client_optimizer, server_optimizer: optimizers given from Python (e.g.
      :func:`fedjax_dp.optimizers.from_transformation`) in place of the config's
      ``client.optimizer`` / ``server.optimizer``.
  """
  ccfg = client_lib.ClientConfig(
      local_steps=cfg.client.local_steps, batch_size=cfg.client.batch_size,
      clip_mode=cfg.client.clip_mode, noise_placement=cfg.privacy.placement,
      mechanism=cfg.privacy.mechanism, l2_reg=cfg.client.l2_reg,
      chunk_size=cfg.client.chunk_size, minibatch=cfg.client.get("minibatch", "shuffle"),
      optimizer=client_optimizer or optimizers.client_optimizer(cfg.client))
  return RoundConfig(ccfg, cfg.server.aggregation, client_chunk,
                     aggregate_upload_noise=cfg.privacy.noise_sampling == "aggregate",
                     expected_fraction=expected_fraction,
                     conv_impl=cfg.server.get("conv_impl", "auto"),
                     clip_rule=cfg.server.get("clip_rule", "fixed"),
                     correlated=correlated_noise,
                     server_optimizer=server_optimizer or optimizers.server_optimizer(
                         cfg.server))


class CarriedParams(NamedTuple):
  """The server's state, carried by the round from one call to the next: the global
  model, the correlated noise's state (BandMF: ``w_{t-1} .. w_{t-b+1}``,
  ``[b-1, *leaf]`` per leaf) and the server optimizer's state (``fedadam``: its
  moments). A part the run does not carry is None. Checkpointed with the model
  (:func:`carried_state_dict`), never written to ``model.msgpack``: the states are
  the server's own."""

  model: PyTree
  noise: PyTree = None
  opt: PyTree = None


def _noise_state(cfg: RoundConfig, params: PyTree) -> PyTree:
  s = cfg.correlated
  return None if s is None else correlated.get(s.name).init(s, params)


def initial_states(cfg: RoundConfig, params: PyTree) -> tuple[PyTree, PyTree]:
  """``(noise state, optimizer state)`` a run starts from, None where none is carried."""
  return _noise_state(cfg, params), cfg.server_optimizer.init(params)


def carries_state(cfg: RoundConfig) -> bool:
  """Whether the round runs on :class:`CarriedParams`: a correlated strategy with
  state, or a server optimizer with state."""
  return cfg.server_optimizer.stateful or _noise_state(cfg, jnp.zeros(())) is not None


def carried_params(cfg: RoundConfig, params: PyTree) -> PyTree:
  """A run's initial round input: ``params``, or :class:`CarriedParams` with the
  initial states when the round carries any (:func:`carries_state`)."""
  if not carries_state(cfg) or isinstance(params, CarriedParams):
    return params
  return CarriedParams(params, *initial_states(cfg, params))


def model_params(params: PyTree) -> PyTree:
  """The model of a round input (strips :class:`CarriedParams`' states)."""
  return params.model if isinstance(params, CarriedParams) else params


def carried_state_dict(params: PyTree) -> Any:
  """``flax.serialization.to_state_dict(params)``, with a :class:`CarriedParams`'
  absent (None) parts left out: a run that carries only a correlated mechanism's
  state writes the checkpoint it wrote before server optimizers existed."""
  if not isinstance(params, CarriedParams):
    return serialization.to_state_dict(params)
  return {k: serialization.to_state_dict(v) for k, v in params._asdict().items()
          if v is not None}


def carried_from_state_dict(template: PyTree, state: Any) -> PyTree:
  """The inverse of :func:`carried_state_dict` against a ``template`` of the same
  structure (raises KeyError or ValueError on a state of another structure)."""
  if not isinstance(template, CarriedParams):
    return serialization.from_state_dict(template, state)
  if set(state) != {k for k, v in template._asdict().items() if v is not None}:
    raise ValueError(f"the carried state holds {sorted(state)}, the run carries "
                     f"{[k for k, v in template._asdict().items() if v is not None]}")
  return template._replace(**{k: serialization.from_state_dict(getattr(template, k), v, name=k)
                              for k, v in state.items()})


def take_rows(a: jax.Array, data_id: jax.Array, idx: jax.Array, stacked: bool) -> jax.Array:
  """Rows ``idx [B]`` of a per-client array ``[U, ...]`` (or ``[D, U, ...]`` if stacked).

  Stacked data is indexed by ``(data_id, idx)`` in one gather: under the sweep's vmap
  ``data_id`` is batched, and indexing the dataset first would copy all of it per point.
  Ids are clipped into range (the host sampler only produces valid ids).
  """
  lead = 2 if stacked else 1
  flat = a.reshape(a.shape[:lead] + (-1,))
  rows = _gather_rows(flat, jnp.asarray(data_id, jnp.int32), idx)
  return rows.reshape(idx.shape + a.shape[lead:])


@jax.custom_batching.custom_vmap
def _gather_rows(flat: jax.Array, data_id: jax.Array, idx: jax.Array) -> jax.Array:
  """``flat[idx]`` (``[U, F]``) or ``flat[data_id, idx]`` (``[D, U, F]``): ``[*idx.shape, F]``."""
  if flat.ndim == 3:
    return flat.at[data_id, idx].get(mode="clip")
  return jnp.take(flat, idx, axis=0, mode="clip")


@_gather_rows.def_vmap
def _gather_rows_vmap(axis_size, in_batched, flat, data_id, idx):
  """Under the sweep's vmap: one gather of all points' rows, in ``[P, B, F]`` order.

  JAX's generic rule puts the new axis after the gathered one, and XLA (CPU) then
  relayouted the gathered client data with extra full copies per round; gathering
  with the flattened indices gives one row-major ``[P * B, F]`` gather instead.
  """
  flat_batched, id_batched, idx_batched = in_batched
  if flat_batched:  # per-point data arrays: no shared rows to gather from
    out = jax.vmap(_gather_rows.fun, in_axes=(0, 0 if id_batched else None,
                                              0 if idx_batched else None))(flat, data_id, idx)
    return out, True
  if not idx_batched:
    idx = jnp.broadcast_to(idx, (axis_size,) + idx.shape)
  data_id = jnp.broadcast_to(data_id if id_batched else data_id[None],
                             (axis_size,) + data_id.shape[int(id_batched):])
  ids = jnp.broadcast_to(data_id.reshape((axis_size,) + (1,) * (idx.ndim - 1)), idx.shape)
  rows = _gather_rows(flat, ids.reshape(-1), idx.reshape(-1))
  return rows.reshape(idx.shape + flat.shape[-1:]), True


def _dataset_total(data: FederatedData, data_id: jax.Array) -> jax.Array:
  """``|D|``: all examples of the (selected) dataset, for unnormalized weights."""
  counts = data.counts[data_id] if data.counts.ndim == 2 else data.counts
  return jnp.sum(counts).astype(jnp.float32)


def _chunked(a: jax.Array, num_chunks: int, chunk: int, fill) -> jax.Array:
  """``[K, ...] -> [num_chunks, chunk, ...]``, padding with ``fill``; slot s goes to
  chunk ``s % num_chunks``.

  The strided assignment keeps a client axis that is sharded in contiguous blocks
  sharded within every chunk, so the scan over chunks moves no data between devices.
  """
  pad = num_chunks * chunk - a.shape[0]
  a = jnp.concatenate([a, jnp.broadcast_to(fill, (pad,) + a.shape[1:]).astype(a.dtype)])
  return jnp.swapaxes(a.reshape((chunk, num_chunks) + a.shape[1:]), 0, 1)


def _chunked_rows(rows: jax.Array | None, num_chunks: int, chunk: int):
  """:func:`_chunked` for a streamed cohort's rows (padding repeats row 0, as the ids'
  padding repeats id 0 of the cohort); None stays None (resident data)."""
  return None if rows is None else _chunked(rows, num_chunks, chunk, rows[0])


def _one(f):
  """``lanes`` of a single point: the function itself (no lane axis)."""
  return f


def conv_impl_for(cfg: RoundConfig, backend: str | None = None) -> str:
  """The convolution implementation a round uses: ``cfg.conv_impl`` unless ``'auto'``,
  then ``'im2col'`` on CPU and GPU and ``'conv'`` elsewhere (TPU, unmeasured).

  Vmapped clients turn each convolution into a grouped one. XLA:CPU runs those and
  convolution weight gradients slowly (docs/scaling.md); on one NVIDIA H200 cuDNN's
  grouped convolutions ran W2's round 3.1x slower than im2col's batched matmuls
  (0.0345 s vs 0.0112 s; BENCHMARKS.md, "On one GPU")."""
  if cfg.conv_impl != "auto":
    return cfg.conv_impl
  return "im2col" if (backend or jax.default_backend()) in ("cpu", "gpu") else "conv"


class _Round(NamedTuple):
  """What every part of one round reads: its static config, its traced inputs and the
  cohort they share (built by :func:`_prepare`)."""

  model: Model                 # with the round's convolution lowering
  cfg: RoundConfig
  client_cfg: client_lib.ClientConfig  # upload noise off when the server aggregates it
  params: PyTree               # the global model(s): one point, or [L] lanes
  data: FederatedData
  args: RoundArgs              # per point ([L] lanes under ``lanes``)
  cohort: RoundArgs            # lane 0's args: ids, mask, data_id, seed, round
  lanes: Callable              # _one, or jax.vmap over the L points of a cohort
  fuse: bool                   # train blocks with fedjax_dp.training.one_step
  total_selected: jax.Array    # sum of the selected clients' |D_i|
  selected_denom: jax.Array    # max(total_selected, 1): the loss weights' denominator
  agg_denom: jax.Array         # the aggregation weights' denominator

  def gather(self, a: jax.Array, idx: jax.Array) -> jax.Array:
    return take_rows(a, self.cohort.data_id, idx, self.data.counts.ndim == 2)

  def gather_block(self, idx: jax.Array, rows: jax.Array | None = None) -> FederatedData:
    """The block's clients ``idx [B]``: examples from ``rows [B]`` of a streamed
    cohort's data (if given), counts from the federation's."""
    return gather_block(self.data, self.cohort.data_id, idx, rows)


def gather_block(data: FederatedData, data_id: jax.Array, idx: jax.Array,
                 rows: jax.Array | None) -> FederatedData:
  """Clients ``idx [B]`` of ``data`` as a :class:`FederatedData` with leading axis B.

  Args:
    data: resident ``[U, ...]`` (or stacked ``[D, U, ...]``) data, or a streamed
      cohort's: ``x``/``y``/``mask`` ``[R, ...]`` rows and the federation's counts.
    data_id: which stacked dataset (ignored unless ``counts`` is ``[D, U]``).
    idx: ``[B]`` client ids (they index ``counts``, and the examples when ``rows`` is None).
    rows: ``[B]`` rows of a streamed cohort's ``x``/``y``/``mask``, or None.
  """
  stacked = data.counts.ndim == 2
  counts = take_rows(data.counts, data_id, idx, stacked)
  if rows is None:
    x, y, mask = (take_rows(a, data_id, idx, stacked) for a in (data.x, data.y, data.mask))
  else:
    x, y, mask = (take_rows(a, 0, rows, False) for a in (data.x, data.y, data.mask))
  return FederatedData(x=x, y=y, counts=counts, mask=mask)


def _prepare(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
             args: RoundArgs, lanes) -> _Round:
  """The round's context: the cohort, the weights' denominators (they need the whole
  cohort before any chunk runs; its counts are a cheap gather of K ints) and the
  client config (aggregated upload noise: the clients upload noiseless models and
  the server adds the noise of their weighted sum, RoundConfig.aggregate_upload_noise)."""
  model = zoo.with_conv_impl(model, conv_impl_for(cfg))
  cohort = args if lanes is _one else jax.tree_util.tree_map(lambda a: a[0], args)
  counts = take_rows(data.counts, cohort.data_id, cohort.idx, data.counts.ndim == 2)
  total_selected = jnp.sum(counts.astype(jnp.float32) * cohort.sel_mask)
  selected_denom = jnp.maximum(total_selected, 1.0)
  if cfg.aggregation == "normalized":
    agg_denom = selected_denom
  elif cfg.aggregation == "fixed":
    agg_denom = cfg.expected_fraction * _dataset_total(data, cohort.data_id)
  else:
    agg_denom = _dataset_total(data, cohort.data_id)
  client_cfg = (dataclasses.replace(cfg.client, noise_placement="none")
                if cfg.aggregate_upload_noise else cfg.client)
  fuse = cfg.fuse_one_step and cfg.clip_rule == "fixed" and one_step.fusable(model, client_cfg)
  if cfg.clip_rule == "private_median" and args.count_noise is None:
    raise ValueError("server.clip_rule='private_median' releases a noisy count: the round's "
                     "RoundArgs needs count_noise (run_loop.private_median_noise gives it)")
  return _Round(model, cfg, client_cfg, params, data, args, cohort, lanes, fuse,
                total_selected, selected_denom, agg_denom)


def _hparams(a: RoundArgs, b: int, step_noise: jax.Array, upload_noise: jax.Array,
             counts: jax.Array) -> client_lib.ClientHParams:
  """One point's :class:`client.ClientHParams` for a block of ``b`` clients."""
  return client_lib.ClientHParams(
      lr=jnp.broadcast_to(a.lr, (b,) + jnp.shape(a.lr)),
      clip=jnp.broadcast_to(a.clip, (b,)), step_noise=step_noise, upload_noise=upload_noise,
      count=counts.astype(jnp.float32))


def _block(r: _Round, idx: jax.Array, sel: jax.Array, noise: jax.Array,
           rows: jax.Array | None = None):
  """Weighted sums over one block of clients ``idx [B]`` (noise ``[B]`` per point;
  examples at ``rows [B]`` of a streamed cohort, if given):
  ``(aggregate, train loss, gradient norm, unclipped count)``, per point."""
  d = r.gather_block(idx, rows)
  c = d.counts.astype(jnp.float32) * sel
  b = idx.shape[0]

  def one_point(p, a, nz):
    # Keys are per point: lanes of a cohort share its clients, not their noise.
    keys = client_keys(r.cohort.seed, r.cohort.round, idx, a.stream)
    hp = _hparams(a, b, nz, nz, d.counts)
    count = jnp.zeros(())
    if r.fuse:
      agg, loss, grad_norm = one_step.block_sum(r.model, r.client_cfg, p, d.x, d.y, d.mask,
                                                keys, hp, c / r.agg_denom)
    else:
      update = jax.vmap(client_lib.client_update, in_axes=(None, None, None, 0, 0, 0, 0, 0))
      out = update(r.model, r.client_cfg, p, d.x, d.y, d.mask, keys, hp)
      agg = jax.tree_util.tree_map(lambda w: jnp.tensordot(c / r.agg_denom, w, axes=1),
                                   out.params)
      loss, grad_norm = out.loss, out.grad_norm
      if r.cfg.clip_rule == "private_median":
        # Andrew et al.'s b_i = 1[||Delta_i|| <= S_t], unweighted
        count = jnp.sum(sel * (out.update_norm <= a.clip).astype(jnp.float32))
    return (agg, jnp.sum(c / r.selected_denom * loss),
            jnp.sum(c / r.selected_denom * grad_norm), count)

  return r.lanes(one_point)(r.params, r.args, noise)


def _norms_block(r: _Round, idx: jax.Array, sel: jax.Array,
                 rows: jax.Array | None = None) -> jax.Array:
  """Unclipped update norms ``[B]`` (per point) of one block (``clip_rule='median'``):
  the same local training and keys as the clipped pass, without the final clip."""
  del sel  # (the median masks the padding slots itself)
  d = r.gather_block(idx, rows)
  b = idx.shape[0]
  norm_cfg = dataclasses.replace(r.client_cfg, clip_mode="none", noise_placement="none")

  def one_point(p, a):
    keys = client_keys(r.cohort.seed, r.cohort.round, idx, a.stream)
    zero = jnp.zeros((b,))
    hp = _hparams(a, b, zero, zero, d.counts)
    update = jax.vmap(client_lib.client_update, in_axes=(None, None, None, 0, 0, 0, 0, 0))
    out = update(r.model, norm_cfg, p, d.x, d.y, d.mask, keys, hp)
    sq = sum(jnp.sum(jnp.square(w - g[None]), axis=tuple(range(1, w.ndim)))
             for w, g in zip(jax.tree_util.tree_leaves(out.params),
                             jax.tree_util.tree_leaves(p)))
    return jnp.sqrt(sq)

  return r.lanes(one_point)(r.params, r.args)


def _median_clip(r: _Round) -> _Round:
  """Geyer et al. (2017): S = median of the cohort's update norms, then every update
  is clipped to S and the central noise is sigma S (the host planned it for
  args.clip). The median reads the data: no sensitivity bound holds (the plan
  certifies inf)."""
  cohort, k, chunk = r.cohort, r.cohort.idx.shape[0], r.cfg.client_chunk
  if chunk <= 0 or chunk >= k:
    norms = _norms_block(r, cohort.idx, cohort.sel_mask, cohort.rows)
  else:
    num_chunks = -(-k // chunk)
    xs = (_chunked(cohort.idx, num_chunks, chunk, cohort.idx[0]),
          _chunked(cohort.sel_mask, num_chunks, chunk, 0.0),
          _chunked_rows(cohort.rows, num_chunks, chunk))
    _, norms = jax.lax.scan(lambda c, i: (c, _norms_block(r, *i)), 0, xs)
    # [chunks, (L,) B] -> [(L,) K]: slot s sits in chunk s % num_chunks (_chunked).
    norms = jnp.moveaxis(norms, 0, -1)
    norms = norms.reshape(norms.shape[:-2] + (-1,))[..., :k]
  s_median = r.lanes(lambda nm: masked_median(nm, cohort.sel_mask))(norms)
  args = r.args._replace(central_noise=r.args.central_noise * s_median / r.args.clip,
                         clip=s_median)
  return r._replace(args=args)


def _client_sums(r: _Round):
  """:func:`_block` over the whole cohort: at once, or as a ``lax.scan`` over chunks
  that accumulates the sums (``RoundConfig.client_chunk``)."""
  cohort, k, chunk = r.cohort, r.cohort.idx.shape[0], r.cfg.client_chunk
  if chunk <= 0 or chunk >= k:
    return _block(r, cohort.idx, cohort.sel_mask, r.args.noise, cohort.rows)
  num_chunks = -(-k // chunk)
  noise = r.lanes(lambda nz: _chunked(nz, num_chunks, chunk, 0.0))(r.args.noise)
  if r.lanes is not _one:
    noise = jnp.swapaxes(noise, 0, 1)  # [L, chunks, B] -> [chunks, L, B]
  # Padding slots repeat a valid id and are masked out of every sum.
  xs = (_chunked(cohort.idx, num_chunks, chunk, cohort.idx[0]),
        _chunked(cohort.sel_mask, num_chunks, chunk, 0.0), noise,
        _chunked_rows(cohort.rows, num_chunks, chunk))

  def body(acc, inputs):
    return jax.tree_util.tree_map(jnp.add, acc, _block(r, *inputs)), None

  zeros = r.lanes(lambda p: (jax.tree_util.tree_map(jnp.zeros_like, p), jnp.zeros(()),
                             jnp.zeros(()), jnp.zeros(())))(r.params)
  sums, _ = jax.lax.scan(body, zeros, xs)
  return sums


def _correlated_noise(cfg: RoundConfig, a: RoundArgs, agg: PyTree, state: PyTree):
  """``(aggregate + central_noise * (C^+ Z)_t, state')``: round t's row of the
  correlated noise (:mod:`fedjax_dp.privacy.correlated`), from the run's correlated
  key (:func:`fedjax_dp.training.keys.correlated_key`) and the carried state."""
  s = cfg.correlated
  noise, state = correlated.get(s.name).sample(s, correlated_key(a.seed, a.stream), a.round,
                                               state, agg)
  agg = jax.tree_util.tree_map(lambda x, w: x + jnp.asarray(a.central_noise, x.dtype) * w,
                               agg, noise)
  return agg, state


def _server_noise(r: _Round, a: RoundArgs, agg: PyTree, count: jax.Array, state=None):
  """The server's draws on one point's aggregate: central noise (i.i.d., or correlated
  across rounds with the carried ``state``), the aggregated upload noise, and the
  private_median rule's noisy count. Returns ``(aggregate, count, state')``."""
  cfg, key = r.cfg, server_key(a.seed, a.round, a.stream)
  if cfg.client.noise_placement == "central" and cfg.correlated is not None:
    agg, state = _correlated_noise(cfg, a, agg, state)
  elif cfg.client.noise_placement == "central":
    agg = mechanisms.add_noise(key, agg, a.central_noise, cfg.client.mechanism)
  if cfg.aggregate_upload_noise:
    w = (r.gather(r.data.counts, r.cohort.idx).astype(jnp.float32) * r.cohort.sel_mask
         / r.agg_denom)
    std = jnp.sqrt(jnp.sum(jnp.square(w * a.noise)))
    agg = mechanisms.add_noise(jax.random.fold_in(key, AGGREGATE_NOISE_TAG), agg, std,
                               "gaussian")
  if cfg.clip_rule == "private_median":
    count = count + a.count_noise * jax.random.normal(
        jax.random.fold_in(key, COUNT_NOISE_TAG), ())
  return agg, count, state


def _server_step(opt: optimizers.Optimizer, w: PyTree, agg: PyTree, server_lr: jax.Array,
                 state: PyTree) -> tuple[PyTree, PyTree]:
  """``(w - server_lr d, state')``: ``d`` the server optimizer's direction of the
  pseudo-gradient ``w - aggregate`` (Reddi et al. 2021), from ``state`` (None: a
  stateless direction, ``fedavg``, whose ``d`` is the pseudo-gradient itself, so the
  step is ``w + server_lr (aggregate - w)`` bit for bit). It reads only the noisy
  aggregate and the public model: post-processing."""
  direction = opt.direction()
  st = direction.init(w) if state is None else state
  grad = jax.tree_util.tree_map(lambda x, y: x - y, w, agg)
  d, st = direction.update(grad, st, w)
  new = jax.tree_util.tree_map(lambda x, u: x - server_lr * u, w, d)
  return new, (None if state is None else st)


def _finish(r: _Round, p, a, agg, loss, norm, count, on, state=(None, None)):
  """One point's server step: the aggregate completed to a model, the server's noise,
  the server optimizer's step (:func:`_server_step`), the metrics; inactive points
  keep their model and their carried ``state = (noise state, optimizer state)``.
  Returns ``((model, state'), metrics)``."""
  if r.cfg.aggregation == "normalized":
    # No client selected (possible under Poisson sampling): keep the global model.
    agg = jax.tree_util.tree_map(lambda x, y: jnp.where(r.total_selected > 0, x, y), agg, p)
  elif r.cfg.aggregation == "fixed":
    # sum_i p_i w_i + (1 - sum_i p_i) w = w + sum_i p_i (w_i - w): average updates.
    rest = 1.0 - r.total_selected / r.agg_denom
    agg = jax.tree_util.tree_map(lambda x, y: x + rest * y, agg, p)
  noise_state, opt_state = state
  agg, count, noise_state = _server_noise(r, a, agg, count, noise_state)
  new, opt_state = _server_step(r.cfg.server_optimizer, p, agg, a.server_lr, opt_state)
  new_state = (noise_state, opt_state)
  update_sq = sum(jnp.sum(jnp.square(x - y)) for x, y in
                  zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(p)))
  metrics = RoundMetrics(train_loss=loss, grad_norm=norm,
                         num_selected=jnp.sum(r.cohort.sel_mask),
                         update_norm=jnp.sqrt(update_sq),
                         clip_bound=jnp.asarray(a.clip, jnp.float32), clip_count=count)
  def keep(n, o):
    return jnp.where(on, n, o)

  return (jax.tree_util.tree_map(keep, new, p),
          jax.tree_util.tree_map(keep, new_state, state)), metrics


def _round(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
           args: RoundArgs, active: jax.Array, lanes) -> tuple[PyTree, RoundMetrics]:
  """The round, for one point or for L points that share a cohort.

  Everything per point is written for ONE point and lifted by ``lanes``: the
  identity for :func:`round_step`, ``jax.vmap`` for :func:`cohort_step`, whose
  points share the selected clients (``idx``, ``sel_mask``, ``data_id``, ``seed``,
  ``round`` of the first lane). The shared cohort's data is gathered once, outside
  the lane axis, so XLA reads each client's examples once for all L points (one
  matmul with L points' weights side by side) instead of once per point.

  Reads top to bottom: the context (:func:`_prepare`), the adaptive clip bound
  (:func:`_median_clip`, ``clip_rule='median'``), the clients' weighted sums
  (:func:`_client_sums`), the server step per point (:func:`_finish`).

  A round that carries state (a correlated mechanism's, a server optimizer's) takes
  ``params`` as :class:`CarriedParams` and returns them so; given the bare model
  instead, its states start from the initial ones (round 0, as the audit runs it)
  and the bare model is returned.
  """
  carried = isinstance(params, CarriedParams)
  state = (params.noise, params.opt) if carried else (None, None)
  params = model_params(params)
  if not carried and carries_state(cfg):
    state = lanes(lambda p: initial_states(cfg, p))(params)
  r = _prepare(model, cfg, params, data, args, lanes)
  if cfg.clip_rule == "median":
    r = _median_clip(r)
  aggregate, train_loss, grad_norm, clip_count = _client_sums(r)

  def finish(p, a, agg, loss, norm, count, on, st):
    return _finish(r, p, a, agg, loss, norm, count, on, st)

  (new, state), metrics = lanes(finish)(params, r.args, aggregate, train_loss, grad_norm,
                                        clip_count, active, state)
  return (CarriedParams(new, *state) if carried else new), metrics


def masked_median(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Median of ``values [K]`` where ``mask > 0`` (the mean of the two middle ones for
  an even count); 0 when nothing is selected."""
  n = jnp.sum(mask > 0)
  v = jnp.sort(jnp.where(mask > 0, values, jnp.inf))
  lo = v[jnp.maximum((n - 1) // 2, 0)]
  hi = v[jnp.maximum(n // 2, 0)]
  return jnp.where(n > 0, 0.5 * (lo + hi), 0.0)


def round_step(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
               args: RoundArgs) -> tuple[PyTree, RoundMetrics]:
  """One federated round (un-jitted; see :func:`make_round_fn`).

  With ``cfg.client_chunk = B < K`` the K client slots run as a ``lax.scan`` over
  ``ceil(K / B)`` vmapped chunks of B clients that accumulates the weighted sum of the
  uploaded models: memory holds B clients' data, activations and model copies instead
  of K, and the result equals the all-at-once round up to float summation order.

  Args:
    model: the model.
    cfg: static round config.
    params: global model ``w^t``.
    data: all clients' data, device resident, ``[U, n_max, ...]`` (or ``[D, U, ...]``
      stacked datasets, indexed by ``args.data_id``).
    args: traced round inputs.

  Returns:
    ``(w^{t+1}, metrics)``.
  """
  return _round(model, cfg, params, data, args, jnp.bool_(True), _one)


def cohort_step(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
                args: RoundArgs, active: jax.Array) -> tuple[PyTree, RoundMetrics]:
  """:func:`round_step` for L points that select the same clients.

  Points with the same seed and partition draw the same cohort every round (the
  sampler depends on (seed, round) only), so they can share its data: a sweep over
  epsilon, learning rate or clip norm at a fixed seed is one cohort.

  Args:
    model: the model.
    cfg: static round config.
    params: ``[L, ...]`` the points' global models.
    data: client data.
    args: :class:`RoundArgs` with a leading ``[L]`` axis; ``idx``, ``sel_mask``,
      ``data_id``, ``seed`` and ``round`` are read from lane 0 (the others' must
      equal them; the host guarantees it).
    active: ``[L]`` bool; inactive points keep their model.

  Returns:
    ``(params [L, ...], metrics with [L] fields)``, each point's as
    :func:`round_step` would give it.
  """
  return _round(model, cfg, params, data, args, active, jax.vmap)


def make_round_fn(model: Model, cfg: RoundConfig):
  """``jit(round_step)`` with the static parts bound: ``fn(params, data, args)``."""
  def fn(params, data, args):
    return round_step(model, cfg, params, data, args)
  return jax.jit(fn)
