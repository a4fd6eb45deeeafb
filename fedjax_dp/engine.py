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
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import client as client_lib
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.models.base import Model
from fedjax_dp.privacy import mechanisms

PyTree = Any
SELECTIONS = ("uniform", "poisson", "round_robin", "all")
AGGREGATIONS = ("normalized", "unnormalized")
SERVER_TAG = 1  # round_key -> fold_in(round_key, SERVER_TAG) for server-side noise
CLIENT_TAG = 0  # round_key -> fold_in(fold_in(round_key, CLIENT_TAG), client_id)


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


class RoundMetrics(NamedTuple):
  """Scalars computed on the device each round."""

  train_loss: jax.Array     # mean over selected clients (weighted by |D_i|)
  grad_norm: jax.Array      # mean per-example gradient norm (per-example clipping)
  num_selected: jax.Array
  update_norm: jax.Array    # ||w^{t+1} - w^t||_2


@dataclasses.dataclass(frozen=True)
class RoundConfig:
  """Static description of a round.

  Attributes:
    client: local training config.
    aggregation: ``'normalized'`` (p_i = |D_i| / sum over selected |D_j|, the spec's
      resolution) or ``'unnormalized'`` (p_i = |D_i| / |D|, Wei et al. eq. (2) as
      printed; shrinks the model by about K/U when K < U).
  """

  client: client_lib.ClientConfig = client_lib.ClientConfig()
  aggregation: str = "normalized"

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"server.aggregation: unknown {self.aggregation!r}; "
                       f"known: {AGGREGATIONS}")


def client_keys(seed: jax.Array, t: jax.Array, ids: jax.Array) -> jax.Array:
  """Keys ``fold_in(fold_in(fold_in(PRNGKey(seed), t), CLIENT_TAG), id)`` for ``ids [K]``."""
  round_key = jax.random.fold_in(jax.random.PRNGKey(seed), t)
  base = jax.random.fold_in(round_key, CLIENT_TAG)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(ids)


