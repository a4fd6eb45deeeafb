"""Output paths: checked before any compute, and directories that list what they wrote.

Every directory the project writes -- a run, a sweep, a sweep's point, an
``optimal_t`` candidate -- holds a manifest, :data:`MANIFEST`::

  {"written_by": "fedjax_dp", "version": 2, "kind": "run",
   "files": ["checkpoint.msgpack", "config.json", ...], "dirs": ["T=10", ...],
   "sha256": {"checkpoint.msgpack": "9f2c...", "config.json": "41ab...", ...}}

``files`` are the names of the files the project wrote there (added *before* each
file is first written, so a kill never leaves an unlisted file of ours), ``sha256``
the digest of each one's content as the project last wrote it (recorded between
writing the temporary file and renaming it; version 1 manifests have none) and
``dirs`` the relative paths of the project directories it created inside (each with
its own manifest; the folders on the way, e.g. a sweep's ``points/``, are the
project's too). Files are written to a temporary name and renamed (atomic on POSIX)
with the mode a plain ``open`` gives (``0o666`` less the umask).

A single file named by ``--out`` (a plot, an audit's JSON) is listed the same way in
its directory's manifest; a directory that is not the project's gets a manifest of
kind ``'files'`` (:data:`FILES_KIND`) that lists only those files and makes the
directory no more the project's than it was. :func:`check_file` refuses, before any
compute, an existing file there that the project did not write, or wrote and the
user changed since, unless ``overwrite`` (the user named that file).

Rules (:func:`claim`):

* A missing or empty directory is created and gets a manifest.
* A directory with a manifest of the same kind resumes. Files the user added there
  are left alone, unless one has the name of a file the project is about to write
  (it would be replaced), or one of the project's files was changed since it wrote
  it (resuming rewrites them): that is refused, named.
* ``overwrite`` removes only the listed files and the project's directories (only
  once empty). If anything else is there, nothing is removed and the first such
  path is named. Nor is anything removed if a listed file was changed since the
  project wrote it (its digest differs: the user edited ``config.json``, replaced
  ``metrics.png``); the first is named, and only ``overwrite=EDITED`` (the CLI's
  ``--overwrite-edited``) removes it too.
* A directory of another kind (a sweep into a run directory, a run into a sweep
  directory or a sweep's point) is refused, with or without ``overwrite``.
* A non-empty directory without a manifest is refused, with or without
  ``overwrite``, unless it is a run or sweep directory of an older version (which
  wrote no manifest): then the manifest of the files present is written and the
  directory resumes like any other. Recognition (:func:`legacy_kind`): a run
  directory holds nothing but the files a run writes (:data:`RUN_FILES`, their
  temporary files ``.NAME.*``) and ``T=<rounds>`` directories that are themselves
  such run directories, and its ``config.json`` is a JSON object with the config
  sections ``rounds``, ``seed``, ``data``, ``model`` and ``privacy``; a sweep
  directory holds nothing but ``sweep.json`` (a JSON object with ``config``,
  ``grid`` and ``points``), ``sweep.csv`` and a ``points/`` directory of such run
  directories. Anything else in it (a ``src/``, a ``notes.txt``) and it is a
  stranger's directory.

Paths are checked before any data is loaded or compiled (:func:`check_dir`,
:func:`check_file`): empty, a file where a directory is expected (or the reverse),
a parent that is not a directory, and a place where no file can be created
(permissions, a read-only file system, ``/proc``). Each is one :class:`OutputError`
line naming the path.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from fedjax_dp.errors import UserError, unreadable

MANIFEST = ".fedjax_dp.json"
RUN_KINDS = ("run", "sweep-point", "candidate")
# A directory of the user's in which the project wrote single files (``--out`` of
# plot and audit): its manifest lists those files only; the directory is not the
# project's (claim() treats it as a stranger's).
FILES_KIND = "files"
KINDS = RUN_KINDS + ("sweep", FILES_KIND)
# overwrite=EDITED: remove the project's files even where the user changed them since.
EDITED = "edited"
# Files whose digest guards nothing of the user's: state the project reads back and
# verifies itself (host/checkpoint.py refuses a changed checkpoint as corrupt, naming
# it, and --overwrite is the remedy it names).
UNGUARDED = ("checkpoint.msgpack",)
# The files each kind writes (what an older version's directory may hold).
RUN_FILES = ("config.json", "metrics.csv", "summary.json", "metrics.png",
             "checkpoint.msgpack", "model.msgpack", "optimal_t.csv")
SWEEP_FILES = ("sweep.json", "sweep.csv")
_CANDIDATE_DIR = re.compile(r"T=\d+")
_CONFIG_SECTIONS = ("rounds", "seed", "data", "model", "privacy")
_TEMP = re.compile(r"\.(.+)\.[0-9a-f]{16}")


class OutputError(UserError):
  """An output path that cannot or may not be written; one line naming it."""


# ---------------------------------------------------------------------------
# Writing files.


def _umask_mode(mode: int = 0o666) -> int:
  """``mode`` less the process umask (read without changing it where Linux allows)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return mode & ~int(line.split()[1], 8)
  except OSError:
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mode & ~mask


