"""Small fixtures shared by the tests: toy federated data and reduced configs."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp.data.federated import build_federated_data

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
# A subprocess, notebook kernel or cell that makes no progress for this long is hung.
# It is a limit for a hang, never for slowness: the suite shares two cores with other
# work, where a subprocess that compiles an eight-device program for a minute on a
# quiet machine takes ten or more.
HANG_S = 3600


def toy_federated(num_clients=6, n=20, shape=(4, 4, 1), classes=3, seed=0, n_max=None):
  """Random clients with between n/2 and n examples each (``FederatedData``)."""
  rng = np.random.default_rng(seed)
  sizes = rng.integers(n // 2, n + 1, num_clients)
  x = rng.normal(size=(sizes.sum(),) + shape).astype(np.float32)
  y = rng.integers(0, classes, sizes.sum()).astype(np.int32)
  bounds = np.concatenate([[0], np.cumsum(sizes)])
  clients = [np.arange(bounds[i], bounds[i + 1]) for i in range(num_clients)]
  return build_federated_data(x, y, clients, n_max=n_max)


def small_config(defaults: dict, **sets):
  """The quickstart config with ``defaults`` then ``sets`` applied as overrides.

  All clients at once (``server.client_chunk=0``) unless a test says otherwise: the
  default (-1) compiles two probe rounds per new config, which tiny rounds do not
  need; tests/test_chunking.py and test_noise_sampling.py cover -1.
  """
  base = {"server.client_chunk": "0", **defaults}
  base.update(sets)
  return config_lib.override(config_lib.load_config(QUICKSTART),
                             [f"{k}={v}" for k, v in base.items()])


# Metric columns compared between runs that must agree (sweep vs single run, ...).
FLOAT_COLUMNS = ("test_loss", "test_accuracy", "train_loss", "grad_norm", "update_norm",
                 "noise_mean", "epsilon_claimed", "epsilon_certified")


def assert_rows_close(got, want, columns=FLOAT_COLUMNS):
  """Two runs' metric rows agree: same rounds and cohort sizes, floats within 2e-5."""
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert int(g["round"]) == int(w["round"])
    assert int(g["num_selected"]) == int(w["num_selected"])
    for c in columns:
      a, b = g[c], w[c]
      if a in ("", None) or b in ("", None):
        assert a in ("", None) and b in ("", None), c
      else:
        np.testing.assert_allclose(float(a), float(b), rtol=2e-5, atol=1e-6, err_msg=c)


def load_experiment(paper: str, name: str):
  """``experiments/<paper>/<name>.py`` as a module. The papers' scripts import their
  siblings by bare name (``common``): another paper's cached ones are hidden while
  these load and put back after, so no test sees the wrong paper's ``common``."""
  here = ROOT / "experiments" / paper
  siblings = {p.stem for p in here.glob("*.py")}
  saved = {k: sys.modules.pop(k) for k in siblings if k in sys.modules}
  sys.path.insert(0, str(here))
  try:
    spec = importlib.util.spec_from_file_location(f"{paper}_{name}_for_test",
                                                  here / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  finally:
    sys.path.remove(str(here))
    for k in siblings:
      sys.modules.pop(k, None)
    sys.modules.update(saved)
  return mod
