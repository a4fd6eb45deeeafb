"""benchmarks/gpu_suite.py --quick: its sections run on CPU and write their table."""

import sys
from pathlib import Path

import pytest

from fedjax_dp.files.results import read_csv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_suite


def test_quick_suite_runs_its_sections_and_writes_the_csv(tmp_path, capsys):
  # W1 (the MLP round and loop), W2 (both conv implementations) and the pfl rounds
  # that reuse W2's compiled programs; W3, W5 and W7 are the same code paths at other
  # shapes and are left to the GPU run (their compiles would double this test).
  assert gpu_suite.main(["--quick", "--no-torch", "--only", "W1,W2,W2/pfl",
                         "--out", str(tmp_path)]) == 0
  rows = read_csv(tmp_path / f"gpu_{gpu_suite.device_name()}_quick.csv")
  tasks = {r["task"] for r in rows}
  assert tasks == {"W1/ours", "W1/loop", "W2/ours_conv", "W2/ours_im2col",
                   "W2/pfl_3_conv", "W2/pfl_3_im2col"}
  assert all(float(r["seconds_per_round"]) > 0 for r in rows)
  assert "server.conv_impl=auto should pick" in capsys.readouterr().out
  assert gpu_suite.conv_choice(rows) in ("conv", "im2col")


def test_budget_skips_the_remaining_sections(tmp_path):
  assert gpu_suite.main(["--quick", "--no-torch", "--budget", "-1", "--out",
                         str(tmp_path)]) == 0
  rows = read_csv(tmp_path / f"gpu_{gpu_suite.device_name()}_quick.csv")
  assert all("skipped" in r["note"] for r in rows)
  assert gpu_suite.conv_choice(rows) is None


def test_a_failing_section_keeps_the_others_rows(tmp_path, monkeypatch):
  def broken(sizes):
    raise RuntimeError("shapes cannot be multiplied")
  monkeypatch.setattr(gpu_suite, "SECTIONS", [("W1", broken), ("W9", lambda s: [
      {"task": "W9/ours", "seconds_per_round": 1.0}])])
  assert gpu_suite.main(["--quick", "--no-torch", "--out", str(tmp_path)]) == 0
  rows = read_csv(tmp_path / f"gpu_{gpu_suite.device_name()}_quick.csv")
  assert [r["task"] for r in rows] == ["W1", "W9/ours"]
  assert "failed: RuntimeError: shapes cannot be multiplied" in rows[0]["note"]


def test_only_names_known_sections(capsys):
  with pytest.raises(SystemExit):
    gpu_suite.main(["--quick", "--only", "W9"])
  assert "unknown sections ['W9']" in capsys.readouterr().err