def atomic_write(path: str | os.PathLike, data: bytes, *, owned: bool = False) -> None:
  """Writes ``data`` to ``path`` through a temporary file and ``os.replace``.

  The file gets the mode a plain ``open`` would give it (``0o666`` less the umask),
  not ``tempfile.mkstemp``'s ``0o600``.

  Args:
    path: the file; missing parent directories are created.
    data: its bytes.
    owned: a file the project owns: it is listed in its directory's manifest before
      it is written (a directory without one gets a manifest of kind
      :data:`FILES_KIND`, or its older version's), and its digest is recorded
      before the rename.
  """
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  owned = owned and path.name != MANIFEST
  if owned:
    _ensure_manifest(path.parent)
    register(path.parent, files=[path.name])
  mode = _umask_mode()
  for _ in range(100):
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    try:
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
      break
    except FileExistsError:
      continue
  else:  # pragma: no cover - 100 collisions of 64 random bits
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))
  try:
    with os.fdopen(fd, "wb") as f:
      os.fchmod(f.fileno(), mode)  # exactly 0o666 & ~umask, whatever the file system
      f.write(data)
    if owned:  # a kill before the rename leaves tmp, whose digest is the recorded one
      register(path.parent, digests={path.name: hashlib.sha256(data).hexdigest()})
    os.replace(tmp, path)
  except BaseException:
    if os.path.lexists(tmp):
      os.unlink(tmp)
    raise


# ---------------------------------------------------------------------------
# Manifests.


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
  """The manifest of ``directory``, or None if it has none.

  Raises:
    OutputError: the manifest is unreadable.
  """
  path = Path(directory) / MANIFEST
  if not path.is_file():
    return None
  try:
    m = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    why = unreadable(e)
  else:
    digests = m.get("sha256", {}) if isinstance(m, dict) else None
    if (isinstance(m, dict) and m.get("kind") in KINDS and isinstance(m.get("files"), list)
        and isinstance(m.get("dirs"), list) and isinstance(digests, dict)):
      return {**m, "sha256": digests}  # (version 1 recorded no digests)
    why = "not a fedjax-dp manifest"
  raise OutputError(f"{path}: unreadable ({why}); this directory's files cannot be told "
                    "apart from others, use another --out")


def _write_manifest(directory: Path, kind: str, files: Iterable[str] = (),
                    dirs: Iterable[str] = (), digests: dict[str, str] | None = None) -> None:
  files = sorted(set(files))
  m = {"written_by": "fedjax_dp", "version": 2, "kind": kind, "files": files,
       "dirs": sorted(set(dirs)),
       "sha256": {n: d for n, d in sorted((digests or {}).items()) if n in files}}
  atomic_write(directory / MANIFEST, (json.dumps(m, indent=1) + "\n").encode())


