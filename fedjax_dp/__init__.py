"""fedjax_dp: differentially private federated learning simulated in JAX.

The public Python API (docs/api.md) is :mod:`fedjax_dp.api`; its names (``api.__all__``)
are exported here on first use: ``fedjax_dp.run``, ``fedjax_dp.sweep``,
``fedjax_dp.federation``, ... so that ``import fedjax_dp.config`` (the CLI's start)
imports no JAX. docs/architecture.md maps the modules.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
  if name == "sweep":  # the module fedjax_dp.sweep, callable as the API's sweep
    return importlib.import_module("fedjax_dp.sweep")
  if name.startswith("__") and name != "__all__":
    raise AttributeError(f"module 'fedjax_dp' has no attribute {name!r}")
  # ``from fedjax_dp import optimizers`` inside the package asks for a submodule first;
  # answering it through the API would import the API (and the whole host floor) while
  # a low module is half initialised: an import circle.
  if importlib.util.find_spec(f"{__name__}.{name}") is not None:
    return importlib.import_module(f"{__name__}.{name}")
  api = importlib.import_module("fedjax_dp.api")
  if name == "__all__":
    return list(api.__all__)
  if name in api.__all__:
    return getattr(api, name)
  raise AttributeError(f"module 'fedjax_dp' has no attribute {name!r}")
