"""Dataset loaders: embedded digits, real MNIST IDX files, CIFAR-10 batches, mocked tfds."""

import gzip
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import HANG_S

from fedjax_dp.data import DATASETS, Dataset, load_dataset
from fedjax_dp.data import datasets as datasets_lib
from fedjax_dp.data.datasets import DatasetUnavailableError, binary_labels, clear_cache

MNIST_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "mnist"
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# From the MNIST README next to the files.
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]

requires_mnist = pytest.mark.skipif(
    not MNIST_DIR.is_dir(), reason=f"real MNIST files not found at {MNIST_DIR} "
    "(the shared datasets folder next to the project root)")


def assert_format(ds: Dataset, shape, num_classes):
  assert ds.x_train.shape[1:] == shape and ds.x_test.shape[1:] == shape
  assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
  assert ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
  assert len(ds.x_train) == len(ds.y_train) and len(ds.x_test) == len(ds.y_test)
  for x in (ds.x_train, ds.x_test):
    assert x.min() >= 0.0 and x.max() <= 1.0
  for y in (ds.y_train, ds.y_test):
    assert y.min() >= 0 and y.max() < num_classes
  assert ds.num_classes == num_classes


@pytest.fixture(scope="module")
def mnist():
  if not MNIST_DIR.is_dir():
    pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
  return load_dataset("mnist", MNIST_DIR)


# ----------------------------------------------------------------------------- digits


def test_digits_embedded_split():
  ds = load_dataset("digits")
  assert_format(ds, (8, 8, 1), 10)
  assert (len(ds.y_train), len(ds.y_test)) == (1437, 360)
  assert ds.x_train.max() == 1.0  # scaled by the 16 intensity levels, not by 255
  # Stratified: every class has ~20% of its examples in the test split.
  frac = np.bincount(ds.y_test, minlength=10) / (
      np.bincount(ds.y_train, minlength=10) + np.bincount(ds.y_test, minlength=10))
  np.testing.assert_allclose(frac, 0.2, atol=0.02)
  # Fixed seed: an uncached reload gives the same split.
  again = load_dataset("digits", cache=False)
  np.testing.assert_array_equal(ds.x_train, again.x_train)
  np.testing.assert_array_equal(ds.y_test, again.y_test)


def test_digits_equal_scikit_learns_loader_and_split_without_importing_it():
  # The stored split and the file read without scikit-learn give exactly what
  # load_digits() + train_test_split(stratify, random_state=0) give.
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split

  from fedjax_dp.data import datasets as datasets_lib
  bunch = load_digits()
  x = (bunch.images / 16.0).astype(np.float32)[..., None]
  y = bunch.target.astype(np.int32)
  x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y,
                                                      random_state=0)
  ds = datasets_lib._load_digits()
  for got, want in ((ds.x_train, x_train), (ds.x_test, x_test), (ds.y_train, y_train),
                    (ds.y_test, y_test)):
    assert got.dtype == want.dtype and np.array_equal(got, want)
  import sklearn
  assert ds.source["what"] == f"scikit-learn {sklearn.__version__} load_digits()"


def test_known_names_and_unknown_name():
  assert set(DATASETS) >= {"digits", "mnist", "fashion_mnist", "cifar10"}
  with pytest.raises(ValueError, match=r"data\.name.*mnist"):
    load_dataset("imagenet")


def test_cache_shares_read_only_arrays():
  a = load_dataset("digits")
  assert load_dataset("digits") is a
  with pytest.raises(ValueError):
    a.x_train[0, 0, 0, 0] = 0.5  # read-only: callers cannot corrupt each other's data
  clear_cache()
  assert load_dataset("digits") is not a


# ----------------------------------------------------------------------------- binary tasks


