"""Output paths: checked before any compute, and --overwrite removes only what the
project wrote (fedjax_dp/files/outputs.py).

PATH_CASES is a table of invocations run in-process through ``cli.main``: each has
an optional setup building a tree under a scratch directory, the argv, the exit
status and a substring of the one stderr line (for a refusal) or of stdout (for a
success). Every case asserts no traceback, and compares the tree before and after:
a refusal changes nothing at all; a success leaves every file that is not one of
the project's output names untouched.
"""

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pytest

from fedjax_dp import cli
from fedjax_dp import config as config_lib
from fedjax_dp.files import outputs, results

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
# The shapes of tests/test_checkpoint.py's runs, all clients of a round at once (sizing
# the chunk to free memory compiles two probe rounds per program; test_chunking.py
# covers it).
SHAPES = ["data.num_clients=6", "data.samples_per_client=40", "server.clients_per_round=4",
          "server.client_chunk=0"]
SMALL = [a for s in SHAPES for a in ("--set", s)] + ["--no-progress"]
RUN = ["run", "{q}", *SMALL, "--set", "rounds=2"]
SWEEP = ["sweep", "{q}", *SMALL, "--set", "rounds=1"]
PROJECT_NAMES = {*outputs.RUN_FILES, *outputs.SWEEP_FILES, outputs.MANIFEST}


class Case(NamedTuple):
  """One invocation: ``argv`` ('{tmp}' is the scratch directory, '{q}' the
  quickstart config), its exit status, a substring of its stderr line (exit != 0)
  or stdout (exit 0), a setup ``(tmp, real_run) -> None`` and files it must create."""

  name: str
  argv: list
  code: int
  text: str
  setup: Callable | None = None
  creates: tuple = ()


# ---------------------------------------------------------------------------
# Setups: trees a user may have (no compute; ``real`` gives a finished run).


def _manifest(d: Path, kind: str, files=(), dirs=()) -> None:
  d.mkdir(parents=True, exist_ok=True)
  (d / outputs.MANIFEST).write_text(json.dumps(
      {"written_by": "fedjax_dp", "version": 1, "kind": kind, "files": list(files),
       "dirs": list(dirs)}))


def _config(rounds=2, **sets) -> dict:
  """The config.json of ``RUN`` (or ``SWEEP`` with rounds=1) with ``sets``."""
  cfg = config_lib.override(config_lib.load_config(QUICKSTART), [
      *SHAPES, f"rounds={rounds}", *(f"{k}={v}" for k, v in sets.items())])
  return json.loads(json.dumps(results._jsonable(cfg.to_dict())))


def issue_project(tmp, real):  # the issue's example: a software project with config.json
  (tmp / "runs/proj/src").mkdir(parents=True)
  (tmp / "runs/proj/config.json").write_text('{"name": "app"}')
  (tmp / "runs/proj/src/main.py").write_text("x\n")


def stranger_metrics(tmp, real):
  (tmp / "d").mkdir()
  (tmp / "d/metrics.csv").write_text("a,b\n1,2\n")


def stranger_notes(tmp, real):
  (tmp / "d").mkdir()
  (tmp / "d/notes.txt").write_text("mine\n")


def a_file(tmp, real):
  (tmp / "afile").write_text("mine\n")


def empty_dir(tmp, real):
  (tmp / "d").mkdir()


def fake_sweep(tmp, real, values=({"seed": 0}, {"seed": 1})):
  names = [f"{i:03d}" + "".join(f"-{k.split('.')[-1]}={x}" for k, x in v.items())
           for i, v in enumerate(values)]
  _manifest(tmp / "sw", "sweep", ["sweep.json"], [f"points/{n}" for n in names])
  (tmp / "sw/sweep.json").write_text(json.dumps({
      "config": _config(rounds=1), "grid": {k: sorted({str(v[k]) for v in values})
                                            for k in values[0]}, "sets": [],
      "points": [{"name": n, "values": v} for n, v in zip(names, values)]}))
  for n in names:
    _manifest(tmp / "sw/points" / n, "sweep-point")


