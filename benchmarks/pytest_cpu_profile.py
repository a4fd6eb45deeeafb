"""A pytest plugin: CPU seconds and XLA compilations of every test of the suite.

Wall-clock durations (``--durations``) mean little on a machine shared with other
work; CPU seconds (this process and the subprocesses it waited for: notebook
kernels, CLI runs) do not depend on the load. Usage, from the repository root:

  PYTHONPATH=$PWD:$PWD/benchmarks CPU_PROFILE=/tmp/profile.json \
      python -m pytest -q -p no:cacheprovider -p pytest_cpu_profile
  (under ``-n N`` each worker writes ``/tmp/profile.json.gwK``; main() merges them)
  python benchmarks/pytest_cpu_profile.py /tmp/profile.json   # the 30 costliest tests

The JSON maps each test id to ``{"cpu", "wall", "compiles", "compile_s"}``;
``<collect>`` is collection (imports), ``<total>`` the whole session.
"""

import collections
import glob
import json
import os
import resource
import sys
import time

import pytest

_current = {"id": "<collect>"}
_stats = collections.defaultdict(
    lambda: {"cpu": 0.0, "wall": 0.0, "compiles": 0, "compile_s": 0.0})
_start = {}


def _cpu_seconds() -> float:
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _on_event(event, duration, **kwargs):
  del kwargs
  if event == "/jax/core/compile/backend_compile_duration":
    stats = _stats[_current["id"]]
    stats["compiles"] += 1
    stats["compile_s"] += duration


def pytest_configure(config):
  del config
  import jax  # pylint: disable=import-outside-toplevel
  _start.update(cpu=_cpu_seconds(), wall=time.perf_counter())
  jax.monitoring.register_event_duration_secs_listener(_on_event)


def pytest_collection_finish(session):
  del session
  _stats["<collect>"].update(cpu=_cpu_seconds() - _start["cpu"],
                             wall=time.perf_counter() - _start["wall"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _current["id"] = item.nodeid
  wall, cpu = time.perf_counter(), _cpu_seconds()
  yield
  _stats[item.nodeid]["wall"] += time.perf_counter() - wall
  _stats[item.nodeid]["cpu"] += _cpu_seconds() - cpu
  _current["id"] = "<between>"


def pytest_sessionfinish(session):
  del session
  _stats["<total>"].update(cpu=_cpu_seconds() - _start["cpu"],
                           wall=time.perf_counter() - _start["wall"])
  path = os.environ.get("CPU_PROFILE", "cpu_profile.json")
  # Under pytest-xdist every worker runs this plugin: each writes its own file
  # (``<path>.gw0``, ...), and main() merges them.
  worker = os.environ.get("PYTEST_XDIST_WORKER")
  with open(f"{path}.{worker}" if worker else path, "w") as f:
    json.dump(_stats, f, indent=1)


def _load(path: str) -> dict:
  """The profile at ``path``, or the merge of its xdist workers' files."""
  parts = sorted(glob.glob(f"{glob.escape(path)}.gw*"))
  if not parts:
    with open(path) as f:
      return json.load(f)
  stats = {}
  for part in parts:
    with open(part) as f:
      for name, v in json.load(f).items():
        if name.startswith("<"):
          # Collection and the session run once per worker: their CPU adds up, the
          # session's wall is the slowest worker's.
          old = stats.get(name, {"cpu": 0.0, "wall": 0.0, "compiles": 0, "compile_s": 0.0})
          v = dict(v, cpu=old["cpu"] + v["cpu"], wall=max(old["wall"], v["wall"]))
        stats[name] = v
  return stats


def main(path: str, top: int = 30) -> None:
  stats = _load(path)
  tests = {k: v for k, v in stats.items() if not k.startswith("<")}
  print(f"{len(tests)} tests: {sum(v['cpu'] for v in tests.values()):.1f} CPU s, "
        f"{sum(v['compiles'] for v in tests.values())} compilations; session "
        f"{stats['<total>']['cpu']:.1f} CPU s, {stats['<total>']['wall']:.1f} s wall")
  for name, v in sorted(tests.items(), key=lambda kv: -kv[1]["cpu"])[:top]:
    print(f"{v['cpu']:7.1f} CPU s {v['compiles']:4d} compiles  {name}")


if __name__ == "__main__":
  main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
