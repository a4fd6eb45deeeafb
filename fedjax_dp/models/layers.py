"""Layers that expose what per-example clipping needs without per-example gradients.

A dense layer ``y = x W + b`` applied to a batch has per-example weight gradient
``a_i g_i^T`` (``a_i`` the layer input of example i, ``g_i`` the gradient of
example i's loss w.r.t. the layer output). Its norms factorise:

* L2: ``||a_i g_i^T||_F = ||a_i||_2 ||g_i||_2`` ("ghost norm", Goodfellow 2015;
  Li et al. 2022);
* L1: ``||a_i g_i^T||_1 = ||a_i||_1 ||g_i||_1``.

and the clipped sum ``sum_i c_i a_i g_i^T = A^T (c * G)`` is a single matmul
("book-keeping", Bu et al. 2023). So a clipped full-batch step costs one forward
pass, one backward pass to the layer outputs and one matmul per layer -- the same
as a non-private step -- and never holds ``[n, d_in, d_out]`` in memory.

:class:`Dense` records its input with ``sow('intermediates', 'ghost_in', x)`` and
marks its output with ``perturb('ghost_out', y)``; both are no-ops in a plain
``apply``. :mod:`fedjax_dp.privacy.clipping` uses them.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

GHOST_IN = "ghost_in"
GHOST_OUT = "ghost_out"


class Dense(nn.Module):
  """A dense layer ``y = x @ kernel + bias`` that supports ghost clipping.

  Parameters are ``kernel [d_in, features]`` and ``bias [features]`` (the same
  names and shapes as ``flax.linen.Dense``).

  Attributes:
    features: output width.
    use_bias: whether to add a bias.
    kernel_init: initialiser for the kernel.
  """

  features: int
  use_bias: bool = True
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

  @nn.compact
  def __call__(self, x):
    """Applies the layer. ``x``: ``[batch, d_in]``; returns ``[batch, features]``."""
    if x.ndim != 2:
      raise ValueError(f"Dense expects [batch, features] inputs, got shape {x.shape}")
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features))
    self.sow("intermediates", GHOST_IN, x)
    y = x @ kernel
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,))
    return self.perturb(GHOST_OUT, y)


def flatten(x):
  """Flattens every axis but the first: ``[batch, ...] -> [batch, prod(...)]``."""
  return jnp.reshape(x, (x.shape[0], -1))
