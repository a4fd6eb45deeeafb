"""Clipping: per-example gradient (L2 / L1), parameter-norm and update clipping.

Written for ONE client; callers add the client axis with ``jax.vmap``.

Per-example clipping (Wei et al. Alg. 1 lines 7-8; Fu et al. L1 for Laplace) never
materialises ``[n, num_params]`` per-example gradients:

* models whose parameters all live in :class:`fedjax_dp.models.layers.Dense` and
  :class:`fedjax_dp.models.layers.Conv` layers (every model of the zoo) use ghost
  norms + book-keeping (see that module): one forward, one backward to the layer
  outputs, per-layer norms, and one matmul per layer for the clipped sum -- about
  the cost of a non-private step;
* other models compute per-example gradients with ``vmap`` over chunks of
  ``chunk_size`` examples inside a ``lax.scan``, so memory is bounded by the chunk.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from fedjax_dp.models.base import Model
from fedjax_dp.models.layers import GHOST_IN, GHOST_OUT

PyTree = Any
ORDS = {"l2": 2, "l1": 1}


def _pow2_exponent(m: jax.Array) -> jax.Array:
  """``e`` with ``2^(e-1) <= m < 2^e`` for finite ``m > 0`` (0 for ``m == 0``)."""
  return jnp.frexp(jnp.where(jnp.isfinite(m), m, 0.0))[1]


def _unit_scale(leaves) -> tuple[jax.Array, jax.Array]:
  """``(p, finite)``: a power of two ``p`` with ``max |x| / p`` in ``[1, 2)`` (1 for
  an all-zero vector), so dividing by it is exact and the scaled squares cannot
  overflow; ``finite``: every entry is finite."""
  m = jnp.max(jnp.stack([jnp.max(jnp.abs(x), initial=0.0) for x in leaves]))
  e = _pow2_exponent(m)
  return jnp.ldexp(jnp.ones((), m.dtype), jnp.where(m > 0, e - 1, 0)), jnp.isfinite(m)


def _scaled_norm(leaves, p: jax.Array, ord: int) -> jax.Array:
  if ord == 1:
    return sum(jnp.sum(jnp.abs(x / p)) for x in leaves)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x / p)) for x in leaves))


def tree_norm(tree: PyTree, ord: int = 2) -> jax.Array:
  """L2 (``ord=2``) or L1 (``ord=1``) norm of all leaves taken as one vector.

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


def clip_by_norm(tree: PyTree, clip: jax.Array, ord: int = 2) -> tuple[PyTree, jax.Array]:
  """Scales ``tree`` so its global L2/L1 norm is at most ``clip``.

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


def ghost_layers(model: Model, params, x, y, weights):
  """One forward and one backward pass to every ghost layer's output.

  Args:
    model: a model with ``model.ghost`` true.
    params: parameters.
    x: ``[n, *input_shape]`` inputs.
    y: ``[n]`` labels.
    weights: ``[n]`` per-example loss weights (0.0 for padding).

  Returns:
    ``(layers, losses, flat_params)``: ``layers`` maps a layer's path to ``(a, g)``,
    its inputs ``a [n, d_in]`` and the gradients ``g [n, d_out]`` of
    ``sum_i weights_i loss_i`` w.r.t. its outputs, so example i's kernel gradient is
    ``a_i g_i^T`` and its bias gradient ``g_i``; for a :class:`Conv` layer ``a`` is
    the unfolded input ``[n, H', W', d_in]`` and ``g`` is ``[n, H', W', d_out]``, so
    example i's (flattened) kernel gradient is ``sum_t a_it g_it^T`` over output
    positions t and its bias gradient ``sum_t g_it``; ``losses [n]`` are the
    unweighted per-example losses; ``flat_params`` is the flattened parameter dict.

  Raises:
    ValueError: when a parameter is not in a ghost layer.
  """
  variables = {"params": params}

  def perts_of(v):
    return model.module.apply(v, x, mutable=["perturbations"])[1]["perturbations"]

  perts = jax.tree_util.tree_map(
      lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(perts_of, variables))

  def weighted_loss(p):
    logits, state = model.module.apply(
        {"params": params, "perturbations": p}, x, mutable=["intermediates"])
    losses = model.per_example_loss(logits, y)
    return jnp.sum(losses * weights), (state["intermediates"], losses)

  out_grads, (inters, losses) = jax.grad(weighted_loss, has_aux=True)(perts)
  flat_params = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  flat_in = flax.traverse_util.flatten_dict(flax.core.unfreeze(inters))
  flat_out = flax.traverse_util.flatten_dict(flax.core.unfreeze(out_grads))

  layers = {}
  for path, g in flat_out.items():
    assert path[-1] == GHOST_OUT, path
    (a,) = flat_in[path[:-1] + (GHOST_IN,)]  # one call per layer: no weight sharing
    layers[path[:-1]] = (a, g)
  covered = {prefix + (name,) for prefix in layers for name in ("kernel", "bias")}
  missing = set(flat_params) - covered
  if missing:
    raise ValueError(
        f"model {model.name!r} is marked ghost=True but parameters {sorted(missing)} are "
        "not in ghost Dense or Conv layers")
  return layers, losses, flat_params


def _positions(a: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(a [n, T, d_in], g [n, T, d_out])``: T output positions (1 for a dense layer)."""
  return a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])


