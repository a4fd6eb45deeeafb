"""The sweep program: G cohorts x L points of one compiled round, laid out on devices.

:func:`sweep_step` runs a sweep's points together: leading axes ``[G, L]`` of G
cohorts (points that select the same clients; :func:`fedjax_dp.training.rounds.cohort_step`
reads their clients' data once) of L points. :func:`make_sweep_fns` jits it and the
sweep's evaluation, laying cohorts and clients over the devices of a mesh
(:mod:`fedjax_dp.sharding`); a single run is a sweep of one point.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from fedjax_dp import sharding
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.models.base import Model
from fedjax_dp.training.evaluation import sweep_evaluate, sweep_evaluate_sets
from fedjax_dp.training.rounds import (
  RoundArgs,
  RoundConfig,
  RoundMetrics,
  _one,
  _round,
  cohort_step,
  model_params,
)

PyTree = Any


def sweep_step(model: Model, cfg: RoundConfig, params: PyTree, data: FederatedData,
               args: RoundArgs, active: jax.Array, cohorts_in_sequence: bool = False,
               sweep_devices: int = 1) -> tuple[PyTree, RoundMetrics]:
  """The round of a sweep: G cohorts x L points each, sharing ``data``.

  Cohorts are independent. ``vmap`` over them turns every matmul into a batched
  matmul over G (each cohort reads different clients), which accelerators run well
  and XLA:CPU runs slowly (W4: 4 cohorts x 8 points took 111 ms vmapped vs 4 x 15 ms
  one cohort at a time). With ``cohorts_in_sequence`` each device runs its G / S
  cohorts one after another (``lax.map``) and only the S devices' share is vmapped,
  which the SPMD partitioner splits so that each device sees one.

  Args:
    model: the model.
    cfg: static round config (the same for every point).
    params: ``[G, L, ...]`` each point's global model.
    data: client data shared by all points (``[U, ...]``, or ``[D, U, ...]`` with a
      per-point ``args.data_id``).
    args: :class:`RoundArgs` whose every field has leading ``[G, L]`` axes; the L
      points of a cohort select the same clients (see :func:`cohort_step`).
    active: ``[G, L]`` bool; inactive points (finished, or padding lanes) keep their
      model, so points of different T run in one program to the largest T.
    cohorts_in_sequence: run a device's cohorts one after another (CPU) instead of
      vmapped (accelerators); the results are the same.
    sweep_devices: S, the size of the mesh's 'sweep' axis (divides G).

  Returns:
    ``(params [G, L, ...], metrics with [G, L] fields)``.
  """
  g, lanes = active.shape
  if lanes == 1:
    # One point per cohort: no lane axis (a size-1 vmap costs XLA relayout copies).
    def one(p, a, on):
      p, a = jax.tree_util.tree_map(lambda x: x[0], (p, a))
      new, m = _round(model, cfg, p, data, a, on[0], _one)
      return jax.tree_util.tree_map(lambda x: x[None], (new, m))
  else:
    def one(p, a, on):
      return cohort_step(model, cfg, p, data, a, on)
  if g == 1:
    return jax.tree_util.tree_map(lambda x: x[None], one(
        *jax.tree_util.tree_map(lambda x: x[0], (params, args, active))))
  if not cohorts_in_sequence or g == sweep_devices:
    return jax.vmap(one)(params, args, active)
  if g % sweep_devices:
    raise ValueError(f"{g} cohorts do not split over {sweep_devices} devices")
  if sweep_devices == 1:
    return jax.lax.map(lambda x: one(*x), (params, args, active))
  # [G, ...] -> [S, G/S, ...]: device s holds cohorts s*G/S ... (block sharding).
  split = jax.tree_util.tree_map(
      lambda x: x.reshape((sweep_devices, g // sweep_devices) + x.shape[1:]),
      (params, args, active))
  out = jax.vmap(lambda xs: jax.lax.map(lambda x: one(*x), xs))(split)
  return jax.tree_util.tree_map(lambda x: x.reshape((g,) + x.shape[2:]), out)


def cohorts_in_sequence() -> bool:
  """Whether a device runs a sweep's cohorts one after another (see :func:`sweep_step`):
  on CPU, where XLA runs the batched matmuls of vmapped cohorts slowly."""
  return jax.default_backend() == "cpu"


@functools.lru_cache(maxsize=32)
def make_sweep_fns(model: Model, cfg: RoundConfig, eval_batch_size: int = 2048,
                   mesh: Any = None):
  """Jitted ``(round_fn, eval_fn)`` over a sweep axis, laid out on ``mesh``.

  ``round_fn(params, data, args, active) -> (params, metrics)`` (:func:`sweep_step`,
  leading axes ``[G, L]``: cohorts, points per cohort) and
  ``eval_fn(params, x, y) -> (loss [G, L], acc [G, L])``. With a mesh (see
  :mod:`fedjax_dp.sharding`) the cohorts are split over its 'sweep' axis and the
  client slots over its 'clients' axis; data and metrics are replicated.
  Cached on the static arguments, so runs and sweeps of the same shapes in one
  process share one compiled program (jit caches by shape on top of that).
  """
  in_sequence = cohorts_in_sequence()
  sweep_devices = 1 if sharding.is_trivial(mesh) else mesh.shape[sharding.SWEEP]

  def round_fn(params, data, args, active):
    return sweep_step(model, cfg, params, data, args, active, in_sequence, sweep_devices)

  def eval_fn(params, x, y):
    return sweep_evaluate(model, model_params(params), x, y, eval_batch_size)

  if sharding.is_trivial(mesh):
    return jax.jit(round_fn, donate_argnums=0), jax.jit(eval_fn)
  pts, rep = sharding.points(mesh), sharding.replicated(mesh)
  args_sharding = round_args_sharding(mesh)
  return (jax.jit(round_fn, in_shardings=(pts, rep, args_sharding, pts),
                  out_shardings=(pts, rep), donate_argnums=0),
          jax.jit(eval_fn, in_shardings=(pts, rep, rep), out_shardings=rep))


@functools.lru_cache(maxsize=32)
def make_sets_eval_fn(model: Model, eval_batch_size: int = 2048, mesh: Any = None):
  """Jitted ``eval_fn(params, x, y, which) -> (loss [G, L], acc [G, L])`` for a group
  whose points score on different evaluation sets ``x [E, N, ...]``, ``y [E, N]``
  (point ``(g, l)`` on set ``which [G, L]``, or row ``g`` on ``which [G]``;
  :func:`evaluation.sweep_evaluate_sets`)."""

  def eval_fn(params, x, y, which):
    return sweep_evaluate_sets(model, model_params(params), x, y, which, eval_batch_size)

  if sharding.is_trivial(mesh):
    return jax.jit(eval_fn)
  pts, rep = sharding.points(mesh), sharding.replicated(mesh)
  return jax.jit(eval_fn, in_shardings=(pts, rep, rep, pts), out_shardings=rep)


def round_args_sharding(mesh) -> RoundArgs:
  """Shardings of stacked :class:`RoundArgs`: per-client fields ``[G, L, K]`` over
  ('sweep', -, 'clients'), the rest ``[G, L, ...]`` over 'sweep'."""
  pts, pc = sharding.points(mesh), sharding.point_clients(mesh)
  return RoundArgs(idx=pc, sel_mask=pc, lr=pts, clip=pts, noise=pc, central_noise=pts,
                   server_lr=pts, round=pts, seed=pts, data_id=pts, stream=pts,
                   count_noise=pts, rows=pc)
