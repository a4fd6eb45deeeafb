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

A convolution is a dense layer applied at every output position: with ``P_i``
``[T, kh*kw*C_in]`` the unfolded input of example i (im2col, one row per output
position) and ``G_i [T, C_out]`` its output gradient, the per-example kernel
gradient is ``P_i^T G_i`` (flattened) and the bias gradient ``sum_t G_i[t]``.
Its norm no longer factorises, but it is computed per layer without the model's
per-example gradients (ghost clipping, Li et al. 2022; Bu et al. 2023, "mixed"):

* L2: ``||P_i^T G_i||_F^2 = sum((P_i P_i^T) * (G_i G_i^T))`` (two ``[T, T]`` Gram
  matrices, ``T^2 (d + o)`` flops) or from the layer's per-example gradient itself
  (``T d o`` flops, ``d o`` numbers per example, one layer at a time): whichever
  costs fewer flops;
* L1: from the layer's per-example gradient ``P_i^T G_i``;

and the clipped sum ``sum_i c_i P_i^T G_i`` is again one matmul over all examples'
positions, like an ordinary convolution's weight gradient.

:class:`Dense` and :class:`Conv` record their (unfolded) input with
``sow('intermediates', 'ghost_in', a)`` and mark their output with
``perturb('ghost_out', y)``; both are no-ops in a plain ``apply`` (XLA drops the
unused im2col). :mod:`fedjax_dp.privacy.clipping` uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import flax.linen as nn
import jax
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


ConvPadding = Union[str, Sequence[tuple[int, int]]]
CONV_DIMS = ("NHWC", "HWIO", "NHWC")


CONV_IMPLS = ("conv", "im2col")


def unfold(x: jax.Array, kernel_size: tuple[int, int], padding: ConvPadding) -> jax.Array:
  """Stride-1 im2col by shifted slices: ``[n, H, W, C] -> [n, H', W', kh * kw * C]``.

  Feature ``(i, j, c)`` (input channel fastest) of output position ``(h, w)`` is
  ``x_padded[h + i, w + j, c]``, so ``unfold(x) @ kernel.reshape(-1, C_out)`` is the
  convolution with ``kernel [kh, kw, C, C_out]``. Pure data movement (pads and
  slices): its transpose in the backward pass is pads and adds, where
  ``jax.lax.conv_general_dilated_patches`` is a convolution with an identity kernel
  (``(kh kw C)^2`` multiply-adds per position).
  """
  kh, kw = kernel_size
  pads = (jax.lax.padtype_to_pads(x.shape[1:3], kernel_size, (1, 1), padding)
          if isinstance(padding, str) else [tuple(p) for p in padding])
  xp = jnp.pad(x, [(0, 0), *pads, (0, 0)])
  h_out, w_out = xp.shape[1] - kh + 1, xp.shape[2] - kw + 1
  cols = [xp[:, i:i + h_out, j:j + w_out, :] for i in range(kh) for j in range(kw)]
  return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


def conv_im2col(x: jax.Array, kernel: jax.Array, padding: ConvPadding) -> jax.Array:
  """The stride-1 convolution of ``x [n, H, W, C]`` with ``kernel [kh, kw, C, O]`` as
  :func:`unfold` and one matmul: ``[n, H', W', O]``.

  Unfolding features-first (``[kh kw C, n, H', W']``, so each shifted slice is copied
  in rows of ``W'`` floats) was measured slower on W2's shapes: XLA:CPU copies the
  patches back to a minor contraction axis for the matmul (docs/scaling.md, "CNN
  speed steps on CPU"; ``benchmarks/bench_cnn_steps.py``).
  """
  kh, kw, _, o = kernel.shape
  return unfold(x, (kh, kw), padding) @ kernel.reshape(-1, o)