def test_binary_tasks():
  base = load_dataset("digits")
  b = load_dataset("digits_binary_0v1")
  assert_format(b, (8, 8, 1), 2)
  assert b.name == "digits_binary_0v1"
  assert np.sum(b.y_train == 1) == np.sum(base.y_train == 0)
  assert np.sum(b.y_train == 0) == np.sum(base.y_train == 1)
  oe = load_dataset("digits_odd_even")
  assert len(oe.y_train) == len(base.y_train)
  np.testing.assert_array_equal(oe.y_train, base.y_train % 2)
  rest = binary_labels(base, positive=[3])  # one-vs-rest
  np.testing.assert_array_equal(rest.y_test, (base.y_test == 3).astype(np.int32))
  with pytest.raises(ValueError, match="data.name"):
    binary_labels(base, positive=[1], negative=[1, 2])
  with pytest.raises(ValueError, match="data.name"):
    binary_labels(base, positive=[10], negative=[1])


# ----------------------------------------------------------------------------- real MNIST


@requires_mnist
def test_real_mnist(mnist):
  assert_format(mnist, (28, 28, 1), 10)
  assert mnist.x_train.shape == (60000, 28, 28, 1)
  assert mnist.x_test.shape == (10000, 28, 28, 1)
  assert mnist.x_train.max() == 1.0 and mnist.x_train.min() == 0.0
  assert np.bincount(mnist.y_train).tolist() == MNIST_TRAIN_COUNTS
  assert sorted(np.unique(mnist.y_test).tolist()) == list(range(10))
  assert load_dataset("mnist", MNIST_DIR) is mnist  # second load comes from the cache


@requires_mnist
def test_real_mnist_gunzipped_copies_load_the_same(mnist, tmp_path):
  for stem in IDX_FILES:
    with gzip.open(MNIST_DIR / f"{stem}.gz", "rb") as src, open(tmp_path / stem, "wb") as dst:
      shutil.copyfileobj(src, dst)
  plain = load_dataset("mnist", tmp_path, cache=False)
  for a, b in zip(plain, mnist):
    if isinstance(a, np.ndarray):
      np.testing.assert_array_equal(a, b)


def test_missing_files_error_names_files_and_dir(tmp_path):
  (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")  # one present, three missing
  with pytest.raises(DatasetUnavailableError) as err:
    load_dataset("mnist", tmp_path, cache=False)
  msg = str(err.value)
  assert str(tmp_path) in msg and "data.dir" in msg
  for stem in IDX_FILES[1:]:
    assert stem in msg
  with pytest.raises(DatasetUnavailableError, match="data_batch_1.*test_batch"):
    load_dataset("cifar10", tmp_path, cache=False)
  with pytest.raises(DatasetUnavailableError, match="not a directory"):
    load_dataset("fashion_mnist", tmp_path / "nope", cache=False)


def test_idx_bad_magic(tmp_path):
  for stem in IDX_FILES:
    (tmp_path / stem).write_bytes(b"\x00\x00\x0d\x01" + bytes(8))
  with pytest.raises(DatasetUnavailableError, match="magic"):
    load_dataset("fashion_mnist", tmp_path, cache=False)


def _write_idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
  data = header + array.astype(np.uint8).tobytes()
  path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def test_fashion_mnist_from_tiny_idx_files(tmp_path):
  rng = np.random.default_rng(0)
  x_tr, x_te = rng.integers(0, 256, (5, 28, 28)), rng.integers(0, 256, (3, 28, 28))
  y_tr, y_te = rng.integers(0, 10, 5), rng.integers(0, 10, 3)
  _write_idx(tmp_path / "train-images-idx3-ubyte.gz", x_tr)  # mixed gzip and plain
  _write_idx(tmp_path / "train-labels-idx1-ubyte", y_tr)
  _write_idx(tmp_path / "t10k-images-idx3-ubyte", x_te)
  _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", y_te)
  ds = load_dataset("fashion_mnist", tmp_path, cache=False)
  assert_format(ds, (28, 28, 1), 10)
  np.testing.assert_allclose(ds.x_train[..., 0], x_tr / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(ds.y_test, y_te)
  assert ds.name == "fashion_mnist"


# ----------------------------------------------------------------------------- CIFAR-10


def _write_cifar(folder, n=4, seed=0):
  """Tiny batches in the official python format (bytes keys, Python-2 style pickle)."""
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  batches = {}
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n).tolist()
    batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
             b"filenames": [f"img{i}.png".encode() for i in range(n)]}
    with open(folder / name, "wb") as f:
      pickle.dump(batch, f, protocol=2)
    batches[name] = (data, labels)
  return batches


