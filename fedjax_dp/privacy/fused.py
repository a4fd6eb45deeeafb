"""One full-batch local step of a block of clients trained as ONE weighted batch.

When local training is a single full-batch gradient step (E = 1, ``batch_size = 0``),
client k's update is ``Delta_k = -eta (G_k / n_k + kappa w)``, with ``G_k`` the sum of
its (per-example clipped) gradients, and the server's weighted sum of the uploads is

  ``sum_k p_k (w + s_k Delta_k) = sum_k p_k (1 - s_k eta kappa) w
  - eta sum_k (p_k s_k / n_k) G_k``

(``s_k`` the update-clipping factor, 1 without update clipping). The second term is
the gradient of ONE weighted loss over all the block's examples, so for models made
of ghost :class:`fedjax_dp.models.layers.Dense` (and ``Conv``) layers it is one matmul
per layer over the whole block (book-keeping, Bu et al. 2023) instead of K
per-client gradients and K model copies.

A clip mode that can be trained so carries a :class:`FusedStep` (its optional hook
``ClipMode.client.fused``): the function that turns the block's ghost layers into
that weighted gradient sum ``sum_k p_k eta_k s_k G_k / n_k`` and the clients' reported
norms. :func:`fedjax_dp.training.one_step.block_sum` runs the block's forward and
backward pass, calls the hook and adds the upload noise;
:func:`fedjax_dp.training.client.client_update` (vmapped) stays the reference, and
``tests/test_one_step.py`` checks the two agree for every registered mode with a hook.
What stays per client:

* per-example clipping (:func:`per_example`): per-example ghost norms (as in
  :mod:`fedjax_dp.privacy.clipping`), no grouping needed;
* update clipping (:data:`UPDATE_L2`): the norm of each client's update,
  ``eta ||G_k|| / n_k``, from client-level ghost norms. For a dense layer with inputs
  ``A_k [n, d]`` and output gradients ``B_k [n, o]`` the client's kernel gradient
  ``A_k^T B_k`` has ``||A_k^T B_k||_F^2 = sum((A_k A_k^T) * (B_k B_k^T))`` (Gram
  matrices, ``n^2 (d + o)`` flops) or is formed explicitly (``n d o`` flops); the Gram
  form is used when it is at most twice the flops, since it never writes K ``[d, o]``
  gradients (XLA runs those small batched matmuls slowly on CPU: 10,000 clients of 16
  examples x 784 x 10 take 0.28 s explicitly vs 0.05 s by Grams); where the explicit
  form is used (many examples per client, e.g. Wei's 800 > 784), the clipped client
  gradients are summed directly instead of running the weighted-gradient matmul as
  well (:func:`_update_clipped_grad`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp

from fedjax_dp.privacy import ghost
from fedjax_dp.privacy.clipping import clip_factor

PyTree = Any


class FusedStep(NamedTuple):
  """A clip mode's fused one-step hook (module docstring).

  Attributes:
    grad: ``(layers, flat_params, mask [B, n], denom [B], clip [B], lr [B],
      weights [B], scale [B, n]) -> (grad, grad_norm [B])``: from the block's ghost
      layers (:func:`fedjax_dp.privacy.ghost.ghost_layers` over its ``B n`` examples),
      the weighted sum ``sum_k p_k eta_k s_k G_k / n_k`` of the clients' (clipped)
      gradient sums as a parameter pytree, and the norm each client reports
      (``ClientOutput.grad_norm``). ``denom`` is ``max(n_k, 1)``, ``weights`` the
      aggregation weights ``p_k`` and ``scale`` ``p_k eta_k / n_k`` per example.
    l2_reg: whether the hook is exact with an L2 regulariser (``client.l2_reg > 0``):
      its step ``eta kappa w`` is data independent and applied to ``w`` by the
      caller, unless the mode clips the update, whose norm then needs ``<G_k, w>``.
  """

  grad: Callable[..., tuple[PyTree, jax.Array]]
  l2_reg: bool = True


def _unclipped(layers, flat_params, mask, denom, clip, lr, weights, scale):
  b, n = mask.shape
  return ghost.ghost_weighted_grad(layers, flat_params, scale.reshape(b * n)), jnp.zeros((b,))


# No clipping: the block's weighted gradient, one matmul per layer.
UNCLIPPED = FusedStep(_unclipped)


def per_example(ord: int) -> FusedStep:
  """Every example's gradient clipped to norm C (``ord``: 1 or 2, the norms ghost
  clipping factorises) before the weighted sum, overflow-safe
  (:func:`fedjax_dp.privacy.ghost.ghost_clipped_grad`); reports the mean per-example
  norm."""
  if ord not in ghost.GHOST_ORDS:
    raise ValueError(f"a fused per-example clip needs ord in {ghost.GHOST_ORDS}, got {ord}")

  def grad(layers, flat_params, mask, denom, clip, lr, weights, scale):
    b, n = mask.shape
    g, norms = ghost.ghost_clipped_grad(layers, flat_params, jnp.repeat(clip, n), ord,
                                        scale.reshape(b * n))
    return g, jnp.sum(norms.reshape(b, n) * mask, 1) / denom
  return FusedStep(grad)


def _update_l2(layers, flat_params, mask, denom, clip, lr, weights, scale):
  # A record whose gradient is not finite (its forward pass overflowed) adds 0.
  layers, _ = ghost.zero_non_finite_rows(layers)
  # grad_norm reports per-example norms only (ClientOutput), 0 here as in client_update.
  return (_update_clipped_grad(layers, flat_params, mask, denom, clip, lr, weights),
          jnp.zeros((mask.shape[0],)))


def _group_sq_norms(a: jax.Array, g: jax.Array, has_bias: bool) -> jax.Array:
  """``||sum_m a_m g_m^T||_F^2 (+ ||sum_m g_m||^2)`` per client.

  Args:
    a: ``[B, n, d]`` layer inputs.
    g: ``[B, n, o]`` gradients w.r.t. the layer outputs.
    has_bias: add the bias gradient's squared norm.

  Returns:
    ``[B]`` squared norms of each client's gradient of this layer.
  """
  n, d, o = g.shape[1], a.shape[2], g.shape[2]
  if n * (d + o) <= 2 * d * o:
    sq = jnp.sum(jnp.einsum("kmd,kld->kml", a, a) * jnp.einsum("kmo,klo->kml", g, g), (1, 2))
  else:
    sq = jnp.sum(jnp.square(jnp.einsum("kmd,kmo->kdo", a, g)), (1, 2))
  if has_bias:
    sq = sq + jnp.sum(jnp.square(jnp.sum(g, 1)), -1)
  return sq




def _update_clipped_grad(layers, flat_params, mask, denom, clip, lr, weights):
  """The fused step of ``update_l2``: each client's gradient is clipped as a whole.

  Client k's update is ``-eta G_k / n_k`` (one full-batch step, no L2 regulariser:
  :attr:`FusedStep.l2_reg` is False), so its norm is ``eta ||G_k|| / n_k`` and its clipped upload is
  ``w - s_k eta G_k / n_k`` with ``s_k = min(1, C n_k / (eta ||G_k||))``. The clipped
  update's norm is at most C for every input, the bound the central (and upload)
  mechanisms' sensitivity assumes; ``tests/test_one_step.py`` checks the result against
  ``client_update``'s update clipping.

  Per layer the norm of ``G_k``'s kernel part ``A_k^T B_k`` is taken by Gram matrices or
  explicitly (:func:`_group_sq_norms`' flop rule). Where it is explicit, the ``[B, d, o]``
  per-client gradients already computed are scaled and summed (``B d o`` flops) instead
  of running the block's weighted-gradient matmul as well: the work of a layer is then
  one matmul over the block's examples, as in a non-private step. For Wei et al.'s
  MNIST MLP (n = 800 > d) this halves the matmul flops of the 784 x 256 layer's backward.
  """
  b, n = mask.shape
  sq = jnp.zeros((b,))
  explicit = {}
  for prefix, (a, g) in layers.items():
    # A convolution's client gradient sums over examples and output positions alike.
    a3, g3 = a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])
    has_bias = prefix + ("bias",) in flat_params
    m, d, o = a3.shape[1], a3.shape[2], g3.shape[2]
    # Convolutions (im2col inputs ``[b n, P, k]``) keep the weighted-gradient path,
    # whose kernel comes out in the layer's own shape.
    if a.ndim > 2 or m * (d + o) <= 2 * d * o:
      sq = sq + _group_sq_norms(a3, g3, has_bias)
      continue
    # [B, d, o] client gradients, formed as ``(B_k^T A_k)^T`` like jax.grad forms a
    # Dense kernel's gradient, and as a plain dot for one client: XLA:CPU runs
    # ``A_k^T B_k`` or a batch of one more slowly (W7 round 0.21 s vs 0.18 s).
    if b == 1:
      kernel = (g3[0].T @ a3[0]).T[None]
    else:
      kernel = jnp.swapaxes(jnp.einsum("kmo,kmd->kod", g3, a3), 1, 2)
    bias = jnp.sum(g3, 1) if has_bias else None  # [B, o]
    sq = sq + jnp.sum(jnp.square(kernel), (1, 2))
    if has_bias:
      sq = sq + jnp.sum(jnp.square(bias), -1)
    explicit[prefix] = (kernel, bias)
  # An overflowing norm (inf, or nan from inf * 0 in a Gram product) gives a zero
  # factor: the client's update is 0, a point of the ball. Zero the explicit
  # gradients that overflowed too, so 0 * inf never makes a nan.
  sq = jnp.where(jnp.isnan(sq), jnp.inf, sq)
  client_scale = clip_factor(lr * jnp.sqrt(sq) / denom, clip)
  explicit = {k: tuple(None if v is None else jnp.where(jnp.isfinite(v), v, 0.0) for v in kb)
              for k, kb in explicit.items()}
  coef = weights * lr * client_scale / denom  # [B]
  grads = {}
  gram_layers = {p: ag for p, ag in layers.items() if p not in explicit}
  if gram_layers:
    example_coef = jnp.broadcast_to(coef[:, None], (b, n)).reshape(b * n)
    grads = flax.traverse_util.flatten_dict(
        ghost.ghost_weighted_grad(gram_layers, flat_params, example_coef))
  for prefix, (kernel, bias) in explicit.items():
    grads[prefix + ("kernel",)] = jnp.tensordot(coef, kernel, axes=1)
    if bias is not None:
      grads[prefix + ("bias",)] = coef @ bias
  return flax.traverse_util.unflatten_dict(grads)


# Each client's update clipped to L2 norm C as a whole (DP-FedAvg); not with an L2
# regulariser (its cross term would need <G_k, w> per client).
UPDATE_L2 = FusedStep(_update_l2, l2_reg=False)
