"""The persistent compilation cache: compiled programs kept on disk between processes.

A run compiles its round, its evaluation, the client-chunk probe and a few small
programs; on a CPU that is most of the time before the first round (docs/scaling.md,
"Time to the first round"). JAX can keep compiled executables on disk
(``jax_compilation_cache_dir``) and load them when the same program (same HLO, jaxlib,
backend, XLA flags and compile options: JAX's cache key) is compiled again, so a
second run of a config, a resumed run and a sweep re-run skip XLA's compiler. This
module turns that machinery on, by default, for every run (``compilation_cache`` in
the config, applied by :func:`fedjax_dp.host.building.build`):

* ``'auto'`` (the default): a directory JAX already has configured (the
  ``JAX_COMPILATION_CACHE_DIR`` environment variable, ``jax.config.update`` or
  ``jax.experimental.compilation_cache.compilation_cache.set_cache_dir``) is used as it
  is, thresholds included; otherwise :func:`default_dir`, in the user's cache directory.
* ``'off'``: no cache from fedjax_dp (one it turned on earlier in the process is turned
  off again); a directory configured in JAX itself stays JAX's business.
* a directory path: that directory.

The ``fedjax-dp`` commands read ``FEDJAX_DP_COMPILATION_CACHE`` (:data:`ENV`) into the
field (``--set compilation_cache=...`` wins over it); the library itself reads no
environment variable.

Nothing about the cache changes a result: an entry is the serialized executable
XLA compiled for the same key, so a loaded program computes exactly what a fresh
compile computes (``tests/test_compile_cache.py`` checks a run's metrics and final
model bit for bit with and without it). Compiled CPU code is specific to the CPU it
was compiled on (vector widths, FMA), which JAX's key does not include, so the
default directory has one folder per processor model and feature set
(:func:`host_tag`): a home directory shared by different machines never serves one
machine's code to another. A directory given explicitly, or configured in JAX, is
used as given. Entries are compressed with a checksum (zlib here): a truncated entry
(a process killed while writing) fails to load, JAX warns and compiles afresh. Remove
the directory to clear the cache.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path

# JAX is imported where it is used: the command line reads ENV before it loads JAX.
AUTO = "auto"
OFF = "off"
# Spellings of the two words a user may type in the environment switch.
_OFF_WORDS = (OFF, "0", "false", "no", "none")
_AUTO_WORDS = (AUTO, "", "1", "true", "on", "yes")
# The environment switch the command line reads (never the library).
ENV = "FEDJAX_DP_COMPILATION_CACHE"
# JAX writes only programs that took at least this long to compile (its default is
# 1 s). A run's smaller programs (model init, evaluation, schedules' helpers) take
# 0.05-0.5 s each on a CPU and are many; loading one takes milliseconds.
MIN_COMPILE_SECONDS = 0.0
_MIN_COMPILE_KEY = "jax_persistent_cache_min_compile_time_secs"
_DIR_KEY = "jax_compilation_cache_dir"

# The directory this module configured in JAX (None: it configured none).
_ours: str | None = None


def user_cache_root() -> Path:
  """The user's cache directory: ``$XDG_CACHE_HOME`` or ``~/.cache`` (Linux and
  other Unix), ``~/Library/Caches`` (macOS), ``%LOCALAPPDATA%`` (Windows)."""
  if sys.platform == "darwin":
    return Path.home() / "Library" / "Caches"
  if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
    return Path(os.environ["LOCALAPPDATA"])
  xdg = os.environ.get("XDG_CACHE_HOME")
  return Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"


def host_tag() -> str:
  """A short name for this processor: its architecture and a hash of its model name
  and feature flags (``/proc/cpuinfo``; elsewhere ``platform.processor()``)."""
  text = platform.processor() or ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      lines = f.read().split("\n\n")[0].splitlines()
    keep = ("model name", "flags", "features", "cpu model", "isa")
    text = "\n".join(line for line in lines if line.split(":")[0].strip().lower() in keep)
  except OSError:
    pass
  digest = hashlib.sha256(text.encode()).hexdigest()[:12]
  return f"{platform.machine() or 'cpu'}-{digest}"


def default_dir() -> Path:
  """Where ``'auto'`` keeps compiled programs: the user's cache directory,
  ``fedjax_dp/xla/<host_tag>``."""
  return user_cache_root() / "fedjax_dp" / "xla" / host_tag()


def active_dir() -> str | None:
  """The directory JAX's persistent cache uses now (None: none)."""
  import jax
  return getattr(jax.config, _DIR_KEY) or None


def use(setting: str) -> str | None:
  """Applies a ``compilation_cache`` setting to this process (see the module docstring).

  Call before the programs it should cover are compiled; JAX reads the directory at
  the next compilation.

  Args:
    setting: ``'auto'``, ``'off'`` or a directory path (``0``, ``false``, ``no``,
      ``none`` also mean off; ``1``, ``true``, ``on``, ``yes`` and ``''`` auto).

  Returns:
    The directory JAX's cache now uses (None: none). A directory that cannot be
    created is reported with a warning and the run goes on without a cache.
  """
  import jax
  global _ours
  setting = str(setting).strip()
  configured = active_dir()
  theirs = configured if configured and configured != _ours else None
  if setting.lower() in _OFF_WORDS:
    if _ours is not None and configured == _ours:
      _set_dir(None)
    _ours = None
    return theirs
  if setting.lower() in _AUTO_WORDS:
    if theirs:
      return theirs  # the user's own JAX setting, thresholds and all
    target = default_dir()
  else:
    target = Path(setting).expanduser()
  target = os.path.abspath(target)
  if target == configured:
    _ours = target if theirs is None else _ours
    return target
  try:
    Path(target).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    warnings.warn(f"compilation_cache: cannot create {target} ({e.strerror or e}); "
                  "compiling without a persistent cache", stacklevel=2)
    return theirs
  if getattr(jax.config, _MIN_COMPILE_KEY) == 1.0 and not os.environ.get(
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
    jax.config.update(_MIN_COMPILE_KEY, MIN_COMPILE_SECONDS)  # JAX's default: not the user's
  _set_dir(target)
  _ours = target
  return target


def _set_dir(path: str | None) -> None:
  """Points JAX's cache at ``path`` and drops the cache object JAX built for the old
  one (JAX reads the directory once, at the first compilation after a reset)."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  jax.config.update(_DIR_KEY, path)
  compilation_cache.reset_cache()
