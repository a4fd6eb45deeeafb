"""How many clients a round can train at once: memory probing and chunk sizing.

:func:`client_chunk_for_memory` compiles the round (nothing runs) at two small chunk
sizes, reads XLA's memory analysis, and picks the largest
``RoundConfig.client_chunk`` whose temporaries fit a share of the device's free
memory (:func:`available_memory_bytes`) and, for dense models on CPU, of the
last-level cache (docs/scaling.md).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.data.federated import FederatedData
from fedjax_dp.models.base import Model
from fedjax_dp.training.rounds import (
    RoundArgs,
    RoundConfig,
    carried_params,
    carries_state,
    conv_impl_for,
    round_step,
)


def available_memory_bytes(device: jax.Device | None = None) -> int:
  """Free memory of ``device``: the allocator's limit minus use (GPU/TPU), else the
  host's available RAM shared by its local CPU devices."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # some backends do not implement it
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  avail = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          avail = int(line.split()[1]) * 1024
  except OSError:
    pass
  if avail is None:
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return int(avail // max(1, jax.local_device_count()))


# The probe needs XLA's buffer assignment, which its HLO passes fix before code is
# generated; the backend's (LLVM's) optimisation only changes the machine code, which
# the probe never runs. On CPU, without it the probe compiles in about half the time (
# 9.8 -> 6.1 s for the quickstart's round under load) with the same memory analysis
# (docs/scaling.md, "Time to the first round").
PROBE_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


@functools.lru_cache(maxsize=32)
def _bytes_per_client(model: Model, cfg: RoundConfig, shapes: FederatedData) -> float:
  """Device bytes one more client slot costs in a round (compiled, not run)."""
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  steps = cfg.client.local_steps

  def temp_bytes(b):
    f32, i32 = jnp.float32, jnp.int32
    args = RoundArgs(
        idx=jax.ShapeDtypeStruct((b,), i32), sel_mask=jax.ShapeDtypeStruct((b,), f32),
        lr=jax.ShapeDtypeStruct((steps,), f32), clip=jax.ShapeDtypeStruct((), f32),
        noise=jax.ShapeDtypeStruct((b,), f32), central_noise=jax.ShapeDtypeStruct((), f32),
        server_lr=jax.ShapeDtypeStruct((), f32), round=jax.ShapeDtypeStruct((), i32),
        seed=jax.ShapeDtypeStruct((), jnp.uint32), data_id=jax.ShapeDtypeStruct((), i32),
        stream=jax.ShapeDtypeStruct((2,), jnp.uint32), count_noise=jax.ShapeDtypeStruct((), f32))
    lowered = jax.jit(lambda p, d, a: round_step(model, cfg, p, d, a)).lower(params, shapes, args)
    options = PROBE_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
    stats = lowered.compile(compiler_options=options).memory_analysis()
    return None if stats is None else stats.temp_size_in_bytes + stats.output_size_in_bytes

  b1, b2 = 2, 6
  t1, t2 = temp_bytes(b1), temp_bytes(b2)
  if t1 is not None and t2 is not None and t2 > t1:
    return (t2 - t1) / (b2 - b1)
  # No memory analysis on this backend: data, a few model copies and activations.
  n = shapes.x.shape[-len(model.input_shape) - 1]
  return 4.0 * (2 * n * int(np.prod(model.input_shape)) + 6 * model.num_params())


def carried_state_bytes(model: Model, cfg: RoundConfig) -> int:
  """Device bytes of one lane's carried states: the correlated noise's (BandMF: ``b - 1``
  model copies; tree and i.i.d. noise: 0) and the server optimizer's (``fedadam``: 2
  model copies; ``fedavg``: 0). A fixed cost of the round, not a per-client one."""
  if not carries_state(cfg):
    return 0
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  state = jax.eval_shape(lambda p: carried_params(cfg, p)[1:], params)
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))