def ghost_weighted_grad(layers, flat_params, scale):
  """``sum_i scale_i * grad_i`` from :func:`ghost_layers`' output: one matmul per layer.

  Args:
    layers: ``{path: (a [n, ..., d_in], g [n, ..., d_out])}``.
    flat_params: the flattened parameter dict (which layers have a bias, kernel shapes).
    scale: ``[n]`` per-example factors, or ``{path: (kernel [n], bias [n])}`` per layer.

  Returns:
    The weighted gradient sum, as a parameter pytree.
  """
  grads = {}
  for prefix, (a, g) in layers.items():
    k_scale, b_scale = scale[prefix] if isinstance(scale, dict) else (scale, scale)
    a, g = _positions(a, g)
    cg = g * k_scale[:, None, None]
    # One matmul over all examples and positions: [d_in, n T] x [n T, d_out].
    t = a.shape[1]
    kernel = (a[:, 0].T @ cg[:, 0] if t == 1
              else a.reshape(-1, a.shape[-1]).T @ cg.reshape(-1, cg.shape[-1]))
    # A Conv kernel [kh, kw, C_in, C_out] in its unfold order is a plain reshape.
    grads[prefix + ("kernel",)] = kernel.reshape(flat_params[prefix + ("kernel",)].shape)
    if prefix + ("bias",) in flat_params:
      grads[prefix + ("bias",)] = jnp.sum(g * b_scale[:, None, None], (0, 1))
  return flax.traverse_util.unflatten_dict(grads)


