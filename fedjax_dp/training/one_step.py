"""One full-batch local step: a block of clients trained as ONE weighted batch.

When local training is one full-batch step of a model of ghost Dense / Conv layers,
the server's weighted sum of the block's uploads is one weighted gradient over all
its examples (the math, and what stays per client: :mod:`fedjax_dp.privacy.fused`).
The fused step is an optional hook of a clip mode (``ClipMode.client.fused``, a
:class:`fedjax_dp.privacy.fused.FusedStep`): :func:`fusable` says when it applies,
:func:`block_sum` runs the block's forward and backward pass, calls the hook and adds
each client's upload noise, drawn with the client's own key exactly as
:func:`fedjax_dp.training.client.client_update` draws it.

The result equals the per-client path (``vmap(client_update)`` and a weighted sum,
the reference) up to float summation order; ``tests/test_one_step.py`` checks it for
every registered mode with a hook, noise placement, padding and chunking.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.models.base import Model
from fedjax_dp.privacy import clip_modes, clipping, mechanisms
from fedjax_dp.training import client as client_lib


def fusable(model: Model, cfg: client_lib.ClientConfig) -> bool:
  """Whether :func:`block_sum` computes this local training exactly: the one place that
  decides the fused path (a condition on the client's training goes here).

  Needs one full-batch step of an all-ghost model (Dense / Conv layers), a clip mode
  with a fused hook (``ClipMode.client.fused``; parameter projection and per-step
  gradient clipping have none), no per-step noise, no L2 regulariser unless the
  hook is exact with one (:attr:`fedjax_dp.privacy.fused.FusedStep.l2_reg`), and a
  client optimizer whose first step from its initial state is SGD's exactly
  (``Optimizer.plain_first_step``: ``sgd``; heavy-ball momentum, whose trace starts at
  0): Adam's normalised step is not a weighted gradient.
  """
  fused = clip_modes.get(cfg.clip_mode).client.fused
  return (model.ghost and cfg.local_steps == 1 and cfg.batch_size == 0
          and cfg.optimizer.plain_first_step
          and fused is not None
          and cfg.noise_placement in ("none", "central", "upload")
          and (fused.l2_reg or not cfg.l2_reg))


def block_sum(model: Model, cfg: client_lib.ClientConfig, params, x: jax.Array,
              y: jax.Array, mask: jax.Array, keys: jax.Array, hp: client_lib.ClientHParams,
              weights: jax.Array):
  """``sum_k weights_k * client_update(...).params`` for B clients, as one batch.

  Args:
    model: a ghost model (see :func:`fusable`).
    cfg: local training; must satisfy :func:`fusable`.
    params: the global model ``w`` (shared by the block).
    x: ``[B, n, *input_shape]`` the clients' (padded) examples.
    y: ``[B, n]`` labels.
    mask: ``[B, n]`` 1.0 for real examples.
    keys: ``[B]`` the clients' keys (upload noise).
    hp: :class:`fedjax_dp.training.client.ClientHParams` with ``[B, ...]`` fields.
    weights: ``[B]`` aggregation weights ``p_k`` (0 for padding slots).

  Returns:
    ``(weighted_sum, loss [B], grad_norm [B])`` -- the sum of the weighted uploads and
    each client's :class:`fedjax_dp.training.client.ClientOutput` ``loss`` and ``grad_norm``.
  """
  if not fusable(model, cfg):
    raise ValueError(f"one-step fusion does not apply to {cfg} with model {model.name!r}")
  b, n = mask.shape
  lr = jnp.reshape(jnp.asarray(hp.lr, jnp.float32), (b, -1))[:, 0]  # E = 1
  flat_mask = mask.reshape(b * n)
  layers, losses, flat_params = clipping.ghost_layers(
      model, params, x.reshape((b * n,) + x.shape[2:]), y.reshape(b * n), flat_mask)
  denom = jnp.maximum(jnp.sum(mask, 1), 1.0)
  loss = jnp.sum(losses.reshape(b, n) * mask, 1) / denom

  shrink = lr * cfg.l2_reg  # the regulariser's step, applied to w itself
  scale = jnp.broadcast_to((weights * lr / denom)[:, None], (b, n))
  fused = clip_modes.get(cfg.clip_mode).client.fused
  grad, grad_norm = fused.grad(layers, flat_params, mask, denom, hp.clip, lr, weights, scale)
  return _finish(cfg, params, grad, keys, hp, weights, shrink), loss, grad_norm


def _finish(cfg, params, grad, keys, hp, weights, shrink):
  """``sum_k p_k (1 - eta_k kappa) w - grad`` plus the weighted upload noise."""
  keep = jnp.sum(weights * (1.0 - shrink))
  total = jax.tree_util.tree_map(lambda w, s: keep * w - s, params, grad)

  if cfg.noise_placement == "upload":
    def noise(key, scale):
      return mechanisms.noise_like(jax.random.fold_in(key, client_lib.UPLOAD_TAG), params,
                                   scale, cfg.mechanism)
    draws = jax.vmap(noise)(keys, hp.upload_noise)
    total = jax.tree_util.tree_map(lambda t, z: t + jnp.tensordot(weights, z, axes=1),
                                   total, draws)
  return total
