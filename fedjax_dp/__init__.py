"""fedjax_dp: differentially private federated learning simulated in JAX.

The public Python API (docs/api.md) is :mod:`fedjax_dp.api`, whose names are
exported here: ``fedjax_dp.run``, ``fedjax_dp.sweep``, ``fedjax_dp.federation``, ...
They load on first use, so ``import fedjax_dp.config`` (the CLI's start) imports no
JAX. docs/architecture.md maps the modules.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
  "ConfigError",
  "Federation",
  "Result",
  "SweepResult",
  "fedprox",
  "federation",
  "make_config",
  "run",
  "sweep",
  "user_model",
]


def __getattr__(name: str) -> Any:
  if name == "sweep":  # the module fedjax_dp.sweep, callable as the API's sweep
    return importlib.import_module("fedjax_dp.sweep")
  if name in __all__:
    return getattr(importlib.import_module("fedjax_dp.api"), name)
  raise AttributeError(f"module 'fedjax_dp' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