def register(directory: str | os.PathLike, files: Sequence[str] = (),
             dirs: Sequence[str] = (), digests: dict[str, str] | None = None) -> None:
  """Adds ``files`` (names), ``dirs`` (relative paths) and the ``digests`` (SHA-256
  by name, of listed files) to ``directory``'s manifest, if it has one (a directory
  without one is not the project's)."""
  directory = Path(directory)
  m = read_manifest(directory)
  if m is None:
    return
  known = {**m["sha256"], **(digests or {})}
  if (set(files) <= set(m["files"]) and set(dirs) <= set(m["dirs"])
      and known == m["sha256"]):
    return
  _write_manifest(directory, m["kind"], [*m["files"], *files], [*m["dirs"], *dirs], known)


def _ensure_manifest(directory: Path) -> None:
  """Gives ``directory`` a manifest if it has none: an older version's run or sweep
  directory is adopted as such, any other gets one of kind :data:`FILES_KIND`."""
  if read_manifest(directory) is not None:
    return
  found = legacy_kind(directory) if any(directory.iterdir()) else None
  if found is not None:
    _adopt(directory, found)
  else:
    _write_manifest(directory, FILES_KIND)


def sha256_file(path: str | os.PathLike) -> str:
  """The SHA-256 of a file's content (hex), read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def changed(path: str | os.PathLike, manifest: dict[str, Any] | None = None) -> bool:
  """Whether the listed file ``path`` differs from what the project last wrote there.

  False where no digest was recorded (a version 1 manifest) or the file is gone; a
  write killed between recording the digest and the rename left the recorded
  content in its temporary file, and the file is the project's previous version.
  """
  path = Path(path)
  m = read_manifest(path.parent) if manifest is None else manifest
  want = None if m is None else m["sha256"].get(path.name)
  if want is None or not path.is_file() or path.is_symlink() or sha256_file(path) == want:
    return False
  temps = path.parent.glob(f".{glob.escape(path.name)}.*")
  return not any(_temp_of(t.name) == path.name and sha256_file(t) == want for t in temps)


# ---------------------------------------------------------------------------
# What is the project's in a directory.


def _entries(directory: Path) -> list[Path]:
  return sorted(directory.iterdir())


def _is_dir(p: Path) -> bool:
  return p.is_dir() and not p.is_symlink()  # never follow a link into someone's tree


def _temp_of(name: str) -> str | None:
  """The file a temporary file ``.NAME.<hex>`` of :func:`atomic_write` belongs to."""
  m = _TEMP.fullmatch(name)
  return m.group(1) if m else None


def _sort_out(root: Path, m: dict[str, Any], rel: str = "") -> tuple[list[Path], list[Path],
                                                                   list[Path]]:
  """``(files, dirs, foreign)`` under ``root/rel`` by ``root``'s manifest ``m``:
  the project's files, its directories (deepest first) and the entries that are
  neither (a foreign folder, not its contents), in sorted order."""
  base = root / rel if rel else root
  names = {*m["files"], MANIFEST}
  files, dirs, foreign = [], [], []
  for e in _entries(base):
    r = f"{rel}{e.name}"
    if e.is_symlink():  # the project writes no links: the user's, even under a listed name
      foreign.append(e)
    elif not _is_dir(e):
      (files if (not rel and (e.name in names or _temp_of(e.name) in names))
       else foreign).append(e)
    elif r in m["dirs"]:
      f, d, x = _sort_child(e)
      files, dirs, foreign = files + f, dirs + d + [e], foreign + x
    elif any(d.startswith(r + "/") for d in m["dirs"]):  # a folder on the way (points/)
      f, d, x = _sort_out(root, m, r + "/")
      files, dirs, foreign = files + f, dirs + d + [e], foreign + x
    else:
      foreign.append(e)
  return files, dirs, foreign


def _sort_child(directory: Path) -> tuple[list[Path], list[Path], list[Path]]:
  m = read_manifest(directory)
  if m is not None:
    return _sort_out(directory, m)
  # A project directory killed between its creation and its manifest: empty.
  return [], [], _entries(directory)


def foreign(directory: str | os.PathLike) -> list[Path]:
  """Paths under a project ``directory`` that the project did not write (sorted;
  a foreign folder is named, not its contents)."""
  directory = Path(directory)
  m = read_manifest(directory)
  return _entries(directory) if m is None else _sort_out(directory, m)[2]


def _first_changed(files: Sequence[Path]) -> Path | None:
  """The first of the project's ``files`` that was changed since it wrote it."""
  manifests: dict[Path, dict[str, Any] | None] = {}
  for p in files:
    if p.name in (MANIFEST, *UNGUARDED) or _temp_of(p.name):
      continue
    if p.parent not in manifests:
      manifests[p.parent] = read_manifest(p.parent)
    if changed(p, manifests[p.parent]):
      return p
  return None


