"""benchmarks/gpu_suite.py --quick: every section runs on CPU and writes its table."""

import sys
from pathlib import Path

from fedjax_dp.results import read_csv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_suite


def test_quick_suite_runs_every_section_and_writes_the_csv(tmp_path, capsys):
  assert gpu_suite.main(["--quick", "--no-torch", "--out", str(tmp_path)]) == 0
  rows = read_csv(tmp_path / f"gpu_{gpu_suite.device_name()}_quick.csv")
  tasks = {r["task"] for r in rows}
  expected = {"W1/ours", "W1/loop", "W2/ours_conv", "W2/ours_im2col", "W5/ours",
              "W7/ours", "W7/loop", "W2/pfl_3_conv", "W2/pfl_3_im2col"}
  assert expected <= tasks
  assert any(t.startswith("W3-") and t.endswith("/ours") for t in tasks)
  assert all(float(r["seconds_per_round"]) > 0 for r in rows)
  assert "server.conv_impl=auto should pick" in capsys.readouterr().out
  assert gpu_suite.conv_choice(rows) in ("conv", "im2col")


def test_budget_skips_the_remaining_sections(tmp_path):
  assert gpu_suite.main(["--quick", "--no-torch", "--budget", "-1", "--out",
                         str(tmp_path)]) == 0
  rows = read_csv(tmp_path / f"gpu_{gpu_suite.device_name()}_quick.csv")
  assert all("skipped" in r["note"] for r in rows)
  assert gpu_suite.conv_choice(rows) is None