def fake_sweep2(tmp, real):
  fake_sweep(tmp, real, [{"seed": 0, "client.lr": 0.5}])


def fake_run(tmp, real, **sets):
  _manifest(tmp / "r", "run", ["config.json", "metrics.csv"])
  (tmp / "r/config.json").write_text(json.dumps(_config(**sets)))
  (tmp / "r/metrics.csv").write_text("round,test_loss\n1,2.0\n")


def legacy_run(tmp, real, **sets):
  fake_run(tmp, real, **sets)
  (tmp / "r" / outputs.MANIFEST).unlink()


def run_with_notes(tmp, real):
  fake_run(tmp, real)
  (tmp / "r/notes.txt").write_text("mine\n")


def run_with_unlisted_png(tmp, real):
  fake_run(tmp, real)
  (tmp / "r/metrics.png").write_bytes(b"my own picture")


def run_with_foreign_in_candidate(tmp, real):
  fake_run(tmp, real)
  _manifest(tmp / "r", "run", ["config.json", "metrics.csv"], ["T=10"])
  _manifest(tmp / "r/T=10", "candidate", ["metrics.csv"])
  (tmp / "r/T=10/metrics.csv").write_text("round\n1\n")
  (tmp / "r/T=10/draft.py").write_text("mine\n")


def run_with_link(tmp, real):
  fake_run(tmp, real)
  (tmp / "user_data").mkdir()
  (tmp / "user_data/precious.txt").write_text("mine\n")
  (tmp / "r/config.json").unlink()
  (tmp / "r/config.json").symlink_to(tmp / "user_data")  # listed name, but a dir link


def bad_manifest(tmp, real):
  (tmp / "r").mkdir()
  (tmp / "r" / outputs.MANIFEST).write_text("{not json")
  (tmp / "r/notes.txt").write_text("mine\n")


def plot_input(tmp, real):
  (tmp / "r").mkdir()
  pd.DataFrame({"round": [1, 2], "test_loss": [2.0, 1.5], "test_accuracy": [0.2, 0.4]}
               ).to_csv(tmp / "r/metrics.csv", index=False)
  (tmp / "pdir").mkdir()
  (tmp / "afile").write_text("mine\n")


def copy_real(tmp, real, legacy=False, notes=False):
  shutil.copytree(real(), tmp / "r", symlinks=True)
  if legacy:
    (tmp / "r" / outputs.MANIFEST).unlink()
  if notes:
    (tmp / "r/notes.txt").write_text("mine\n")


def with_stale_candidate(tmp, real):
  copy_real(tmp, real)
  outputs.claim(tmp / "r/T=10", "candidate", parent=tmp / "r")
  outputs.atomic_write(tmp / "r/T=10/metrics.csv", b"round\n", owned=True)