def server_key(seed: jax.Array, t: jax.Array) -> jax.Array:
  """The server's key for round ``t``."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), t), SERVER_TAG)


def round_step(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
               args: RoundArgs) -> tuple[PyTree, RoundMetrics]:
  """One federated round (un-jitted; see :func:`make_round_fn`).

  Args:
    model: the model.
    cfg: static round config.
    params: global model ``w^t``.
    data: all clients' data, device resident, ``[U, n_max, ...]``.
    args: traced round inputs.

  Returns:
    ``(w^{t+1}, metrics)``.
  """
  x = jnp.take(data.x, args.idx, axis=0)
  y = jnp.take(data.y, args.idx, axis=0)
  mask = jnp.take(data.mask, args.idx, axis=0)
  counts = jnp.take(data.counts, args.idx, axis=0).astype(jnp.float32) * args.sel_mask
  keys = client_keys(args.seed, args.round, args.idx)
  k = args.idx.shape[0]
  hp = client_lib.ClientHParams(
      lr=jnp.broadcast_to(args.lr, (k,) + jnp.shape(args.lr)),
      clip=jnp.broadcast_to(args.clip, (k,)),
      step_noise=args.noise, upload_noise=args.noise)
  update = jax.vmap(client_lib.client_update, in_axes=(None, None, None, 0, 0, 0, 0, 0))
  out = update(model, cfg.client, params, x, y, mask, keys, hp)

  total_selected = jnp.sum(counts)
  if cfg.aggregation == "normalized":
    weights = counts / jnp.maximum(total_selected, 1.0)
  else:
    weights = counts / jnp.sum(data.counts).astype(jnp.float32)
  aggregate = jax.tree_util.tree_map(lambda w: jnp.tensordot(weights, w, axes=1), out.params)
  if cfg.aggregation == "normalized":
    # No client selected (possible under Poisson sampling): keep the global model.
    aggregate = jax.tree_util.tree_map(
        lambda a, p: jnp.where(total_selected > 0, a, p), aggregate, params)
  if cfg.client.noise_placement == "central":
    aggregate = mechanisms.add_noise(server_key(args.seed, args.round), aggregate,
                                     args.central_noise, cfg.client.mechanism)
  new = jax.tree_util.tree_map(lambda p, a: p + args.server_lr * (a - p), params, aggregate)

  loss_w = counts / jnp.maximum(total_selected, 1.0)
  update_sq = sum(jnp.sum(jnp.square(a - b)) for a, b in
                  zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(params)))
  metrics = RoundMetrics(
      train_loss=jnp.sum(loss_w * out.loss),
      grad_norm=jnp.sum(loss_w * out.grad_norm),
      num_selected=jnp.sum(args.sel_mask),
      update_norm=jnp.sqrt(update_sq))
  return new, metrics


def make_round_fn(model: Model, cfg: RoundConfig):
  """``jit(round_step)`` with the static parts bound: ``fn(params, data, args)``."""
  def fn(params, data, args):
    return round_step(model, cfg, params, data, args)
  return jax.jit(fn)


def evaluate(model: Model, params: PyTree, x: jax.Array, y: jax.Array,
             batch_size: int = 2048) -> tuple[jax.Array, jax.Array]:
  """Mean loss and accuracy of ``params`` on ``x [N, ...]``, ``y [N]``, in batches.

  Batches run in a ``lax.map`` so memory is bounded by ``batch_size`` examples.
  """
  n = x.shape[0]
  bs = min(batch_size, n)
  nb = -(-n // bs)
  pad = nb * bs - n
  xp = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((nb, bs) + x.shape[1:])
  yp = jnp.pad(y, (0, pad)).reshape(nb, bs)
  wp = jnp.pad(jnp.ones(n, jnp.float32), (0, pad)).reshape(nb, bs)

  def batch(inputs):
    xb, yb, wb = inputs
    logits = model.apply(params, xb)
    losses = model.per_example_loss(logits, yb)
    correct = (jnp.argmax(logits, -1) == yb).astype(jnp.float32)
    return jnp.sum(losses * wb), jnp.sum(correct * wb)

  losses, correct = jax.lax.map(batch, (xp, yp, wp))
  return jnp.sum(losses) / n, jnp.sum(correct) / n


def make_eval_fn(model: Model, batch_size: int = 2048):
  """``jit(evaluate)``: ``fn(params, x, y) -> (loss, accuracy)``."""
  return jax.jit(lambda params, x, y: evaluate(model, params, x, y, batch_size))


# ----------------------------------------------------------------------------- host side


def poisson_cap(num_clients: int, q: float) -> int:
  """Static padded cohort size for Poisson sampling: mean + 8 std (+1), at most U.

  A draw above the cap (probability < 1e-15) raises rather than silently dropping
  clients.
  """
  mean = num_clients * q
  return int(min(num_clients, np.ceil(mean + 8.0 * np.sqrt(mean * (1 - q)) + 1)))


def cohort_size(selection: str, num_clients: int, clients_per_round: int, q: float) -> int:
  """The static number of client slots K of a round for ``selection``."""
  if selection == "poisson":
    return poisson_cap(num_clients, q)
  if selection == "all":
    return num_clients
  return clients_per_round


def select_clients(selection: str, num_clients: int, clients_per_round: int, q: float,
                   seed: int, t: int) -> tuple[np.ndarray, np.ndarray]:
  """Host-side client selection for round ``t``.

  Uses ``np.random.default_rng([seed, t])`` so a round's cohort does not depend on
  earlier rounds (a resumed or re-planned run draws the same cohorts).

  Args:
    selection: ``'uniform'`` (K of U without replacement; Wei "K-user random
      scheduling"), ``'poisson'`` (each client independently with rate q),
      ``'round_robin'`` (Fu et al.: consecutive groups of K, cycling), ``'all'``.
    num_clients: U.
    clients_per_round: K (uniform, round_robin).
    q: Poisson rate.
    seed: run seed.
    t: round index.

  Returns:
    ``(idx [K_slots] int32, mask [K_slots] float32)``.
  """
  k_slots = cohort_size(selection, num_clients, clients_per_round, q)
  rng = np.random.default_rng([seed, t])
  if selection == "uniform":
    ids = np.sort(rng.choice(num_clients, clients_per_round, replace=False))
  elif selection == "poisson":
    ids = np.flatnonzero(rng.random(num_clients) < q)
    if ids.size > k_slots:
      raise RuntimeError(f"Poisson draw of {ids.size} clients exceeds the cap {k_slots}")
  elif selection == "round_robin":
    ids = (t * clients_per_round + np.arange(clients_per_round)) % num_clients
  elif selection == "all":
    ids = np.arange(num_clients)
  else:
    raise ValueError(f"server.selection: unknown {selection!r}; known: {SELECTIONS}")
  idx = np.zeros(k_slots, np.int32)
  mask = np.zeros(k_slots, np.float32)
  idx[:ids.size] = ids
  mask[:ids.size] = 1.0
  # Padding slots repeat client ids[0] (or 0); they are masked out of every sum.
  if ids.size:
    idx[ids.size:] = ids[0]
  return idx, mask
