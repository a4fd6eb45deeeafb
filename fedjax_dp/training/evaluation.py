"""Evaluation on the device: the test set, and the selected clients' validation score.

:func:`evaluate` gives a model's mean loss and accuracy on the test set in batches;
:func:`sweep_evaluate` does it for every point of a sweep in one pass over the test
set, :func:`sweep_evaluate_sets` when the points score on different sets.
:func:`selected_accuracy` is A-DPFL's validation score on the round's selected
clients' data, released with Gaussian noise (``schedule.validation='clients'``).
Only these aggregates leave the device.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.data.federated import FederatedData
from fedjax_dp.models import zoo
from fedjax_dp.models.base import Model
from fedjax_dp.training.keys import VALIDATION_NOISE_TAG, round_key
from fedjax_dp.training.rounds import (
  RoundArgs,
  RoundConfig,
  conv_impl_for,
  gather_block,
  model_params,
)

PyTree = Any


def evaluate(model: Model, params: PyTree, x: jax.Array, y: jax.Array,
             batch_size: int = 2048, which: jax.Array | None = None
             ) -> tuple[jax.Array, jax.Array]:
  """Mean loss and accuracy of ``params`` on ``x [N, ...]``, ``y [N]``, in batches.

  With ``which`` (an int32 scalar), ``x [E, N, ...]``, ``y [E, N]`` hold E evaluation
  sets of equal size and the model is scored on set ``which``: each batch is sliced
  out of that set alone, so under ``vmap`` over ``which`` only a batch per point is
  gathered, never a set.

  For a regressor (``model.is_regression``, a static switch) the loss is the test MSE
  and the accuracy is NaN: there is no accuracy to report.

  A ``fori_loop`` slices batches of ``batch_size`` straight out of ``x``, so memory is
  bounded by one batch and the test set is never copied (padding it, or reshaping
  it into ``[num_batches, batch, ...]`` for ``lax.map``, copied all of it per call and
  made evaluation several times slower than the model on CPU). The last batch is
  shifted back to stay in bounds and counts only the examples it adds.
  """
  n = x.shape[0] if which is None else x.shape[1]
  bs = min(batch_size, n)
  num_batches = -(-n // bs)

  def rows(a, start):
    if which is None:
      return jax.lax.dynamic_slice_in_dim(a, start, bs)
    return jax.lax.dynamic_slice(a, (which, start) + (0,) * (a.ndim - 2),
                                 (1, bs) + a.shape[2:])[0]

  def body(i, carry):
    loss_sum, correct_sum = carry
    start = jnp.minimum(i * bs, n - bs)
    xb, yb = rows(x, start), rows(y, start)
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


def sweep_evaluate(model: Model, params: PyTree, x: jax.Array, y: jax.Array,
                   batch_size: int = 2048) -> tuple[jax.Array, jax.Array]:
  """:func:`evaluate` of ``params [G, L, ...]`` on one test set: ``(loss, acc)``, each
  ``[G, L]``. The points' models meet every test batch together (one matmul), so the
  test set is read once per round, not once per point."""
  lead = jax.tree_util.tree_leaves(params)[0].shape[:2]
  flat = jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), params)
  loss, acc = jax.vmap(lambda p: evaluate(model, p, x, y, batch_size))(flat)
  return loss.reshape(lead), acc.reshape(lead)


def sweep_evaluate_sets(model: Model, params: PyTree, x: jax.Array, y: jax.Array,
                        which: jax.Array, batch_size: int = 2048
                        ) -> tuple[jax.Array, jax.Array]:
  """:func:`sweep_evaluate` where the points score on different evaluation sets of
  equal size: ``x [E, N, ...]``, ``y [E, N]`` (e.g. each seed's unassigned examples).

  ``which [G, L]`` names each point's set: each batch gathers one batch per point, so
  memory grows with the points, not with E. ``which [G]`` names one set per row (a
  row's runs share a cohort, hence usually a partition and its set): the row's lanes
  then read ONE batch together, as in :func:`sweep_evaluate`, instead of a gathered
  batch each, which on CPU made a LeNet-5 score 1.3x slower per lane (a grouped
  convolution over lanes in place of one over shared input).
  """
  if which.ndim == 1:
    def row(p, w):  # the row's lanes [L, ...] on its set w
      return jax.vmap(lambda q: evaluate(model, q, x, y, batch_size, w))(p)
    return jax.vmap(row)(params, which)
  lead = which.shape
  flat = jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), params)
  loss, acc = jax.vmap(lambda p, w: evaluate(model, p, x, y, batch_size, w))(
      flat, which.reshape(-1))
  return loss.reshape(lead), acc.reshape(lead)


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
  x, y, counts, mask = gather_block(data, args.data_id, args.idx, args.rows)

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
                                  (model_params(params), args, std))
    out = one(flat[0], data, flat[1], flat[2])
    return jax.tree_util.tree_map(lambda a: a.reshape(lead), out)

  return jax.jit(fn)


def make_eval_fn(model: Model, batch_size: int = 2048):
  """``jit(evaluate)``: ``fn(params, x, y) -> (loss, accuracy)``."""
  return jax.jit(lambda params, x, y: evaluate(model, params, x, y, batch_size))
