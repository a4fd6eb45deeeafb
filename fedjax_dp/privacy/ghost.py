"""Ghost clipping: per-example norms and clipped sums without per-example gradients.

For models whose parameters all live in :class:`fedjax_dp.models.layers.Dense` and
:class:`fedjax_dp.models.layers.Conv` layers (every model of the zoo): one forward,
one backward to the layer outputs (:func:`ghost_layers`), per-layer norm parts
(:func:`layer_norm_parts`: example i's kernel gradient is ``a_i g_i^T``), and one
matmul per layer for the clipped sum (:func:`ghost_weighted_grad`, book-keeping;
Bu et al. 2023) -- about the cost of a non-private step. L1 and L2 norms factorise
over layers this way; :mod:`fedjax_dp.privacy.clipping` takes any other norm by
materialised per-example gradients.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from fedjax_dp.models.base import Model
from fedjax_dp.models.layers import GHOST_IN, GHOST_OUT

# The norms whose per-example parts add up over layers (L1; L2 squared).
GHOST_ORDS = (1, 2)


def pow2_exponent(m: jax.Array) -> jax.Array:
  """``e`` with ``2^(e-1) <= m < 2^e`` for finite ``m > 0`` (0 for ``m == 0``)."""
  return jnp.frexp(jnp.where(jnp.isfinite(m), m, 0.0))[1]


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
  e = jnp.where(m > 0, pow2_exponent(m) - 1, 0)
  shape = (-1,) + (1,) * (v.ndim - 1)
  out = jnp.ldexp(jnp.where(finite.reshape(shape), v, 0.0), -e.reshape(shape))
  return out, e, finite
