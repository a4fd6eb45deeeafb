"""Record, and compare, what every shipped config writes: a refactor's guard.

A move of code between modules must not change a single output byte. This script
runs every shipped config (``fedjax_dp/configs``) for a few rounds and the
quickstart sweep, then hashes what each run wrote: ``metrics.csv`` (without the
wall-clock column), ``summary.json`` (without its timings and version stamps) and
``checkpoint.msgpack`` (its arrays and values, without the wall-clock fields). The
MNIST configs read ``../shared/datasets/mnist`` beside the repository when it is
there. Usage, from the repository root:

  PYTHONPATH=$PWD python benchmarks/golden_outputs.py record /tmp/golden_before
  ...move code...
  PYTHONPATH=$PWD python benchmarks/golden_outputs.py record /tmp/golden_after
  python benchmarks/golden_outputs.py compare /tmp/golden_before /tmp/golden_after

``compare`` prints one line per differing file and exits 1 if any differ.
"""

import argparse
import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MNIST = ROOT.parent / "shared" / "datasets" / "mnist"
ROUNDS = 2
# Fields that change from run to run without the computation changing.
_VOLATILE = ("wall", "seconds", "version", "commit", "created", "time", "host", "python")
_SWEEP_GRID = ("--grid", "privacy.epsilon=2,8", "--grid", "seed=0,1")


def _runs(out: Path):
  """Yields (label, argv, run_dirs) for every recorded job."""
  sys.path.insert(0, str(ROOT))
  from fedjax_dp import config as config_lib  # pylint: disable=import-outside-toplevel
  from fedjax_dp import configs  # pylint: disable=import-outside-toplevel
  for name in configs.names():
    extra = []
    if config_lib.load_config(name).data.name == "mnist" and MNIST.is_dir():
      extra = ["--set", f"data.dir={MNIST}"]
    yield name, ["run", name, "--out", str(out / name), "--set", f"rounds={ROUNDS}",
                 *extra, "--no-progress"], [out / name]
  sweep = out / "quickstart_sweep"
  yield "quickstart_sweep", ["sweep", "quickstart", "--out", str(sweep), *_SWEEP_GRID,
                             "--set", f"rounds={ROUNDS}", "--no-progress"], [sweep]


def _strip(obj):
  if isinstance(obj, dict):
    return {k: _strip(v) for k, v in obj.items()
            if not any(word in k.lower() for word in _VOLATILE)}
  if isinstance(obj, list):
    return [_strip(v) for v in obj]
  return obj


def _tree_bytes(obj) -> bytes:
  """A canonical byte string of a restored msgpack tree (dict keys sorted)."""
  if isinstance(obj, dict):
    return b"{" + b",".join(k.encode() + b":" + _tree_bytes(obj[k]) for k in sorted(obj)) + b"}"
  if isinstance(obj, (list, tuple)):
    return b"[" + b",".join(_tree_bytes(v) for v in obj) + b"]"
  if hasattr(obj, "dtype"):
    return str(obj.dtype).encode() + str(obj.shape).encode() + obj.tobytes()
  return repr(obj).encode()


def _digest(path: Path) -> str:
  data = path.read_bytes()
  if path.suffix == ".msgpack":
    from flax import serialization  # pylint: disable=import-outside-toplevel
    magic = b"fedjax_dp checkpoint v1\n"  # host/checkpoint.py: magic, SHA-256 hex, newline, payload
    if data.startswith(magic):
      data = data[len(magic) + 65:]
    data = _tree_bytes(_strip(serialization.msgpack_restore(data)))
  elif path.suffix == ".json":
    data = json.dumps(_strip(json.loads(data)), sort_keys=True).encode()
  elif path.suffix == ".csv":
    rows = list(csv.reader(io.StringIO(data.decode())))
    if rows:
      keep = [i for i, col in enumerate(rows[0])
              if not any(word in col.lower() for word in _VOLATILE)]
      data = "\n".join(",".join(r[i] for i in keep if i < len(r)) for r in rows).encode()
  return hashlib.sha256(data).hexdigest()


def record(out: Path) -> int:
  out.mkdir(parents=True, exist_ok=False)
  hashes, failures = {}, {}
  for label, argv, dirs in _runs(out):
    proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if proc.returncode:
      failures[label] = proc.stderr.strip().splitlines()[-1:] or [str(proc.returncode)]
      print(f"{label}: FAILED {failures[label]}")
      continue
    for run_dir in dirs:
      for path in sorted(run_dir.rglob("*")):
        if path.is_file() and path.suffix in (".csv", ".json", ".msgpack"):
          try:
            hashes[str(path.relative_to(out))] = _digest(path)
          except Exception as e:  # pylint: disable=broad-except
            raise RuntimeError(f"cannot digest {path}: {e}") from e
    print(f"{label}: {sum(1 for k in hashes if k.startswith(label + '/'))} files")
  (out / "hashes.json").write_text(json.dumps(
      {"hashes": hashes, "failures": failures}, indent=1, sort_keys=True))
  return 0


def compare(before: Path, after: Path) -> int:
  a = json.loads((before / "hashes.json").read_text())
  b = json.loads((after / "hashes.json").read_text())
  bad = 0
  for key in sorted(set(a["hashes"]) | set(b["hashes"])):
    if a["hashes"].get(key) != b["hashes"].get(key):
      bad += 1
      print(f"DIFFERS {key}")
  # Which jobs failed must agree; their messages may be reworded by the change.
  if sorted(a["failures"]) != sorted(b["failures"]):
    bad += 1
    print(f"failed jobs differ: {sorted(a['failures'])} vs {sorted(b['failures'])}")
  print(f"{len(a['hashes'])} files compared, {bad} differ")
  return 1 if bad else 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="cmd", required=True)
  sub.add_parser("record").add_argument("out", type=Path)
  cmp = sub.add_parser("compare")
  cmp.add_argument("before", type=Path)
  cmp.add_argument("after", type=Path)
  args = parser.parse_args(argv)
  if args.cmd == "record":
    return record(args.out)
  return compare(args.before, args.after)


if __name__ == "__main__":
  sys.exit(main())
