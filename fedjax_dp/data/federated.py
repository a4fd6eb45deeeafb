"""Device-resident federated data: every client's examples as one padded array.

Clients are a leading array axis (ARCHITECTURE decision 1): client ``u`` owns
``x[u, :counts[u]]``; the rest of its row is zero padding with ``mask == 0``. A round
selects its clients with :func:`gather_clients` on the device, inside the jitted step,
so the selected ids can be a traced array and changing them never recompiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class FederatedData(NamedTuple):
  """Per-client training data, client axis leading.

  Attributes:
    x: float32 ``[U, n_max, *example_shape]``, zero-padded.
    y: int32 labels ``[U, n_max]`` (float32 targets for regression), padded with 0.
    counts: int32 ``[U]``, real examples per client.
    mask: float32 ``[U, n_max]``, 1.0 for real examples, 0.0 for padding.
  """

  x: jax.Array
  y: jax.Array
  counts: jax.Array
  mask: jax.Array


def build_federated_data(x: np.ndarray, y: np.ndarray, client_indices: Sequence[np.ndarray],
                         n_max: int | None = None) -> FederatedData:
  """Packs host arrays and a partition into padded device arrays.

  :func:`pack_federated_data`, then moved to the default device (``data.placement=
  'device'``; the host placement keeps the packed arrays, :mod:`.streaming`).
  """
  return jax.tree_util.tree_map(jnp.asarray, pack_federated_data(x, y, client_indices, n_max))


def pack_federated_data(x: np.ndarray, y: np.ndarray, client_indices: Sequence[np.ndarray],
                        n_max: int | None = None) -> FederatedData:
  """Packs host arrays and a partition into padded host (numpy) arrays.

  Args:
    x: all training examples ``[N, *example_shape]``.
    y: integer labels ``[N]``, or float regression targets (kept as float32).
    client_indices: one index array into ``x`` per client (e.g. from
      :func:`fedjax_dp.data.partition`); a client may be empty.
    n_max: padded length per client; default the largest client (at least 1). Fixing it
      keeps shapes, hence compiled programs, the same across partitions.

  Returns:
    A :class:`FederatedData` of numpy arrays (``x`` float32 ``[U, n_max, ...]``).

  Raises:
    ValueError: mismatched ``x``/``y``, an index out of range, or a client larger than
      ``n_max`` (config field ``data.n_max``).
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if len(x) != len(y) or y.ndim != 1:
    raise ValueError(f"x {x.shape} and y {y.shape} must hold the same number of examples.")
  idx = [np.asarray(i, np.int64).reshape(-1) for i in client_indices]
  if not idx:
    raise ValueError("client_indices must describe at least one client.")
  counts = np.array([len(i) for i in idx], np.int32)
  largest = int(counts.max())
  if n_max is None:
    n_max = max(largest, 1)
  elif largest > n_max:
    raise ValueError(f"data.n_max={n_max} is smaller than the largest client "
                     f"({largest} examples, client {int(counts.argmax())}).")
  flat = np.concatenate(idx)
  if flat.size and (flat.min() < 0 or flat.max() >= len(x)):
    raise ValueError(f"client_indices must lie in [0, {len(x)}), got values in "
                     f"[{flat.min()}, {flat.max()}].")

  mask = np.arange(n_max)[None, :] < counts[:, None]  # [U, n_max]
  padded = np.zeros(mask.shape, np.int64)  # index 0 for padding, zeroed below
  padded[mask] = flat  # row-major fill: client u's indices land in row u, in order
  xs = x[padded].astype(np.float32)       # one gather: [U, n_max, *example_shape]
  xs[~mask] = 0.0
  y_dtype = np.float32 if np.issubdtype(y.dtype, np.floating) else np.int32
  ys = np.where(mask, y[padded], 0).astype(y_dtype)
  return FederatedData(x=xs, y=ys, counts=counts, mask=mask.astype(np.float32))


def gather_clients(data: FederatedData, idx: jax.Array) -> FederatedData:
  """Selects clients ``idx [K]`` on the device; jittable, ``idx`` may be traced.

  Ids must lie in ``[0, U)``: out-of-range ids are not clipped but filled (NaN in ``x``
  and ``mask``), so a bad sampler shows up instead of silently reusing a client.

  Returns:
    A :class:`FederatedData` with leading axis K.
  """
  idx = jnp.asarray(idx)
  return jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0), data)
