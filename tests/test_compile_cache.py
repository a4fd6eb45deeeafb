"""The persistent compilation cache (fedjax_dp.compile_cache): where it goes, how it is
switched off, and that a run loading its programs from it gives the same bits."""

import math
import os
import warnings

import jax
import numpy as np
import pytest
from _helpers import small_config

from fedjax_dp import cli, compile_cache, experiment
from fedjax_dp.config import noise_identity, schema
from fedjax_dp.host import checkpoint

KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


@pytest.fixture
def jax_cache_state(monkeypatch):
  """Restores JAX's cache settings and the module's record of them afterwards (the
  session's temporary cache, tests/conftest.py)."""
  old = {k: getattr(jax.config, k) for k in KEYS}
  monkeypatch.setattr(compile_cache, "_ours", compile_cache._ours)
  yield
  for k, v in old.items():
    jax.config.update(k, v)
  from jax.experimental.compilation_cache import compilation_cache as jax_cc
  jax_cc.reset_cache()


def test_auto_uses_a_directory_configured_in_jax(jax_cache_state, tmp_path):
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
  compile_cache._ours = None
  assert compile_cache.use("auto") == str(tmp_path / "theirs")
  assert compile_cache.active_dir() == str(tmp_path / "theirs")
  # 'off' leaves a directory the user configured in JAX alone.
  assert compile_cache.use("off") == str(tmp_path / "theirs")
  assert compile_cache.active_dir() == str(tmp_path / "theirs")


def test_auto_without_one_uses_the_users_cache_directory(jax_cache_state, tmp_path,
                                                          monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  jax.config.update("jax_compilation_cache_dir", None)
  compile_cache._ours = None
  got = compile_cache.use("auto")
  assert got == str(compile_cache.default_dir()) == compile_cache.active_dir()
  assert got.startswith(str(tmp_path / "xdg" / "fedjax_dp" / "xla"))
  assert os.path.isdir(got)
  assert compile_cache.host_tag() in got  # one folder per processor
  # 'off' turns off the cache this module turned on; 'auto' turns it on again.
  assert compile_cache.use("off") is None and compile_cache.active_dir() is None
  assert compile_cache.use("auto") == got
  # What a user may type in FEDJAX_DP_COMPILATION_CACHE: never a directory named "0".
  assert compile_cache.use("0") is None and compile_cache.active_dir() is None
  assert compile_cache.use("true") == got


def test_a_path_is_used_and_an_unwritable_one_is_a_warning(jax_cache_state, tmp_path):
  assert compile_cache.use(str(tmp_path / "mine")) == str(tmp_path / "mine")
  assert compile_cache.active_dir() == str(tmp_path / "mine")
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.warns(UserWarning, match="compilation_cache: cannot create"):
    assert compile_cache.use(str(blocker / "sub")) is None
  assert compile_cache.active_dir() == str(tmp_path / "mine")  # unchanged


def test_cli_reads_the_environment_switch_and_set_wins(monkeypatch):
  class Args:
    set = ["rounds=3"]

  monkeypatch.delenv(compile_cache.ENV, raising=False)
  assert cli._overrides(Args) == ["rounds=3"]
  monkeypatch.setenv(compile_cache.ENV, "off")
  assert cli._overrides(Args) == ["compilation_cache=off", "rounds=3"]
  Args.set = ["compilation_cache=/tmp/x"]
  assert cli._overrides(Args)[-1] == "compilation_cache=/tmp/x"  # applied last: wins


def test_the_field_changes_no_release_and_a_run_resumes_across_it():
  a = small_config({"compilation_cache": "off"})
  b = small_config({"compilation_cache": "auto"})
  assert np.array_equal(noise_identity.stream(a), noise_identity.stream(b))
  assert checkpoint.config_diff(a.to_dict(), b.to_dict()) == []
  # A config stored before the field existed reads it at its default.
  old = {k: v for k, v in a.to_dict().items() if k != "compilation_cache"}
  assert schema.upgraded(old)["compilation_cache"] == "auto"


class _Events:
  """Counts the persistent cache's hits and XLA compilations while in use."""

  def __init__(self):
    self.hits = self.compiles = 0

  def count(self, event, **kw):
    del kw
    self.hits += event == "/jax/compilation_cache/cache_hits"

  def duration(self, event, duration, **kw):
    del duration, kw
    self.compiles += event == "/jax/core/compile/backend_compile_duration"

  def __enter__(self):
    jax.monitoring.register_event_listener(self.count)
    jax.monitoring.register_event_duration_secs_listener(self.duration)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_listener(self.count)
    jax.monitoring.unregister_event_duration_listener(self.duration)


def _run(cfg):
  jax.clear_caches()  # every program compiled (or loaded) anew, as in a fresh process
  with _Events() as events:
    result = experiment.run(cfg)
  return result, events


def _same_bits(a, b):
  for ra, rb in zip(a.rows, b.rows, strict=True):
    for k, v in ra.items():
      if k != "wall_s":
        w = rb[k]
        assert (v == w or (isinstance(v, float) and math.isnan(v) and math.isnan(w))), k
  for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params),
                  strict=True):
    assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_programs_loaded_from_the_cache_give_the_same_bits(jax_cache_state, tmp_path):
  # Per-example clipping, upload noise, the chunk probe (client_chunk -1) and the
  # evaluation: every program of a run, compiled without a cache, compiled into an
  # empty one, and loaded from it.
  sets = {"rounds": "2", "server.client_chunk": "-1", "progress": "false",
          "model.name": "logistic", "data.num_clients": "5", "data.samples_per_client": "24",
          "server.clients_per_round": "3"}
  compile_cache._set_dir(None)  # not even the session's (tests/conftest.py)
  compile_cache._ours = None
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # every program kept
  without, events = _run(small_config(sets, compilation_cache="off"))
  assert compile_cache.active_dir() is None and events.hits == 0
  cold, events = _run(small_config(sets, compilation_cache=str(tmp_path / "c")))
  assert events.hits == 0 and any((tmp_path / "c").iterdir())
  with warnings.catch_warnings():
    # JAX warns (and compiles) when an entry cannot be read: none may fail.
    warnings.filterwarnings("error", message=".*persistent compilation cache.*")
    warm, events = _run(small_config(sets, compilation_cache=str(tmp_path / "c")))
  # Every program loaded, none compiled: the round, the evaluation, the probe, the
  # initialisation and the small helpers.
  assert events.hits == events.compiles >= 4
  _same_bits(without, cold)
  _same_bits(without, warm)