def remove_owned(directory: str | os.PathLike, overwrite: bool | str = True) -> None:
  """Removes what the project wrote under ``directory`` (keeping ``directory``).

  Args:
    directory: a project directory.
    overwrite: :data:`EDITED` removes also the project's files that were changed
      since it wrote them; anything else refuses them.

  Raises:
    OutputError: something else is there, or one of the project's files was changed
      (nothing is removed); names the first.
  """
  directory = Path(directory)
  m = read_manifest(directory)
  files, dirs, strangers = ([], [], _entries(directory)) if m is None else _sort_out(
      directory, m)
  if strangers:
    raise OutputError(f"--out {directory}: --overwrite removes only what fedjax-dp wrote, and "
                      f"{strangers[0]} is not; nothing was removed (move it away or use "
                      "another --out)")
  edited = None if overwrite == EDITED else _first_changed(files)
  if edited is not None:
    raise OutputError(f"--out {directory}: {edited} was changed since fedjax-dp wrote it; "
                      "nothing was removed (move it away, or --overwrite-edited removes it "
                      "too)")
  # Manifests last, deepest first: an interrupted removal leaves directories that
  # still say what is theirs.
  files.sort(key=lambda p: (p.name == MANIFEST, -len(p.parts)))
  for p in files:
    p.unlink(missing_ok=True)
  for d in dirs:  # deepest first
    try:
      d.rmdir()
    except OSError:
      pass


# ---------------------------------------------------------------------------
# Directories of older versions (no manifest).


