"""Several hosts: 2 processes x 2 CPU devices joined by ``jax.distributed`` (gloo
collectives) write the sweep.csv of 1 process x 4 devices (docs/scaling.md)."""

import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import HANG_S

WORKER = Path(__file__).resolve().parent / "_multihost_sweep.py"
ROOT = WORKER.parents[1]
# A hang, not slowness: the processes import, compile and run while other work shares
# the cores.
TIMEOUT_S = HANG_S
VOLATILE = ("wall",)


def _free_port() -> int:
  """A port nothing listens on now (the OS picks it); a race with another program is
  caught by retrying with a new one."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  return env


def _start(out: Path, processes: int, pid: int, port: int, devices: int):
  log = open(out.parent / f"{out.name}_{pid}.log", "w+")  # pylint: disable=consider-using-with
  proc = subprocess.Popen(
      [sys.executable, str(WORKER), str(out), str(processes), str(pid), f"localhost:{port}"],
      env=_env(devices), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  return proc, log


def _finish(proc, log) -> tuple[int, str]:
  try:
    proc.wait(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
  log.seek(0)
  text = log.read()
  log.close()
  return proc.returncode, text


def _rows(path: Path) -> list[dict]:
  with open(path, newline="") as f:
    return [{k: v for k, v in r.items() if not any(w in k for w in VOLATILE)}
            for r in csv.DictReader(f)]


@pytest.mark.slow
def test_two_processes_of_two_devices_give_the_single_process_sweep(tmp_path):
  single_out = tmp_path / "single"
  single = _start(single_out, 1, 0, 0, devices=4)
  for attempt in range(3):
    out = tmp_path / f"multi{attempt}"
    port = _free_port()
    pair = [_start(out, 2, pid, port, devices=2) for pid in (0, 1)]
    results = [_finish(*p) for p in pair]
    if all(code == 0 for code, _ in results):
      break
    text = "\n".join(t for _, t in results)
    if "in use" not in text.lower() and "bind" not in text.lower():
      break  # not a port taken by someone else: report it
  code, text = _finish(*single)
  assert code == 0, text[-3000:]
  for (code, text), pid in zip(results, (0, 1)):
    assert code == 0, f"process {pid}:\n{text[-3000:]}"
  assert "process 1 of 2: 4 devices, 2 local" in results[1][1]
  multi, alone = _rows(out / "sweep.csv"), _rows(single_out / "sweep.csv")
  assert len(alone) == 4 * 2  # 4 points x 2 rounds
  assert multi == alone
