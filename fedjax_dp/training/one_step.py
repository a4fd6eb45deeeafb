"""One full-batch local step: a block of clients trained as ONE weighted batch.

When local training is a single full-batch gradient step (E = 1, ``batch_size = 0``),
client k's update is ``Delta_k = -eta (G_k / n_k + kappa w)``, with ``G_k`` the sum of
its (per-example clipped) gradients, and the server's weighted sum of the uploads is

  ``sum_k p_k (w + s_k Delta_k) = sum_k p_k (1 - s_k eta kappa) w
  - eta sum_k (p_k s_k / n_k) G_k``

(``s_k`` the update-clipping factor, 1 without update clipping). The second term is
the gradient of ONE weighted loss over all the block's examples, so for models made
of ghost :class:`fedjax_dp.models.layers.Dense` (and ``Conv``) layers it is one matmul per layer
over the whole block (book-keeping, Bu et al. 2023) instead of K per-client
gradients and K model copies. What stays per client:

* ``per_example_l2`` / ``per_example_l1``: per-example ghost norms (as in
  :mod:`fedjax_dp.privacy.clipping`), no grouping needed;
* ``update_l2``: the norm of each client's update, ``eta ||G_k|| / n_k``, from
  client-level ghost norms. For a dense layer with inputs ``A_k [n, d]`` and output
  gradients ``B_k [n, o]`` the client's kernel gradient ``A_k^T B_k`` has
  ``||A_k^T B_k||_F^2 = sum((A_k A_k^T) * (B_k B_k^T))`` (Gram matrices, ``n^2 (d + o)``
  flops) or is formed explicitly (``n d o`` flops); the Gram form is used when it is
  at most twice the flops, since it never writes K ``[d, o]`` gradients (XLA runs
  those small batched matmuls slowly on CPU: 10,000 clients of 16 examples x 784 x 10
  take 0.28 s explicitly vs 0.05 s by Grams); where the explicit form is used (many
  examples per client, e.g. Wei's 800 > 784), the clipped client gradients are summed
  directly instead of running the weighted-gradient matmul as well
  (:func:`_update_clipped_sum`);
* per-client upload noise, drawn with each client's own key exactly as
  :func:`fedjax_dp.training.client.client_update` draws it, then summed with the weights.

The result equals the per-client path (``vmap(client_update)`` and a weighted sum)
up to float summation order; ``tests/test_one_step.py`` checks it for every clipping
mode, noise placement, padding and chunking.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from fedjax_dp.models.base import Model
from fedjax_dp.privacy import clipping, mechanisms
from fedjax_dp.training import client as client_lib

FUSABLE_CLIP_MODES = ("none", "per_example_l2", "per_example_l1", "update_l2")


def fusable(model: Model, cfg: client_lib.ClientConfig) -> bool:
  """Whether :func:`block_sum` computes this local training exactly.

  Needs one full-batch step of an all-ghost model (Dense / Conv layers), no per-step noise, no
  parameter projection, no L2 regulariser together with update clipping (its
  cross term would need ``<G_k, w>`` per client), and a client optimizer whose first
  step from its initial state is SGD's exactly (``sgd``; heavy-ball momentum, whose
  trace starts at 0): Adam's normalised step is not a weighted gradient.
  """
  return (model.ghost and cfg.local_steps == 1 and cfg.batch_size == 0
          and cfg.optimizer.plain_first_step
          and cfg.clip_mode in FUSABLE_CLIP_MODES
          and cfg.noise_placement in ("none", "central", "upload")
          and not (cfg.clip_mode == "update_l2" and cfg.l2_reg))


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

  grad_norm = jnp.zeros((b,))
  shrink = lr * cfg.l2_reg  # the regulariser's step, applied to w itself
  scale = jnp.broadcast_to((weights * lr / denom)[:, None], (b, n))
  if cfg.clip_mode in ("per_example_l2", "per_example_l1"):
    # Overflow-safe clipping, finite for any input (clipping.ghost_clipped_grad).
    ord = 1 if cfg.clip_mode == "per_example_l1" else 2
    grad, norms = clipping.ghost_clipped_grad(layers, flat_params, jnp.repeat(hp.clip, n),
                                              ord, scale.reshape(b * n))
    grad_norm = jnp.sum(norms.reshape(b, n) * mask, 1) / denom
    return _finish(cfg, params, grad, keys, hp, weights, shrink), loss, grad_norm
  if cfg.clip_mode == "update_l2":
    # A record whose gradient is not finite (its forward pass overflowed) adds 0.
    layers, _ = clipping.zero_non_finite_rows(layers)
    return _update_clipped_sum(cfg, params, layers, flat_params, mask, keys, hp, weights,
                               lr, loss, shrink)
  grad = clipping.ghost_weighted_grad(layers, flat_params, scale.reshape(b * n))
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


def _update_clipped_sum(cfg, params, layers, flat_params, mask, keys, hp, weights, lr, loss,
                        shrink):
  """:func:`block_sum` for ``update_l2``: each client's gradient is clipped as a whole.

  Client k's update is ``-eta G_k / n_k`` (one full-batch step, no L2 regulariser, see
  :func:`fusable`), so its norm is ``eta ||G_k|| / n_k`` and its clipped upload is
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
  denom = jnp.maximum(jnp.sum(mask, 1), 1.0)
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
  client_scale = clipping.clip_factor(lr * jnp.sqrt(sq) / denom, hp.clip)
  explicit = {k: tuple(None if v is None else jnp.where(jnp.isfinite(v), v, 0.0) for v in kb)
              for k, kb in explicit.items()}
  coef = weights * lr * client_scale / denom  # [B]
  grads = {}
  gram_layers = {p: ag for p, ag in layers.items() if p not in explicit}
  if gram_layers:
    example_coef = jnp.broadcast_to(coef[:, None], (b, n)).reshape(b * n)
    grads = flax.traverse_util.flatten_dict(
        clipping.ghost_weighted_grad(gram_layers, flat_params, example_coef))
  for prefix, (kernel, bias) in explicit.items():
    grads[prefix + ("kernel",)] = jnp.tensordot(coef, kernel, axes=1)
    if bias is not None:
      grads[prefix + ("bias",)] = coef @ bias
  grad = flax.traverse_util.unflatten_dict(grads)
  # grad_norm reports per-example norms only (ClientOutput), 0 here as in client_update.
  return _finish(cfg, params, grad, keys, hp, weights, shrink), loss, jnp.zeros((b,))