P = "{tmp}/"
PATH_CASES = [
    # Paths checked before compute: one line, exit 2, nothing written.
    Case("run empty out", [*RUN, "--out", ""], 2, "--out '': empty path"),
    Case("run blank out", [*RUN, "--out", "  "], 2, "empty path"),
    Case("run /proc", [*RUN, "--out", "/proc/fedjax_dp_x/run"], 2,
         "--out /proc/fedjax_dp_x/run: cannot create files in /proc"),
    Case("run out is a file", [*RUN, "--out", P + "afile"], 2, "afile: is a file", a_file),
    Case("run under a file", [*RUN, "--out", P + "afile/x"], 2,
         "afile is a file, not a directory", a_file),
    Case("sweep empty out", [*SWEEP, "--grid", "seed=0", "--out", ""], 2, "empty path"),
    Case("sweep /proc", [*SWEEP, "--grid", "seed=0", "--out", "/proc/x"], 2,
         "--out /proc/x: cannot create files in /proc"),
    Case("sweep out is a file", [*SWEEP, "--grid", "seed=0", "--out", P + "afile"], 2,
         "afile: is a file", a_file),
    Case("audit empty out", ["audit", "{q}", "--trials", "20", "--out", ""], 2, "empty path"),
    Case("audit /proc", ["audit", "{q}", "--trials", "20", "--out", "/proc/a.json"], 2,
         "--out /proc/a.json: cannot create files in /proc"),
    Case("audit under a file", ["audit", "{q}", "--out", P + "afile/a.json"], 2,
         "afile is a file", a_file),
    Case("plot empty out", ["plot", P + "r", "--out", ""], 2, "empty path", plot_input),
    Case("plot /proc", ["plot", P + "r", "--out", "/proc/p.png"], 2,
         "cannot create files in /proc", plot_input),
    Case("plot under a file", ["plot", P + "r", "--out", P + "afile/p.png"], 2,
         "afile is a file", plot_input),
    Case("plot of a non-run", ["plot", P + "pdir", "--out", P + "p.png"], 2,
         "pdir is neither a run directory", plot_input),
    # plot writes exactly the path it prints.
    Case("plot into a directory", ["plot", P + "r", "--out", P + "pdir"], 0,
         "wrote {tmp}/pdir/plot.png", plot_input, ("pdir/plot.png",)),
    Case("plot without suffix", ["plot", P + "r", "--out", P + "fig"], 0,
         "wrote {tmp}/fig.png", plot_input, ("fig.png",)),
    Case("plot svg", ["plot", P + "r", "--out", P + "new/fig.svg"], 0,
         "wrote {tmp}/new/fig.svg", plot_input, ("new/fig.svg",)),
    # Strangers' directories: refused with or without --overwrite, nothing removed.
    Case("issue 20: --overwrite a project folder", [*RUN, "--out", P + "runs/proj",
                                                     "--overwrite"], 2,
         "not written by fedjax-dp (it holds {tmp}/runs/proj/config.json)", issue_project),
    Case("project folder", [*RUN, "--out", P + "runs/proj"], 2, "not written by fedjax-dp",
         issue_project),
    Case("stranger's metrics.csv", [*RUN, "--out", P + "d"], 2,
         "--out {tmp}/d: not empty and not written by fedjax-dp", stranger_metrics),
    Case("stranger's notes", [*RUN, "--out", P + "d", "--overwrite"], 2, "d/notes.txt",
         stranger_notes),
    Case("sweep into a stranger's", [*SWEEP, "--grid", "seed=0", "--out", P + "d"], 2,
         "not written by fedjax-dp", stranger_notes),
    # Kinds: a sweep into a run directory, a run into a sweep's.
    Case("sweep into a run dir", [*SWEEP, "--grid", "seed=0", "--out", P + "r"], 2,
         "--out {tmp}/r: is a run directory, not a sweep directory", fake_run),
    Case("sweep into an old run dir", [*SWEEP, "--grid", "seed=0", "--out", P + "r"], 2,
         "is a run directory, not a sweep directory", legacy_run),
    Case("sweep --overwrite a run dir", [*SWEEP, "--grid", "seed=0", "--out", P + "r",
                                         "--overwrite"], 2, "is a run directory", fake_run),
    Case("run into a sweep dir", [*RUN, "--out", P + "sw"], 2,
         "is a sweep directory, not a run directory", fake_sweep),
    Case("run into a sweep point", [*RUN, "--out", P + "sw/points/000-seed=0"], 2,
         "is a sweep-point directory, not a run directory", fake_sweep),
    # Run directories holding something of the user's.
    Case("--overwrite with notes", [*RUN, "--out", P + "r", "--overwrite"], 2,
         "{tmp}/r/notes.txt is not; nothing was removed", run_with_notes),
    Case("unlisted metrics.png", [*RUN, "--out", P + "r"], 2,
         "{tmp}/r/metrics.png was not written by fedjax-dp and would be replaced",
         run_with_unlisted_png),
    Case("foreign file in a candidate", [*RUN, "--out", P + "r", "--overwrite"], 2,
         "{tmp}/r/T=10/draft.py is not", run_with_foreign_in_candidate),
    Case("link to a user dir", [*RUN, "--out", P + "r", "--overwrite"], 2,
         "{tmp}/r/config.json is not", run_with_link),
    Case("unreadable manifest", [*RUN, "--out", P + "r", "--overwrite"], 2,
         "unreadable", bad_manifest),
    # Another config or grid: named; nothing written.
    Case("run of another config", [*RUN, "--set", "seed=3", "--out", P + "r"], 2,
         "holds a run of a different config (seed: 0 -> 3)", fake_run),
    Case("old run of another config", [*RUN, "--set", "seed=3", "--out", P + "r"], 2,
         "different config (seed: 0 -> 3)", legacy_run),
    Case("sweep of another grid", [*SWEEP, "--grid", "seed=2,3", "--out", P + "sw"], 2,
         "holds a sweep of a different grid (seed: [0, 1] -> [2, 3])", fake_sweep),
    Case("sweep of another key", [*SWEEP, "--grid", "client.lr=0.1", "--out", P + "sw"], 2,
         "different grid (seed: [0, 1] -> (not in grid); client.lr: (not in grid) -> [0.1])",
         fake_sweep),
    Case("sweep of another key order", [*SWEEP, "--grid", "client.lr=0.5", "--grid",
                                         "seed=0", "--out", P + "sw"], 2,
         "different grid (key order: ['seed', 'client.lr'] -> ['client.lr', 'seed'])",
         fake_sweep2),
    Case("sweep of another config", [*SWEEP, "--grid", "seed=0,1", "--set", "client.lr=0.2",
                                     "--out", P + "sw"], 2,
         "holds a sweep of a different config (client.lr: 0.5 -> 0.2)", fake_sweep),
    # Runs that go ahead (tiny compute).
    Case("run into an empty dir", [*RUN, "--out", P + "d"], 0, "outputs in {tmp}/d",
         empty_dir, ("d/metrics.csv", "d/" + outputs.MANIFEST)),
    Case("run into a new nested dir", [*RUN, "--out", P + "a/b/c"], 0, "outputs in",
         None, ("a/b/c/summary.json",)),
    Case("resume keeps the user's notes", [*RUN, "--out", P + "r"], 0, "after 2 rounds",
         lambda t, r: copy_real(t, r, notes=True), ("r/notes.txt",)),
    Case("old run directory resumes", [*RUN, "--out", P + "r"], 0, "after 2 rounds",
         lambda t, r: copy_real(t, r, legacy=True), ("r/" + outputs.MANIFEST,)),
    Case("old run directory --overwrite", [*RUN, "--set", "seed=3", "--out", P + "r",
                                           "--overwrite"], 0, "after 2 rounds",
         lambda t, r: copy_real(t, r, legacy=True), ("r/model.msgpack",)),
    Case("--overwrite removes a stale candidate", [*RUN, "--set", "seed=3", "--out", P + "r",
                                                   "--overwrite"], 0, "after 2 rounds",
         with_stale_candidate),
]