def layer_norm_parts(a: jax.Array, g: jax.Array, has_bias: bool, ord: int = 2) -> jax.Array:
  """One layer's share of each example's gradient norm: ``[n]``.

  The squared L2 norm (``ord=2``) or the L1 norm (``ord=1``) of example i's kernel
  gradient ``sum_t a_it g_it^T`` plus, with a bias, of its bias gradient
  ``sum_t g_it``; a layer's parts add up over layers to the whole model's (squared)
  norm, since the layers' parameters are disjoint.

  * One position (dense): ``||a_i||^2 ||g_i||^2`` and ``||a_i||_1 ||g_i||_1`` exactly.
  * T positions (convolution), L2: ``sum((A_i A_i^T) * (G_i G_i^T))`` by Gram matrices
    when ``T (d_in + d_out) <= d_in d_out``, else the squared entries of the layer's
    per-example gradient ``A_i^T G_i`` (``d_in d_out`` numbers per example, one layer
    at a time); both are exact, the rule only picks the cheaper one.
  * T positions, L1: no factorisation exists, so from ``A_i^T G_i``.

  Privacy: these are the exact per-example norms (identities, not bounds), so
  scaling example i by ``clip_factor(norm_i, C)`` bounds its clipped gradient by C
  up to float rounding, and adding or removing one example moves the clipped sum by
  at most C -- the sensitivity the accountants assume for per-example clipping,
  whatever the layers (``tests/test_conv_ghost.py`` checks the bound against
  materialised per-example gradients).

  Args:
    a: ``[n, ..., d_in]`` layer inputs (unfolded for a convolution).
    g: ``[n, ..., d_out]`` gradients w.r.t. the layer outputs.
    has_bias: add the bias gradient's part.
    ord: 2 or 1.

  Returns:
    ``[n]`` squared L2 norms (ord 2) or L1 norms (ord 1).
  """
  a, g = _positions(a, g)
  t, d, o = a.shape[1], a.shape[2], g.shape[2]
  if t == 1:
    a, g = a[:, 0], g[:, 0]
    if ord == 1:
      kernel = jnp.sum(jnp.abs(a), -1) * jnp.sum(jnp.abs(g), -1)
    else:
      kernel = jnp.sum(a * a, -1) * jnp.sum(g * g, -1)
    bias_grad = g
  else:
    if ord == 2 and t * (d + o) <= d * o:
      kernel = jnp.sum(jnp.einsum("ntd,nsd->nts", a, a) * jnp.einsum("nto,nso->nts", g, g),
                       (1, 2))
    else:
      per_example = jnp.einsum("ntd,nto->ndo", a, g)
      kernel = (jnp.sum(jnp.abs(per_example), (1, 2)) if ord == 1
                else jnp.sum(jnp.square(per_example), (1, 2)))
    bias_grad = jnp.sum(g, 1)
  if has_bias:
    kernel = kernel + (jnp.sum(jnp.abs(bias_grad), -1) if ord == 1
                       else jnp.sum(jnp.square(bias_grad), -1))
  return kernel


def ghost_norms(layers, flat_params, ord: int = 2) -> jax.Array:
  """Per-example gradient norms ``[n]`` from :func:`ghost_layers`' output.

  The sum over layers of :func:`layer_norm_parts` (then a square root for L2).
  """
  total = sum(layer_norm_parts(a, g, prefix + ("bias",) in flat_params, ord)
              for prefix, (a, g) in layers.items())
  return total if ord == 1 else jnp.sqrt(total)


def _ghost_clipped_sum(model: Model, params, x, y, weights, clip, ord):
  """Ghost-norm per-example clipping for models of ghost :class:`Dense` / :class:`Conv` layers.

  Args:
    model: a model with ``model.ghost`` true.
    params: parameters.
    x: ``[n, *input_shape]`` inputs.
    y: ``[n]`` labels.
    weights: ``[n]`` 1.0 for examples that count, 0.0 for padding.
    clip: clipping threshold C.
    ord: 2 or 1.

  Returns:
    ``(sum_i weights_i * clip(g_i), losses [n], norms [n])``.
  """
  layers, losses, flat_params = ghost_layers(model, params, x, y, weights)
  grad, norms = ghost_clipped_grad(layers, flat_params, clip, ord)
  return grad, losses, norms