@pytest.mark.parametrize("subdir", ["", "cifar-10-batches-py"])
def test_cifar10_python_batches(tmp_path, subdir):
  batches = _write_cifar(tmp_path / subdir if subdir else tmp_path)
  ds = load_dataset("cifar10", tmp_path, cache=False)
  assert_format(ds, (32, 32, 3), 10)
  assert ds.x_train.shape == (20, 32, 32, 3) and ds.x_test.shape == (4, 32, 32, 3)
  data, labels = batches["data_batch_2"]
  np.testing.assert_array_equal(ds.y_train[4:8], labels)
  # Row layout: 1024 red, then 1024 green, then 1024 blue values, each row-major 32x32.
  i, r, c = 1, 7, 19
  for ch in range(3):
    assert ds.x_train[4 + i, r, c, ch] == np.float32(data[i, ch * 1024 + r * 32 + c] / 255.0)
  np.testing.assert_array_equal(ds.y_test, batches["test_batch"][1])


def test_cifar10_refuses_code_in_pickles(tmp_path):
  _write_cifar(tmp_path)

  class Evil:
    def __reduce__(self):
      return (os.getcwd, ())

  with open(tmp_path / "test_batch", "wb") as f:
    pickle.dump({b"data": Evil(), b"labels": [0]}, f, protocol=2)
  with pytest.raises(DatasetUnavailableError, match="test_batch.*refusing") as err:
    load_dataset("cifar10", tmp_path, cache=False)
  assert isinstance(err.value.__context__, pickle.UnpicklingError)


# ----------------------------------------------------------------------------- tfds


@pytest.mark.parametrize("name,shape", [("mnist", (28, 28, 1)), ("fashion_mnist", (28, 28, 1)),
                                        ("cifar10", (32, 32, 3))])
def test_tfds_mocked(name, shape, monkeypatch):
  """The tfds path on mocked data (never the network); works without TensorFlow."""
  tfds = pytest.importorskip("tensorflow_datasets")
  monkeypatch.setattr(datasets_lib, "DEFAULT_DIRS", {})  # not the installed Fashion-MNIST
  with tfds.testing.mock_data(num_examples=12):
    ds = load_dataset(name, cache=False)
  assert_format(ds, shape, 10)
  assert len(ds.x_train) == 12 and len(ds.x_test) == 12
  assert ds.name == name


def test_tfds_missing_gives_one_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import now fails
  with pytest.raises(DatasetUnavailableError) as err:
    load_dataset("mnist", cache=False)
  msg = str(err.value)
  assert isinstance(err.value, RuntimeError)
  assert "fedjax_dp[tfds]" in msg and "data.dir" in msg
  assert all(stem in msg for stem in IDX_FILES)
  with pytest.raises(DatasetUnavailableError, match="data_batch_1"):
    load_dataset("cifar10_binary_3v5", cache=False)


def test_core_imports_without_tfds_or_tensorflow():
  code = ("import sys\n"
          "sys.modules['tensorflow_datasets'] = None; sys.modules['tensorflow'] = None\n"
          "import fedjax_dp.data as d\n"
          "print(d.load_dataset('digits').x_train.shape)")
  # The timeout catches a hang, not a slow import on a loaded machine.
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1], timeout=HANG_S, check=True)
  assert "(1437, 8, 8, 1)" in out.stdout
