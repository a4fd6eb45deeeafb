"""The model container: a flax module exposed as pure ``init`` / ``apply``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Params = Any  # a pytree of arrays


def cross_entropy(logits, labels):
  """Per-example softmax cross-entropy. ``logits [n, C]``, ``labels [n]`` -> ``[n]``."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def multiclass_hinge(logits, labels):
  """Per-example Crammer-Singer hinge ``max(0, 1 + max_{j != y} s_j - s_y)``.

  For two classes this equals the binary hinge ``max(0, 1 - y' (s_1 - s_0))`` with
  margin 1 on the score difference (Wei et al. eq. (32), corrected as in spec
  section 10 item 14). ``logits [n, C]``, ``labels [n]`` -> ``[n]``.
  """
  true = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
  others = jnp.where(jax.nn.one_hot(labels, logits.shape[-1], dtype=bool), -jnp.inf, logits)
  return jnp.maximum(0.0, 1.0 + jnp.max(others, axis=-1) - true)


def squared_error(preds, targets):
  """Per-example squared error ``(s - y)^2`` of a one-output regressor.

  ``preds [n, 1]``, float ``targets [n]`` -> ``[n]``; its mean is the MSE (Fu et al.
  Sec. V: linear regression on Lending Club, loss and metric MSE, spec A9).
  """
  return jnp.square(preds[..., 0] - targets)


LOSSES: dict[str, Callable] = {"cross_entropy": cross_entropy, "hinge": multiclass_hinge,
                               "mse": squared_error}
# Losses of regression models: float targets, one output, MSE instead of accuracy.
REGRESSION_LOSSES = ("mse",)


@dataclasses.dataclass(frozen=True)
class Model:
  """A classifier or a one-output regressor as pure functions.

  The task is static (a property of ``loss_name``), so code that differs between
  classification and regression branches in Python at trace time, never at run time.

  Attributes:
    name: registry name.
    module: the flax module; ``module.apply({'params': p}, x)`` maps ``[n, *input_shape]``
      to logits ``[n, num_classes]`` (predictions ``[n, 1]`` for a regressor).
    input_shape: shape of one example, e.g. ``(28, 28, 1)``.
    num_classes: number of output classes (1 for a regressor).
    loss_name: ``'cross_entropy'``, ``'hinge'`` or ``'mse'`` (regression).
    ghost: True when every parameter belongs to a :class:`fedjax_dp.models.layers.Dense`
      or :class:`fedjax_dp.models.layers.Conv`, so per-example clipping can use ghost
      norms instead of per-example gradients.
    conv: True when the model has convolutions (the engine picks its CNN round
      implementation by it, see ``RoundConfig.conv_impl`` in :mod:`fedjax_dp.training.engine`).
  """

  name: str
  module: nn.Module
  input_shape: tuple[int, ...]
  num_classes: int
  loss_name: str = "cross_entropy"
  ghost: bool = False
  conv: bool = False

  @property
  def is_regression(self) -> bool:
    """True for a regressor: float targets, MSE loss, no accuracy."""
    return self.loss_name in REGRESSION_LOSSES

  def init(self, key: jax.Array) -> Params:
    """Returns the initial parameters for PRNG ``key``."""
    x = jnp.zeros((1, *self.input_shape), jnp.float32)
    return self.module.init(key, x)["params"]

  def apply(self, params: Params, x: jax.Array) -> jax.Array:
    """Logits ``[n, num_classes]`` for inputs ``x [n, *input_shape]``."""
    return self.module.apply({"params": params}, x)

  def per_example_loss(self, logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example loss ``[n]`` from ``logits [n, C]`` and integer ``labels [n]`` (or
    predictions ``[n, 1]`` and float targets ``[n]`` for a regressor)."""
    return LOSSES[self.loss_name](logits, labels)

  def losses(self, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """The per-example training loss ``[n]`` of ``params`` on ``x [n, ...]``, ``y [n]``:
    what clipping differentiates (a user model adds its global-model term here,
    :mod:`fedjax_dp.models.adapters`)."""
    return self.per_example_loss(self.apply(params, x), y)

  def anchored(self, global_params: Params) -> Model:
    """This model for a client of the round whose global model is ``global_params``
    (a model whose loss does not read it returns itself)."""
    del global_params
    return self

  def num_params(self) -> int:
    """Number of scalar parameters (computed from shapes, no FLOPs)."""
    shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
    return sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))
