"""The sweep axis and the client axis, laid out over devices with ``jax.sharding``.

A round of a sweep is one jitted program over arrays with leading sweep axes
``[G, L]`` (G cohorts of L points that select the same clients, see
``engine.cohort_step``) and, inside, a client axis K. The cohorts and the clients
become the axes of one 2-D device mesh::

  mesh axes   ('sweep', 'clients'), shape (S, C) with S * C = number of devices
  params      [G, L, ...]     sharded over 'sweep'       (each device: G/S cohorts)
  client ids  [G, L, K]       sharded over ('sweep', -, 'clients')
  data        [U, n, ...]     replicated (gathered on the device by client id)
  metrics     [G, L]          replicated (the host reads them every round)

XLA's SPMD partitioner then runs each device's clients of each of its cohorts and
sums the weighted updates across the 'clients' axis with one all-reduce per round;
cohorts never communicate, and a cohort's L points stay on the same devices so
they keep sharing the reads of its clients' data.

``jax.devices()`` lists every device of every process after
``jax.distributed.initialize()``, so the same code spans several GPUs of one
machine or several hosts; every process runs the same host loop (the host side is
deterministic numpy) and only process 0 writes files. No ``pmap``.

The layout never changes results beyond float summation order: keys are derived
from (seed, round, client id), never from a device or a position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PyTree = Any
SWEEP = "sweep"
CLIENTS = "clients"


def mesh_shape(num_devices: int, num_cohorts: int) -> tuple[int, int]:
  """``(S, C)``: S = gcd(devices, cohorts) devices split the cohorts, C the clients.

  Cohorts are independent, so they take as many devices as divide them evenly (no
  idle padding lanes); the remaining factor shards each cohort's clients, which
  costs one all-reduce of the models per round.
  """
  s = math.gcd(num_devices, max(num_cohorts, 1))
  return s, num_devices // s


def make_mesh(num_cohorts: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``('sweep', 'clients')`` mesh over ``devices`` (default: all, all hosts).

  Devices are listed process by process, so the row-major reshape puts one host's
  devices next to each other on the 'clients' axis, where the all-reduce runs.
  """
  devices = list(jax.devices() if devices is None else devices)
  s, c = mesh_shape(len(devices), num_cohorts)
  return Mesh(np.asarray(devices, dtype=object).reshape(s, c), (SWEEP, CLIENTS))


def is_trivial(mesh: Mesh | None) -> bool:
  """True for no mesh or a one-device mesh: plain ``jit``, no shardings."""
  return mesh is None or mesh.size == 1


def points(mesh: Mesh) -> NamedSharding:
  """Per-point arrays ``[G, L, ...]`` split over the 'sweep' axis (by cohort G)."""
  return NamedSharding(mesh, PartitionSpec(SWEEP))


def point_clients(mesh: Mesh) -> NamedSharding:
  """Per-client arrays ``[G, L, K, ...]`` split over 'sweep' (G) and 'clients' (K)."""
  return NamedSharding(mesh, PartitionSpec(SWEEP, None, CLIENTS))


def replicated(mesh: Mesh) -> NamedSharding:
  """Arrays every device holds whole (client data, test set, metrics)."""
  return NamedSharding(mesh, PartitionSpec())


def put(tree: PyTree, sharding: Any) -> PyTree:
  """Places host arrays (identical on every process) with ``sharding``.

  Single process: ``jax.device_put``. Several processes: each provides the shards of
  its own devices from its full host copy (``make_array_from_callback``), which is
  how a global array is built without any process holding another's devices.
  """
  if sharding is None:
    return jax.tree_util.tree_map(jax.numpy.asarray, tree)
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def one(a, sh):
    if a is None:  # an absent optional field (RoundArgs.rows of resident data)
      return None
    a = np.asarray(a)
    return jax.make_array_from_callback(a.shape, sh, lambda index: a[index])

  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree_util.tree_map(lambda a: one(a, sharding), tree)
  # A None in ``tree`` where ``sharding`` names one (jax.device_put accepts that) is a
  # leaf here, so the two trees match.
  return jax.tree_util.tree_map(one, tree, sharding, is_leaf=lambda a: a is None)


def to_host(tree: PyTree) -> PyTree:
  """Device arrays -> numpy, gathering shards that live on other processes."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def is_primary() -> bool:
  """Only process 0 writes files in a multi-host job."""
  return jax.process_index() == 0
