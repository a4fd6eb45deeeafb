"""The results excerpt of README.md and each REPRODUCTION.md's summary table match the
committed CSVs (reads committed files only; no run).

Every number of a row's "ours" and "certified eps" columns must be a value of one of
the CSVs the row names, at the digits printed (``0.885`` matches 0.88462, ``1.4e+07``
matches 14331092.85, ``50`` matches 50); and the committed tables are what
``experiments/summary_tables.py`` writes from those CSVs today.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("summary_tables",
                                              ROOT / "experiments" / "summary_tables.py")
summary = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(summary)
DOCS = [ROOT / "README.md", *(ROOT / "experiments" / p / "REPRODUCTION.md" for p in summary.DOCS)]
NUMBER = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?(?:e[+-]?\d+)?|inf)(?![\w.])")
COLUMNS = ("ours", "certified eps")


def _rows(path: Path) -> list[dict[str, str]]:
  text = path.read_text()
  block = text.split(summary.BEGIN, 1)[1].split(summary.END, 1)[0].strip().splitlines()
  header = [c.strip() for c in block[0].strip("|").split("|")]
  return [dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
          for line in block[2:]]


def _csv_values(paths: list[str]) -> np.ndarray:
  values = []
  for p in paths:
    df = pd.read_csv(ROOT / p)
    for col in df.columns:
      v = pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64)
      values.append(v[~np.isnan(v)])
  return np.concatenate(values) if values else np.array([])


def _matches(token: str, values: np.ndarray) -> bool:
  """Whether some CSV value prints as ``token`` at the token's precision."""
  if token == "inf":
    return bool(np.any(np.isinf(values)))
  finite = values[np.isfinite(values)]
  if "e" in token:
    mant = token.split("e")[0]
    sig = len(mant.replace(".", "").lstrip("0")) or 1
    return any(f"{v:.{sig}g}" == f"{float(token):.{sig}g}" for v in finite)
  decimals = len(token.split(".")[1]) if "." in token else 0
  target = float(token)
  return bool(np.any(np.abs(finite - target) <= 0.5 * 10.0 ** -decimals + 1e-12 * abs(target)))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_number_is_in_the_csv_the_row_names(path):
  rows = _rows(path)
  assert rows, f"{path}: an empty summary table"
  missing = []
  for row in rows:
    csvs = re.findall(r"`([^`]+\.csv)`", row["CSV"])
    assert csvs, f"{path}: a row names no CSV: {row}"
    values = _csv_values(csvs)
    for col in COLUMNS:
      for token in NUMBER.findall(row[col]):
        if not _matches(token, values):
          missing.append((row["claim (paper)"], col, token))
  assert missing == [], f"{path}: numbers not in the CSVs they cite"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_row_names_its_regime_and_a_verdict(path):
  for row in _rows(path):
    assert row["regime"] and row["verdict"], row
    dp = "degenerate" in row["ours"]
    assert not dp or "degenerate" in row["verdict"], row


def test_the_committed_tables_are_what_the_script_writes():
  stale = [p.relative_to(ROOT).as_posix() for p, text in summary.documents().items()
           if p.read_text() != text]
  assert stale == [], "run: python experiments/summary_tables.py"


def test_matching_respects_the_printed_digits():
  values = np.array([0.88462, 14331092.85, 50.0, math.inf])
  assert _matches("0.885", values) and not _matches("0.884", values)
  assert _matches("1.4e+07", values) and not _matches("1.5e+07", values)
  assert _matches("50", values) and _matches("inf", values) and not _matches("51", values)
