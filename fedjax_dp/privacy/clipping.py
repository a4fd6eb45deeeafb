"""Clipping in any Lp norm: per-example gradients, parameters, updates.

Written for ONE client; callers add the client axis with ``jax.vmap``.

A norm is its order ``ord``: any ``p >= 1`` or ``inf`` (:data:`NORMS` names the ones
the clip modes use; a clip mode says which it clips in). :func:`clip_by_norm` scales
a whole pytree into the ball of radius C of that norm (the parameter vector after
each local step, Yuan et al. Alg. 1; a client's update, DP-FedAvg; a step's mean
gradient, Fu et al.).

Per-example clipping (Wei et al. Alg. 1 lines 7-8; Fu et al. L1 for Laplace):

* in L1 or L2, for models whose parameters all live in
  :class:`fedjax_dp.models.layers.Dense` and :class:`fedjax_dp.models.layers.Conv`
  layers (every model of the zoo), by ghost norms + book-keeping
  (:mod:`fedjax_dp.privacy.ghost`), without ``[n, num_params]`` per-example gradients:
  about the cost of a non-private step;
* otherwise (another norm, or another model) by per-example gradients with ``vmap``
  over chunks of ``chunk_size`` examples inside a ``lax.scan``, so memory is bounded
  by the chunk.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.models.base import Model
from fedjax_dp.privacy.ghost import (  # noqa: F401  (re-exported: clipping.ghost_layers, ...)
  GHOST_ORDS,
  ghost_clipped_grad,
  ghost_layers,
  ghost_norms,
  ghost_weighted_grad,
  layer_norm_parts,
  pow2_exponent,
  zero_non_finite_rows,
)

PyTree = Any
# The norms by name (``ord``); clipping takes any p >= 1 and inf.
NORMS = {"l1": 1, "l2": 2, "linf": math.inf}


def check_ord(ord) -> float:
  """``ord`` as a float after checking it names a norm (``p >= 1``, or ``inf``).

  Raises:
    ValueError: ``ord < 1`` or not a number.
  """
  try:
    p = float(ord)
  except (TypeError, ValueError):
    raise ValueError(f"ord must be a number >= 1 or inf, got {ord!r}") from None
  if not p >= 1:
    raise ValueError(f"ord must be a number >= 1 or inf, got {ord!r}")
  return p


def _unit_scale(leaves) -> tuple[jax.Array, jax.Array]:
  """``(p, finite)``: a power of two ``p`` with ``max |x| / p`` in ``[1, 2)`` (1 for
  an all-zero vector), so dividing by it is exact and the scaled squares cannot
  overflow; ``finite``: every entry is finite."""
  m = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in leaves]))
  e = pow2_exponent(m)
  return jnp.ldexp(jnp.ones((), m.dtype), jnp.where(m > 0, e - 1, 0)), jnp.isfinite(m)


def _scaled_norm(leaves, p: jax.Array, ord: float) -> jax.Array:
  """The Lp norm of ``leaves / p`` (largest entry in ``[1, 2)``, so no term overflows
  for the orders in use: ``2^ord`` stays below the float range up to ord ~100)."""
  if ord == 1:
    return sum(jnp.sum(jnp.abs(x / p)) for x in leaves)
  if ord == 2:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x / p)) for x in leaves))
  if math.isinf(ord):
    return jnp.max(jnp.stack([jnp.max(jnp.abs(x / p), initial=0.0) for x in leaves]))
  return sum(jnp.sum(jnp.abs(x / p) ** ord) for x in leaves) ** (1.0 / ord)


def tree_norm(tree: PyTree, ord: float = 2) -> jax.Array:
  """The Lp norm (``ord``: 1, 2, any p >= 1, or ``inf``) of all leaves taken as one
  vector.

  Computed on the vector divided by a power of two near its largest entry, so it
  does not overflow unless the norm itself exceeds the float range (then ``inf``),
  and does not lose denormal entries; non-finite entries give a non-finite norm."""
  leaves = jax.tree_util.tree_leaves(tree)
  p, _ = _unit_scale(leaves)
  return p * _scaled_norm(leaves, p, ord)


def clip_factor(norm: jax.Array, clip: jax.Array) -> jax.Array:
  """``min(1, clip / norm)``, safe at ``norm == 0`` (returns 1).

  Written as ``clip / max(norm, clip)`` so it is exact for huge norms and never
  divides by zero.
  """
  return clip / jnp.maximum(norm, clip)


def clip_by_norm(tree: PyTree, clip: jax.Array, ord: float = 2) -> tuple[PyTree, jax.Array]:
  """Scales ``tree`` so its global Lp norm (``ord``, :func:`tree_norm`) is at most ``clip``.

  Used for the parameter vector after each local step (Yuan et al. Alg. 1), for a
  client's model update (DP-FedAvg, McMahan et al. 2018) and for each example's
  gradient. For ANY input the output is finite with norm at most ``clip`` (up to
  float rounding): the vector is divided by a power of two ``p`` near its largest
  entry (exact), whose scaled norm ``s`` cannot overflow, and multiplied by
  ``min(p, clip / s)``; a vector with a non-finite entry (e.g. the gradient of a
  record whose forward pass overflows) is mapped to 0, a data-independent point
  of the ball, so neighbours still differ by at most the clip's sensitivity.

  Returns:
    ``(clipped_tree, norm_before)`` (``norm_before`` may be ``inf``/``nan``).
  """
  leaves = jax.tree_util.tree_leaves(tree)
  p, finite = _unit_scale(leaves)
  s = _scaled_norm(leaves, p, ord)
  mult = jnp.where(finite, jnp.minimum(p, clip / jnp.where(s > 0, s, 1.0)), 0.0)

  def scale(x):
    return jnp.where(finite, x / p.astype(x.dtype), 0.0) * mult.astype(x.dtype)

  return jax.tree_util.tree_map(scale, tree), p * s


def _ghost_clipped_sum(model: Model, params, x, y, weights, clip, ord):
  """Ghost-norm per-example clipping for models of ghost :class:`Dense` / :class:`Conv` layers.

  Args:
    model: a model with ``model.ghost`` true.
    params: parameters.
    x: ``[n, *input_shape]`` inputs.
    y: ``[n]`` labels.
    weights: ``[n]`` 1.0 for examples that count, 0.0 for padding.
    clip: clipping threshold C.
    ord: 2 or 1 (:data:`GHOST_ORDS`).

  Returns:
    ``(sum_i weights_i * clip(g_i), losses [n], norms [n])``.
  """
  layers, losses, flat_params = ghost_layers(model, params, x, y, weights)
  grad, norms = ghost_clipped_grad(layers, flat_params, clip, ord)
  return grad, losses, norms


def _vmap_clipped_sum(model: Model, params, x, y, weights, clip, ord, chunk_size):
  """Per-example clipping by ``vmap(grad)`` over chunks (any model).

  Memory holds ``chunk_size`` per-example gradients at a time.
  """
  n = x.shape[0]
  chunk = max(1, min(chunk_size, n))
  num_chunks = -(-n // chunk)
  pad = num_chunks * chunk - n

  def padded(a):
    a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
    return a.reshape((num_chunks, chunk) + a.shape[1:])

  def one_loss(p, xi, yi):
    return model.losses(p, xi[None], yi[None])[0]

  grad_one = jax.vmap(jax.value_and_grad(one_loss), in_axes=(None, 0, 0))

  def body(acc, inputs):
    xc, yc, wc = inputs
    losses, g = grad_one(params, xc, yc)
    clipped, norms = jax.vmap(lambda gi: clip_by_norm(gi, clip, ord))(g)
    acc = jax.tree_util.tree_map(lambda s, gi: s + jnp.tensordot(wc, gi, axes=1), acc, clipped)
    return acc, (losses, norms)

  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  total, (losses, norms) = jax.lax.scan(body, zeros, (padded(x), padded(y), padded(weights)))
  return total, losses.reshape(-1)[:n], norms.reshape(-1)[:n]


def per_example_clipped_grad_sum(model: Model, params, x, y, weights, clip, ord: int = 2,
                                 chunk_size: int = 64):
  """Sum over examples of per-example gradients clipped to norm ``clip``.

  ``sum_i weights_i * g_i * min(1, C / ||g_i||)`` where ``g_i`` is the gradient of
  example i's loss -- Wei et al. Alg. 1 lines 6-8 (before dividing by |D_i|), and
  DP-SGD's clipped sum (Abadi et al. 2016).

  Args:
    model: the model.
    params: parameters (pytree).
    x: ``[n, *input_shape]``.
    y: ``[n]`` int labels.
    weights: ``[n]`` float, 1 for real examples and 0 for padding.
    clip: threshold C (scalar, may be traced).
    ord: the norm: 2 (L2), 1 (L1, Fu et al. for the Laplace mechanism), any p >= 1 or
      inf (by per-example gradients).
    chunk_size: examples per chunk on the per-example-gradient path.

  Returns:
    ``(clipped_sum, losses [n], norms [n])`` -- norms are before clipping.
  """
  check_ord(ord)
  if model.ghost and ord in GHOST_ORDS:
    return _ghost_clipped_sum(model, params, x, y, weights, clip, ord)
  return _vmap_clipped_sum(model, params, x, y, weights, clip, ord, chunk_size)


def per_example_grads_reference(model: Model, params, x, y):
  """Materialised per-example gradients ``[n, ...]`` (tests and references only)."""
  def one_loss(p, xi, yi):
    return model.losses(p, xi[None], yi[None])[0]
  return jax.vmap(jax.grad(one_loss), in_axes=(None, 0, 0))(params, x, y)