class Conv(nn.Module):
  """A stride-1 2-D convolution (NHWC) that supports ghost clipping.

  Parameters are ``kernel [kh, kw, C_in, features]`` and ``bias [features]``, the
  names, shapes and (with the same ``kernel_init``) initial values of
  ``flax.linen.Conv``, which it replaces in :class:`fedjax_dp.models.zoo.ConvNet`.

  It sows its input unfolded by :func:`unfold`, ``[n, H', W', kh * kw * C_in]``, so
  ``kernel.reshape(-1, features)`` is the matching matrix.

  Attributes:
    features: output channels.
    kernel_size: ``(kh, kw)``.
    padding: ``'SAME'``, ``'VALID'`` or ``((lo, hi), (lo, hi))``.
    use_bias: whether to add a bias.
    kernel_init: initialiser for the kernel.
    impl: how the convolution is computed, with the same result up to float
      summation order: ``'conv'`` (``lax.conv_general_dilated``) or ``'im2col'``
      (:func:`unfold` and one matmul). Vmapped over clients whose kernels differ,
      ``'conv'`` becomes a grouped convolution, which XLA:CPU runs slowly, while
      ``'im2col'`` becomes a batched matmul (see :mod:`fedjax_dp.training.engine`,
      ``RoundConfig.conv_impl``).
  """

  features: int
  kernel_size: tuple[int, int]
  padding: ConvPadding = "VALID"
  use_bias: bool = True
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
  impl: str = "conv"

  @nn.compact
  def __call__(self, x):
    """Applies the layer. ``x``: ``[n, H, W, C_in]``; returns ``[n, H', W', features]``."""
    if x.ndim != 4:
      raise ValueError(f"Conv expects [n, H, W, C] inputs, got shape {x.shape}")
    if self.impl not in CONV_IMPLS:
      raise ValueError(f"conv_impl: unknown {self.impl!r}; known: {CONV_IMPLS}")
    kernel = self.param("kernel", self.kernel_init,
                        (*self.kernel_size, x.shape[-1], self.features))
    padding = self.padding if isinstance(self.padding, str) else tuple(
        tuple(p) for p in self.padding)
    ghost = self.is_mutable_collection("intermediates")
    if ghost:
      cols = unfold(x, self.kernel_size, padding)
      self.sow("intermediates", GHOST_IN, cols)
    if self.impl == "im2col" and ghost:
      y = cols @ kernel.reshape(-1, self.features)
    elif self.impl == "im2col":
      y = conv_im2col(x, kernel, padding)
    else:
      y = jax.lax.conv_general_dilated(x, kernel, (1, 1), padding, dimension_numbers=CONV_DIMS)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,))
    return self.perturb(GHOST_OUT, y)


def max_pool(x: jax.Array, window: int, padding: str = "VALID") -> jax.Array:
  """Square max pooling with stride equal to the window, as a reshape and a max.

  ``[n, H, W, C] -> [n, H', W', C]`` with ``H' = H // window`` (``'VALID'``, floor,
  as ``torch.nn.MaxPool2d``) or ``ceil(H / window)`` (``'SAME'``, as
  ``tf.nn.max_pool``). The same values as ``flax.linen.max_pool(x, (window,
  window), strides=(window, window), padding=padding)``, computed without
  ``lax.reduce_window``: XLA:CPU runs a reduce-window and its gradient
  (select-and-scatter) as slow scalar loops, where a max over two reshaped axes is
  an ordinary fused reduction and its gradient an elementwise select.

  Sizes that the window does not divide: ``'VALID'`` drops the trailing rows and
  columns (as ``reduce_window`` does); ``'SAME'`` pads with ``-inf`` as
  ``lax.padtype_to_pads`` places the padding (the low side gets the smaller
  half), which a finite maximum never selects.

  Gradient: each output's cotangent goes to one element of its window, the
  maximum; on **ties** (several elements equal to the window's maximum) to the
  first of them in row-major window order, which is what ``reduce_window``'s
  select-and-scatter does (flax's gradient): the same gradient, ties included.
  (``jnp.max`` over the reshaped axes would split a tie's gradient equally among
  the tied elements instead, and its gradient compares the input with the pooled
  value, which XLA may recompute in different fusions with different rounding:
  measured at ``--xla_backend_optimization_level=0``, where it lost gradient.)

  Args:
    x: ``[n, H, W, C]``.
    window: the pooling window and stride, ``>= 1``.
    padding: ``'VALID'`` or ``'SAME'``.

  Returns:
    ``[n, H', W', C]``.
  """
  if window == 1:
    return x
  n, h, w, c = x.shape
  if padding == "SAME":
    pads = jax.lax.padtype_to_pads((h, w), (window, window), (window, window), "SAME")
    if any(lo or hi for lo, hi in pads):
      x = jnp.pad(x, [(0, 0), *pads, (0, 0)], constant_values=-jnp.inf)
  elif padding != "VALID":
    raise ValueError(f"max_pool: padding must be 'VALID' or 'SAME', got {padding!r}")
  ho, wo = x.shape[1] // window, x.shape[2] // window
  x = x[:, :ho * window, :wo * window, :].reshape(n, ho, window, wo, window, c)
  # A running maximum by selects, in row-major window order: ">" keeps the earlier
  # element on ties. Its gradient routes each cotangent through the same selects, so
  # it reaches exactly one element per window and never compares the input with the
  # recomputed maximum (jnp.max's gradient does, and an input recomputed in another
  # fusion may differ from the pooled value in its last bit).
  out = x[:, :, 0, :, 0, :]
  for i in range(window):
    for j in range(window):
      if i or j:
        cand = x[:, :, i, :, j, :]
        out = jnp.where(cand > out, cand, out)
  return out


def flatten(x):
  """Flattens every axis but the first: ``[batch, ...] -> [batch, prod(...)]``."""
  return jnp.reshape(x, (x.shape[0], -1))