def _tree(root: Path) -> dict:
  """``{relative path: bytes | 'dir' | 'link -> target'}`` (links not followed)."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      p = Path(dirpath) / name
      rel = p.relative_to(root).as_posix()
      out[rel] = (f"link -> {os.readlink(p)}" if p.is_symlink() else
                  "dir" if p.is_dir() else p.read_bytes())
  return out


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
  """A finished tiny run directory (made once, on first use)."""
  made = {}

  def get() -> Path:
    if "dir" not in made:
      d = tmp_path_factory.mktemp("template") / "run"
      args = [a.format(q=QUICKSTART) for a in RUN]
      assert cli.main([*args, "--set", "checkpoint.every=1", "--out", str(d)]) == 0
      made["dir"] = d
    return made["dir"]

  return get


def test_table_is_big_enough():
  assert len(PATH_CASES) >= 25
  assert len({c.name for c in PATH_CASES}) == len(PATH_CASES)


@pytest.mark.parametrize("case", PATH_CASES, ids=[c.name for c in PATH_CASES])
def test_path_case(case, tmp_path, real_run, capsys):
  tmp = tmp_path / "scratch"
  tmp.mkdir()
  if case.setup:
    case.setup(tmp, real_run)
  argv = [a.format(tmp=tmp, q=QUICKSTART) for a in case.argv]
  before = _tree(tmp)
  capsys.readouterr()
  try:
    code = cli.main(argv)
  except SystemExit as e:  # argparse
    code = e.code
  out, err = capsys.readouterr()
  after = _tree(tmp)
  assert "Traceback" not in err
  assert code == case.code, err
  text = case.text.format(tmp=tmp)
  if case.code:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert text in lines[0]
    assert after == before  # checked before compute: nothing created, changed or removed
  else:
    assert text in out
    for rel, content in before.items():  # the user's files are untouched
      if Path(rel).name not in PROJECT_NAMES and not Path(rel).name.startswith("T="):
        assert after.get(rel) == content, rel
    for rel in case.creates:
      assert rel in after, rel
    assert not [r for r in after if Path(r).name.startswith(".") and
                Path(r).name != outputs.MANIFEST], "temporary files left"


def test_overwrite_removes_exactly_the_listed_files(tmp_path, real_run):
  run = tmp_path / "r"
  shutil.copytree(real_run(), run)
  (run / "notes.txt").write_text("mine\n")
  with pytest.raises(outputs.OutputError, match="notes.txt is not"):
    outputs.remove_owned(run)
  (run / "notes.txt").unlink()
  listed = json.loads((run / outputs.MANIFEST).read_text())["files"]
  assert set(listed) == {p.name for p in run.iterdir()} - {outputs.MANIFEST}
  outputs.claim(run / "T=3", "candidate", parent=run)  # a project sub-directory
  outputs.atomic_write(run / "T=3/metrics.csv", b"round\n", owned=True)
  (run / "T=3/.metrics.csv.0123456789abcdef").write_bytes(b"")  # a write killed midway
  outputs.remove_owned(run)
  assert list(run.iterdir()) == []


def test_old_run_directory_recognition(tmp_path, real_run):
  run = tmp_path / "r"
  shutil.copytree(real_run(), run)
  (run / outputs.MANIFEST).unlink()
  assert outputs.kind_of(run) == "run"
  (run / ".metrics.csv.0123456789abcdef").write_bytes(b"partial")  # a killed write
  assert outputs.kind_of(run) == "run"
  (run / "notes.txt").write_text("mine\n")  # anything else: a stranger's
  assert outputs.kind_of(run) is None
  (run / "notes.txt").unlink()
  (run / "config.json").write_text('{"name": "app"}')  # not the project's config
  assert outputs.kind_of(run) is None


def test_files_get_the_umask_mode_not_0600(tmp_path, real_run):
  old = os.umask(0o027)
  try:
    run = tmp_path / "r"
    shutil.copytree(real_run(), run)
    (run / outputs.MANIFEST).unlink()  # adopted, then every file rewritten
    args = [a.format(q=QUICKSTART) for a in RUN]
    assert cli.main([*args, "--set", "seed=5", "--out", str(run), "--overwrite"]) == 0
    modes = {p.name: p.stat().st_mode & 0o777 for p in run.iterdir()}
    assert "checkpoint.msgpack" in modes and "model.msgpack" in modes
    assert set(modes.values()) == {0o640}, modes
    os.umask(0o002)
    outputs.atomic_write(tmp_path / "f.json", b"{}")
    assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o664
  finally:
    os.umask(old)


def test_read_only_file_system_is_one_line(tmp_path, monkeypatch, capsys):
  real_open = os.open

  def read_only(path, flags, *a, **k):
    if flags & os.O_CREAT:
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_open(path, flags, *a, **k)

  monkeypatch.setattr(os, "open", read_only)
  code = cli.main(["run", str(QUICKSTART), "--out", str(tmp_path / "x")])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1
  assert f"--out {tmp_path / 'x'}: cannot create files in {tmp_path} (Read-only file system)" \
      in err[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_unwritable_directory_is_one_line(tmp_path, capsys):
  ro = tmp_path / "ro"
  ro.mkdir(mode=0o555)
  code = cli.main(["run", str(QUICKSTART), "--out", str(ro / "x")])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "Permission denied" in err[0]


def test_sweep_overwrite_and_resume(tmp_path, capsys):
  out = tmp_path / "sw"
  argv = [a.format(q=QUICKSTART) for a in SWEEP] + ["--out", str(out)]
  assert cli.main([*argv, "--grid", "seed=0,1"]) == 0
  (out / "notes.txt").write_text("mine\n")  # the user's: kept by a resume
  kept = (out / "points/000-seed=0/summary.json").stat().st_mtime_ns
  assert cli.main([*argv, "--grid", "seed=0,1"]) == 0  # finished points skipped
  assert (out / "points/000-seed=0/summary.json").stat().st_mtime_ns == kept
  for m in out.rglob(outputs.MANIFEST):  # as an older version left it
    m.unlink()
  assert outputs.kind_of(out) is None  # notes.txt: not only a sweep's files
  (out / "notes.txt").rename(tmp_path / "notes.txt")
  assert outputs.kind_of(out) == "sweep"
  assert cli.main([*argv, "--grid", "seed=0,1"]) == 0  # adopted, still skipped
  assert (out / "points/000-seed=0/summary.json").stat().st_mtime_ns == kept
  assert outputs.read_manifest(out / "points/001-seed=1")["kind"] == "sweep-point"
  (tmp_path / "notes.txt").rename(out / "notes.txt")
  capsys.readouterr()
  assert cli.main([*argv, "--grid", "seed=2", "--overwrite"]) == 2  # notes.txt is foreign
  assert "notes.txt is not" in capsys.readouterr().err
  (out / "notes.txt").unlink()
  assert cli.main([*argv, "--grid", "seed=2", "--overwrite"]) == 0
  assert sorted(p.name for p in (out / "points").iterdir()) == ["000-seed=2"]
  assert set(pd.read_csv(out / "sweep.csv")["seed"]) == {2}


def _project_dir(tmp_path: Path) -> Path:
  """A run directory of the project's holding two files it wrote (no compute)."""
  run = outputs.claim(tmp_path / "r", "run")
  outputs.atomic_write(run / "config.json", b'{"seed": 0}\n', owned=True)
  outputs.atomic_write(run / "metrics.png", b"the project's figure", owned=True)
  return run


