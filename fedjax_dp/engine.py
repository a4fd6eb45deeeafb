"""The round as one compiled program, and the thin host loop around it.

Data flow of one round (ARCHITECTURE.md)::

  host:   plan = schedule.plan(state, t)       -> noise scale per client, lr, stop
  host:   idx  = select_clients(rng[seed, t])  -> selected ids [K] (padded, masked)
  device: one jitted call of ``round_step``:
            gather the selected clients' data by index      [K, n_max, ...]
            vmap(client_update) (clipping, step/upload noise inside)
            weighted mean (+ central noise), server step
  device: evaluate(params, test set)          -> loss, accuracy (scalars leave)
  host:   accountant, schedule.observe(metrics)

Everything that varies between rounds or sweep points (selected ids, noise scales,
learning rate, clip norm, seed, round index) is a traced argument of ``round_step``,
so changing it never recompiles.

Scaling (docs/scaling.md):

* ``RoundConfig.client_chunk`` runs the K clients as a ``lax.scan`` over vmapped
  chunks, so memory is bounded by one chunk (:func:`client_chunk_for_memory`
  picks it from the free memory);
* :func:`sweep_step` runs a sweep's points together: leading axes ``[G, L]`` of G
  cohorts (points that select the same clients; :func:`cohort_step` reads their
  clients' data once) of L points;
* :func:`make_sweep_fns` lays cohorts and clients over the devices of a mesh
  (:mod:`fedjax_dp.sharding`).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import client as client_lib
from fedjax_dp import one_step, sharding
from fedjax_dp import selection as selection_lib
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.models import layers, zoo
from fedjax_dp.models.base import Model
from fedjax_dp.privacy import mechanisms

PyTree = Any
SELECTIONS = selection_lib.SELECTIONS
AGGREGATIONS = ("normalized", "unnormalized", "fixed")
CONV_IMPLS = ("auto",) + layers.CONV_IMPLS
SERVER_TAG = 1  # round_key -> fold_in(round_key, SERVER_TAG) for server-side noise
AGGREGATE_NOISE_TAG = 2  # server_key -> fold_in(., 2): the aggregated upload noise
CLIENT_TAG = 0  # round_key -> fold_in(fold_in(round_key, CLIENT_TAG), client_id)
STREAM_TAG = 3  # stream s != 0: round_key -> fold_in(fold_in(round_key, STREAM_TAG), s_0)...
COUNT_NOISE_TAG = 4  # server_key -> fold_in(., 4): noise of the clip rule's count
# round_key -> fold_in(., 5): noise of the released validation score on the selected
# clients' data (schedule.validation='clients', A-DPFL eq. (15))
VALIDATION_NOISE_TAG = 5
# server.clip_rule: how the server's update clip bound S is set (central placement,
# update_l2): fixed (S = client.clip) | median (Geyer et al. 2017: the cohort's median
# update norm; data dependent, certified epsilon inf) | private_median (Andrew et al.
# 2021: S_t from a noisy count of unclipped updates, updated by the host).
CLIP_RULES = ("fixed", "median", "private_median")


class RoundArgs(NamedTuple):
  """Traced inputs of one round.

  Attributes:
    idx: ``[K]`` int32 ids of the selected clients (padding repeats a valid id).
    sel_mask: ``[K]`` float32, 1 for selected clients, 0 for padding (Poisson).
    lr: ``[E]`` local learning rate of each step.
    clip: clipping threshold C.
    noise: ``[K]`` noise scale of each selected client (step or upload placement).
    central_noise: noise scale added by the server to the aggregate.
    server_lr: server step size: ``w <- w + server_lr * (aggregate - w)``.
    round: round index t (for keys).
    seed: run seed (for keys).
    data_id: which dataset of a stacked :class:`FederatedData` (counts ``[D, U]``)
      this round reads; sweeps over seeds stack one partition per seed. Ignored for
      ordinary ``[U, ...]`` data.
    stream: the run's random stream, ``uint32 [2]`` from its config's identity
      (:func:`fedjax_dp.noise_identity.stream`; a scalar is one word): runs that
      share a seed, and so a cohort, draw independent noise and minibatches when
      their streams differ. All zeros is the seed's own stream.
    count_noise: ``clip_rule='private_median'``: std of the Gaussian noise on the
      count of selected clients whose update norm is at most ``clip`` (Andrew et al.
      2021, the ``sigma_b`` of their Alg. 1), required then (a round without it is
      refused: the count would go out unnoised); unused (may be None) otherwise.
      ``experiment.private_median_noise`` gives it with the round's clip and noise.
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
      and Conv layers (:func:`fedjax_dp.one_step.fusable`), train each block of clients as ONE
      weighted batch (:mod:`fedjax_dp.one_step`): per-client work shrinks to norms,
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
  """

  client: client_lib.ClientConfig = client_lib.ClientConfig()
  aggregation: str = "normalized"
  client_chunk: int = 0
  aggregate_upload_noise: bool = False
  fuse_one_step: bool = True
  expected_fraction: float = 1.0
  conv_impl: str = "auto"
  clip_rule: str = "fixed"

  def __post_init__(self):
    if not 0.0 < self.expected_fraction <= 1.0:
      raise ValueError("RoundConfig.expected_fraction must be in (0, 1], got "
                       f"{self.expected_fraction}")
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"server.aggregation: unknown {self.aggregation!r}; "
                       f"known: {AGGREGATIONS}")
    if self.clip_rule not in CLIP_RULES:
      raise ValueError(f"server.clip_rule: unknown {self.clip_rule!r}; known: {CLIP_RULES}")
    if self.clip_rule != "fixed" and (self.client.clip_mode != "update_l2"
                                      or self.client.noise_placement not in ("central",
                                                                             "none")):
      raise ValueError(f"server.clip_rule={self.clip_rule!r} clips the clients' updates at "
                       "the server: it needs client.clip_mode='update_l2' and "
                       "privacy.placement='central' (or 'none'); got "
                       f"{self.client.clip_mode!r}, {self.client.noise_placement!r}")
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


def round_key(seed: jax.Array, t: jax.Array, stream: jax.Array | int = 0) -> jax.Array:
  """``fold_in(PRNGKey(seed), t)``, moved to stream ``s`` by
  ``fold_in(fold_in(., STREAM_TAG), s_0), ..., s_n)`` when some word of ``s`` is not 0.

  ``stream`` is a scalar or a vector of uint32 words (a run's
  :func:`fedjax_dp.noise_identity.stream` is two); all zeros is the seed's own stream.
  """
  key = jax.random.fold_in(jax.random.PRNGKey(seed), t)
  words = jnp.atleast_1d(jnp.asarray(stream)).astype(jnp.uint32)
  moved = jax.random.fold_in(key, STREAM_TAG)
  for i in range(words.shape[0]):  # static: the words of one run's stream
    moved = jax.random.fold_in(moved, words[i])
  return jnp.where(jnp.any(words != 0), moved, key)


def client_keys(seed: jax.Array, t: jax.Array, ids: jax.Array,
                stream: jax.Array | int = 0) -> jax.Array:
  """Keys ``fold_in(fold_in(round_key(seed, t, stream), CLIENT_TAG), id)`` for ``ids [K]``."""
  base = jax.random.fold_in(round_key(seed, t, stream), CLIENT_TAG)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(ids)


def server_key(seed: jax.Array, t: jax.Array, stream: jax.Array | int = 0) -> jax.Array:
  """The server's key for round ``t``."""
  return jax.random.fold_in(round_key(seed, t, stream), SERVER_TAG)