def client_chunk_for_memory(model: Model, cfg: RoundConfig, data: FederatedData,
                            k_slots: int, memory_bytes: int | None = None, lanes: int = 1,
                            multiple_of: int = 1, fraction: float = 0.5,
                            cache_bytes: int | None = None, cohorts: int = 1) -> int:
  """The largest client chunk whose round fits in ``fraction`` of the free memory.

  Measures the compiled round's temporary memory (``memory_analysis``) at two small
  chunk sizes, so the per-client cost includes the gathered data, activations,
  per-example work and model copies that XLA really allocates; nothing runs.

  Args:
    model: the model.
    cfg: the round config (its ``client_chunk`` is ignored).
    data: the client data (arrays or ``jax.ShapeDtypeStruct``s).
    k_slots: client slots per round K.
    memory_bytes: free memory per device; default :func:`available_memory_bytes`.
    lanes: points of one cohort running the round at once (they share the clients'
      data, see :func:`cohort_step`).
    multiple_of: the chunk is a multiple of this (the mesh's 'clients' axis size).
    fraction: share of the free memory the round's temporaries may take.
    cache_bytes: also keep a chunk's temporaries within this many bytes; default on
      CPU the last-level cache (a speed limit, not a memory limit), elsewhere none.
    cohorts: cohorts per device running at once (vmapped; 1 where they run in
      sequence, see :func:`sweep_step`).

  Returns:
    A chunk size for ``RoundConfig.client_chunk``; 0 when all K fit at once.
  """
  memory_bytes = available_memory_bytes() if memory_bytes is None else memory_bytes
  # A correlated mechanism's carried state (BandMF's b - 1 model copies, in and out of
  # the round) is held by every lane whatever the chunk: it comes off the budget first.
  fixed = 2 * max(lanes, 1) * max(cohorts, 1) * carried_state_bytes(model, cfg)
  memory_bytes = max(int(memory_bytes - fixed / fraction), 1)
  shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), data)
  # The probe leaves out the noise, whose threefry code takes XLA (CPU) seconds to
  # compile; a client's noise is a model-sized draw, counted here instead.
  quiet = dataclasses.replace(cfg, client_chunk=0, aggregate_upload_noise=False,
                              client=dataclasses.replace(cfg.client, noise_placement="none"))
  per_client = _bytes_per_client(model, quiet, shapes)
  if cfg.client.noise_placement in ("upload", "step") and not cfg.aggregate_upload_noise:
    per_client += 2 * 4 * model.num_params()
  # A cohort gathers a client's examples once for all its lanes; the rest (model
  # copies, activations, per-example work) is per lane.
  example_dims = len(model.input_shape) + 1
  shared = min(per_client, sum(a.dtype.itemsize * int(np.prod(a.shape[-dims:])) for a, dims in
                               ((shapes.x, example_dims), (shapes.y, 1), (shapes.mask, 1))))
  lane_bytes = max(cohorts, 1) * max(shared + max(lanes, 1) * (per_client - shared), 1.0)
  chunk = int(fraction * memory_bytes // lane_bytes)
  if cache_bytes is None and jax.default_backend() == "cpu" and (
      not model.conv or conv_impl_for(cfg) == "im2col"):
    # Not for CNNs computed by XLA convolutions: XLA (CPU) runs convolution weight
    # gradients inside loops (the chunk scan) on a path ~15x slower than outside, so
    # small chunks cost them far more than cache misses do. With 'im2col' (the CPU
    # default) weight gradients are matmuls, and the per-client models and unfolded
    # inputs of a small chunk stay in cache: W2 ran 1.19x faster in chunks of 1
    # client than all 50 at once (docs/scaling.md, "CNN speed steps on CPU").
    # A quarter of the last-level cache: XLA's buffers (temporaries, the gathered
    # block) outnumber what memory_analysis counts per client; measured best for
    # Wei's MLP round, 10,000-client logistic cohorts and a linear-SVM sweep.
    cache_bytes = _last_level_cache_bytes() // 4
  if cache_bytes:
    # On CPU a chunk whose temporaries stay in the last-level cache runs up to 2x
    # faster than one that streams them through DRAM (e.g. Wei's MLP round).
    chunk = min(chunk, max(1, int(cache_bytes // lane_bytes)))
  chunk = max(multiple_of, chunk - chunk % multiple_of)
  if chunk >= k_slots:
    return 0
  # The same number of chunks, as even as possible: the last chunk's padding slots
  # compute on nothing (K = 1000 in chunks of 161 pads 127 slots; of 143, one).
  num_chunks = -(-k_slots // chunk)
  return -(-k_slots // (num_chunks * multiple_of)) * multiple_of


def _last_level_cache_bytes(default: int = 32 << 20) -> int:
  """Size of the largest CPU cache (Linux sysfs), else ``default``."""
  sizes = []
  for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
    try:
      with open(path) as f:
        text = f.read().strip().upper()
    except OSError:
      continue
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    if digits.isdigit():
      sizes.append(int(digits) * scale)
  return max(sizes) if sizes else default