def test_the_manifest_records_each_file_digest(tmp_path):
  run = _project_dir(tmp_path)
  m = outputs.read_manifest(run)
  assert m["version"] == 2 and m["files"] == ["config.json", "metrics.png"]
  assert m["sha256"]["metrics.png"] == hashlib.sha256(b"the project's figure").hexdigest()
  outputs.atomic_write(run / "metrics.png", b"round 2's figure", owned=True)  # rewritten
  assert outputs.read_manifest(run)["sha256"]["metrics.png"] == hashlib.sha256(
      b"round 2's figure").hexdigest()
  assert not outputs.changed(run / "metrics.png")


def test_overwrite_refuses_an_edited_file_and_removes_untouched_ones(tmp_path):
  """The digest rule: an edited file blocks --overwrite (nothing removed) unless
  --overwrite-edited; untouched files are removed."""
  run = _project_dir(tmp_path)
  (run / "config.json").write_text('{"seed": 0, "note": "mine"}\n')  # edited by the user
  before = _tree(run)
  with pytest.raises(outputs.OutputError, match=r"config\.json was changed since fedjax-dp "
                     r"wrote it; nothing was removed .*--overwrite-edited"):
    outputs.remove_owned(run)
  assert _tree(run) == before
  with pytest.raises(outputs.OutputError, match="resuming would replace it"):
    outputs.claim(run, "run")  # resuming would rewrite it too
  assert _tree(run) == before
  outputs.remove_owned(run, outputs.EDITED)
  assert list(run.iterdir()) == []
  # Untouched: removed by a plain --overwrite.
  run = _project_dir(tmp_path / "again")
  outputs.claim(run, "run", overwrite=True)
  assert [p.name for p in run.iterdir()] == [outputs.MANIFEST]


