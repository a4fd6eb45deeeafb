"""Helpers shared by the paper reproductions under ``experiments/<paper>/``.

Sweeps write one row per point and round (:func:`fedjax_dp.sweep.run_sweep`); a
figure wants the final row of every point, averaged over seeds with its spread, a
CSV and a PNG under the reproduction's ``results/`` and the wall time of the command
that made them. These are those steps, written once.

Every ``results/<name>_meta.json`` (:func:`save_meta`) records what is needed to make
its CSVs again: the command (relative to the repository root), the git commit of the
code that ran (``-dirty`` when ``fedjax_dp/`` or ``experiments/`` had uncommitted
changes outside ``results/``), the package versions, a hash of the resolved configs
the command ran (:func:`run_sweep` / :func:`note_configs`), the CSVs it wrote, what
each of its decisions reads (``decisions``, :func:`config_decisions`: a reported test
accuracy is honest only if no decision read the test set, or the paper states that
it does) and the CPU that ran it (``cpu_model`` and its SIMD ``cpu_flags``,
:func:`cpu_info`): DP rows are bit-exact only on the CPU that made them, since XLA
picks its kernels by the vector units it finds.
``python -m fedjax_dp.reproduction regenerate experiments/<paper>/results/<name>``
re-runs that command into a fresh directory and prints, per CSV and numeric column,
the largest absolute difference to the committed file
(:func:`regenerate`), and says when this CPU is not the one that made the result.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "fedjax_dp")
# What this process ran and wrote, for its meta.json (scripts run one figure each).
_CONFIGS: list[str] = []
_OUTPUTS: list[str] = []
_COMMIT: list[str] = []  # the commit when the first config was noted (before compute)
_DECISIONS: list[dict[str, Any]] = []  # what the noted runs' decisions read


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
  """The last evaluated row of every sweep point (its final test metrics).

  Args:
    df: sweep rows (``pandas.DataFrame(run_sweep(...))``), a ``point`` column.

  Returns:
    One row per point, with ``rounds_used``: the last round the point ran.
  """
  ev = df[df["test_loss"].notna()]
  fin = ev.groupby("point", sort=False).tail(1).reset_index(drop=True)
  fin["rounds_used"] = df.groupby("point", sort=False)["round"].max().reindex(
      fin["point"]).to_numpy()
  return fin


def mean_std(df: pd.DataFrame, by: Sequence[str], cols: Sequence[str]) -> pd.DataFrame:
  """Mean, std and count of ``cols`` per ``by`` group (over seeds): ``<col>_mean``,
  ``<col>_std``, ``<col>_count``."""
  agg = df.groupby(list(by))[list(cols)].agg(["mean", "std", "count"])
  agg.columns = [f"{c}_{s}" for c, s in agg.columns]
  return agg.reset_index()


def errorbar_plot(ax, table: pd.DataFrame, x: str, y: str, label: str, **kw) -> None:
  """``y_mean`` against ``x`` with ``y_std`` error bars (a single seed: no bars)."""
  ax.errorbar(table[x], table[f"{y}_mean"], yerr=np.nan_to_num(table[f"{y}_std"]),
              marker="o", capsize=3, label=label, **kw)


def write_csv(results_dir: Path, df: pd.DataFrame, name: str) -> Path:
  """Writes ``results_dir/<name>.csv`` (6 significant digits)."""
  results_dir.mkdir(parents=True, exist_ok=True)
  path = results_dir / f"{name}.csv"
  df.to_csv(path, index=False, float_format="%.6g")
  if path.name not in _OUTPUTS:
    _OUTPUTS.append(path.name)
  return path


def note_outputs(*names: str) -> None:
  """Adds CSV file names (written without :func:`write_csv`) to this process's
  meta.json ``outputs``."""
  for name in names:
    if name not in _OUTPUTS:
      _OUTPUTS.append(name)


def git_commit(root: Path = ROOT) -> str:
  """HEAD of the repository holding ``root``, ``-dirty`` when ``fedjax_dp/`` or
  ``experiments/`` (outside ``results/`` folders, which the command itself writes)
  differ from it; ``'unknown'`` outside a git checkout."""
  def git(*args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout.strip()
  try:
    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--", "fedjax_dp", "experiments",
                ":(exclude,glob)experiments/*/results/**")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("-dirty" if dirty else "")


def package_versions() -> dict[str, str | None]:
  """Installed versions of :data:`PACKAGES` (None: not installed)."""
  out: dict[str, str | None] = {}
  for name in PACKAGES:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


# The vector-unit flags that decide which kernels XLA's CPU backend emits (recorded
# beside the model name: two CPUs of one name can expose different flags in a VM).
SIMD_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq",
              "avx512bw", "avx512vl", "avx512cd", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile", "asimd", "sve", "sve2")
# What an old meta.json's CPU is: the field did not exist when it was written.
CPU_UNKNOWN = "unknown (recorded before cpu_model)"


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
  """``{'cpu_model': name, 'cpu_flags': [the SIMD_FLAGS it has]}`` of this machine.

  Args:
    cpuinfo: the text of ``/proc/cpuinfo`` (default: read it; elsewhere the model is
      :func:`platform.processor` and the flags are unknown, an empty list).
  """
  if cpuinfo is None:
    try:
      cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
      cpuinfo = ""
  fields: dict[str, str] = {}
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(":")
    if sep:
      fields.setdefault(key.strip(), value.strip())
  model = (fields.get("model name") or fields.get("Model") or fields.get("cpu model")
           or platform.processor() or platform.machine() or "unknown")
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  return {"cpu_model": model, "cpu_flags": [f for f in SIMD_FLAGS if f in flags]}


def cpu_difference(meta: Mapping[str, Any], here: Mapping[str, Any] | None = None) -> str | None:
  """A line saying how this CPU differs from the one a meta.json recorded (None: the
  same model and flags)."""
  here = cpu_info() if here is None else here
  made = meta.get("cpu_model")
  if not made or made == CPU_UNKNOWN:
    return (f"the CPU that made this result is unknown (recorded before cpu_model); this "
            f"one is {here['cpu_model']} ({' '.join(here['cpu_flags']) or 'no flags'}): "
            "DP rows may differ in their last digits")
  flags = meta.get("cpu_flags")
  if made == here["cpu_model"] and (flags is None or list(flags) == list(here["cpu_flags"])):
    return None
  return (f"made on {made} ({' '.join(flags or []) or 'flags unknown'}), re-run on "
          f"{here['cpu_model']} ({' '.join(here['cpu_flags']) or 'no flags'}): another "
          "CPU, so DP rows may differ in their last digits")


# Where a decision's input comes from (``decisions[].reads``): the test set the results
# are reported on, or data that is not it.
READS_TEST = "test set"
READS_CLIENTS = "the selected clients' data (noised, charged by the accountant)"
READS_UNASSIGNED = "the training examples no client holds (eval.split='unassigned')"


def eval_reads(cfg) -> str:
  """What a decision that reads a run's evaluation metrics reads (``eval.split``)."""
  return READS_UNASSIGNED if cfg.get("eval", {}).get("split", "test") == "unassigned" \
      else READS_TEST
