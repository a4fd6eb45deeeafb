"""docs/api.md: its first python block (the issue's example: an own flax.linen model, 20
clients from numpy arrays, DP-FedAdam with central noise, 5 rounds) runs as written from
an empty directory and prints a finite certified epsilon; every public name is listed."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import fedjax_dp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"


def _blocks():
  return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_first_block_is_the_promised_example():
  first = _blocks()[0]
  assert len(first.strip().splitlines()) <= 25
  for needle in ("flax.linen", "fd.federation(", "range(20)", '"rounds": 5', "fedadam",
                 '"privacy.placement": "central"', "res.epsilon", "res.accuracy"):
    assert needle in first, needle


def test_first_block_runs_in_an_empty_directory(tmp_path):
  script = tmp_path / "example.py"
  script.write_text(_blocks()[0])
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
  out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       check=False, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  m = re.search(r"accuracy ([0-9.]+), certified epsilon ([0-9.]+|inf)", out.stdout)
  assert m, out.stdout
  assert math.isfinite(float(m.group(2))) and float(m.group(2)) <= 8.0 + 1e-6
  assert sorted(p.name for p in tmp_path.iterdir()) == ["example.py"]  # writes nothing


def test_every_public_name_is_documented():
  text = DOC.read_text()
  for name in fedjax_dp.__all__:
    assert f"fd.{name}" in text, name