def ghost_clipped_grad(layers, flat_params, clip, ord: int = 2, scale=None):
  """``sum_i scale_i clip_C(grad_i)`` and the norms ``[n]`` from :func:`ghost_layers`'
  output, finite with each clipped term of norm <= C for any finite a and g.

  Every layer's a and g are divided per example by powers of two 2^e (exact), so the
  norm parts cannot overflow; the parts are recombined with their exponents, and each
  layer's clipped gradient is ``(a / 2^ea)^T (g / 2^eg) c 2^(ea + eg)`` with the factor
  ``c 2^e = min(2^e, C 2^(e - top) / root)`` finite. An example with a non-finite a or
  g (its forward pass overflowed) contributes 0, a point of the ball. ``g`` already
  carries the loss weights, so padded examples (g = 0) contribute nothing.

  Args:
    layers: ``{path: (a, g)}`` from :func:`ghost_layers`.
    flat_params: the flattened parameter dict.
    clip: C, a scalar or ``[n]`` per example.
    ord: 2 or 1.
    scale: ``[n]`` per-example factors applied after clipping (default 1).

  Returns:
    ``(clipped_sum, norms [n])``; a norm is ``inf`` where it overflows or the
    example's gradient is not finite.
  """
  power = 1 if ord == 1 else 2
  parts, exps, scaled = [], [], {}
  finite = None
  for prefix, (a, g) in layers.items():
    (a_s, ea, fa), (g_s, eg, fg) = _row_scale(a), _row_scale(g)
    finite = fa & fg if finite is None else finite & fa & fg
    scaled[prefix] = (a_s, g_s, ea + eg, eg)
    parts.append(layer_norm_parts(a_s, g_s, False, ord))
    exps.append(ea + eg)
    if prefix + ("bias",) in flat_params:
      parts.append(layer_norm_parts(jnp.zeros_like(a_s), g_s, True, ord))
      exps.append(eg)
  top = jnp.max(jnp.stack(exps), 0)
  total = sum(p * jnp.ldexp(jnp.ones_like(p), power * (e - top)) for p, e in zip(parts, exps))
  root = total if ord == 1 else jnp.sqrt(total)
  norms = jnp.where(finite, jnp.ldexp(root, top), jnp.inf)
  safe_root = jnp.where(root > 0, root, 1.0)
  extra = 1.0 if scale is None else scale

  def factor(e):
    return jnp.where(finite, jnp.minimum(jnp.ldexp(jnp.ones_like(root), e),
                                         jnp.ldexp(clip / safe_root, e - top)) * extra, 0.0)

  grad = ghost_weighted_grad({k: v[:2] for k, v in scaled.items()}, flat_params,
                             {k: (factor(v[2]), factor(v[3])) for k, v in scaled.items()})
  return grad, norms


def zero_non_finite_rows(layers):
  """``(layers, finite [n])``: each example whose a or g (any layer) is not finite gets
  zero rows in every layer, so it contributes 0 to any clipped sum."""
  finite = None
  for a, g in layers.values():
    f = _row_scale(a)[2] & _row_scale(g)[2]
    finite = f if finite is None else finite & f

  def keep(v):
    return jnp.where(finite.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0.0)

  return {k: (keep(a), keep(g)) for k, (a, g) in layers.items()}, finite


def _row_scale(v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per example (axis 0): ``(v / 2^e, e, finite)`` with the row's largest entry
  divided into ``[1, 2)`` (``e = 0`` for a zero row; a non-finite row becomes 0)."""
  m = jnp.max(jnp.abs(v), axis=tuple(range(1, v.ndim)))
  finite = jnp.isfinite(m)
  e = jnp.where(m > 0, _pow2_exponent(m) - 1, 0)
  shape = (-1,) + (1,) * (v.ndim - 1)
  out = jnp.ldexp(jnp.where(finite.reshape(shape), v, 0.0), -e.reshape(shape))
  return out, e, finite


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
    return model.per_example_loss(model.apply(p, xi[None]), yi[None])[0]

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
    ord: 2 (L2) or 1 (L1, Fu et al. for the Laplace mechanism).
    chunk_size: examples per chunk on the per-example-gradient path.

  Returns:
    ``(clipped_sum, losses [n], norms [n])`` -- norms are before clipping.
  """
  if ord not in (1, 2):
    raise ValueError(f"ord must be 1 or 2, got {ord}")
  if model.ghost:
    return _ghost_clipped_sum(model, params, x, y, weights, clip, ord)
  return _vmap_clipped_sum(model, params, x, y, weights, clip, ord, chunk_size)


def per_example_grads_reference(model: Model, params, x, y):
  """Materialised per-example gradients ``[n, ...]`` (tests and references only)."""
  def one_loss(p, xi, yi):
    return model.per_example_loss(model.apply(p, xi[None]), yi[None])[0]
  return jax.vmap(jax.grad(one_loss), in_axes=(None, 0, 0))(params, x, y)
