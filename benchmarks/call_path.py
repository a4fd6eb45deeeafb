"""The path a run takes through the package, from ``cli._cmd_run`` to the compiled round.

Runs ``fedjax-dp run quickstart --set rounds=1`` in this process under
``sys.setprofile`` and records the ``fedjax_dp`` functions in the order they are
first entered, as a reader following the run through the code meets them (each
function read once: the noise calibration's bisection calls the accountant dozens
of times, and counts once), from ``cli._cmd_run`` until the sweep program's
``round_fn`` is first entered (the first call of the compiled round). Only calls
whose whole stack up to ``cli._cmd_run`` is the package's own functions count:
what JAX traces (the round's contents while the chunk size is measured, the
model's ``eval_shape``), module bodies run by imports and callbacks from the
standard library are left out. The path is the host's, not the compiled program's.

It prints three numbers:

* stays: maximal runs of consecutive calls in one room (a room entered, then
  left); a room is a top-level module, or a subpackage (``host``, ``config``,
  ``training``, ``privacy``, ``data``, ``models``, ``files``) as a whole;
* rooms: distinct rooms entered;
* climbs: transitions of the path from a module to one on a higher floor
  (:data:`FLOORS`, also in docs/architecture.md): the reader goes back up (a return
  to an upper module that then calls on, or a call up);
* up-calls: the climbs that are calls, a function calling one on a higher floor
  than its own module's (an arrow pointing back up).

Usage, from the repository root (``--path`` also lists the stays)::

  PYTHONPATH=$PWD python benchmarks/call_path.py [--path]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

# Floors from the top (0) down. A module is on the floor of its longest matching
# prefix; a module on no floor is an error, so a new module must be placed.
FLOORS = (
    ("cli", ("fedjax_dp.cli", "fedjax_dp.account_cli")),
    ("experiments", ("fedjax_dp.api", "fedjax_dp.experiment", "fedjax_dp.sweep",
                     "fedjax_dp.optimal_t", "fedjax_dp.papers", "fedjax_dp.audit",
                     "fedjax_dp.attacks", "fedjax_dp.reproduction",
                     "fedjax_dp.calibration_sweep", "fedjax_dp.catalog")),
    ("host", ("fedjax_dp.host",)),
    ("config", ("fedjax_dp.config", "fedjax_dp.configs")),
    ("training", ("fedjax_dp.training",)),
    ("privacy", ("fedjax_dp.privacy", "fedjax_dp.theory")),
    ("models and data", ("fedjax_dp.models", "fedjax_dp.data", "fedjax_dp.optimizers")),
    ("utils", ("fedjax_dp.files", "fedjax_dp.sharding", "fedjax_dp.errors",
               "fedjax_dp.plotting", "fedjax_dp.compile_cache")),
)


def floor_of(module: str) -> int:
  """The floor index of ``module`` (0 = top)."""
  best, floor = -1, None
  for i, (_, prefixes) in enumerate(FLOORS):
    for p in prefixes:
      if (module == p or module.startswith(p + ".")) and len(p) > best:
        best, floor = len(p), i
  if floor is None:
    raise KeyError(f"{module} is on no floor: add it to FLOORS")
  return floor


class _Stop(Exception):
  """Raised in the profiler when the compiled round is entered."""


def _module(frame) -> str | None:
  """The room of ``frame``'s code: a top-level module of the package, or a subpackage
  as a whole (``fedjax_dp.privacy.plan`` is in the room ``fedjax_dp.privacy``)."""
  name = frame.f_globals.get("__name__", "")
  # (a config file is user code: ``fedjax_dp_config_<stem>`` is not the package's)
  if name != "fedjax_dp" and not name.startswith("fedjax_dp."):
    return None
  return ".".join(name.split(".")[:2])


def _host_call(frame) -> bool:
  """Whether every frame from ``frame`` up to ``cli._cmd_run`` is the package's own
  function code (not a module body, not JAX tracing a function, not the stdlib)."""
  while frame is not None:
    if _module(frame) is None or frame.f_code.co_name == "<module>":
      return False
    if frame.f_code.co_name == "_cmd_run" and _module(frame) == "fedjax_dp.cli":
      return True
    frame = frame.f_back
  return False


def record(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """The module of every recorded call (see the module docstring), in order, and the
  up-calls among them: ``(caller module, callee module)`` with the callee on a higher
  floor than its caller (a dependency pointing up, not a return)."""
  from fedjax_dp import cli  # pylint: disable=import-outside-toplevel

  calls: list[str] = []
  up_calls: list[tuple[str, str]] = []
  seen: set = set()
  started = False

  def profile(frame, event, arg):
    nonlocal started
    if event != "call":
      return
    module = _module(frame)
    if module is None:
      return
    code = frame.f_code
    if module == "fedjax_dp.cli" and code.co_name == "_cmd_run":
      started = True
    if not started:
      return
    if code.co_name == "round_fn":  # the sweep program's round, first traced now
      sys.setprofile(None)
      raise _Stop
    if code.co_name == "<module>" or code in seen or not _host_call(frame):
      return
    seen.add(code)
    calls.append(module)
    up_calls.extend([(_module(frame.f_back), module)]
                    if floor_of(module) < floor_of(_module(frame.f_back)) else [])

  sys.setprofile(profile)
  try:
    cli.main(argv)
  except _Stop:
    pass
  finally:
    sys.setprofile(None)
  return calls, up_calls


def stays(calls: list[str]) -> list[str]:
  """Maximal runs of consecutive calls in one module, one entry each."""
  out: list[str] = []
  for m in calls:
    if not out or out[-1] != m:
      out.append(m)
  return out


def climbs(path: list[str]) -> list[tuple[str, str]]:
  """Transitions of ``path`` to a module on a higher floor."""
  return [(a, b) for a, b in itertools.pairwise(path) if floor_of(b) < floor_of(a)]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--path", action="store_true", help="list the stays too")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    calls, up_calls = record(["run", "quickstart", "--out", str(Path(tmp) / "run"), "--set",
                    "rounds=1", "--no-progress"])
  path = stays(calls)
  up = climbs(path)
  if args.path:
    for m in path:
      print(f"  {FLOORS[floor_of(m)][0]:>16}  {m}")
    print("climbs: " + "; ".join(f"{a} -> {b}" for a, b in up))
    print("up-calls: " + "; ".join(f"{a} -> {b}" for a, b in up_calls))
  entered = {m: path.count(m) for m in dict.fromkeys(path)}
  most = sorted(entered.items(), key=lambda kv: -kv[1])[:3]
  print(f"{len(path)} stays in {len(entered)} rooms, {len(up)} climbs, "
        f"{len(up_calls)} up-calls "
        f"({len(calls)} calls; most entered: "
        + ", ".join(f"{m.removeprefix('fedjax_dp.')} {n}x" for m, n in most) + ")")
  return 0


if __name__ == "__main__":
  sys.exit(main())
