"""Client data streamed from host memory: the federation stays on the host, each
round's cohort moves to the device.

``data.placement='device'`` (default) puts the whole federation on the device
(:func:`fedjax_dp.data.federated.build_federated_data`) and the round gathers its
clients there. ``data.placement='host'`` keeps it in host memory -- numpy arrays,
or read-only memory-mapped ``.npy`` files (:func:`open_federation`) for a federation
larger than memory -- as a :class:`FederatedData` of numpy leaves with the same
fixed-shape layout::

  x       [U, n_max, *example_shape]   any dtype (float32 on the device)
  y       [U, n_max]                   int32 labels or float32 targets
  counts  [U]                          int32 real examples per client
  mask    [U, n_max]                   float32 (computed from counts when opened)

A :class:`CohortStream` gathers a round's cohort (client ids ``[K]``) on the host,
converts it exactly as the resident path does (``astype(float32)``), and puts
``[K, n_max, ...]`` on the device; the round reads its examples through
``RoundArgs.rows`` (:func:`fedjax_dp.training.rounds.gather_block`) while keys and weights
follow the client ids, so the streamed round computes bit for bit what the resident
round computes (``tests/test_streaming.py``). Selection depends only on
``(seed, round)``, so the next round's cohort is known ahead: :meth:`CohortStream.prefetch`
gathers it and starts its transfer on a background thread while the current round
computes. Nothing here holds state a resume would need (a resumed run re-gathers).

Device memory holds the federation's counts ``[U]`` (4 bytes a client), the current
round's cohort and, while prefetching, the next round's: bounded by the cohort,
not the federation.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.data.federated import FederatedData

PLACEMENTS = ("device", "host")
_READ_BLOCK, _READ_THREADS = 64, 8  # rows per read task, reading threads (memory maps)
FILES = ("x.npy", "y.npy", "counts.npy")


class PrefetchError(RuntimeError):
  """A cohort gathered on the prefetch thread failed; the cause is chained."""


def is_host(data: FederatedData) -> bool:
  """Whether ``data`` is a host federation (numpy or memory-mapped leaves)."""
  return isinstance(data.x, np.ndarray)


def mask_of(counts: np.ndarray, n_max: int) -> np.ndarray:
  """``[U, n_max]`` float32, 1.0 for the first ``counts[u]`` slots of each client."""
  return (np.arange(n_max)[None, :] < np.asarray(counts)[:, None]).astype(np.float32)


def check_federation(data: FederatedData, where: str = "the federation") -> None:
  """Checks the layout of a host federation; raises ValueError naming what is wrong.

  Args:
    data: a :class:`FederatedData` of numpy arrays.
    where: how to name it in the message (e.g. a directory).
  """
  x, y, counts = data.x, data.y, data.counts
  if x.ndim < 2 or y.ndim != 2 or counts.ndim != 1:
    raise ValueError(f"{where}: expected x [U, n_max, ...], y [U, n_max], counts [U]; got "
                     f"x {x.shape}, y {y.shape}, counts {counts.shape}")
  if x.shape[:2] != y.shape or counts.shape[0] != x.shape[0] or not x.shape[0]:
    raise ValueError(f"{where}: x {x.shape}, y {y.shape} and counts {counts.shape} must "
                     "agree on U >= 1 clients and n_max examples")
  if not np.issubdtype(counts.dtype, np.integer):
    raise ValueError(f"{where}: counts must be integers, got {counts.dtype}")
  lo, hi = int(np.min(counts)), int(np.max(counts))
  if lo < 0 or hi > x.shape[1]:
    raise ValueError(f"{where}: counts must lie in [0, n_max={x.shape[1]}], got values in "
                     f"[{lo}, {hi}]")


def save_federation(path: str | os.PathLike, data: FederatedData) -> Path:
  """Writes a federation as ``x.npy``, ``y.npy``, ``counts.npy`` under ``path``
  (created), readable by :func:`open_federation`. ``data.mask`` is not stored."""
  out = Path(path)
  out.mkdir(parents=True, exist_ok=True)
  host = FederatedData(*(np.asarray(a) for a in data))
  check_federation(host, str(out))
  for name, a in zip(FILES, (host.x, host.y, host.counts.astype(np.int32))):
    np.save(out / name, a)
  return out


def create_federation(path: str | os.PathLike, num_clients: int, n_max: int,
                      example_shape: Sequence[int], x_dtype=np.uint8, y_dtype=np.int32
                      ) -> tuple[np.memmap, np.memmap, np.memmap]:
  """Empty, writable memory-mapped ``(x, y, counts)`` files under ``path``, for
  federations written piece by piece (larger than memory); fill them, flush, then
  :func:`open_federation`."""
  out = Path(path)
  out.mkdir(parents=True, exist_ok=True)
  shapes = ((num_clients, n_max, *example_shape), (num_clients, n_max), (num_clients,))
  dtypes = (x_dtype, y_dtype, np.int32)
  return tuple(np.lib.format.open_memmap(out / name, mode="w+", dtype=dt, shape=sh)
               for name, dt, sh in zip(FILES, dtypes, shapes))


def open_federation(path: str | os.PathLike) -> FederatedData:
  """A federation written by :func:`save_federation` / :func:`create_federation`,
  memory-mapped read-only (only ``counts`` and the computed ``mask`` are in memory).

  Raises:
    FileNotFoundError: ``path`` or one of its files is missing.
    ValueError: the files do not form a federation (:func:`check_federation`).
  """
  src = Path(path)
  if not src.is_dir():
    raise FileNotFoundError(f"federation directory {str(src)!r} does not exist")
  missing = [n for n in FILES if not (src / n).is_file()]
  if missing:
    raise FileNotFoundError(f"federation directory {str(src)!r} lacks {', '.join(missing)} "
                            f"(expected {', '.join(FILES)})")
  try:
    x, y = (np.load(src / n, mmap_mode="r") for n in FILES[:2])
    counts = np.load(src / FILES[2]).astype(np.int32)
  except ValueError as e:  # not an .npy file, truncated header
    raise ValueError(f"federation directory {str(src)!r}: {', '.join(FILES)} are not all "
                     "NumPy .npy arrays (one is another kind of file, or cut short)") from e
  data = FederatedData(x=x, y=y, counts=counts, mask=np.zeros((0, 0), np.float32))
  check_federation(data, repr(str(src)))
  for a in (x, y):  # a cohort reads scattered rows: no readahead around them
    _advise(a, "MADV_RANDOM")
  return data._replace(mask=mask_of(counts, x.shape[1]))


def _advise(a: np.ndarray, advice: str) -> None:
  """``madvise`` on the whole mapping of a memory-mapped array (where the platform
  has it; nothing otherwise). ``MADV_RANDOM``: read only the pages touched (the kernel
  would otherwise read ahead, up to megabytes around each client's row);
  ``MADV_DONTNEED``: drop this process's mapping of the pages read (they stay in the
  page cache), so its resident memory holds the cohort, not every row ever read."""
  m = getattr(a, "_mmap", None)  # numpy.memmap's mmap object
  flag = getattr(mmap, advice, None)
  if m is not None and flag is not None and hasattr(m, "madvise"):
    try:
      m.madvise(flag)
    except (OSError, ValueError):
      pass


def _read_rows(a: np.ndarray, ids: np.ndarray) -> np.ndarray:
  """``a[ids]``. A memory-mapped file (as :func:`open_federation` maps
  it) is read with one ``preadv`` per row into a fresh buffer, so the process maps
  none of the file: its resident memory holds the cohort, not the rows read so far
  (page faults on the mapping would also pull in the pages around each row). Other
  arrays (and views of a mapping) are indexed; a mapping's pages are then dropped
  from this process afterwards (``MADV_DONTNEED``; they stay in the page cache)."""
  if not (isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap) and a.filename
          and a.flags.c_contiguous and hasattr(os, "preadv")):
    out = np.asarray(a[ids])
    _advise(a, "MADV_DONTNEED")
    return out
  row = a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
  out = np.empty((ids.size,) + a.shape[1:], a.dtype)
  buf = memoryview(out.reshape(-1).view(np.uint8))
  # The file is read in increasing order (rows land at their cohort positions).
  order = np.argsort(ids, kind="stable").tolist()
  ids = ids.tolist()

  def read(js: range) -> None:
    for j in (order[r] for r in js):
      if os.preadv(fd, [buf[j * row:(j + 1) * row]], a.offset + ids[j] * row) != row:
        raise OSError(f"{a.filename}: short read at client {ids[j]} (file truncated?)")

  with open(a.filename, "rb", buffering=0) as f:
    fd = f.fileno()
    # Several reads in flight: a disk serves scattered rows faster with a deeper queue.
    parts = [range(s, min(s + _READ_BLOCK, len(ids))) for s in range(0, len(ids), _READ_BLOCK)]
    if len(parts) == 1:
      read(parts[0])
    else:
      with concurrent.futures.ThreadPoolExecutor(min(len(parts), _READ_THREADS)) as pool:
        for done in pool.map(read, parts):
          del done
  return out


def gather_cohort(data: FederatedData, idx: np.ndarray, float32: bool = True) -> FederatedData:
  """Clients ``idx [K]`` of a host federation, as the device would see them.

  ``x`` becomes float32 the way :func:`fedjax_dp.data.federated.pack_federated_data`
  and :func:`to_device` convert it, so the values are those of the resident path.

  Args:
    data: a host federation.
    idx: ``[K]`` client ids (repeats allowed).
    float32: convert ``x`` here; False keeps its stored dtype (:class:`CohortStream`
      moves the smaller array and converts on the device, with the same result).

  Returns:
    A numpy :class:`FederatedData` with leading axis K (``counts`` too).

  Raises:
    IndexError: an id outside ``[0, U)``.
  """
  idx = np.asarray(idx, np.int64)
  u = data.x.shape[0]
  if idx.size and (idx.min() < 0 or idx.max() >= u):
    raise IndexError(f"cohort ids must lie in [0, {u}), got values in "
                     f"[{idx.min()}, {idx.max()}]")
  x = _read_rows(data.x, idx)
  x = x.astype(np.float32) if float32 else x
  y = _read_rows(data.y, idx)
  y = y.astype(np.float32 if np.issubdtype(y.dtype, np.floating) else np.int32)
  return FederatedData(x=x, y=y, counts=np.asarray(data.counts)[idx].astype(np.int32),
                       mask=np.asarray(data.mask)[idx].astype(np.float32))


def to_device(data: FederatedData) -> FederatedData:
  """The whole host federation on the default device, converted as
  :func:`gather_cohort` converts a cohort (the resident twin of a stream)."""
  y = np.asarray(data.y)
  return FederatedData(
      x=jnp.asarray(np.asarray(data.x).astype(np.float32)),
      y=jnp.asarray(y.astype(np.float32 if np.issubdtype(y.dtype, np.floating) else np.int32)),
      counts=jnp.asarray(np.asarray(data.counts, np.int32)),
      mask=jnp.asarray(np.asarray(data.mask, np.float32)))


@jax.jit
def _as_float32(x: jax.Array) -> jax.Array:
  """The cohort's examples as float32, on the device where they were put (an integer
  or float32 value converts exactly as numpy's ``astype`` does)."""
  return x.astype(jnp.float32)


