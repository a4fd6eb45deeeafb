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


LOSSES: dict[str, Callable] = {"cross_entropy": cross_entropy, "hinge": multiclass_hinge}


@dataclasses.dataclass(frozen=True)
class Model:
  """A classifier as pure functions.

  Attributes:
    name: registry name.
    module: the flax module; ``module.apply({'params': p}, x)`` maps ``[n, *input_shape]``
      to logits ``[n, num_classes]``.
    input_shape: shape of one example, e.g. ``(28, 28, 1)``.
    num_classes: number of output classes.
    loss_name: ``'cross_entropy'`` or ``'hinge'``.
    ghost: True when every parameter belongs to a :class:`fedjax_dp.models.layers.Dense`
      or :class:`fedjax_dp.models.layers.Conv`, so per-example clipping can use ghost
      norms instead of per-example gradients.
    conv: True when the model has convolutions (the engine picks its CNN round
      implementation by it, see ``RoundConfig.conv_impl`` in :mod:`fedjax_dp.engine`).
  """

  name: str
  module: nn.Module
  input_shape: tuple[int, ...]
  num_classes: int
  loss_name: str = "cross_entropy"
  ghost: bool = False
  conv: bool = False

  def init(self, key: jax.Array) -> Params:
    """Returns the initial parameters for PRNG ``key``."""
    x = jnp.zeros((1, *self.input_shape), jnp.float32)
    return self.module.init(key, x)["params"]

  def apply(self, params: Params, x: jax.Array) -> jax.Array:
    """Logits ``[n, num_classes]`` for inputs ``x [n, *input_shape]``."""
    return self.module.apply({"params": params}, x)

  def per_example_loss(self, logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example loss ``[n]`` from ``logits [n, C]`` and integer ``labels [n]``."""
    return LOSSES[self.loss_name](logits, labels)

  def num_params(self) -> int:
    """Number of scalar parameters (computed from shapes, no FLOPs)."""
    shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
    return sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))
