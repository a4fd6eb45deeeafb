"""Test-suite settings: property tests draw the same examples on every run, XLA
compiles without LLVM optimization and with its loop emitters, and compiled programs
are kept in a temporary persistent cache shared by the session's workers."""

import os
import shutil
import sys
import tempfile

from hypothesis import HealthCheck, settings

# Compiling dominates the suite's time (hundreds of tiny programs, each run a few times);
# without LLVM's optimization passes XLA:CPU compiles about twice as fast and gives the
# same numbers on these sizes. Set before any jax backend starts (XLA reads the flags
# once); subprocesses (notebook kernels, CLI runs) inherit them. A flag the caller
# gives wins.
# XLA:CPU's newer fusion emitters compile more slowly than the loop emitters they
# replace: turning them off cut the CPU time of the engine, conv and audit tests by a
# quarter (421 -> 316 CPU s, one A/B run side by side) with the same results.
_SUITE_XLA_FLAGS = {"--xla_backend_optimization_level": "0",
                    "--xla_cpu_use_fusion_emitters": "false"}
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", "")]
    + [f"{k}={v}" for k, v in _SUITE_XLA_FLAGS.items()
       if k not in os.environ.get("XLA_FLAGS", "")]).strip()

# The persistent compilation cache (fedjax_dp.compile_cache, on by default in the user's
# cache directory) goes to a temporary directory for the session: nothing is written
# to the user's cache, and a program compiled by one worker is loaded by the others.
# The controller creates it before the workers start (they inherit the environment);
# runs with compilation_cache='auto' use the directory configured in JAX.
_CACHE_ENV = "FEDJAX_DP_TEST_COMPILATION_CACHE"
_OWN_CACHE = _CACHE_ENV not in os.environ
if _OWN_CACHE:
  os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="fedjax_dp_test_xla_cache_")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_CACHE_ENV]
os.environ.pop("FEDJAX_DP_COMPILATION_CACHE", None)  # the user's switch: not in the tests
if "jax" in sys.modules:  # a plugin imported JAX before this file: tell it directly
  sys.modules["jax"].config.update("jax_compilation_cache_dir", os.environ[_CACHE_ENV])


def pytest_unconfigure(config):  # pylint: disable=unused-argument
  if _OWN_CACHE:
    shutil.rmtree(os.environ.get(_CACHE_ENV, ""), ignore_errors=True)


# Derandomized: a property test that passes once passes in CI too; a new
# counterexample is found by raising max_examples locally, not by chance in CI.
# No clock: neither a deadline per example nor the health check that times the
# examples' generation (too_slow, about a second) -- both fail on a loaded machine.
settings.register_profile("fedjax_dp", derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fedjax_dp")


def pytest_xdist_auto_num_workers(config):  # pylint: disable=unused-argument
  """``-n auto``: a worker per core, at most 4, and at most one per 5 GB of memory
  (a worker peaks at about 4.2 GB: its compiled programs and datasets; beyond 4 the
  suite's longest tests bound it anyway)."""
  try:
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError, AttributeError):  # no sysconf (Windows): cores alone
    memory_gb = float("inf")
  return int(max(1, min(os.cpu_count() or 1, 4, memory_gb // 5)))