# Decisions whose paper states that they read the test loss (quoted): a faithful
# reproduction keeps them, and the meta says so.
PAPER_STATED = {
    "crd": ("Wei et al. CRD's discount trigger", '"V(w^t) is the test loss by the model w^t"'),
    "optimal_t": ("Wei et al. optimal UDP's T (the lowest final loss of the T grid)",
                  "the optimal T of Figs. 5/6, chosen on the plotted test loss"),
    "refine": ("Yuan et al.'s online refinement of M", ('"If the test loss function value '
               'at the aggregator stops decreasing, then a new M\' is calculated"')),
}


def decision(what: str, reads: str, quote: str | None = None) -> dict[str, Any]:
  """One ``decisions`` entry: ``paper_states`` is true when ``quote`` (the paper's
  words) says the decision reads what it reads."""
  return {"decision": what, "reads": reads, "paper_states": quote is not None,
          **({"paper": quote} if quote else {})}


def config_decisions(cfg) -> list[dict[str, Any]]:
  """What the decisions a run of ``cfg`` makes read: A-DPFL's noise decay reads its
  score (``schedule.validation``), CRD's trigger, Yuan's refinement and optimal UDP's
  choice read the test loss, as their papers state (:data:`PAPER_STATED`)."""
  name = str(cfg.schedule.name)
  if name == "adpfl":
    clients = cfg.schedule.get("validation", "server") == "clients"
    return [decision("A-DPFL noise decay (eq. (15)): the validation score",
                     READS_CLIENTS if clients else eval_reads(cfg))]
  if name == "geometric" and float(cfg.schedule.get("refine", 0.0)):
    name = "refine"
  if name in PAPER_STATED:
    what, quote = PAPER_STATED[name]
    reads = eval_reads(cfg)
    return [decision(what, reads, quote if reads == READS_TEST else None)]
  return []