def _take(a: jax.Array, data_id: jax.Array, idx: jax.Array, stacked: bool) -> jax.Array:
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


def _one(f):
  """``lanes`` of a single point: the function itself (no lane axis)."""
  return f


def conv_impl_for(cfg: RoundConfig, backend: str | None = None) -> str:
  """The convolution implementation a round uses: ``cfg.conv_impl`` unless ``'auto'``,
  then ``'im2col'`` on CPU (XLA:CPU runs the grouped convolutions of vmapped clients
  and convolution weight gradients slowly; docs/scaling.md) and ``'conv'`` elsewhere."""
  if cfg.conv_impl != "auto":
    return cfg.conv_impl
  return "im2col" if (backend or jax.default_backend()) == "cpu" else "conv"


def _round(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
           args: RoundArgs, active: jax.Array, lanes) -> tuple[PyTree, RoundMetrics]:
  """The round, for one point or for L points that share a cohort.

  Everything per point is written for ONE point and lifted by ``lanes``: the
  identity for :func:`round_step`, ``jax.vmap`` for :func:`cohort_step`, whose
  points share the selected clients (``idx``, ``sel_mask``, ``data_id``, ``seed``,
  ``round`` of the first lane). The shared cohort's data is gathered once, outside
  the lane axis, so XLA reads each client's examples once for all L points (one
  matmul with L points' weights side by side) instead of once per point.
  """
  model = zoo.with_conv_impl(model, conv_impl_for(cfg))
  cohort = args if lanes is _one else jax.tree_util.tree_map(lambda a: a[0], args)
  k = cohort.idx.shape[0]
  stacked = data.counts.ndim == 2

  def gather(a, idx):
    return _take(a, cohort.data_id, idx, stacked)

  # The weights' denominators need the whole cohort before any chunk runs; its counts
  # are a cheap gather of K ints.
  total_selected = jnp.sum(gather(data.counts, cohort.idx).astype(jnp.float32)
                           * cohort.sel_mask)
  selected_denom = jnp.maximum(total_selected, 1.0)
  if cfg.aggregation == "normalized":
    agg_denom = selected_denom
  elif cfg.aggregation == "fixed":
    agg_denom = cfg.expected_fraction * _dataset_total(data, cohort.data_id)
  else:
    agg_denom = _dataset_total(data, cohort.data_id)

  # Aggregated upload noise: the clients upload noiseless models and the server
  # adds the noise of their weighted sum (RoundConfig.aggregate_upload_noise).
  client_cfg = (dataclasses.replace(cfg.client, noise_placement="none")
                if cfg.aggregate_upload_noise else cfg.client)

  fuse = cfg.fuse_one_step and cfg.clip_rule == "fixed" and one_step.fusable(model, client_cfg)
  count_rule = cfg.clip_rule == "private_median"
  if count_rule and args.count_noise is None:
    raise ValueError("server.clip_rule='private_median' releases a noisy count: the round's "
                     "RoundArgs needs count_noise (experiment.private_median_noise gives it)")

  def block(idx, sel, noise):
    """Weighted sums over one block of clients ``idx [B]`` (noise ``[B]`` per point)."""
    d = gather_block(idx)
    c = d.counts.astype(jnp.float32) * sel
    b = idx.shape[0]

    def one_point(p, a, nz):
      # Keys are per point: lanes of a cohort share its clients, not their noise.
      keys = client_keys(cohort.seed, cohort.round, idx, a.stream)
      hp = client_lib.ClientHParams(
          lr=jnp.broadcast_to(a.lr, (b,) + jnp.shape(a.lr)),
          clip=jnp.broadcast_to(a.clip, (b,)), step_noise=nz, upload_noise=nz,
          count=d.counts.astype(jnp.float32))
      count = jnp.zeros(())
      if fuse:
        agg, loss, grad_norm = one_step.block_sum(model, client_cfg, p, d.x, d.y, d.mask,
                                                  keys, hp, c / agg_denom)
      else:
        update = jax.vmap(client_lib.client_update,
                          in_axes=(None, None, None, 0, 0, 0, 0, 0))
        out = update(model, client_cfg, p, d.x, d.y, d.mask, keys, hp)
        agg = jax.tree_util.tree_map(lambda w: jnp.tensordot(c / agg_denom, w, axes=1),
                                     out.params)
        loss, grad_norm = out.loss, out.grad_norm
        if count_rule:  # Andrew et al.'s b_i = 1[||Delta_i|| <= S_t], unweighted
          count = jnp.sum(sel * (out.update_norm <= a.clip).astype(jnp.float32))
      return (agg, jnp.sum(c / selected_denom * loss),
              jnp.sum(c / selected_denom * grad_norm), count)

    return lanes(one_point)(params, args, noise)

  def norms_block(idx, sel):
    """Unclipped update norms ``[B]`` (per point) of one block (``clip_rule='median'``):
    the same local training and keys as the clipped pass, without the final clip."""
    d = gather_block(idx)
    b = idx.shape[0]
    norm_cfg = dataclasses.replace(client_cfg, clip_mode="none", noise_placement="none")

    def one_point(p, a):
      keys = client_keys(cohort.seed, cohort.round, idx, a.stream)
      zero = jnp.zeros((b,))
      hp = client_lib.ClientHParams(
          lr=jnp.broadcast_to(a.lr, (b,) + jnp.shape(a.lr)),
          clip=jnp.broadcast_to(a.clip, (b,)), step_noise=zero, upload_noise=zero,
          count=d.counts.astype(jnp.float32))
      update = jax.vmap(client_lib.client_update, in_axes=(None, None, None, 0, 0, 0, 0, 0))
      out = update(model, norm_cfg, p, d.x, d.y, d.mask, keys, hp)
      sq = sum(jnp.sum(jnp.square(w - g[None]), axis=tuple(range(1, w.ndim)))
               for w, g in zip(jax.tree_util.tree_leaves(out.params),
                               jax.tree_util.tree_leaves(p)))
      return jnp.sqrt(sq)

    return lanes(one_point)(params, args)

  def gather_block(idx):
    return jax.tree_util.tree_map(lambda a: gather(a, idx), data)

  chunk = cfg.client_chunk
  if cfg.clip_rule == "median":
    # Geyer et al. (2017): S = median of the cohort's update norms, then every update
    # is clipped to S and the central noise is sigma S (the host planned it for
    # args.clip). The median reads the data: no sensitivity bound holds (the plan
    # certifies inf).
    if chunk <= 0 or chunk >= k:
      norms = norms_block(cohort.idx, cohort.sel_mask)
    else:
      num_chunks = -(-k // chunk)
      xs = (_chunked(cohort.idx, num_chunks, chunk, cohort.idx[0]),
            _chunked(cohort.sel_mask, num_chunks, chunk, 0.0))
      _, norms = jax.lax.scan(lambda c, i: (c, norms_block(*i)), 0, xs)
      # [chunks, (L,) B] -> [(L,) K]: slot s sits in chunk s % num_chunks (_chunked).
      norms = jnp.moveaxis(norms, 0, -1)
      norms = norms.reshape(norms.shape[:-2] + (-1,))[..., :k]
    s_median = lanes(lambda nm: masked_median(nm, cohort.sel_mask))(norms)
    args = args._replace(central_noise=args.central_noise * s_median / args.clip,
                         clip=s_median)
  if chunk <= 0 or chunk >= k:
    aggregate, train_loss, grad_norm, clip_count = block(cohort.idx, cohort.sel_mask,
                                                         args.noise)
  else:
    num_chunks = -(-k // chunk)
    noise = lanes(lambda nz: _chunked(nz, num_chunks, chunk, 0.0))(args.noise)
    if lanes is not _one:
      noise = jnp.swapaxes(noise, 0, 1)  # [L, chunks, B] -> [chunks, L, B]
    # Padding slots repeat a valid id and are masked out of every sum.
    xs = (_chunked(cohort.idx, num_chunks, chunk, cohort.idx[0]),
          _chunked(cohort.sel_mask, num_chunks, chunk, 0.0), noise)

    def body(acc, inputs):
      return jax.tree_util.tree_map(jnp.add, acc, block(*inputs)), None

    zeros = lanes(lambda p: (jax.tree_util.tree_map(jnp.zeros_like, p), jnp.zeros(()),
                             jnp.zeros(()), jnp.zeros(())))(params)
    (aggregate, train_loss, grad_norm, clip_count), _ = jax.lax.scan(body, zeros, xs)

  def finish(p, a, agg, loss, norm, count, on):
    if cfg.aggregation == "normalized":
      # No client selected (possible under Poisson sampling): keep the global model.
      agg = jax.tree_util.tree_map(lambda x, y: jnp.where(total_selected > 0, x, y), agg, p)
    elif cfg.aggregation == "fixed":
      # sum_i p_i w_i + (1 - sum_i p_i) w = w + sum_i p_i (w_i - w): average updates.
      rest = 1.0 - total_selected / agg_denom
      agg = jax.tree_util.tree_map(lambda x, y: x + rest * y, agg, p)
    if cfg.client.noise_placement == "central":
      agg = mechanisms.add_noise(server_key(a.seed, a.round, a.stream), agg, a.central_noise,
                                 cfg.client.mechanism)
    if cfg.aggregate_upload_noise:
      w = gather(data.counts, cohort.idx).astype(jnp.float32) * cohort.sel_mask / agg_denom
      std = jnp.sqrt(jnp.sum(jnp.square(w * a.noise)))
      agg = mechanisms.add_noise(
          jax.random.fold_in(server_key(a.seed, a.round, a.stream), AGGREGATE_NOISE_TAG), agg, std,
          "gaussian")
    if count_rule:
      count = count + a.count_noise * jax.random.normal(
          jax.random.fold_in(server_key(a.seed, a.round, a.stream), COUNT_NOISE_TAG), ())
    new = jax.tree_util.tree_map(lambda w, x: w + a.server_lr * (x - w), p, agg)
    update_sq = sum(jnp.sum(jnp.square(x - y)) for x, y in
                    zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(p)))
    metrics = RoundMetrics(train_loss=loss, grad_norm=norm,
                           num_selected=jnp.sum(cohort.sel_mask),
                           update_norm=jnp.sqrt(update_sq),
                           clip_bound=jnp.asarray(a.clip, jnp.float32), clip_count=count)
    # Inactive points (finished, or padding lanes) keep their model.
    return jax.tree_util.tree_map(lambda n, o: jnp.where(on, n, o), new, p), metrics

  return lanes(finish)(params, args, aggregate, train_loss, grad_norm, clip_count, active)


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


def evaluate(model: Model, params: PyTree, x: jax.Array, y: jax.Array,
             batch_size: int = 2048) -> tuple[jax.Array, jax.Array]:
  """Mean loss and accuracy of ``params`` on ``x [N, ...]``, ``y [N]``, in batches.

  For a regressor (``model.is_regression``, a static switch) the loss is the test MSE
  and the accuracy is NaN: there is no accuracy to report.

  A ``fori_loop`` slices batches of ``batch_size`` straight out of ``x``, so memory is
  bounded by one batch and the test set is never copied (padding it, or reshaping
  it into ``[num_batches, batch, ...]`` for ``lax.map``, copied all of it per call and
  made evaluation several times slower than the model on CPU). The last batch is
  shifted back to stay in bounds and counts only the examples it adds.
  """
  n = x.shape[0]
  bs = min(batch_size, n)
  num_batches = -(-n // bs)

  def body(i, carry):
    loss_sum, correct_sum = carry
    start = jnp.minimum(i * bs, n - bs)
    xb = jax.lax.dynamic_slice_in_dim(x, start, bs)
    yb = jax.lax.dynamic_slice_in_dim(y, start, bs)
    new = (start + jnp.arange(bs) >= i * bs).astype(jnp.float32)
    logits = model.apply(params, xb)
    losses = model.per_example_loss(logits, yb)
    if model.is_regression:
      correct = jnp.zeros_like(losses)
    else:
      correct = (jnp.argmax(logits, -1) == yb).astype(jnp.float32)
    return loss_sum + jnp.sum(losses * new), correct_sum + jnp.sum(correct * new)

  zero = jnp.zeros((), jnp.float32)
  loss_sum, correct_sum = jax.lax.fori_loop(0, num_batches, body, (zero, zero))
  accuracy = jnp.full((), jnp.nan, jnp.float32) if model.is_regression else correct_sum / n
  return loss_sum / n, accuracy


def selected_accuracy(model: Model, params: PyTree, data: FederatedData, args: RoundArgs,
                      std: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Accuracy of ``params`` on the union of the round's selected clients' local data,
  and its release with Gaussian noise (A-DPFL's validation score ``S_t``, eq. (15)).

  ``S_t = sum_{i in S} c_i / N_sel`` with ``c_i`` client i's correctly classified
  examples (masked: padding and unselected slots count nothing) and
  ``N_sel = sum_{i in S} |D_i|`` (public counts), i.e. the count-weighted mean of the
  per-client accuracies ``c_i / |D_i|``. Its replace-one-example sensitivity is
  ``1 / N_sel`` (:func:`fedjax_dp.privacy.plan.validation_sensitivity`).

  Args:
    model: the model (a classifier).
    params: one point's model (the new global model).
    data: client data ``[U, ...]`` (or ``[D, U, ...]`` indexed by ``args.data_id``).
    args: the round's :class:`RoundArgs` (``idx``, ``sel_mask``, ``data_id``, ``seed``,
      ``round``, ``stream`` are read).
    std: noise std of the release (``z_val / N_sel``; 0 releases the exact score).

  Returns:
    ``(released, exact)`` scalars: ``exact + N(0, std^2)`` with the key
    ``fold_in(round_key(seed, round, stream), VALIDATION_NOISE_TAG)``, and ``exact``.
  """
  stacked = data.counts.ndim == 2
  x, y, mask, counts = (_take(a, args.data_id, args.idx, stacked)
                        for a in (data.x, data.y, data.mask, data.counts))

  def correct(xi, yi, mi):  # [n_max, ...] -> correctly classified real examples
    pred = jnp.argmax(model.apply(params, xi), -1)
    return jnp.sum((pred == yi).astype(jnp.float32) * mi)

  c = jax.vmap(correct)(x, y, mask)  # [K]
  n_sel = jnp.sum(counts.astype(jnp.float32) * args.sel_mask)
  exact = jnp.sum(c * args.sel_mask) / jnp.maximum(n_sel, 1.0)
  key = jax.random.fold_in(round_key(args.seed, args.round, args.stream),
                           VALIDATION_NOISE_TAG)
  return exact + std * jax.random.normal(key, ()), exact


@functools.lru_cache(maxsize=32)
def make_validation_fn(model: Model, cfg: RoundConfig):
  """Jitted ``(params [G, L, ...], data, args [G, L], std [G, L]) -> (released, exact)``,
  each ``[G, L]``: :func:`selected_accuracy` of every point of a sweep."""
  model = zoo.with_conv_impl(model, conv_impl_for(cfg))
  one = jax.vmap(functools.partial(selected_accuracy, model), in_axes=(0, None, 0, 0))

  def fn(params, data, args, std):
    # One vmap over the flattened [G * L] points (the gather's batching rule takes one
    # point axis), as sweep_evaluate does.
    lead = std.shape
    flat = jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]),
                                  (params, args, std))
    out = one(flat[0], data, flat[1], flat[2])
    return jax.tree_util.tree_map(lambda a: a.reshape(lead), out)

  return jax.jit(fn)


def make_eval_fn(model: Model, batch_size: int = 2048):
  """``jit(evaluate)``: ``fn(params, x, y) -> (loss, accuracy)``."""
  return jax.jit(lambda params, x, y: evaluate(model, params, x, y, batch_size))


# ----------------------------------------------------------------------------- sweeps


def sweep_step(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
               args: RoundArgs, active: jax.Array, cohorts_in_sequence: bool = False,
               sweep_devices: int = 1) -> tuple[PyTree, RoundMetrics]:
  """The round of a sweep: G cohorts x L points each, sharing ``data``.

  Cohorts are independent. ``vmap`` over them turns every matmul into a batched
  matmul over G (each cohort reads different clients), which accelerators run well
  and XLA:CPU runs slowly (W4: 4 cohorts x 8 points took 111 ms vmapped vs 4 x 15 ms
  one cohort at a time). With ``cohorts_in_sequence`` each device runs its G / S
  cohorts one after another (``lax.map``) and only the S devices' share is vmapped,
  which the SPMD partitioner splits so that each device sees one.

  Args:
    model: the model.
    cfg: static round config (the same for every point).
    params: ``[G, L, ...]`` each point's global model.
    data: client data shared by all points (``[U, ...]``, or ``[D, U, ...]`` with a
      per-point ``args.data_id``).
    args: :class:`RoundArgs` whose every field has leading ``[G, L]`` axes; the L
      points of a cohort select the same clients (see :func:`cohort_step`).
    active: ``[G, L]`` bool; inactive points (finished, or padding lanes) keep their
      model, so points of different T run in one program to the largest T.
    cohorts_in_sequence: run a device's cohorts one after another (CPU) instead of
      vmapped (accelerators); the results are the same.
    sweep_devices: S, the size of the mesh's 'sweep' axis (divides G).

  Returns:
    ``(params [G, L, ...], metrics with [G, L] fields)``.
  """
  g, lanes = active.shape
  if lanes == 1:
    # One point per cohort: no lane axis (a size-1 vmap costs XLA relayout copies).
    def one(p, a, on):
      p, a = jax.tree_util.tree_map(lambda x: x[0], (p, a))
      new, m = _round(model, cfg, p, data, a, on[0], _one)
      return jax.tree_util.tree_map(lambda x: x[None], (new, m))
  else:
    def one(p, a, on):
      return cohort_step(model, cfg, p, data, a, on)
  if g == 1:
    return jax.tree_util.tree_map(lambda x: x[None], one(
        *jax.tree_util.tree_map(lambda x: x[0], (params, args, active))))
  if not cohorts_in_sequence or g == sweep_devices:
    return jax.vmap(one)(params, args, active)
  if g % sweep_devices:
    raise ValueError(f"{g} cohorts do not split over {sweep_devices} devices")
  if sweep_devices == 1:
    return jax.lax.map(lambda x: one(*x), (params, args, active))
  # [G, ...] -> [S, G/S, ...]: device s holds cohorts s*G/S ... (block sharding).
  split = jax.tree_util.tree_map(
      lambda x: x.reshape((sweep_devices, g // sweep_devices) + x.shape[1:]),
      (params, args, active))
  out = jax.vmap(lambda xs: jax.lax.map(lambda x: one(*x), xs))(split)
  return jax.tree_util.tree_map(lambda x: x.reshape((g,) + x.shape[2:]), out)


def sweep_evaluate(model: Model, params: PyTree, x: jax.Array, y: jax.Array,
                   batch_size: int = 2048) -> tuple[jax.Array, jax.Array]:
  """:func:`evaluate` of ``params [G, L, ...]`` on one test set: ``(loss, acc)``, each
  ``[G, L]``. The points' models meet every test batch together (one matmul), so the
  test set is read once per round, not once per point."""
  lead = jax.tree_util.tree_leaves(params)[0].shape[:2]
  flat = jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), params)
  loss, acc = jax.vmap(lambda p: evaluate(model, p, x, y, batch_size))(flat)
  return loss.reshape(lead), acc.reshape(lead)


def cohorts_in_sequence() -> bool:
  """Whether a device runs a sweep's cohorts one after another (see :func:`sweep_step`):
  on CPU, where XLA runs the batched matmuls of vmapped cohorts slowly."""
  return jax.default_backend() == "cpu"


@functools.lru_cache(maxsize=32)
def make_sweep_fns(model: Model, cfg: RoundConfig, eval_batch_size: int = 2048,
                   mesh: Any = None):
  """Jitted ``(round_fn, eval_fn)`` over a sweep axis, laid out on ``mesh``.

  ``round_fn(params, data, args, active) -> (params, metrics)`` (:func:`sweep_step`,
  leading axes ``[G, L]``: cohorts, points per cohort) and
  ``eval_fn(params, x, y) -> (loss [G, L], acc [G, L])``. With a mesh (see
  :mod:`fedjax_dp.sharding`) the cohorts are split over its 'sweep' axis and the
  client slots over its 'clients' axis; data and metrics are replicated.
  Cached on the static arguments, so runs and sweeps of the same shapes in one
  process share one compiled program (jit caches by shape on top of that).
  """
  in_sequence = cohorts_in_sequence()
  sweep_devices = 1 if sharding.is_trivial(mesh) else mesh.shape[sharding.SWEEP]

  def round_fn(params, data, args, active):
    return sweep_step(model, cfg, params, data, args, active, in_sequence, sweep_devices)

  def eval_fn(params, x, y):
    return sweep_evaluate(model, params, x, y, eval_batch_size)

  if sharding.is_trivial(mesh):
    return jax.jit(round_fn, donate_argnums=0), jax.jit(eval_fn)
  pts, rep = sharding.points(mesh), sharding.replicated(mesh)
  args_sharding = round_args_sharding(mesh)
  return (jax.jit(round_fn, in_shardings=(pts, rep, args_sharding, pts),
                  out_shardings=(pts, rep), donate_argnums=0),
          jax.jit(eval_fn, in_shardings=(pts, rep, rep), out_shardings=rep))


def round_args_sharding(mesh) -> RoundArgs:
  """Shardings of stacked :class:`RoundArgs`: per-client fields ``[G, L, K]`` over
  ('sweep', -, 'clients'), the rest ``[G, L, ...]`` over 'sweep'."""
  pts, pc = sharding.points(mesh), sharding.point_clients(mesh)
  return RoundArgs(idx=pc, sel_mask=pc, lr=pts, clip=pts, noise=pc, central_noise=pts,
                   server_lr=pts, round=pts, seed=pts, data_id=pts, stream=pts,
                   count_noise=pts)


def available_memory_bytes(device: jax.Device | None = None) -> int:
  """Free memory of ``device``: the allocator's limit minus use (GPU/TPU), else the
  host's available RAM shared by its local CPU devices."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # some backends do not implement it
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  avail = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          avail = int(line.split()[1]) * 1024
  except OSError:
    pass
  if avail is None:
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return int(avail // max(1, jax.local_device_count()))


@functools.lru_cache(maxsize=32)
def _bytes_per_client(model: Model, cfg: RoundConfig, shapes: FederatedData) -> float:
  """Device bytes one more client slot costs in a round (compiled, not run)."""
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  steps = cfg.client.local_steps

  def temp_bytes(b):
    f32, i32 = jnp.float32, jnp.int32
    args = RoundArgs(
        idx=jax.ShapeDtypeStruct((b,), i32), sel_mask=jax.ShapeDtypeStruct((b,), f32),
        lr=jax.ShapeDtypeStruct((steps,), f32), clip=jax.ShapeDtypeStruct((), f32),
        noise=jax.ShapeDtypeStruct((b,), f32), central_noise=jax.ShapeDtypeStruct((), f32),
        server_lr=jax.ShapeDtypeStruct((), f32), round=jax.ShapeDtypeStruct((), i32),
        seed=jax.ShapeDtypeStruct((), jnp.uint32), data_id=jax.ShapeDtypeStruct((), i32),
        stream=jax.ShapeDtypeStruct((2,), jnp.uint32), count_noise=jax.ShapeDtypeStruct((), f32))
    lowered = jax.jit(lambda p, d, a: round_step(model, cfg, p, d, a)).lower(params, shapes, args)
    stats = lowered.compile().memory_analysis()
    return None if stats is None else stats.temp_size_in_bytes + stats.output_size_in_bytes

  b1, b2 = 2, 6
  t1, t2 = temp_bytes(b1), temp_bytes(b2)
  if t1 is not None and t2 is not None and t2 > t1:
    return (t2 - t1) / (b2 - b1)
  # No memory analysis on this backend: data, a few model copies and activations.
  n = shapes.x.shape[-len(model.input_shape) - 1]
  return 4.0 * (2 * n * int(np.prod(model.input_shape)) + 6 * model.num_params())


def client_chunk_for_memory(model: Model, cfg: RoundConfig, data: FederatedData,
                            k_slots: int, memory_bytes: int | None = None, lanes: int = 1,
                            multiple_of: int = 1, fraction: float = 0.5,
                            cache_bytes: int | None = None, cohorts: int = 1) -> int:
  """The largest client chunk whose round fits in ``fraction`` of the free memory.

  Measures the compiled round's temporary memory (``memory_analysis``) at two small
  chunk sizes, so the per-client cost includes the gathered data, activations,
  per-example work and model copies that XLA really allocates; nothing runs.

  Args:
    model: the model.
    cfg: the round config (its ``client_chunk`` is ignored).
    data: the client data (arrays or ``jax.ShapeDtypeStruct``s).
    k_slots: client slots per round K.
    memory_bytes: free memory per device; default :func:`available_memory_bytes`.
    lanes: points of one cohort running the round at once (they share the clients'
      data, see :func:`cohort_step`).
    multiple_of: the chunk is a multiple of this (the mesh's 'clients' axis size).
    fraction: share of the free memory the round's temporaries may take.
    cache_bytes: also keep a chunk's temporaries within this many bytes; default on
      CPU the last-level cache (a speed limit, not a memory limit), elsewhere none.
    cohorts: cohorts per device running at once (vmapped; 1 where they run in
      sequence, see :func:`sweep_step`).

  Returns:
    A chunk size for ``RoundConfig.client_chunk``; 0 when all K fit at once.
  """
  memory_bytes = available_memory_bytes() if memory_bytes is None else memory_bytes
  shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), data)
  # The probe leaves out the noise, whose threefry code takes XLA (CPU) seconds to
  # compile; a client's noise is a model-sized draw, counted here instead.
  quiet = dataclasses.replace(cfg, client_chunk=0, aggregate_upload_noise=False,
                              client=dataclasses.replace(cfg.client, noise_placement="none"))
  per_client = _bytes_per_client(model, quiet, shapes)
  if cfg.client.noise_placement in ("upload", "step") and not cfg.aggregate_upload_noise:
    per_client += 2 * 4 * model.num_params()
  # A cohort gathers a client's examples once for all its lanes; the rest (model
  # copies, activations, per-example work) is per lane.
  example_dims = len(model.input_shape) + 1
  shared = min(per_client, sum(a.dtype.itemsize * int(np.prod(a.shape[-dims:])) for a, dims in
                               ((shapes.x, example_dims), (shapes.y, 1), (shapes.mask, 1))))
  lane_bytes = max(cohorts, 1) * max(shared + max(lanes, 1) * (per_client - shared), 1.0)
  chunk = int(fraction * memory_bytes // lane_bytes)
  if cache_bytes is None and jax.default_backend() == "cpu" and not model.conv:
    # Only for all-dense models: XLA (CPU) runs convolution weight gradients inside
    # loops (the chunk scan) on a path ~15x slower than outside, so small chunks
    # cost CNNs far more than cache misses do.
    # A quarter of the last-level cache: XLA's buffers (temporaries, the gathered
    # block) outnumber what memory_analysis counts per client; measured best for
    # Wei's MLP round, 10,000-client logistic cohorts and a linear-SVM sweep.
    cache_bytes = _last_level_cache_bytes() // 4
  if cache_bytes:
    # On CPU a chunk whose temporaries stay in the last-level cache runs up to 2x
    # faster than one that streams them through DRAM (e.g. Wei's MLP round).
    chunk = min(chunk, max(1, int(cache_bytes // lane_bytes)))
  chunk = max(multiple_of, chunk - chunk % multiple_of)
  if chunk >= k_slots:
    return 0
  # The same number of chunks, as even as possible: the last chunk's padding slots
  # compute on nothing (K = 1000 in chunks of 161 pads 127 slots; of 143, one).
  num_chunks = -(-k_slots // chunk)
  return -(-k_slots // (num_chunks * multiple_of)) * multiple_of


def _last_level_cache_bytes(default: int = 32 << 20) -> int:
  """Size of the largest CPU cache (Linux sysfs), else ``default``."""
  sizes = []
  for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
    try:
      with open(path) as f:
        text = f.read().strip().upper()
    except OSError:
      continue
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    if digits.isdigit():
      sizes.append(int(digits) * scale)
  return max(sizes) if sizes else default


# ----------------------------------------------------------------------------- host side


def poisson_cap(num_clients: int, q: float) -> int:
  """Static padded cohort size for Poisson sampling (:func:`selection.poisson_cap`)."""
  return selection_lib.poisson_cap(num_clients, q)


def cohort_size(selection: str, num_clients: int, clients_per_round: int, q: float) -> int:
  """The static number of client slots K of a round for ``selection``."""
  return selection_lib.get_rule(selection).slots(num_clients, clients_per_round, q)


def select_clients(selection: str, num_clients: int, clients_per_round: int, q: float,
                   seed: int, t: int, weights: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Host-side client selection for round ``t`` by the rule ``selection``
  (:data:`fedjax_dp.selection.RULES`).

  A round's cohort depends only on ``(seed, t)`` (``np.random.default_rng([seed, t])``;
  round robin: on ``(seed, pass)``), not on earlier rounds, so a resumed or re-planned
  run draws the same cohorts.

  Args:
    selection: ``'uniform'`` (K of U without replacement; Wei "K-user random
      scheduling"), ``'poisson'`` (each client independently with rate q),
      ``'round_robin'`` (Fu et al.: K at a time through a fresh permutation of the
      U clients per pass of ceil(U/K) rounds), ``'all'``.
    num_clients: U.
    clients_per_round: K (uniform, round_robin).
    q: Poisson rate.
    seed: run seed.
    t: round index.
    weights: ``[U]`` the rule's per-client side information
      (:attr:`fedjax_dp.selection.SelectionRule.weights`; A-DPFL scores or
      probabilities), None for rules without.

  Returns:
    ``(idx [K_slots] int32, mask [K_slots] float32)``.
  """
  rule = selection_lib.get_rule(selection)
  k_slots = rule.slots(num_clients, clients_per_round, q)
  ids = rule.sample(num_clients, clients_per_round, q, seed, t, weights=weights)
  idx = np.zeros(k_slots, np.int32)
  mask = np.zeros(k_slots, np.float32)
  idx[:ids.size] = ids
  mask[:ids.size] = 1.0
  # Padding slots repeat client ids[0] (or 0); they are masked out of every sum.
  if ids.size:
    idx[ids.size:] = ids[0]
  return idx, mask