def test_a_write_killed_before_its_rename_is_not_an_edit(tmp_path):
  run = _project_dir(tmp_path)
  # The digest of the new content is recorded, the rename did not happen: the new
  # content is in the temporary file and the file holds the previous version.
  new = b"the next figure"
  outputs.register(run, digests={"metrics.png": hashlib.sha256(new).hexdigest()})
  (run / ".metrics.png.0123456789abcdef").write_bytes(new)
  assert not outputs.changed(run / "metrics.png")
  outputs.remove_owned(run)
  assert list(run.iterdir()) == []


def test_a_checkpoint_is_verified_by_its_own_digest_not_guarded(tmp_path):
  run = _project_dir(tmp_path)
  outputs.atomic_write(run / "checkpoint.msgpack", b"state", owned=True)
  (run / "checkpoint.msgpack").write_bytes(b"stat")  # damage: --overwrite is the remedy
  outputs.remove_owned(run)
  assert list(run.iterdir()) == []


def test_an_out_file_is_replaced_only_if_it_is_the_projects_unchanged_output(tmp_path):
  (tmp_path / "mine.png").write_bytes(b"my own figure")
  with pytest.raises(outputs.OutputError, match=r"mine\.png exists and was not written by "
                     r"fedjax-dp; --overwrite replaces it"):
    outputs.check_file(tmp_path / "mine.png", "plot.png", ["png"])
  assert outputs.check_file(tmp_path / "mine.png", "plot.png", ["png"], overwrite=True)
  ours = outputs.check_file(tmp_path / "ours.png", "plot.png", ["png"])
  outputs.atomic_write(ours, b"a plot", owned=True)
  assert outputs.read_manifest(tmp_path)["kind"] == outputs.FILES_KIND
  assert outputs.check_file(ours, "plot.png", ["png"]) == ours  # the same command again
  ours.write_bytes(b"a plot, annotated by hand")
  with pytest.raises(outputs.OutputError, match="was changed since fedjax-dp wrote it"):
    outputs.check_file(ours, "plot.png", ["png"])
  with pytest.raises(outputs.OutputError, match="name of fedjax-dp's list"):
    outputs.check_file(tmp_path / outputs.MANIFEST, "plot.png")
  # The folder stays the user's: a run is refused there, naming their file.
  with pytest.raises(outputs.OutputError, match=r"not written by fedjax-dp \(it holds "
                     rf"{tmp_path / 'mine.png'}\)"):
    outputs.claim(tmp_path, "run")
  # A folder whose only entry is that list (the plot was deleted) is empty.
  (tmp_path / "empty").mkdir()
  outputs.atomic_write(tmp_path / "empty/p.png", b"a plot", owned=True)
  (tmp_path / "empty/p.png").unlink()
  assert outputs.claim(tmp_path / "empty", "run") and outputs.kind_of(tmp_path / "empty") == "run"