def _key(data_id: int, idx: np.ndarray) -> tuple[int, bytes]:
  return int(data_id), np.asarray(idx, np.int32).tobytes()


class CohortStream:
  """Moves cohorts of host federations to the device, the next round's ahead.

  Per round the caller :meth:`begin_round`, then :meth:`take` s the cohorts its
  device calls read (served from what :meth:`prefetch` started, else gathered now),
  and after dispatching the round :meth:`prefetch` es the next round's cohorts: one
  background thread gathers each and starts its transfer while the device computes.
  A cohort taken in a round is kept until the next :meth:`begin_round` (the
  validation pass re-reads it). An exception of the prefetch thread is raised by the
  :meth:`take` that needs its cohort, as :class:`PrefetchError`.

  Args:
    sources: the host federations (one per dataset; a cohort names its ``data_id``).
    put: moves a numpy pytree to the device(s) (default ``jax.device_put``).
    background: gather on a background thread (False: :meth:`prefetch` does nothing).
  """

  def __init__(self, sources: Sequence[FederatedData], put=None, background: bool = True):
    if not sources:
      raise ValueError("CohortStream needs at least one host federation")
    for d, s in enumerate(sources):
      if not is_host(s):
        raise ValueError(f"CohortStream: source {d} is not a host (numpy) federation")
    self.sources = list(sources)
    self._put = put or jax.device_put
    counts = [np.asarray(s.counts, np.int32) for s in sources]
    # The federation's counts stay on the device (weights, |D|): [U] or stacked [D, U].
    self.counts = self._put(counts[0] if len(counts) == 1 else np.stack(counts))
    self._pool = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cohort-prefetch")
                  if background else None)
    self._pending: dict[tuple, concurrent.futures.Future] = {}
    self._ready: dict[tuple, FederatedData] = {}
    self._keep: set[tuple] = set()  # taken cohorts the next round reads again
    self.hits = self.misses = 0

  def _load(self, key: tuple[int, bytes]) -> FederatedData:
    data_id, raw = key
    cohort = gather_cohort(self.sources[data_id], np.frombuffer(raw, np.int32), float32=False)
    on_device = self._put(cohort._replace(counts=np.zeros((0,), np.int32)))
    return on_device._replace(x=_as_float32(on_device.x))

  def begin_round(self) -> None:
    """Forgets the cohorts taken in the previous round (their device buffers), but
    those the last :meth:`prefetch` asked for again (e.g. ``server.selection='all'``)."""
    self._ready = {k: v for k, v in self._ready.items() if k in self._keep}
    self._keep = set()

  def prefetch(self, cohorts: Sequence[tuple[int, np.ndarray]]) -> None:
    """Starts gathering ``cohorts`` (``(data_id, ids [K])`` pairs) in the background;
    prefetches not among them are dropped."""
    keys = [_key(d, i) for d, i in cohorts]
    self._keep = {k for k in keys if k in self._ready}
    for k in list(self._pending):
      if k not in keys:
        self._pending.pop(k).cancel()
    if self._pool is None:
      return
    for k in keys:
      if k not in self._pending and k not in self._ready:
        self._pending[k] = self._pool.submit(self._load, k)

  def _one(self, key: tuple[int, bytes]) -> FederatedData:
    if key in self._ready:
      return self._ready[key]
    fut = self._pending.pop(key, None)
    if fut is None:
      self.misses += 1
      out = self._load(key)
    else:
      self.hits += 1
      try:
        out = fut.result()
      except Exception as e:
        ids = np.frombuffer(key[1], np.int32)
        raise PrefetchError(f"prefetching the cohort of dataset {key[0]} (clients "
                            f"{ids[:4].tolist()}{'...' if ids.size > 4 else ''}) failed: "
                            f"{type(e).__name__}: {e}") from e
    self._ready[key] = out
    return out

  def take(self, cohorts: Sequence[tuple[int, np.ndarray]]
           ) -> tuple[FederatedData, list[int]]:
    """The device data of ``cohorts`` (``(data_id, ids [K])`` pairs) for one call.

    Returns:
      ``(data, offsets)``: ``data.x``/``y``/``mask`` hold the cohorts' rows one after
      another ``[sum K, ...]`` (cohort j's client s at row ``offsets[j] + s``, what
      ``RoundArgs.rows`` points at), ``data.counts`` the federation's counts.
    """
    parts, offsets, start = [], [], 0
    for d, ids in cohorts:
      parts.append(self._one(_key(d, ids)))
      offsets.append(start)
      start += int(np.size(ids))
    if len(parts) == 1:
      x, y, mask = parts[0].x, parts[0].y, parts[0].mask
    else:
      x, y, mask = (jnp.concatenate([getattr(p, f) for p in parts]) for f in ("x", "y", "mask"))
    return FederatedData(x=x, y=y, counts=self.counts, mask=mask), offsets

  def close(self) -> None:
    """Stops the background thread (pending prefetches are dropped)."""
    for fut in self._pending.values():
      fut.cancel()
    self._pending.clear()
    self._ready.clear()
    if self._pool is not None:
      self._pool.shutdown(wait=True)
