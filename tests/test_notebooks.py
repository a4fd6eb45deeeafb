"""Notebooks execute end to end (in their reduced SMOKE mode)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch):
  # Covers quickstart.ipynb and wei2021_crd.ipynb (each in its SMOKE mode).
  monkeypatch.setenv("SMOKE", "1")
  nb = nbformat.read(path, as_version=4)
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": str(path.parent)}}).execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  errors = [o for o in outputs if o.get("output_type") == "error"]
  assert not errors
  if any("plt." in c.source for c in nb.cells if c.cell_type == "code"):
    # Figures really show (a backend switched to Agg would draw nothing).
    assert any("image/png" in o.get("data", {}) for o in outputs)


def test_wei2021_crd_notebook_is_valid():
  path = NOTEBOOK_DIR / "wei2021_crd.ipynb"
  assert path in NOTEBOOKS  # so test_notebook_runs executes it
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  assert nb.nbformat == 4 and nb.metadata.kernelspec.name == "python3"
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean
  source = "\n".join(c.source for c in nb.cells)
  for needle in ("run_sweep", '"optimal_t"', '"crd"', '"linear_decay"', "epsilon_certified",
                 '"horizon"', 'os.environ.get("SMOKE")', "wei_mnist_mlp.py",
                 "shared/datasets/mnist", "privacy.noise_sampling=aggregate",
                 "data.samples_per_client=100", "eval.every=1"):
    assert needle in source, needle


def test_every_notebook_starts_with_the_same_colab_setup_cell():
  # Notebooks open on Colab as they are: the first code cell installs the package there
  # (and does nothing elsewhere); every notebook carries the same cell.
  firsts = []
  for path in NOTEBOOKS:
    nb = nbformat.read(path, as_version=4)
    firsts.append(next(c.source for c in nb.cells if c.cell_type == "code"))
  assert firsts and all('"google.colab" in sys.modules' in s for s in firsts)
  assert len(set(firsts)) == 1
