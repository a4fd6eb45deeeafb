"""A federation a user already holds: per-client arrays (or dicts of arrays) and a
test set, from a list or any iterable (a generator, a Flower Datasets / Hugging Face
``datasets`` partition converted with ``with_format("numpy")``).

:func:`federation` checks and packs them into one :class:`Federation`: the examples of
all clients concatenated in the order given, each client's size, and the test set.
The run takes the number of clients and their sizes from it (never from the config),
and records its name, shapes and content fingerprint (:meth:`Federation.describe`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.data.datasets import Dataset
from fedjax_dp.data.fingerprint import array_digest


class Federation(NamedTuple):
  """Clients' data and a test set, held on the host.

  Attributes:
    name: what the run's record calls the data (``data.name``).
    x: float32 ``[N, ...]`` every client's examples, client after client.
    y: int32 labels ``[N]`` in ``[0, num_classes)``, or float32 targets (regression).
    sizes: int64 ``[U]`` examples of each client (``sum == N``).
    x_test: float32 ``[M, ...]``.
    y_test: ``[M]``, as ``y``.
    num_classes: number of classes; 0 for real-valued targets.
  """

  name: str
  x: np.ndarray
  y: np.ndarray
  sizes: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int

  @property
  def num_clients(self) -> int:
    return len(self.sizes)

  def clients(self) -> list[np.ndarray]:
    """Each client's example indices into :attr:`x` (sorted int64 arrays)."""
    ends = np.cumsum(self.sizes)
    return [np.arange(e - s, e, dtype=np.int64) for s, e in zip(self.sizes, ends)]

  def fingerprint(self) -> str:
    """32 hex digits of the content: examples, labels, client sizes, test set."""
    return array_digest(self.x, self.y, self.sizes, self.x_test, self.y_test,
                        np.asarray([self.num_classes]))

  def describe(self) -> dict[str, Any]:
    """What the run's record (``summary.json``'s ``data_source``) says about the data."""
    return {"kind": "python", "name": self.name, "num_clients": self.num_clients,
            "client_sizes": [int(s) for s in self.sizes], "x_shape": list(self.x.shape),
            "y_shape": list(self.y.shape), "x_test_shape": list(self.x_test.shape),
            "num_classes": int(self.num_classes), "fingerprint": self.fingerprint()}

  def dataset(self) -> Dataset:
    """The federation as a loaded :class:`Dataset` (its clients as natural groups)."""
    groups = np.repeat(np.arange(self.num_clients, dtype=np.int64), self.sizes)
    return Dataset(self.x, self.y, self.x_test, self.y_test, self.num_classes, self.name,
                   groups, self.describe())


def _pair(item: Any, keys: tuple[str, str], where: str) -> tuple[np.ndarray, np.ndarray]:
  if isinstance(item, Mapping):
    missing = [k for k in keys if k not in item]
    if missing:
      raise ValueError(f"{where}: a dict without {missing} (has {sorted(item)}); name the "
                       f"keys with keys=(x_key, y_key)")
    item = (item[keys[0]], item[keys[1]])
  if not (isinstance(item, (tuple, list)) and len(item) == 2):
    raise ValueError(f"{where}: expected (x, y) arrays or a dict of arrays, got "
                     f"{type(item).__name__}")
  x, y = (np.asarray(a) for a in item)
  if x.ndim < 1 or y.ndim != 1 or len(x) != len(y):
    raise ValueError(f"{where}: x {list(x.shape)} and y {list(y.shape)} must hold the same "
                     f"number of examples, y one label per example")
  return x, y


def federation(clients: Iterable[Any], test: Any, *, name: str = "user_data",
               keys: tuple[str, str] = ("x", "y"), num_classes: int | None = None
               ) -> Federation:
  """Packs a user's clients and test set into a :class:`Federation`.

  Args:
    clients: per-client ``(x, y)`` pairs or dicts of arrays (``keys``): a list, or any
      iterable (a generator, Flower Datasets partitions); read once.
    test: the test set, ``(x, y)`` or a dict.
    name: the data's name in the run's record.
    keys: the dict keys of inputs and labels (e.g. ``("image", "label")``).
    num_classes: the number of classes; default ``max label + 1``. Float labels
      mean regression (``num_classes`` 0).

  Raises:
    ValueError: no clients, an empty client, shapes that differ between clients or
      from the test set, negative labels. One line naming the client.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"name must be a non-empty string, got {name!r}")
  xs, ys = [], []
  for i, item in enumerate(clients):
    x, y = _pair(item, keys, f"client {i}")
    if len(y) == 0:
      raise ValueError(f"client {i} holds no examples")
    if xs and x.shape[1:] != xs[0].shape[1:]:
      raise ValueError(f"client {i}: examples of shape {list(x.shape[1:])}, client 0's "
                       f"are {list(xs[0].shape[1:])}")
    xs.append(x)
    ys.append(y)
  if not xs:
    raise ValueError("clients: no clients given")
  x_test, y_test = _pair(test, keys, "test")
  if x_test.shape[1:] != xs[0].shape[1:]:
    raise ValueError(f"test: examples of shape {list(x_test.shape[1:])}, the clients' are "
                     f"{list(xs[0].shape[1:])}")
  y = np.concatenate(ys)
  regression = np.issubdtype(y.dtype, np.floating)
  if regression != np.issubdtype(y_test.dtype, np.floating):
    raise ValueError(f"test: labels of dtype {y_test.dtype}, the clients' are {y.dtype}")
  if not regression:
    if not np.issubdtype(y.dtype, np.integer):
      raise ValueError(f"labels must be integers (classes) or floats (regression), got "
                       f"{y.dtype}")
    low = min(int(y.min()), int(y_test.min()))
    top = max(int(y.max()), int(y_test.max())) + 1
    if low < 0:
      raise ValueError(f"labels must be >= 0 (class ids), got {low}")
    num_classes = top if num_classes is None else int(num_classes)
    if num_classes < top:
      raise ValueError(f"num_classes={num_classes}, but the labels go up to {top - 1}")
  cast = np.float32 if regression else np.int32
  return Federation(name, np.concatenate(xs).astype(np.float32), y.astype(cast),
                    np.asarray([len(v) for v in ys], np.int64),
                    x_test.astype(np.float32), y_test.astype(cast),
                    0 if regression else int(num_classes))
