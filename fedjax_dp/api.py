"""The Python API: a user's own data, model, loss and optimizers, run from a notebook.

::

  import fedjax_dp as fd
  fed = fd.federation([(x_i, y_i) for ...], test=(x_test, y_test), name="my_data")
  res = fd.run("quickstart", {"privacy.epsilon": 4, "rounds": 5},
               federation=fed, model=MyFlaxModule())
  res.metrics            # pandas.DataFrame, one row per evaluated round
  res.epsilon            # the certified epsilon (summary["epsilon_certified"])

The config stays the one description of hyperparameters (the CLI's): a base config
(a shipped name, a path, a ConfigDict or dict, or None for the defaults) with dotted
overrides as ``--set`` takes them, plus the Python objects. Every path runs the CLI's
validation (config fields, the privacy plan's refusals, the builder's checks), takes
the number of clients and their sizes from the data given (a config that disagrees is
an error naming both), and refuses, before compute, a model whose output does not fit
the labels and a loss that does not return one value per example
(:func:`fedjax_dp.models.adapters.check_fits`). The run's record (``config.json``'s
``data.name``, ``model.name='python'``; ``summary.json``'s ``data_source``) names the
data and the model given, their shapes and content fingerprints; the noise stream
hashes both (:mod:`fedjax_dp.config.noise_identity`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp import sweep as sweep_lib
from fedjax_dp.config import ConfigError
from fedjax_dp.data.given import Federation, federation
from fedjax_dp.models.adapters import PYTHON_MODEL, UserSpec, fedprox

# The package exports these (fedjax_dp/__init__.py, on first use).
__all__ = [
  "ConfigError",
  "Federation",
  "Result",
  "SweepResult",
  "federation",
  "fedprox",
  "make_config",
  "run",
  "sweep",
  "user_model",
]

Overrides = Mapping[str, Any] | Sequence[str] | None


def user_model(model: Any, *, loss: str | Callable | None = None,
               global_term: Callable | None = None, name: str | None = None) -> UserSpec:
  """A user's model for :func:`run`: a ``flax.linen`` module, a ``flax.nnx`` module
  (or a function ``rngs -> module``, drawn from the run's seed), or an
  ``(init, apply)`` pair (``init(key) -> params``, ``apply(params, x [n, ...]) ->
  outputs [n, C]``).

  Args:
    model: the model.
    loss: a named loss (``cross_entropy``, ``hinge``, ``mse``) or a per-example loss
      ``(outputs [n, C], labels [n]) -> [n]``; default cross-entropy (mse for real
      targets).
    global_term: ``(params, global_params) -> scalar`` added to every example's loss,
      the round's global model bound (:func:`fedprox`); clipped with the loss.
    name: what the run's record calls it (default: the class or function name).
  """
  if isinstance(model, UserSpec):
    return model
  default = type(model).__name__ if not isinstance(model, tuple) else getattr(
      model[1], "__name__", "functions")
  if callable(model) and getattr(model, "__name__", None) and not hasattr(model, "apply"):
    default = model.__name__
  return UserSpec(model, loss, global_term, name or default)


def make_config(base: Any = None, overrides: Overrides = None):
  """The run's config: ``base`` (None: the defaults; a shipped name such as
  ``"quickstart"``; a path; a ConfigDict or dict) with ``overrides`` (``{"privacy.epsilon":
  4}`` or ``["privacy.epsilon=4"]``, as the CLI's ``--set``) applied and validated.

  Raises:
    ConfigError: unknown keys (with suggestions), bad values, refused combinations.
  """
  cfg = _config(base, overrides)
  config_lib.validate(cfg)
  return cfg


def _config(base: Any, overrides: Overrides):
  """:func:`make_config` before validation (the objects given still to be described)."""
  if base is None:
    cfg = config_lib.base_config()
  elif isinstance(base, (str, os.PathLike)):
    cfg = config_lib.load_config(base)
  elif isinstance(base, Mapping) and not hasattr(base, "to_dict"):
    cfg = config_lib.from_dict(dict(base), "config")
  else:
    cfg = config_lib.from_dict(base.to_dict(), "config")
  return config_lib.override(cfg, _sets(overrides))


def _sets(overrides: Overrides) -> list[str]:
  if overrides is None:
    return []
  if isinstance(overrides, Mapping):
    return [f"{k}={config_lib.as_set_text(v)}" for k, v in overrides.items()]
  if isinstance(overrides, str):
    raise ConfigError(f"overrides: expected a dict or a list of 'key=value', got the "
                      f"string {overrides!r}")
  return list(overrides)


@dataclasses.dataclass(frozen=True)
class Result:
  """A finished run.

  Attributes:
    params: the final global model (a pytree of arrays).
    metrics: ``pandas.DataFrame``, one row per evaluated round (``metrics.csv``'s columns).
    summary: ``summary.json`` as a dict (certified and claimed epsilon, privacy unit, ...).
    config: the run's full config.
    out_dir: its run directory, or None.
    test_metrics: the custom metrics of :func:`run` on the test set at the final model.
  """

  params: Any
  metrics: Any
  summary: dict[str, Any]
  config: Any
  out_dir: str | None = None
  test_metrics: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def epsilon(self) -> float:
    """The certified epsilon of the release (worst client)."""
    return self.summary["epsilon_certified"]

  @property
  def epsilon_claimed(self) -> float:
    """The epsilon the configured formula claims."""
    return self.summary["epsilon_claimed"]

  @property
  def privacy_unit(self) -> str:
    """The unit of privacy and the neighbouring relation the epsilon is certified for."""
    return self.summary["privacy_unit"]

  @property
  def accuracy(self) -> float | None:
    """The final test accuracy (None for a regression)."""
    return self.summary["final_test_accuracy"]


@dataclasses.dataclass(frozen=True)
class SweepResult:
  """A finished sweep: one :class:`Result` per point, in grid order.

  Attributes:
    runs: the points' results.
    points: each point's grid values (``{dotted key: value}``).
    metrics: ``pandas.DataFrame`` of every point's rows, grid values as columns.
  """

  runs: list[Result]
  points: list[dict[str, Any]]
  metrics: Any

  def summary(self):
    """``pandas.DataFrame``: one row per point, grid values and the final numbers."""
    import pandas as pd
    keys = ("final_test_accuracy", "final_test_loss", "epsilon_certified",
            "epsilon_claimed", "privacy_unit", "rounds_run", "status")
    return pd.DataFrame([{**p, **{k: r.summary.get(k) for k in keys}}
                         for p, r in zip(self.points, self.runs)])


def _optimizer(side: str, opt: Any):
  """``(override, optimizer)``: a registered name is the config's ``<side>.optimizer``; an
  optax transformation (or a :class:`fedjax_dp.optimizers.Optimizer`) is given to the
  build."""
  if opt is None:
    return [], None
  if isinstance(opt, str):
    return [f"{side}.optimizer={opt}"], None
  from fedjax_dp import optimizers
  if isinstance(opt, optimizers.Optimizer):
    return [], opt
  return [], optimizers.from_transformation(opt, name=f"python_{side}")


def _given(cfg, fed, model, loss, global_term, client_optimizer=None, server_optimizer=None):
  """``cfg`` made to describe the objects given (data.name, num_clients, partition,
  model.name, the optimizers' names), and the build's keyword arguments."""
  if isinstance(fed, str):  # a loader by name: the config's data fields
    cfg = config_lib.override(cfg, [f"data.name={fed}"])
    fed = None
  if fed is not None and not isinstance(fed, Federation):
    raise TypeError(f"federation: expected fedjax_dp.federation(...) or a dataset name, "
                    f"got {type(fed).__name__}")
  if model is None and (loss is not None or global_term is not None):
    raise ConfigError("loss/global_term are given with the model; pass model= too (a "
                      "named model's loss is part of model.name)")
  spec = None if model is None else (
      user_model(model, loss=loss, global_term=global_term) if not isinstance(model, str)
      else None)
  sets = []
  if isinstance(model, str):
    sets.append(f"model.name={model}")
  if spec is not None:
    sets.append(f"model.name={PYTHON_MODEL}")
  if fed is not None:
    sets += [f"data.name={fed.name}", "data.partition=natural"]
  kwargs = {"federation": fed, "model": spec}
  for side, opt in (("client", client_optimizer), ("server", server_optimizer)):
    more, given = _optimizer(side, opt)
    sets += more
    if given is not None:
      kwargs[f"{side}_optimizer"] = given
  return config_lib.override(cfg, sets), kwargs


def _with_clients(cfg, fed, explicit: bool):
  """``data.num_clients`` from the federation unless the user set it (then they must
  agree, which the builder checks), and the whole config validated."""
  if fed is not None and not explicit:
    cfg = config_lib.override(cfg, [f"data.num_clients={fed.num_clients}"])
  config_lib.validate(cfg)
  return cfg


def _explicit_clients(overrides: Overrides) -> bool:
  return any(s.split("=", 1)[0].strip() == "data.num_clients" for s in _sets(overrides))


def _result(res, cfg, out_dir, metrics, build_kwargs) -> Result:
  import pandas as pd
  scores = {}
  if metrics:
    scores = _test_metrics(res.params, cfg, metrics, build_kwargs)
  return Result(res.params, pd.DataFrame(res.rows), dict(res.summary), cfg,
                None if out_dir is None else str(out_dir), scores)


def _test_metrics(params, cfg, metrics: Mapping[str, Callable], build_kwargs) -> dict:
  """The custom per-example metrics ``(outputs, labels) -> [n]`` on the test set, mean."""
  fed = build_kwargs["federation"]
  spec = build_kwargs["model"]
  if fed is None or spec is None:
    raise ConfigError("metrics= needs a federation and a model given from Python")
  model = spec(fed.x.shape[1:], fed.num_classes)
  out = jax.jit(model.apply)(params, jnp.asarray(fed.x_test))
  y = jnp.asarray(fed.y_test)
  return {name: float(jnp.mean(fn(out, y))) for name, fn in metrics.items()}


def run(config: Any = None, overrides: Overrides = None, *, federation: Any = None,
        model: Any = None, loss: str | Callable | None = None,
        global_term: Callable | None = None, metrics: Mapping[str, Callable] | None = None,
        client_optimizer: Any = None, server_optimizer: Any = None,
        out_dir: str | os.PathLike | None = None, overwrite: bool = False) -> Result:
  """Runs one experiment from Python.

  Args:
    config: the base config (None, a shipped name, a path, a ConfigDict or dict).
    overrides: dotted overrides, ``{"privacy.epsilon": 4, "rounds": 5}`` (the CLI's ``--set``).
    federation: :func:`federation` (the clients' own data), a dataset name (the
      loaders: ``data.*`` fields partition it), or None (the config's data).
    model: a flax.linen / flax.nnx module, an ``(init, apply)`` pair, a
      :func:`user_model`, a zoo name, or None (the config's ``model.name``).
    loss, global_term: see :func:`user_model`.
    metrics: ``{name: (outputs, labels) -> [n]}`` scored on the test set at the end.
    client_optimizer, server_optimizer: a registered name (``client.optimizer``:
      sgd, momentum, adam; ``server.optimizer``: fedavg, fedavgm, fedadam, fedyogi) or
      an ``optax.GradientTransformation`` whose learning rate is inside it (leave
      ``client.lr`` / ``server.lr`` at their defaults then).
    out_dir: a run directory to write (and resume from), or None (memory only).
    overwrite: replace the project's files in ``out_dir``.

  Returns:
    :class:`Result`.

  Raises:
    ConfigError: a bad config or override, a refused privacy combination, a config
      that disagrees with the data (``data.num_clients``), a model whose output does
      not fit the labels, a loss of the wrong shape. All before compute.
  """
  cfg, kwargs = _given(_config(config, overrides), federation, model, loss, global_term,
                       client_optimizer, server_optimizer)
  cfg = _with_clients(cfg, kwargs["federation"], _explicit_clients(overrides))
  res = experiment.run(cfg, None if out_dir is None else str(out_dir), overwrite=overwrite,
                       build_kwargs=kwargs)
  return _result(res, cfg, out_dir, metrics, kwargs)


def sweep(config: Any = None, grid: Mapping[str, Sequence[Any]] | None = None,
          overrides: Overrides = None, *, federation: Any = None, model: Any = None,
          loss: str | Callable | None = None, global_term: Callable | None = None,
          metrics: Mapping[str, Callable] | None = None, client_optimizer: Any = None,
          server_optimizer: Any = None) -> SweepResult:
  """Runs every point of ``grid`` (``{dotted key: [values]}``) over the config, points
  that share shapes as one vmapped program (:mod:`fedjax_dp.sweep`); in memory (for a
  sweep directory use ``fedjax-dp sweep`` or :func:`fedjax_dp.sweep.run_sweep`).

  Arguments as :func:`run`. Returns a :class:`SweepResult`.
  """
  import pandas as pd
  cfg, kwargs = _given(_config(config, overrides), federation, model, loss, global_term,
                       client_optimizer, server_optimizer)
  cfg = _with_clients(cfg, kwargs["federation"], _explicit_clients(overrides)
                      or "data.num_clients" in (grid or {}))
  points = sweep_lib.expand(cfg, dict(grid or {}))
  res = experiment.run_batched([p.config for p in points], [None] * len(points),
                               build_kwargs=kwargs)
  runs = [_result(r, p.config, None, metrics, kwargs) for r, p in zip(res, points)]
  rows = [{"point": p.name, **p.values, **row} for p, r in zip(points, res) for row in r.rows]
  return SweepResult(runs, [dict(p.values) for p in points], pd.DataFrame(rows))