def _json_object(path: Path, keys: Sequence[str]) -> bool:
  try:
    obj = json.loads(path.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(obj, dict) and all(k in obj for k in keys)


def _legacy_run(directory: Path, kind: str) -> list[tuple[Path, str, list[str], list[str]]]:
  """The manifests that adopt ``directory`` as a run of an older version, or []."""
  adopted, files, dirs = [], [], []
  for e in _entries(directory):
    if not _is_dir(e):
      if e.is_symlink() or not (e.name in RUN_FILES or _temp_of(e.name) in RUN_FILES):
        return []
      files.append(e.name)
    elif kind != "candidate" and _CANDIDATE_DIR.fullmatch(e.name):
      child = _legacy_run(e, "candidate")
      if not child:
        return []
      adopted += child
      dirs.append(e.name)
    else:
      return []
  if set(files) - {n for n in files if _temp_of(n)} and not _json_object(
      directory / "config.json", _CONFIG_SECTIONS):
    return []
  return adopted + [(directory, kind, files, dirs)]


def _legacy_sweep(directory: Path) -> list[tuple[Path, str, list[str], list[str]]]:
  adopted, files, dirs = [], [], []
  for e in _entries(directory):
    if not _is_dir(e):
      if e.is_symlink() or not (e.name in SWEEP_FILES or _temp_of(e.name) in SWEEP_FILES):
        return []
      files.append(e.name)
    elif e.name == "points":
      for p in _entries(e):
        if not _is_dir(p):
          return []
        child = _legacy_run(p, "sweep-point")
        if not child:
          return []
        adopted += child
        dirs.append(f"points/{p.name}")
    else:
      return []
  if not _json_object(directory / "sweep.json", ("config", "grid", "points")):
    return []
  return adopted + [(directory, "sweep", files, dirs)]


def legacy_kind(directory: str | os.PathLike) -> str | None:
  """``'run'`` or ``'sweep'`` if ``directory`` (without a manifest) is one written by
  an older version (see the module docstring), else None."""
  directory = Path(directory)
  if _legacy_run(directory, "run"):
    return "run"
  return "sweep" if _legacy_sweep(directory) else None


def _adopt(directory: Path, kind: str) -> None:
  plan = _legacy_sweep(directory) if kind == "sweep" else _legacy_run(directory, kind)
  for path, k, files, dirs in plan:  # children first, the directory itself last
    _write_manifest(path, k, files, dirs, {n: sha256_file(path / n) for n in files
                                           if not _temp_of(n)})


# ---------------------------------------------------------------------------
# Checks before compute, and claiming a directory.


def _option(option: str, path: Any) -> str:
  return f"{option} {path}" if str(path) else f"{option} ''"


def _writable_in(directory: Path, option: str, path: Any) -> None:
  """Raises OutputError unless a file can be created in the existing ``directory``
  (a real attempt: permissions, read-only file systems and ``/proc`` all fail it)."""
  probe = directory / f".fedjax_dp_probe.{secrets.token_hex(8)}"
  try:
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
  except OSError as e:
    raise OutputError(f"{_option(option, path)}: cannot create files in {directory} "
                      f"({e.strerror or e})") from None
  probe.unlink()


def _existing_ancestor(path: Path, option: str, raw: Any) -> Path:
  """The nearest existing one of ``path`` and its parents; it must be a directory."""
  for a in (path, *path.parents):
    if os.path.lexists(a):
      if not a.is_dir():
        raise OutputError(f"{_option(option, raw)}: {a} is a file, not a directory")
      return a
  return Path.cwd()  # pragma: no cover - a relative path's parents end at '.'


def check_dir(path: str | os.PathLike | None, option: str = "--out") -> Path:
  """Checks, before any compute, that directory ``path`` can be created or written.

  Raises:
    OutputError: empty; a file; under a file; no file can be created there.
  """
  if path is None or not str(path).strip():
    raise OutputError(f"{_option(option, path or '')}: empty path; give a directory")
  p = Path(path)
  if p.exists() and not p.is_dir():
    raise OutputError(f"{_option(option, path)}: is a file, not a directory")
  _writable_in(_existing_ancestor(p, option, path), option, path)
  return p


def check_file(path: str | os.PathLike | None, default_name: str,
               suffixes: Sequence[str] | None = None, option: str = "--out", *,
               overwrite: bool = False) -> Path:
  """Checks, before any compute, an output file and returns the path to write.

  Write it with ``atomic_write(path, data, owned=True)``: it is then listed, with its
  digest, in its directory's manifest, and the same command may replace it again.

  Args:
    path: the path given.
    default_name: the file written inside ``path`` when ``path`` is an existing
      directory (e.g. ``plot.png``).
    suffixes: the accepted suffixes (without the dot); a path with another or none
      gets the first appended (``fig`` -> ``fig.png``). None: any.
    option: the option's name, for messages.
    overwrite: replace an existing file that the project did not write, or that it
      wrote and that was changed since (the user named it).

  Raises:
    OutputError: empty; the file's place is a directory, or under a file; no file
      can be created there; the file exists and is not the project's unchanged
      output (and not ``overwrite``).
  """
  if path is None or not str(path).strip():
    raise OutputError(f"{_option(option, path or '')}: empty path; give a file name")
  p = Path(path)
  if p.is_dir():
    p = p / default_name
  elif suffixes is not None and p.suffix.lower().lstrip(".") not in suffixes:
    p = p.with_name(p.name + "." + suffixes[0])
  if p.is_dir():
    raise OutputError(f"{_option(option, path)}: {p} is a directory")
  if p.name == MANIFEST:
    raise OutputError(f"{_option(option, path)}: {MANIFEST} is the name of fedjax-dp's list "
                      "of the files it wrote; choose another name")
  _writable_in(_existing_ancestor(p.parent, option, path), option, path)
  if os.path.lexists(p) and not overwrite:
    _check_replaceable(p, option, path)
  return p


def _check_replaceable(p: Path, option: str, raw: Any) -> None:
  """Refuses to replace ``p`` unless the project wrote it and it is unchanged."""
  m = read_manifest(p.parent)
  listed = m is not None and p.name in m["files"] and not p.is_symlink()
  if listed and not changed(p, m):
    return
  why = ("was changed since fedjax-dp wrote it" if listed else
         "exists and was not written by fedjax-dp")
  raise OutputError(f"{_option(option, raw)}: {p} {why}; --overwrite replaces it (or use "
                    f"another {option})")


def kind_of(directory: str | os.PathLike) -> str | None:
  """The kind of a project directory (its manifest's, or an older version's), else
  None (missing, empty, or a stranger's)."""
  directory = Path(directory)
  m = read_manifest(directory)
  if m is not None:
    return m["kind"]
  return legacy_kind(directory) if _is_dir(directory) and any(directory.iterdir()) else None


def _output_names(kind: str) -> tuple[str, ...]:
  return SWEEP_FILES + ("points",) if kind == "sweep" else RUN_FILES


def claim(path: str | os.PathLike, kind: str, *, overwrite: bool | str = False,
          accept: Sequence[str] | None = None, parent: str | os.PathLike | None = None,
          check: Callable[[Path], None] | None = None, option: str = "--out") -> Path:
  """Makes ``path`` a project directory of ``kind`` (see the module docstring).

  Args:
    path: the directory.
    kind: one of :data:`KINDS`; a new directory's manifest gets it.
    overwrite: remove what the project wrote there first (only that, and only what
      was not changed since; :data:`EDITED`: also what was).
    accept: kinds of an existing directory that may be resumed (default: ``kind``).
    parent: a project directory that ``path`` belongs to (a sweep's point, an
      ``optimal_t`` candidate): ``path`` is listed in its manifest.
    check: called with ``path`` when it holds earlier output to be resumed (not with
      ``overwrite``); raises to refuse (a run of another config, ...).
    option: the option's name, for messages.

  Returns:
    ``path`` as a Path.

  Raises:
    OutputError: see the module docstring; one line naming the path.
  """
  path = Path(path)
  accept = tuple(accept or (kind,))
  if os.path.lexists(path) and not path.is_dir():  # (a link to a directory is fine)
    raise OutputError(f"{_option(option, path)}: is a file, not a directory")
  if path.is_dir() and [e.name for e in path.iterdir()] == [MANIFEST] and (
      read_manifest(path)["kind"] == FILES_KIND):
    _write_manifest(path, kind)  # it lists only files of ours that are gone: empty
  if path.is_dir() and any(path.iterdir()):
    m = read_manifest(path)
    if m is not None and m["kind"] == FILES_KIND:  # someone's folder, with a plot of ours
      m = None
    found = m["kind"] if m else legacy_kind(path)
    if found is None:
      held = [e for e in _entries(path) if e.name != MANIFEST] or _entries(path)
      raise OutputError(
          f"{_option(option, path)}: not empty and not written by fedjax-dp (it holds "
          f"{held[0]}); use another --out" + (
              "" if overwrite else " (--overwrite removes only what fedjax-dp wrote)"))
    if found not in accept:
      raise OutputError(f"{_option(option, path)}: is a {found} directory, not a {kind} "
                        "directory; use another --out")
    if not overwrite:
      taken = [p for p in foreign(path) if p.name in _output_names(found)
               or _CANDIDATE_DIR.fullmatch(p.name)] if m is not None else []
      if taken:
        raise OutputError(f"{_option(option, path)}: {taken[0]} was not written by fedjax-dp "
                          "and would be replaced; move it away or use another --out")
      edited = _first_changed(_sort_out(path, m)[0]) if m is not None else None
      if edited is not None:  # (before check: an edited config.json is not another run's)
        raise OutputError(f"{_option(option, path)}: {edited} was changed since fedjax-dp wrote "
                          "it, and resuming would replace it; move it away, or "
                          "--overwrite-edited starts afresh")
      if check is not None:
        check(path)
    if m is None:  # an older version's: list its files (only once it is to be used)
      _adopt(path, found)
    if overwrite:
      remove_owned(path, overwrite)
  if parent is not None:  # listed before it is created: a kill leaves nothing unlisted
    register(parent, dirs=[path.relative_to(parent).as_posix()])
  try:
    path.mkdir(parents=True, exist_ok=True)
    if read_manifest(path) is None:
      _write_manifest(path, kind)
  except OSError as e:
    raise OutputError(f"{_option(option, path)}: cannot write there ({e.strerror or e})") from None
  return path