def note_decision(entry: Mapping[str, Any]) -> None:
  """Adds a :func:`decision` this process made outside a run's config (a calibration's
  choice of setting) to its meta.json's ``decisions``."""
  if dict(entry) not in _DECISIONS:
    _DECISIONS.append(dict(entry))


def config_digest(cfg) -> str:
  """SHA-256 of one resolved config (a ConfigDict or a mapping), keys sorted."""
  from fedjax_dp.files import results
  raw = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
  text = json.dumps(results._jsonable(raw), sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()


def run_commit() -> str:
  """:func:`git_commit` as it was when this process first noted a config (before its
  compute), so that editing the tree while a long run goes on does not change what
  its meta.json records."""
  if not _COMMIT:
    _COMMIT.append(git_commit())
  return _COMMIT[0]


def note_configs(cfgs: Iterable[Any] | Mapping[Any, Any]) -> None:
  """Adds resolved configs to what this process's :func:`save_meta` hashes."""
  run_commit()
  values = list(cfgs.values() if isinstance(cfgs, Mapping) else cfgs)
  _CONFIGS.extend(config_digest(c) for c in values)
  for c in values:
    for entry in config_decisions(c) if hasattr(c, "schedule") else ():
      note_decision(entry)


def configs_hash(digests: Sequence[str] | None = None) -> str | None:
  """One SHA-256 over the (sorted) config digests noted so far; None if none were."""
  digests = sorted(_CONFIGS if digests is None else digests)
  return hashlib.sha256("\n".join(digests).encode()).hexdigest() if digests else None


def run_sweep(cfg, grid, out_dir=None, **kwargs):
  """:func:`fedjax_dp.sweep.run_sweep`, noting every point's resolved config (finished
  points read back from ``out_dir`` included) for the meta.json's hash."""
  from fedjax_dp import sweep
  note_configs(p.config for p in sweep.expand(cfg, grid, kwargs.get("sets", ())))
  return sweep.run_sweep(cfg, grid, out_dir, **kwargs)


# Schedules whose noise reads the round's metrics (CRD's test loss, A-DPFL's score,
# Yuan's refinement): their epsilon follows only from a real run.
ADAPTIVE_SCHEDULES = ("crd", "adpfl")


def accounted_epsilon(cfg, *, cache: dict | None = None) -> dict[str, float]:
  """The claimed and certified epsilon a run of ``cfg`` ends with, from the run loop's
  host side alone (the schedule's noise plan, the selection and the accountant of
  :class:`fedjax_dp.host.run_loop.RunLoop`), without training: the numbers a run's
  last metrics row records, for a result whose CSV kept only the claimed one.

  Exact for schedules whose noise does not read the metrics; the loop records zero
  metrics and a zero test loss.

  Args:
    cfg: the run's config.
    cache: a :func:`fedjax_dp.host.building.build` cache shared by many calls.

  Returns:
    ``{'epsilon_claimed', 'epsilon_certified', 'rounds'}`` after the last round.

  Raises:
    ValueError: the schedule's noise reads the metrics (:data:`ADAPTIVE_SCHEDULES`,
      ``geometric`` with ``schedule.refine``).
  """
  from fedjax_dp import experiment
  name = str(cfg.schedule.name)
  if name in ADAPTIVE_SCHEDULES or (name == "geometric"
                                    and float(cfg.schedule.get("refine", 0.0))):
    raise ValueError(f"schedule {name!r} reads the round's metrics: its epsilon follows "
                     "only from a real run")
  loop = experiment.RunLoop(cfg, experiment.build(cfg, cache=cache), None)
  while (args := loop.plan_round()) is not None:
    zero = {"train_loss": 0.0, "grad_norm": 0.0, "update_norm": 0.0,
            "num_selected": float(np.sum(args.sel_mask))}
    loop.record(zero, (0.0, 0.0) if loop.wants_eval else None, 0.0,
                0.0 if loop.wants_validation else None)
  last = loop.rows[-1]
  return {"epsilon_claimed": float(last["epsilon_claimed"]),
          "epsilon_certified": float(last["epsilon_certified"]), "rounds": int(last["round"])}


def command_line(argv: Sequence[str] | None = None) -> str:
  """``python <script> <args>`` with the script relative to the repository root (the
  directory :func:`regenerate` runs it from), shell-quoted."""
  argv = list(sys.argv if argv is None else argv)
  script = Path(argv[0]).resolve()
  if script.is_relative_to(ROOT):
    argv[0] = str(script.relative_to(ROOT))
  return shlex.join(["python", *argv])


def save_meta(results_dir: Path, name: str, start: float, *, configs=None, **extra) -> dict:
  """Writes ``results_dir/<name>_meta.json``: wall time, machine (:func:`cpu_info`), command, commit,
  package versions, the hash of the resolved configs (``configs`` and those noted by
  :func:`note_configs` / :func:`run_sweep`) and the CSVs this process wrote."""
  import jax
  if configs is not None:
    note_configs(configs)
  results_dir.mkdir(parents=True, exist_ok=True)
  meta = dict(wall_seconds=round(time.time() - start, 1), device=str(jax.devices()[0]),
              cpu_count=os.cpu_count(), **cpu_info(), command=command_line(),
              commit=run_commit(),
              versions=package_versions(), configs_sha256=configs_hash(),
              configs=len(_CONFIGS), outputs=list(_OUTPUTS), decisions=list(_DECISIONS),
              **extra)
  (results_dir / f"{name}_meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
  print(f"{name}: {meta['wall_seconds']} s")
  return meta


def pyplot():
  """``matplotlib.pyplot`` on the file-only Agg backend (scripts write PNGs; no display)."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  return plt


# Flags appended to a recorded command by ``regenerate --smoke``: the same script on a
# seconds-long version of its figure (argparse keeps the last value of a flag).
SMOKE_FLAGS = {
    "experiments/adpfl2022/fig4_ablation.py": ["--seeds", "1", "--rounds", "2",
                                               "--methods", "dpfl", "--test-samples", "200",
                                               "--model", "mlp_784_256_10", "--local-steps", "0"],
    "experiments/fu2023/fig1_lr_epsilon.py": ["--seeds", "1", "--rounds", "3"],
    "experiments/wei2021/fig7_initial_T.py": ["--seeds", "1", "--epsilons", "4", "--t0", "5"],
    "experiments/yuan2023/fig4_epsilon.py": ["--seeds", "1", "--m-grid", "2", "--samples", "100"],
}


class RegenerateError(ValueError):
  """A result that cannot be re-run (no meta.json, no command, an unknown script)."""


def _result_paths(result: str | Path) -> tuple[Path, str, str]:
  """``experiments/<paper>/results/<name>`` -> (results dir, name, paper)."""
  path = Path(result)
  name = path.name.removesuffix("_meta.json").removesuffix(".csv")
  results_dir = path.parent.resolve()
  if results_dir.name != "results" or not (results_dir / f"{name}_meta.json").is_file():
    raise RegenerateError(f"{path}: no {name}_meta.json in a results/ folder (expected "
                          "experiments/<paper>/results/<name>)")
  return results_dir, name, results_dir.parent.name


def recorded_command(meta: Mapping[str, Any], smoke: bool = False) -> list[str]:
  """The argv of a meta.json's command (``python`` -> this interpreter), with
  :data:`SMOKE_FLAGS` appended when ``smoke``.

  Raises:
    RegenerateError: no command, not a ``python <script>`` one, or ``smoke`` for a
      script without smoke flags.
  """
  try:
    argv = shlex.split(str(meta.get("command", "")))
  except ValueError as e:
    raise RegenerateError(f"unparsable command {meta.get('command')!r}: {e}") from None
  if len(argv) < 2 or argv[0] != "python":
    raise RegenerateError(f"not a 'python <script> ...' command: {meta.get('command')!r}")
  script = argv[1]
  if smoke and script not in SMOKE_FLAGS:
    raise RegenerateError(f"--smoke: no smoke flags for {script} (known: "
                          f"{', '.join(sorted(SMOKE_FLAGS))})")
  return [sys.executable, *argv[1:], *(SMOKE_FLAGS[script] if smoke else [])]


# Wall-clock columns: a re-run never reproduces them, so they are not compared.
TIMING_COLUMNS = frozenset({"wall_s", "sweep_seconds", "setting_wall_s"})


def max_abs_diff(new: pd.DataFrame, old: pd.DataFrame) -> dict[str, float]:
  """Largest absolute difference of every numeric column the two tables share, row by
  row over their common length (equal values, infinities and NaNs included, count as
  0; NaN against a number as inf), wall-clock columns (:data:`TIMING_COLUMNS`) left out."""
  n = min(len(new), len(old))
  out = {}
  for col in new.columns:
    if col in TIMING_COLUMNS or col not in old.columns or not (pd.api.types.is_numeric_dtype(new[col])
                                      and pd.api.types.is_numeric_dtype(old[col])):
      continue
    a = new[col].iloc[:n].to_numpy(np.float64)
    b = old[col].iloc[:n].to_numpy(np.float64)
    with np.errstate(invalid="ignore"):
      diff = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))
    out[col] = float(np.nan_to_num(diff, nan=np.inf).max()) if n else 0.0
  return out


def compare_results(new_dir: Path, old_dir: Path, names: Sequence[str]) -> list[dict[str, Any]]:
  """One row per (CSV, numeric column) of ``names`` in both folders: its largest
  absolute difference and the two row counts."""
  rows = []
  for csv in names:
    if not (new_dir / csv).is_file() or not (old_dir / csv).is_file():
      state = "not written" if not (new_dir / csv).is_file() else "not committed"
      rows.append({"csv": csv, "column": None, "max_abs_diff": None, "rows": state})
      continue
    new, old = pd.read_csv(new_dir / csv), pd.read_csv(old_dir / csv)
    for col, d in max_abs_diff(new, old).items():
      rows.append({"csv": csv, "column": col, "max_abs_diff": d,
                   "rows": f"{len(new)} vs {len(old)}"})
  return rows


def _run_in_process(argv: Sequence[str], env: Mapping[str, str]) -> None:
  """Runs ``python <script> <args>`` in this process (the test's fast path: imports
  and compiled programs are shared by two runs). The script's ``common`` module is
  imported afresh (each paper has one) and the environment, argv, ``sys.path``, the
  noted configs and outputs are restored afterwards."""
  import runpy
  script = ROOT / argv[1]
  saved = (dict(os.environ), list(sys.argv), list(sys.path), list(_CONFIGS), list(_OUTPUTS),
           list(_COMMIT), list(_DECISIONS), sys.modules.pop("common", None))
  os.environ.update(env)
  sys.argv[:] = [str(script), *argv[2:]]
  sys.path.insert(0, str(script.parent))
  del _CONFIGS[:], _OUTPUTS[:], _COMMIT[:], _DECISIONS[:]
  try:
    runpy.run_path(str(script), run_name="__main__")
  finally:
    os.environ.clear()
    os.environ.update(saved[0])
    (sys.argv[:], sys.path[:], _CONFIGS[:], _OUTPUTS[:], _COMMIT[:],
     _DECISIONS[:]) = saved[1:7]
    sys.modules.pop("common", None)
    if saved[7] is not None:
      sys.modules["common"] = saved[7]


def regenerate(result: str | Path, out: str | Path | None = None, *, smoke: bool = False,
               in_process: bool = False) -> pd.DataFrame:
  """Re-runs the command recorded in ``<result>_meta.json`` and compares its CSVs.

  The command runs from the repository root with the paper's ``<PAPER>_RESULTS`` and
  ``<PAPER>_RUNS`` pointing under ``out`` (a new temporary folder by default), so
  nothing committed or cached is overwritten and no cached run is read back: every
  run is fresh. The new results folder starts with a copy of the committed CSVs
  (:func:`_seed_inputs`), for the figures that read another result.

  Args:
    result: ``experiments/<paper>/results/<name>`` (``.csv`` or ``_meta.json`` too).
    out: an empty or missing folder for the new results and runs.
    smoke: append the script's :data:`SMOKE_FLAGS` (a seconds-long figure; its
      numbers are not comparable to the committed ones).
    in_process: run the script in this process (:func:`_run_in_process`) instead
      of a fresh interpreter.

  Returns:
    :func:`compare_results`'s rows (the CSVs the meta.json lists, else every CSV the
    command wrote or rewrote), one per CSV and numeric column; ``attrs['cpu']`` is
    :func:`cpu_difference` (None when this CPU is the one that made the result).

  Raises:
    RegenerateError: see :func:`recorded_command`; ``out`` is not empty; the command
      failed.
  """
  import tempfile
  results_dir, name, paper = _result_paths(result)
  meta = json.loads((results_dir / f"{name}_meta.json").read_text())
  argv = recorded_command(meta, smoke)
  out = Path(out) if out else Path(tempfile.mkdtemp(prefix=f"regenerate_{name}_"))
  if out.exists() and any(out.iterdir()):
    raise RegenerateError(f"--out {out} is not empty (regenerate writes only into a new folder)")
  _seed_inputs(results_dir, out / "results")
  before = {f.name: f.stat().st_mtime_ns for f in (out / "results").glob("*.csv")}
  env = {**os.environ, f"{paper.upper()}_RESULTS": str(out / "results"),
         f"{paper.upper()}_RUNS": str(out / "runs"),
         "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  print(f"regenerate {name}: {shlex.join(argv)} -> {out}", flush=True)
  if in_process:
    _run_in_process(argv, env)
  elif subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode:
    raise RegenerateError(f"the command of {name} failed: {shlex.join(argv)}")
  written = sorted(f.name for f in (out / "results").glob("*.csv")
                   if before.get(f.name) != f.stat().st_mtime_ns)
  if not written:
    # The script wrote elsewhere (it does not read <PAPER>_RESULTS): comparing the
    # seeded copies with themselves would report a false "identical".
    raise RegenerateError(f"the command of {name} wrote no CSV under {out / 'results'}: "
                          f"its script must read {paper.upper()}_RESULTS and "
                          f"{paper.upper()}_RUNS")
  names = meta.get("outputs") or written
  table = pd.DataFrame(compare_results(out / "results", results_dir, names))
  table.attrs["cpu"] = cpu_difference(meta)
  if table.attrs["cpu"]:
    print(f"regenerate {name}: {table.attrs['cpu']}", flush=True)
  return table


def _seed_inputs(results_dir: Path, new_results: Path) -> None:
  """Copies the committed CSVs into the new results folder: some figures read another
  result (A-DPFL Fig. 5 reads Table 2's rounds). Only what the command rewrites is
  compared (its meta.json's ``outputs``, else the CSVs it touched)."""
  import shutil
  new_results.mkdir(parents=True, exist_ok=True)
  for csv in results_dir.glob("*.csv"):
    shutil.copyfile(csv, new_results / csv.name)


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m fedjax_dp.reproduction regenerate RESULT [--out DIR] [--smoke]``."""
  import argparse
  ap = argparse.ArgumentParser(prog="python -m fedjax_dp.reproduction")
  sub = ap.add_subparsers(dest="cmd", required=True)
  reg = sub.add_parser("regenerate", help="re-run a committed result's command and print "
                       "the largest difference per numeric column to its CSVs")
  reg.add_argument("result", help="experiments/<paper>/results/<name>")
  reg.add_argument("--out", default=None, help="empty folder for the new files (default: "
                   "a new temporary folder)")
  reg.add_argument("--smoke", action="store_true", help="a seconds-long version of the "
                   "figure (SMOKE_FLAGS; not comparable to the committed numbers)")
  args = ap.parse_args(argv)
  try:
    table = regenerate(args.result, args.out, smoke=args.smoke)
  except RegenerateError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  with pd.option_context("display.max_rows", None, "display.width", 200):
    print(table.to_string(index=False))
  worst = pd.to_numeric(table.get("max_abs_diff"), errors="coerce").max() if len(table) else 0.0
  print(f"largest absolute difference: {worst:.6g}")
  print(f"CPU: {table.attrs.get('cpu') or 'the one that made the result'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
