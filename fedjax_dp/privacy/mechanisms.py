"""Additive noise mechanisms on pytrees: Gaussian and Laplace.

The ``scale`` argument is the per-coordinate standard deviation for the Gaussian
mechanism and the Laplace scale ``b`` (std ``sqrt(2) b``) for the Laplace mechanism.
Callers derive it from the sensitivity and the privacy target (see
:mod:`fedjax_dp.privacy.formulas`); here it is just an array, possibly traced.

Where the noise goes (the placement) is decided by the engine:
``upload`` -- every selected client noises the model it uploads (Wei UDP, Yuan, Fu);
``step`` -- noise on each local step's summed clipped gradient (DP-SGD, A-DPFL);
``central`` -- the server noises the aggregate (DP-FedAvg).

``tree`` and ``bandmf`` are noise correlated across rounds (central placement only),
drawn by the round from :mod:`fedjax_dp.privacy.correlated`; :func:`noise_like` draws
the independent ones (:data:`ADDITIVE`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.privacy import correlated

PyTree = Any
ADDITIVE = ("gaussian", "laplace")  # i.i.d. per round: noise_like draws them
CORRELATED = tuple(correlated.CORRELATED)  # correlated across rounds: tree, bandmf
MECHANISMS = ADDITIVE + CORRELATED
PLACEMENTS = ("none", "upload", "step", "central")


def noise_like(key: jax.Array, tree: PyTree, scale: jax.Array, mechanism: str) -> PyTree:
  """Draws i.i.d. noise shaped like ``tree``.

  Each leaf uses ``fold_in(key, leaf_index)``, so the noise of a leaf does not depend
  on the other leaves' shapes.

  Args:
    key: PRNG key.
    tree: pytree whose leaf shapes/dtypes the noise takes.
    scale: scalar std (Gaussian) or ``b`` (Laplace); 0 gives zeros.
    mechanism: ``'gaussian'`` or ``'laplace'``.
  """
  if mechanism not in ADDITIVE:
    raise ValueError(f"privacy.mechanism: {mechanism!r} is not drawn i.i.d. per round; "
                     f"noise_like draws {ADDITIVE}")
  sample = jax.random.normal if mechanism == "gaussian" else jax.random.laplace
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  noise = [sample(jax.random.fold_in(key, i), x.shape, x.dtype) * jnp.asarray(scale, x.dtype)
           for i, x in enumerate(leaves)]
  return jax.tree_util.tree_unflatten(treedef, noise)


def add_noise(key: jax.Array, tree: PyTree, scale: jax.Array, mechanism: str) -> PyTree:
  """``tree + noise_like(key, tree, scale, mechanism)``."""
  return jax.tree_util.tree_map(jnp.add, tree, noise_like(key, tree, scale, mechanism))
