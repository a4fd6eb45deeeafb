"""No import circles: the package's module-level imports form a graph without cycles,
and a low module imports on its own in a fresh interpreter (``from fedjax_dp.training
import engine`` once failed: ``from fedjax_dp import optimizers`` went through the
package's lazy API export, which imports the host floor above it)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedjax_dp"


def _module_name(path: Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
  return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _targets(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
  """The package modules ``name`` imports at module level (not inside functions,
  where imports are deliberately lazy, nor under ``if TYPE_CHECKING``)."""
  out = set()
  is_pkg = path.name == "__init__.py"
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name in modules}
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # relative
        base = name.split(".")[: len(name.split(".")) - node.level + is_pkg]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module or ""
      for a in node.names:
        if f"{mod}.{a.name}" in modules:  # a submodule, imported as such
          out.add(f"{mod}.{a.name}")
        elif mod in modules:
          out.add(mod)
  return out - {name}


def test_module_level_imports_have_no_cycle():
  modules = _modules()
  graph = {n: _targets(n, p, modules) for n, p in modules.items()}
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(n):
    state[n] = 1
    stack.append(n)
    for m in sorted(graph[n]):
      if state.get(m) == 1:
        raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
      if m not in state:
        visit(m)
    stack.pop()
    state[n] = 2

  for n in sorted(graph):
    if n not in state:
      visit(n)


def test_a_low_module_imports_alone():
  code = ("from fedjax_dp.training import engine, rounds; "
          "import fedjax_dp; assert callable(fedjax_dp.run)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
