"""The configs shipped with the package, loadable by name from any directory.

Each module here is a config file: ``get_config()`` returns an
``ml_collections.ConfigDict`` (``fedjax_dp.config.base_config()`` with fields set).
``fedjax_dp.config.load_config("quickstart")`` and ``fedjax-dp run quickstart`` find
them through :mod:`importlib.resources`, so they work from an installed package, a
notebook or a copy outside the repository. ``experiments/configs/<name>.py`` in the
repository re-exports them for the paths the scripts and docs use.
"""

from __future__ import annotations

# Listing and loading them is :mod:`fedjax_dp.config`'s (``config.shipped_names``).
from fedjax_dp.config import shipped_names as names

__all__ = ["names"]
