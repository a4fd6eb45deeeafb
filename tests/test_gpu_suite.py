"""benchmarks/gpu_suite.py --quick: its sections run on CPU and write their table."""

import sys
from pathlib import Path

import pytest

from fedjax_dp.files.results import read_csv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_suite


@pytest.fixture
def all_clients_at_once(monkeypatch):
  """Every round takes all its clients at once: sizing the chunk to free memory
  compiles two probe rounds per program, which doubled these tests' compiles; the
  sizing is tests/test_chunking.py's (the GPU run keeps it)."""
  from fedjax_dp.training import memory  # (after gpu_suite: engine first is an import cycle)
  for module in (gpu_suite.engine, memory):
    monkeypatch.setattr(module, "client_chunk_for_memory", lambda *a, **k: 0)


def test_quick_suite_runs_its_sections_and_writes_the_csv(tmp_path, capsys,
                                                          all_clients_at_once):
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


def test_quick_second_edition_sections(tmp_path, all_clients_at_once):
  # The sections the second edition added, at tiny shapes: the paper-scale results
  # (listed, not regenerated), pfl (through a stand-in interpreter: pfl and torch are
  # not test dependencies), W4's sweep against one by one, a streamed federation.
  stub = tmp_path / "pfl_python"
  stub.write_text("#!/bin/sh\necho '{\"seconds_per_round\": 1.5, \"versions\": "
                  "\"pfl stand-in\", \"device\": \"cpu\", \"torch_threads\": 2}'\n")
  stub.chmod(0o755)
  assert gpu_suite.main(["--quick", "--no-torch", "--only", "paper,pfl,W4-lanes,W8-1M",
                         "--pfl-python", str(stub), "--out", str(tmp_path)]) == 0
  rows = {r["task"]: r for r in read_csv(tmp_path / f"gpu_{gpu_suite.device_name()}_quick.csv")}
  assert list(rows)[0] == "paper/fu2023/fig4_cnn_T_paper"  # Fu Fig. 4 first
  assert "regenerates none" in rows["paper/fu2023/fig4_cnn_T_paper"]["note"]
  assert rows["W2/pfl"]["seconds_per_round"] == "1.5" and "pfl stand-in" in rows["W7/pfl"]["note"]
  for task in ("W4-lanes/4/batched", "W4-lanes/4/one_by_one", "W8-1M/streamed_k10",
               "W8-1M/streamed_k100"):
    assert float(rows[task]["seconds_per_round"]) > 0, task
  assert "projected" in rows["W4-lanes/4/one_by_one"]["note"]


def test_paper_scale_results_are_the_ones_made_on_a_gpu():
  found = gpu_suite.gpu_results()
  assert found[0].name == "fig4_cnn_T_paper" and found[0].parent.parent.name == "fu2023"
  assert all((r.parent / f"{r.name}_meta.json").is_file() for r in found)


def test_without_pfl_its_rows_say_so():
  rows = gpu_suite.pfl_same_device({"pfl_python": None})
  assert [r["task"] for r in rows] == ["W2/pfl", "W7/pfl"]
  assert all("no --pfl-python" in r["note"] for r in rows)


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

