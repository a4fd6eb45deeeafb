"""Experiment configs: ``ml_collections.ConfigDict`` with every field overridable.

A config file is a Python file with ``get_config()`` returning a ConfigDict, usually
``base_config()`` with some fields changed. ``--set key=value`` overrides any field;
values are parsed to the field's type (``inf`` is a float, ``true``/``false`` bools,
``(400,600)`` tuples) and an unknown key is an error that suggests the close ones.

:func:`validate` checks each field's type and range (:data:`FIELD_RULES`) and the
cross-field constraints of the run as a whole; the schedule, selection rule and clip
mode a config picks check their own fields (:data:`OWNER_CHECKS`).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import importlib.util
import json
import math
import numbers
import os
import re
from collections.abc import Sequence
from importlib import resources
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Any, NamedTuple

import ml_collections
from ml_collections import config_dict

from fedjax_dp.errors import ConfigError, UserError, unreadable

ConfigDict = ml_collections.ConfigDict


SKEW_SCHEMES = ("constant", "adpfl_uniform", "adpfl_even")
# schedule.name of the T search (fedjax_dp.optimal_t): not a schedule, a batched
# sweep over T of the constant schedule that keeps the best run.
OPTIMAL_T = "optimal_t"
# privacy.noise_seed as recorded in a run directory: entropy drawn for 'os'.
NOISE_SEED_HEX = re.compile(r"[0-9a-f]{32,}")
# A stored config's schema version (fedjax_dp.config.schema), not a field of the config.
SCHEMA_KEY = "schema_version"


def base_config() -> ConfigDict:
  """Defaults for every field the engine reads (a small UDP run on ``digits``)."""
  c = ConfigDict()
  c.seed = 0
  c.rounds = 100                 # T: planned communication rounds
  c.name = "run"

  c.data = _data_fields()
  c.model = ConfigDict()
  c.model.name = "mlp_784_256_10"
  c.client = _client_fields()
  c.server = _server_fields()
  c.privacy = _privacy_fields()
  c.schedule = _schedule_fields()

  c.eval = ConfigDict()
  c.eval.every = 1
  c.eval.batch_size = 2048
  # What the run evaluates on (its test_loss / test_accuracy columns and every
  # decision that reads them): 'test' (the dataset's test split) | 'unassigned' (the
  # training examples no client holds, data.holdout's among them: a held-out split for
  # choosing hyperparameters without reading the test set; the federation itself is
  # unchanged, but for the examples data.holdout sets aside).
  c.eval.split = "test"

  c.checkpoint = ConfigDict()
  # Save a checkpoint every N rounds into the run directory (0 = never); re-running
  # the same command resumes from it (fedjax_dp.host.checkpoint).
  c.checkpoint.every = 10
  c.progress = True
  # Compiled programs kept on disk between processes (fedjax_dp.compile_cache): 'auto'
  # (a directory configured in JAX, else the user's cache directory) | 'off' | a path.
  # Changes no result; `fedjax-dp` reads FEDJAX_DP_COMPILATION_CACHE into it.
  c.compilation_cache = "auto"
  return c


def _data_fields() -> ConfigDict:
  """The ``data`` section: the dataset, its partition into clients and where the
  client data live (device or host memory)."""
  s = ConfigDict()
  s.name = "digits"         # digits | mnist | fashion_mnist | cifar10 | mnist_binary_0v1 ...
  s.dir = config_dict.placeholder(str)   # local dir with the standard files
  # iid | k_classes | dirichlet | unbalanced | label_skew | writer_like | sorted | natural
  s.partition = "iid"
  s.num_clients = 10        # U
  s.samples_per_client = 100
  # Training examples set aside before the partition: a uniform random subset of this
  # size, the same for every run and seed, that no client holds, so eval.split=
  # 'unassigned' has a validation set where the partition would use every example
  # (fedjax_dp.data.partition.partition_clients). 0 = none.
  s.holdout = 0
  # Which block of data.holdout examples of that fixed permutation is set aside: folds
  # are disjoint and fold 0 is the set of before, so n // data.holdout folds are a
  # k-fold cross-validation (fedjax_dp.calibration_sweep.calibrate's folds).
  s.holdout_fold = 0
  s.classes_per_client = 4  # k_classes
  s.alpha = 0.5             # dirichlet
  s.group_sizes = (400, 600, 800, 1000, 1200)  # unbalanced
  s.skew = 0.8              # label_skew: fraction s from the dominant label
  s.skews = ()              # label_skew: one s per client (overrides skew)
  # label_skew: constant (skew / skews) | adpfl_uniform (s_i iid from {0, .1, .., 1},
  # A-DPFL spec 5.2) | adpfl_even (those levels spread evenly over the clients)
  s.skew_scheme = "constant"
  s.skew_remainder = "others"  # label_skew: rest from other labels | all (spec 5.2)
  s.size_sigma = 0.6        # writer_like: log-normal spread of the client sizes
  s.dominance = 0.8         # writer_like: share from classes_per_client classes
  # Evaluate on a fixed random subset of this many test examples (0 = all): for CNN
  # sweeps on a CPU, where scoring all 10,000 MNIST test images dominates a round.
  s.test_samples = 0
  # Where the federation's client data live: device (all of it on the device, gathered
  # there each round) | host (host memory; each round's cohort is moved to the device,
  # the next round's prefetched; same results, device memory bounded by the cohort).
  s.placement = "device"
  return s


def _client_fields() -> ConfigDict:
  """The ``client`` section: local training and clipping."""
  s = ConfigDict()
  s.local_steps = 1       # E
  s.batch_size = 0        # 0 = full batch; B (expected B for minibatch=poisson)
  # shuffle: B examples without replacement per step | poisson: each example joins each
  # step's batch with q_i = B / |D_i| (DP-SGD's sampling; exact subsampled-Gaussian
  # accounting at example level, add/remove; needs privacy.placement=step with
  # per_example_l2 clipping and the Gaussian mechanism). client.local_steps counts
  # the steps: one local epoch is round(|D_i| / B) of them.
  s.minibatch = "shuffle"
  s.lr = 0.1              # eta
  s.lr_decay = 1.0        # local schedule: lr * lr_decay**s at local step s
  s.clip_mode = "per_example_l2"
  s.clip = 1.0            # C
  s.l2_reg = 0.0
  s.chunk_size = 64
  # The local steps' optax direction (fedjax_dp.optimizers.CLIENT_OPTIMIZERS): sgd |
  # momentum (heavy ball, d = G + momentum d) | adam; its state starts fresh each round.
  # Upload noise on per-example or per-step gradient clipping admits only the linear
  # ones (sgd, momentum without l2_reg): their bound counts learning rates x steps.
  s.optimizer = "sgd"
  s.momentum = 0.9        # momentum: beta
  s.beta1 = 0.9           # adam
  s.beta2 = 0.999         # adam
  s.eps = 1e-8            # adam
  return s


def _server_fields() -> ConfigDict:
  """The ``server`` section: selection, aggregation, the clip rule and chunking."""
  s = ConfigDict()
  # uniform (K of U) | poisson | round_robin | cyclic (one fixed order) |
  # cyclic_poisson (cyclic's groups of K, each client of round t's group with rate q) | all |
  # wasserstein_topk (A-DPFL: the K
  # clients closest to the global label distribution) | wasserstein_sample (K with
  # probability p_i); the A-DPFL rules assume public label histograms (selection.py)
  s.selection = "uniform"
  s.wasserstein_metric = "zero_one"  # A-DPFL ground metric on labels: zero_one | ordinal
  s.clients_per_round = 10  # K
  s.q = 0.0                 # Poisson rate (selection=poisson, cyclic_poisson)
  # normalized (|D_i| / the cohort's total) | unnormalized (|D_i| / |D|, Wei eq. (2)) |
  # fixed (|D_i| / (q |D|) on the updates, DP-FedAvg; central noise with Poisson needs it)
  s.aggregation = "normalized"
  s.lr = 1.0
  # The server's clip bound S on update_l2 updates (privacy.placement=central):
  # fixed (S = client.clip) | median (Geyer et al. 2017 CL-FL as printed: S = median of
  # the cohort's update norms; data dependent, so certified epsilon = inf and the RDP
  # value for a fixed S is reported as the claim) | private_median (Andrew et al. 2021
  # adaptive clipping: S_t moves geometrically toward the clip_quantile of the update
  # norms from a noisy count; the count's noise is taken out of the round's budget)
  s.clip_rule = "fixed"
  s.clip_quantile = 0.5     # private_median: target quantile gamma
  s.clip_lr = 0.2           # private_median: geometric step eta_C
  s.clip_count_std = -1.0   # private_median: count noise std; < 0 = K / 20
  # Clients trained at once; a round scans over ceil(K / chunk) vmapped chunks, so
  # memory is bounded by one chunk. 0 = all K at once; -1 (default) = from the free
  # memory and, on CPU, the cache (engine.client_chunk_for_memory): the fast path
  # the benchmarks measure (W1, W7).
  s.client_chunk = -1
  # CNNs: 'auto' (im2col on CPU and GPU, XLA convolutions elsewhere) | 'conv' | 'im2col'.
  s.conv_impl = "auto"
  # The server's step on the noisy aggregate, an optax direction of the pseudo-gradient
  # w - aggregate times server.lr (post-processing; fedjax_dp.optimizers): fedavg |
  # fedavgm (server momentum; DP-FedAvgM) | fedadam | fedyogi (Reddi et al. 2021).
  s.optimizer = "fedavg"
  s.momentum = 0.9          # fedavgm
  s.beta1 = 0.9             # fedadam, fedyogi
  s.beta2 = 0.99            # fedadam, fedyogi
  s.tau = 1e-3              # fedadam, fedyogi: the adaptivity epsilon
  return s


def _privacy_fields() -> ConfigDict:
  """The ``privacy`` section: the target, the mechanism and the noise stream."""
  s = ConfigDict()
  s.epsilon = 4.0          # per-client target; inf disables noise
  s.delta = 1e-3
  # gaussian | laplace (i.i.d. per round) | tree | bandmf (correlated across rounds,
  # central placement: DP-FTRL tree aggregation, Kairouz et al. 2021; banded matrix
  # factorisation, Choquette-Choo et al. 2023; fedjax_dp.privacy.correlated)
  s.mechanism = "gaussian"
  # bandmf: bands b of the Toeplitz strategy (0: the round-robin pass length U/K,
  # capped at rounds; 1 band is i.i.d. noise)
  s.bands = 0
  # tree: rounds per tree before a restart (0: the round-robin pass length, or rounds)
  s.tree_restart = 0
  s.placement = "upload"   # upload | step | central | none
  # calibrated (the smallest noise whose certified epsilon meets privacy.epsilon) |
  # wei_eq10 (Wei et al. eq. (10) as printed; overspends above epsilon ~4.6) |
  # noise_multiplier (scale = z * sensitivity) | yuan_eq8, yuan_eq8_corrected (Yuan eq. (8)
  # as printed / corrected, paper's Delta_s = 2C/|D_k|) | yuan_laplace, yuan_laplace_matched
  # fu_thm1 / fu_thm2 (Fu et al. Theorem 1
  # Laplace / Theorem 2 Gaussian; need client.clip_mode=step_grad_l1 / step_grad_l2)
  s.formula = "calibrated"
  s.noise_multiplier = 1.0  # formula=noise_multiplier: scale = z * sensitivity
  s.client_epsilons = ()   # optional per-client epsilons, one per client
  s.enforce_budget = False  # stop before the certified epsilon passes epsilon
  # Gaussian upload noise: 'per_client' draws each upload's noise; 'aggregate' draws
  # the noise of the weighted sum once (same distribution of the model, K x fewer
  # random numbers; see engine.RoundConfig.aggregate_upload_noise).
  s.noise_sampling = "per_client"
  # The run's random stream for noise (and minibatches) is a hash of its config
  # (fedjax_dp.config.noise_identity): runs that differ in what they release never draw the
  # same noise at different scales (releasing two would reveal the noiseless
  # aggregate), and the same config draws the same again. noise_stream is part of
  # that config (another value: an independent replicate). common_random_numbers=True
  # opts in to shared noise: the stream is (seed, noise_stream) alone, the same for
  # every run (every sweep point) of that seed that also opts in.
  s.noise_stream = 0
  s.common_random_numbers = False
  # '' : noise from the config's identity (deterministic: a simulation convenience);
  # 'os': fresh OS entropy for a real release, drawn once and recorded in config.json
  # (a resume reads it back); a recorded hex value reproduces that release.
  s.noise_seed = ""
  return s


def _schedule_fields() -> ConfigDict:
  """The ``schedule`` section: the noise schedule and its parameters."""
  s = ConfigDict()
  # constant (UDP) | crd (Wei Alg. 2) | linear_decay (Lei) | optimal_t (constant over
  # the T grid schedule.t_grid, run as one sweep; the best final test loss is kept)
  s.name = "constant"
  s.beta = 0.9            # crd: discount factor in (0, 1)
  s.zeta = 0.001          # crd: trigger threshold on the test-loss decrease
  s.decay_fraction = 0.5  # linear_decay: share of sigma_0 removed over T0 rounds
  s.decay_floor = 0.1     # linear_decay: lowest sigma as a fraction of sigma_0
  s.theta = 1.0           # geometric (Yuan eq. (6)): variance ratio per round
  s.refine = 0.0          # geometric: 1 = online refinement of Theorem 2
  s.alpha_d = 0.9         # geometric: on a trigger M' = ceil(alpha_d M)
  s.refine_patience = 1.0  # geometric: non-decreasing rounds before a trigger
  s.refine_tol = 0.0      # geometric: "stops decreasing" = loss >= previous - tol
  s.refine_exact = 0.0    # geometric: 0 = eq. (9) as printed, 1 = budget-exact
  s.k = 0.7               # adpfl (eq. (15)): sigma <- k sigma when the score stalls
  s.alpha = 0.005         # adpfl: stall = validation-accuracy gain <= alpha
  s.adjust_every = 1.0    # adpfl: rounds between two adjustment checks
  # adpfl: where the score S_t comes from. 'clients': accuracy on the selected clients'
  # local data (the paper's default), released with N(0, (z_val / N_sel)^2) and charged
  # by the accountant; 'server': the run's held-out evaluation (test_accuracy, eval.every
  # must divide adjust_every), reads no client data.
  s.validation = "clients"
  s.val_noise_multiplier = 1.0  # adpfl, validation='clients': z_val (> 0)
  s.t_grid = ()           # optimal_t: T values searched; () = 10, 20, ..., rounds
  return s


@contextlib.contextmanager
def as_config_errors():
  """Within this context a ValueError (from a function checking the config's values
  and naming the field) is re-raised as a :class:`ConfigError`."""
  try:
    yield
  except UserError:
    raise
  except ValueError as e:
    raise ConfigError(str(e)) from e


SHIPPED = "fedjax_dp.configs"  # the package of shipped config files


def shipped_names() -> list[str]:
  """The names of the shipped configs (``quickstart``, ``wei_mnist_mlp``, ...), sorted:
  the modules of :data:`SHIPPED` (``fedjax_dp/configs``)."""
  return sorted(f.name[:-3] for f in resources.files(SHIPPED).iterdir()
                if f.name.endswith(".py") and not f.name.startswith("_"))


def load_config(path: str | Path) -> ConfigDict:
  """The config of a Python file's ``get_config()``, of a run's ``config.json``, or of a
  config shipped in the package.

  ``get_config()`` may return a ConfigDict or a plain dict; a dict, like a JSON file
  (e.g. ``runs/x/config.json``, to run that run again), is laid over
  :func:`base_config` (:func:`from_dict`).

  Args:
    path: a Python file with ``get_config()``, a run's ``config.json``, or the name of
      a shipped config (``"quickstart"``: ``fedjax_dp/configs/quickstart.py``, found
      from any directory). An existing file wins over a name.

  Raises:
    ConfigError: ``path`` is neither an existing file nor a shipped name (the message
      lists the names), or the file fails to load, has no ``get_config()``, or holds
      a config of the wrong kind.
  """
  shipped = shipped_names()
  if not isinstance(path, (str, Path)) or not str(path):
    raise ConfigError(f"no config given ({path!r}): pass a config file or one of the "
                      f"shipped names: {', '.join(shipped)}")
  if not Path(path).is_file():
    if str(path) not in shipped:
      raise ConfigError(f"config file not found: {path}, nor a shipped config of that name "
                        f"(shipped: {', '.join(shipped)})")
    with resources.as_file(resources.files(SHIPPED) / f"{path}.py") as file:
      return _load_file(file)
  path = Path(path)
  if path.suffix == ".json":
    try:
      blob = json.loads(path.read_text())
    except ValueError as e:  # (UnicodeDecodeError is one)
      raise ConfigError(f"config file {path}: {unreadable(e)}") from None
    return from_dict(blob, str(path))
  if path.suffix not in ("", ".py"):  # a file without a suffix is Python all the same
    raise ConfigError(f"config file {path}: expected a Python file (.py) with get_config() "
                      "or a run's config.json")
  return _load_file(path)


def _load_file(path: Path) -> ConfigDict:
  """Imports the config file ``path`` and returns its ``get_config()``."""
  name = f"fedjax_dp_config_{path.stem}"
  # An explicit source loader: a file without the .py suffix is Python all the same.
  spec = importlib.util.spec_from_loader(name, SourceFileLoader(name, str(path)))
  module = importlib.util.module_from_spec(spec)
  with _user_code(path, "failed to load"):
    spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{path} has no get_config()")
  with _user_code(path, "get_config() failed"):
    cfg = module.get_config()
  if isinstance(cfg, ConfigDict):
    if set(_all_keys(base_config())) <= set(_all_keys(cfg)):
      return cfg
    cfg = cfg.to_dict()  # a partial ConfigDict: laid over the defaults like a dict
  return from_dict(cfg, f"{path}: get_config()")


@contextlib.contextmanager
def _user_code(path: Path, what: str):
  """Runs a config file's code: its errors, and an exit, become one ConfigError naming
  the file (a wrongly typed assignment to a field in the project's words)."""
  try:
    yield
  except SystemExit as e:  # sys.exit() in a config file: no config, and no run
    raise ConfigError(f"config file {path}: exited (sys.exit({e.code!r})) instead of "
                      "returning a config; get_config() must return one") from None
  except Exception as e:  # a config file is user code: say which file failed, and how
    typed = _assignment_error(e, path)
    if typed is not None:
      raise typed from None
    raise ConfigError(f"config file {path}: {what}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}") from e


_EXPECTED = {float: "a number", int: "an integer", bool: "true or false", str: "a string",
             tuple: "a tuple, e.g. (1, 2)", list: "a list"}


def _assignment_error(error: Exception, path: Path) -> ConfigError | None:
  """ml_collections' refusal of ``c.privacy.epsilon = '8'`` (a TypeError raised in a
  ConfigDict's ``__setitem__``) as ``privacy.epsilon='8' in FILE: expected a number``;
  None for any other error."""
  if not isinstance(error, TypeError):
    return None
  frame, tb = None, error.__traceback__
  while tb is not None:  # the innermost ConfigDict.__setitem__ holds section, key, value
    f = tb.tb_frame
    if f.f_code.co_name == "__setitem__" and isinstance(f.f_locals.get("self"), ConfigDict):
      frame = f
    tb = tb.tb_next
  if frame is None or not isinstance(frame.f_locals.get("key"), str):
    return None
  section, key, value = (frame.f_locals[k] for k in ("self", "key", "value"))
  try:
    old = section[key]
  except (KeyError, AttributeError):
    return None
  if isinstance(old, ConfigDict):
    want = f"a section of fields (set them one by one: {_section_name(section)}{key}.<field> = ...)"
  else:
    want = _EXPECTED.get(type(old), f"a {type(old).__name__}")
  return ConfigError(f"{_section_name(section)}{key}={value!r} in {path}: expected {want}")


def _section_name(section: ConfigDict) -> str:
  """``'privacy.'`` for the privacy section of a config (told by its fields), ``''``
  for the top level or a section the base config does not have."""
  have = set(section.keys())
  best, score = "", len(have & set(base_config().keys()))
  for name, sub in base_config().items():
    if isinstance(sub, ConfigDict) and len(have & set(sub.keys())) > score:
      best, score = f"{name}.", len(have & set(sub.keys()))
  return best


def _coerce(value: Any, like: Any) -> Any:
  """A JSON / dict value as the type of the base field ``like`` (lists -> tuples,
  'inf' -> float, 8 -> 8.0); anything else is left for :func:`validate` to judge."""
  if isinstance(like, tuple) and isinstance(value, list):
    return tuple(_coerce(v, 0.0) if isinstance(v, str) else v for v in value)
  if isinstance(like, float) and isinstance(value, str):
    try:
      return float(value)
    except ValueError:
      return value
  if isinstance(like, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value


def from_dict(blob: Any, source: str) -> ConfigDict:
  """``blob`` (nested dicts, e.g. a run's ``config.json``) laid over :func:`base_config`.

  Raises:
    ConfigError: ``blob`` is not a dict, or names a key the config does not have.
  """
  if not isinstance(blob, dict):
    raise ConfigError(f"{source}: expected a ConfigDict or a dict of config fields, got "
                      f"{type(blob).__name__}")
  cfg = base_config()
  known = _all_keys(cfg)

  def lay(node: ConfigDict, d: dict, prefix: str) -> None:
    for k, v in d.items():
      key = f"{prefix}{k}"
      if not isinstance(k, str) or (key not in known and not any(
          n.startswith(key + ".") for n in known)):
        close = difflib.get_close_matches(str(key), known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"{source}: unknown config key {key!r}{hint}")
      if isinstance(node[k], ConfigDict):
        if not isinstance(v, dict):
          raise ConfigError(f"{source}: {key} must be a dict of fields, got {v!r}")
        lay(node[k], v, key + ".")
      elif key in _STRING_PLACEHOLDERS:
        node[k] = v
      else:
        node[k] = _coerce(v, node[k])

  cfg = ml_collections.ConfigDict(cfg.to_dict(), type_safe=False)
  lay(cfg, {k: v for k, v in blob.items() if k != SCHEMA_KEY}, "")
  return cfg


class _FloatNames(ast.NodeTransformer):
  """``inf`` and ``nan`` in a tuple literal, as in ``(1, inf)``, are the floats."""

  def visit_Name(self, node):
    if node.id in ("inf", "nan"):
      return ast.copy_location(ast.Constant(float(node.id)), node)
    return node


def _literal(raw: str) -> Any:
  return ast.literal_eval(_FloatNames().visit(ast.parse(raw.strip(), mode="eval")))


def _parse(raw: str, like: Any, key: str, field_type: type | None) -> Any:
  kind = field_type if like is None else type(like)
  try:
    if kind is bool:
      low = raw.strip().lower()
      if low not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(raw)
      return low in ("true", "1", "yes")
    if kind is float:
      return float(raw)
    if kind is int:
      try:
        return int(raw.strip())  # exact, however large (the range is checked later)
      except ValueError:
        pass
      value = float(raw)  # '1e3'
      if not value.is_integer():
        raise ValueError(raw)
      return int(value)
    if kind is str:
      return raw
    if kind in (tuple, list):
      value = _literal(raw if raw.strip().startswith(("(", "[")) else f"({raw},)")
      return tuple(value)
    try:  # an unset (None) field: a Python literal, else the raw string
      return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      return raw
  except (ValueError, SyntaxError) as e:
    raise ConfigError(f"--set {key}={raw}: cannot parse as {kind.__name__}") from e


# Unset-by-default fields that hold strings (placeholders lose their type in to_dict()).
_STRING_PLACEHOLDERS = ("data.dir",)


def _all_keys(cfg: ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for k, v in cfg.items():
    full = f"{prefix}{k}"
    keys.extend(_all_keys(v, full + ".") if isinstance(v, ConfigDict) else [full])
  return keys


def as_set_text(value: Any) -> str:
  """A Python value as ``--set`` text that :func:`override` parses back to it."""
  if isinstance(value, str):
    return value
  if hasattr(value, "item") and not isinstance(value, (list, tuple)):
    value = value.item()  # numpy scalars
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else str(value)
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return str(value)


def override(cfg: ConfigDict, assignments: Sequence[str]) -> ConfigDict:
  """Applies ``key=value`` strings to a copy of ``cfg``.

  Raises:
    ConfigError: malformed assignment, unknown key (with suggestions), bad value.
  """
  cfg = ml_collections.ConfigDict(cfg.to_dict(), type_safe=False)
  known = _all_keys(cfg)
  for a in assignments:
    if "=" not in a:
      raise ConfigError(f"--set expects key=value, got {a!r}")
    key, raw = a.split("=", 1)
    key = key.strip()
    if key not in known:
      close = difflib.get_close_matches(key, known, n=3)
      hint = f"; did you mean {', '.join(close)}?" if close else ""
      raise ConfigError(f"unknown config key {key!r}{hint}")
    *parents, leaf = key.split(".")
    node = cfg
    for p in parents:
      node = node[p]
    field_type = str if key in _STRING_PLACEHOLDERS else None
    node[leaf] = _parse(raw, node[leaf], key, field_type)
  return cfg


class Rule(NamedTuple):
  """What one config field may hold (:data:`FIELD_RULES`).

  Attributes:
    kind: 'int', 'float', 'str', 'bool', 'ints' or 'floats' (tuples of numbers), or
      'dir' (a string or None).
    low, high: inclusive bounds on a number (or on each element of a tuple); None = none.
    open_low, open_high: ``low`` (``high``) itself is refused.
    inf: a float field may be ``inf`` (e.g. ``privacy.epsilon``: no noise).
    choices: a callable giving the allowed strings (registries are imported lazily).
    min_len: the fewest elements a tuple may hold.
  """

  kind: str
  low: float | None = None
  high: float | None = None
  open_low: bool = False
  open_high: bool = False
  inf: bool = False
  choices: Any = None
  min_len: int = 0


_U32, _I32 = 2**32 - 1, 2**31 - 1
MAX_LOCAL_STEPS = 1_000_000  # client.local_steps: a million local steps a round at most


def _registry(module: str, name: str, *extra: str):
  def names():
    return (*getattr(importlib.import_module(module), name), *extra)
  return names


def _fixed(*names: str):
  return lambda: names


_POSITIVE = Rule("float", 0.0, open_low=True)
_UNIT = Rule("float", 0.0, 1.0)
_DECAY = Rule("float", 0.0, 1.0, open_high=True)  # an optimizer's momentum or moment decay
# Every field of base_config(): a wrong type, a value out of range, nan, a stray inf or
# an unknown name fails here, before data is read or anything is compiled.
FIELD_RULES: dict[str, Rule] = {
    "seed": Rule("int", 0, _U32),  # a uint32 on the device, a numpy seed on the host
    "rounds": Rule("int", 1, _I32),
    "name": Rule("str"),
    "data.name": Rule("str"),
    "data.dir": Rule("dir"),
    "data.partition": Rule("str", choices=_registry("fedjax_dp.data.partition", "PARTITIONERS")),
    "data.num_clients": Rule("int", 1, _I32),
    "data.samples_per_client": Rule("int", 0, _I32),
    "data.holdout": Rule("int", 0, _I32),
    "data.holdout_fold": Rule("int", 0, _I32),
    "data.classes_per_client": Rule("int", 1, _I32),
    "data.alpha": _POSITIVE,
    "data.group_sizes": Rule("ints", 1, _I32, min_len=1),
    "data.skew": _UNIT,
    "data.skews": Rule("floats", 0.0, 1.0),
    "data.skew_scheme": Rule("str", choices=_fixed(*SKEW_SCHEMES)),
    "data.skew_remainder": Rule("str", choices=_fixed("others", "all")),
    "data.size_sigma": Rule("float", 0.0),
    "data.dominance": _UNIT,
    "data.test_samples": Rule("int", 0, _I32),
    "data.placement": Rule("str", choices=_registry("fedjax_dp.data.streaming", "PLACEMENTS")),
    # 'python': a model given from Python (fedjax_dp.api; building refuses it without one).
    "model.name": Rule("str", choices=_registry("fedjax_dp.models.zoo", "MODELS", "python")),
    # (The privacy layer holds one step size per local step: 2^31 of them would take
    # tens of GB before any check could run.)
    "client.local_steps": Rule("int", 1, MAX_LOCAL_STEPS),
    "client.batch_size": Rule("int", 0, _I32),
    "client.minibatch": Rule("str", choices=_fixed("shuffle", "poisson")),
    "client.lr": _POSITIVE,
    "client.lr_decay": _POSITIVE,
    "client.clip_mode": Rule("str", choices=_registry("fedjax_dp.privacy.clip_modes",
                                                        "CLIP_MODES")),
    "client.clip": _POSITIVE,
    "client.l2_reg": Rule("float", 0.0),
    "client.chunk_size": Rule("int", 1, _I32),
    "client.optimizer": Rule("str", choices=_registry("fedjax_dp.optimizers",
                                                      "CLIENT_OPTIMIZERS")),
    "client.momentum": _DECAY,
    "client.beta1": _DECAY,
    "client.beta2": _DECAY,
    "client.eps": _POSITIVE,
    "server.selection": Rule("str", choices=_registry("fedjax_dp.privacy.selection", "RULES")),
    "server.wasserstein_metric": Rule("str", choices=_fixed("zero_one", "ordinal")),
    "server.clients_per_round": Rule("int", 0, _I32),
    "server.q": _UNIT,
    "server.aggregation": Rule("str", choices=_registry("fedjax_dp.training.engine", "AGGREGATIONS")),
    "server.lr": _POSITIVE,
    "server.clip_rule": Rule("str", choices=_registry("fedjax_dp.training.engine", "CLIP_RULES")),
    "server.clip_quantile": Rule("float", 0.0, 1.0, open_low=True, open_high=True),
    "server.clip_lr": Rule("float"),
    "server.clip_count_std": Rule("float"),
    "server.client_chunk": Rule("int", -1, _I32),
    "server.conv_impl": Rule("str", choices=_registry("fedjax_dp.training.engine", "CONV_IMPLS")),
    "server.optimizer": Rule("str", choices=_registry("fedjax_dp.optimizers",
                                                      "SERVER_OPTIMIZERS")),
    "server.momentum": _DECAY,
    "server.beta1": _DECAY,
    "server.beta2": _DECAY,
    "server.tau": _POSITIVE,
    "privacy.epsilon": Rule("float", 0.0, open_low=True, inf=True),
    "privacy.delta": Rule("float", 0.0, 1.0, open_low=True, open_high=True),
    "privacy.mechanism": Rule("str", choices=_registry("fedjax_dp.privacy.mechanisms",
                                                       "MECHANISMS")),
    "privacy.placement": Rule("str", choices=_registry("fedjax_dp.privacy.mechanisms",
                                                       "PLACEMENTS")),
    "privacy.formula": Rule("str", choices=_registry("fedjax_dp.privacy.formulas.registry",
                                                     "FORMULAS")),
    "privacy.noise_multiplier": Rule("float", 0.0),
    "privacy.client_epsilons": Rule("floats", 0.0, open_low=True, inf=True),
    "privacy.enforce_budget": Rule("bool"),
    "privacy.noise_sampling": Rule("str", choices=_fixed("per_client", "aggregate")),
    "privacy.noise_stream": Rule("int", 0, _I32),
    "privacy.bands": Rule("int", 0, _I32),
    "privacy.tree_restart": Rule("int", 0, _I32),
    "privacy.common_random_numbers": Rule("bool"),
    "schedule.name": Rule("str", choices=_registry("fedjax_dp.privacy.schedules", "SCHEDULES",
                                                   OPTIMAL_T)),
    "schedule.beta": Rule("float", 0.0, 1.0, open_low=True, open_high=True),
    "schedule.zeta": Rule("float"),
    "schedule.decay_fraction": _UNIT,
    "schedule.decay_floor": _UNIT,
    "schedule.theta": _POSITIVE,
    "schedule.refine": _UNIT,
    "schedule.alpha_d": Rule("float", 0.0, 1.0, open_low=True),
    "schedule.refine_patience": _POSITIVE,
    "schedule.refine_tol": Rule("float"),
    "schedule.refine_exact": _UNIT,
    "schedule.k": _POSITIVE,
    "schedule.alpha": Rule("float"),
    "schedule.adjust_every": Rule("float", 1.0),
    "schedule.validation": Rule("str", choices=_fixed("server", "clients")),
    "schedule.val_noise_multiplier": Rule("float", 0.0),  # 0 only without privacy (plan)
    "schedule.t_grid": Rule("ints", 1, _I32),
    "eval.every": Rule("int", 1, _I32),
    "eval.batch_size": Rule("int", 1, _I32),
    "eval.split": Rule("str", choices=_fixed("test", "unassigned")),
    "checkpoint.every": Rule("int", 0, _I32),
    "progress": Rule("bool"),
    "compilation_cache": Rule("str"),
}


def _bound(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number_text(kind: str, value: Any, rule: Rule) -> str | None:
  """Why ``value`` is not a valid number of ``kind`` under ``rule``; None if it is."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return f"expected {'an integer' if kind == 'int' else 'a number'}"
  value = float(value) if kind == "float" else value
  if kind == "int" and not float(value).is_integer():
    return "expected an integer"
  if math.isnan(value) or (math.isinf(value) and not rule.inf):
    return "must be a finite number" + (" (or inf)" if rule.inf else "")
  low_ok = rule.low is None or (value > rule.low if rule.open_low else value >= rule.low)
  high_ok = rule.high is None or (value < rule.high if rule.open_high else value <= rule.high)
  if not (low_ok and high_ok):
    lo = "" if rule.low is None else f"{'>' if rule.open_low else '>='} {_bound(rule.low)}"
    hi = "" if rule.high is None else f"{'<' if rule.open_high else '<='} {_bound(rule.high)}"
    return f"must be {' and '.join(t for t in (lo, hi) if t)}"
  return None


def check_field(key: str, value: Any, rule: Rule) -> None:
  """Raises :class:`ConfigError` ``'<key>=<value>: <why>'`` if ``value`` breaks ``rule``."""
  why = None
  if rule.kind in ("int", "float"):
    why = _number_text(rule.kind, value, rule)
  elif rule.kind in ("ints", "floats"):
    if not isinstance(value, (tuple, list)):
      why = "expected a tuple of numbers, e.g. (1,2)"
    elif len(value) < rule.min_len:
      why = f"needs at least {rule.min_len} value(s)"
    else:
      why = next((f"element {v!r} {w}" for v in value
                  if (w := _number_text(rule.kind[:-1], v, rule))), None)
  elif rule.kind == "bool":
    why = None if isinstance(value, bool) else "expected true or false"
  elif rule.kind == "dir":
    ok = value is None or isinstance(value, os.PathLike) or (isinstance(value, str) and value)
    why = None if ok else "expected a directory path"
  elif not isinstance(value, str):
    why = "expected a string"
  elif rule.choices is not None and value not in (known := rule.choices()):
    close = difflib.get_close_matches(value, known, n=1)
    why = (f"unknown value; known: {', '.join(sorted(known))}"
           + (f" (did you mean {close[0]}?)" if close else ""))
  if why:
    raise ConfigError(f"{key}={value!r}: {why}")


def check_fields(cfg: ConfigDict) -> None:
  """Applies :data:`FIELD_RULES` to every field ``cfg`` has."""
  for key, rule in FIELD_RULES.items():
    *parents, leaf = key.split(".")
    node = cfg
    for p in parents:
      node = node.get(p) if isinstance(node, ConfigDict) else None
    if isinstance(node, ConfigDict) and leaf in node:
      check_field(key, node[leaf], rule)


def _check_client_epsilons(cfg: ConfigDict) -> None:
  """One target per client, or none: a shorter list would be silently cycled."""
  n, u = len(cfg.privacy.client_epsilons), int(cfg.data.num_clients)
  if n and n != u and cfg.data.partition != "natural":
    raise ConfigError(f"privacy.client_epsilons={tuple(cfg.privacy.client_epsilons)!r}: "
                      f"holds {n} values, but data.num_clients is {u} (give one per client)")


def _check_data_source(cfg: ConfigDict) -> None:
  """``data.dir`` with the embedded ``digits`` would be ignored: refuse it."""
  name, folder = str(cfg.data.name), cfg.data.get("dir")
  if folder is not None and (name == "digits" or name.startswith("digits_")):
    raise ConfigError(f"data.dir={folder!r}: data.name={name!r} is embedded and reads no "
                      "directory; set data.name (mnist, fashion_mnist, cifar10, adult, "
                      "lending_club or femnist) for the files there, or unset data.dir")


# The mechanisms that validate their own fields (each module's ``check_config(inputs)``,
# raising a ConfigError naming the field): the selection rule, the schedule and the
# clip mode the config picks. They sit below this module (docs/architecture.md: the
# config floor is above the round, the mechanisms, the models and the data, whose
# registries FIELD_RULES read too) and read the config's typed privacy inputs, which
# PRIVACY_INPUTS builds (fedjax_dp.config.privacy_inputs: from_config, check_owners);
# like those registries it is imported when a config is validated, so that loading a
# config imports no JAX.
PRIVACY_INPUTS = "fedjax_dp.config.privacy_inputs"
SELECTION_CHECKS = "fedjax_dp.privacy.selection"
OWNER_CHECKS = ("fedjax_dp.privacy.schedules", "fedjax_dp.privacy.clip_modes")


def _check_owners(cfg: ConfigDict) -> None:
  """The picked selection rule's, schedule's and clip mode's own checks, in that order,
  on the config's :class:`fedjax_dp.privacy.inputs.PrivacyInputs`."""
  importlib.import_module(PRIVACY_INPUTS).check_owners(cfg)


def _check_targets(cfg: ConfigDict) -> None:
  """Privacy targets and the run's size."""
  eps = float(cfg.privacy.epsilon)
  if not eps > 0 or math.isnan(eps):
    raise ConfigError(f"privacy.epsilon must be > 0 (inf disables noise), got {eps}")
  for e in cfg.privacy.client_epsilons:
    if not float(e) > 0:
      raise ConfigError(f"privacy.client_epsilons must all be > 0, got {e}")
  if not 0.0 < float(cfg.privacy.delta) < 1.0:
    raise ConfigError(f"privacy.delta must be in (0, 1), got {cfg.privacy.delta}")
  if int(cfg.rounds) < 1:
    raise ConfigError(f"rounds must be >= 1, got {cfg.rounds}")
  u = int(cfg.data.num_clients)
  if u < 1:
    raise ConfigError(f"data.num_clients must be >= 1, got {u}")
  if cfg.data.get("skew_scheme", "constant") not in SKEW_SCHEMES:
    raise ConfigError(f"data.skew_scheme: unknown {cfg.data.skew_scheme!r}; known: "
                      f"{list(SKEW_SCHEMES)}")


def _check_training(cfg: ConfigDict) -> None:
  """Local training and the server's clip rule."""
  minibatch = cfg.client.get("minibatch", "shuffle")
  if minibatch not in ("shuffle", "poisson"):
    raise ConfigError(f"client.minibatch: unknown {minibatch!r}; known: ['poisson', 'shuffle']")
  if minibatch == "poisson" and int(cfg.client.batch_size) < 1:
    raise ConfigError("client.minibatch='poisson' needs client.batch_size >= 1 (the expected "
                      f"batch size B, q_i = B / |D_i|), got {cfg.client.batch_size}")
  clip_rule = cfg.server.get("clip_rule", "fixed")
  if clip_rule not in ("fixed", "median", "private_median"):
    raise ConfigError(f"server.clip_rule: unknown {clip_rule!r}; known: "
                      "['fixed', 'median', 'private_median']")
  if clip_rule == "private_median":
    if not 0.0 < float(cfg.server.clip_quantile) < 1.0:
      raise ConfigError(f"server.clip_quantile must be in (0, 1), got "
                        f"{cfg.server.clip_quantile}")
    if not float(cfg.server.clip_lr) > 0.0:
      raise ConfigError(f"server.clip_lr must be > 0, got {cfg.server.clip_lr}")
  if float(cfg.client.clip) <= 0:
    raise ConfigError(f"client.clip must be > 0, got {cfg.client.clip}")
  if float(cfg.client.lr) <= 0:
    raise ConfigError(f"client.lr must be > 0, got {cfg.client.lr}")


def _check_execution(cfg: ConfigDict) -> None:
  """Chunking, noise identity, evaluation, checkpoints and noise sampling."""
  if int(cfg.server.client_chunk) < -1:
    raise ConfigError(f"server.client_chunk must be >= 0 (0 = all clients at once) or -1 "
                      f"(from free memory), got {cfg.server.client_chunk}")
  if int(cfg.privacy.noise_stream) < 0:
    raise ConfigError(f"privacy.noise_stream must be >= 0, got {cfg.privacy.noise_stream}")
  seed = cfg.privacy.get("noise_seed", "")
  if seed not in ("", "os") and not (isinstance(seed, str) and NOISE_SEED_HEX.fullmatch(seed)):
    raise ConfigError(f"privacy.noise_seed must be '' (noise from the config's identity), "
                      f"'os' (fresh OS entropy) or a recorded entropy of at least 32 "
                      f"lowercase hex digits, got {seed!r}")
  if cfg.server.get("conv_impl", "auto") not in ("auto", "conv", "im2col"):
    raise ConfigError(f"server.conv_impl: unknown {cfg.server.conv_impl!r}; "
                      "known: ['auto', 'conv', 'im2col']")
  if int(cfg.data.get("test_samples", 0)) < 0:
    raise ConfigError(f"data.test_samples must be >= 0 (0 = all), got {cfg.data.test_samples}")
  if int(cfg.eval.every) < 1:
    raise ConfigError(f"eval.every must be >= 1, got {cfg.eval.every}")
  if "checkpoint" in cfg and int(cfg.checkpoint.every) < 0:
    raise ConfigError(f"checkpoint.every must be >= 0 (0 = never), got {cfg.checkpoint.every}")
  if cfg.privacy.noise_sampling not in ("per_client", "aggregate"):
    raise ConfigError(f"privacy.noise_sampling: unknown {cfg.privacy.noise_sampling!r}; "
                      "known: ['aggregate', 'per_client']")
  if cfg.privacy.noise_sampling == "aggregate" and (
      cfg.privacy.placement != "upload" or cfg.privacy.mechanism != "gaussian"):
    raise ConfigError("privacy.noise_sampling='aggregate' needs privacy.placement='upload' "
                      "and privacy.mechanism='gaussian' (a sum of Laplace draws is not "
                      f"Laplace); got {cfg.privacy.placement!r}, {cfg.privacy.mechanism!r}")


class Readers(NamedTuple):
  """A registry whose entries declare the config fields they read (:data:`READERS`).

  Attributes:
    chooser: the field that picks the entry (``server.selection``).
    module: the registry's module, imported when a config is checked.
    reads: ``module -> {entry name: fields it reads}``: each entry's own declaration
      (a ``reads`` field on the entry, or a table beside a registry of functions).
  """

  chooser: str
  module: str
  reads: Any


def _entries_read(registry: str):
  return lambda m: {n: tuple(e.reads) for n, e in getattr(m, registry).items()}


def _schedules_read(m) -> dict[str, tuple[str, ...]]:
  """A schedule reads its ``PARAMS`` and its entry's ``reads``; the T search
  (:data:`OPTIMAL_T`, not a schedule) reads ``schedule.t_grid``."""
  return {**{n: (*(f"schedule.{k}" for k in m.SCHEDULE_PARAMS[n]), *s.reads)
             for n, s in m.SCHEDULES.items()}, OPTIMAL_T: ("schedule.t_grid",)}


def _mechanisms_read(m) -> dict[str, tuple[str, ...]]:
  """The i.i.d. mechanisms read none of the correlated ones' fields."""
  correlated = importlib.import_module("fedjax_dp.privacy.correlated").CORRELATED
  return {n: tuple(correlated[n].reads) if n in correlated else () for n in m.MECHANISMS}


# Every registry whose entries read fields that other entries do not: the one place
# unread_fields() learns what reads what (each registry declares it; looked up by
# module name at call time, so loading a config imports none of them).
READERS = (
    Readers("server.selection", "fedjax_dp.privacy.selection", _entries_read("RULES")),
    Readers("schedule.name", "fedjax_dp.privacy.schedules", _schedules_read),
    Readers("privacy.mechanism", "fedjax_dp.privacy.mechanisms", _mechanisms_read),
    Readers("privacy.formula", "fedjax_dp.privacy.formulas.registry",
            _entries_read("FORMULAS")),
    Readers("client.clip_mode", "fedjax_dp.privacy.clip_modes", _entries_read("CLIP_MODES")),
    Readers("server.clip_rule", "fedjax_dp.privacy.adaptive_clip", _entries_read("CLIP_RULES")),
    Readers("data.partition", "fedjax_dp.data.partition", lambda m: m.PARTITION_READS),
)


def get_field(cfg: ConfigDict, key: str) -> Any:
  """The value of a dotted field, ``get_field(cfg, "server.lr")``."""
  node = cfg
  for part in key.split("."):
    node = node[part]
  return node


def unread_fields(cfg: ConfigDict, as_given: ConfigDict | None = None) -> list[str]:
  """The fields ``cfg`` sets that the objects it picks do not read, one message each.

  A field is read by some entries of a registry (:data:`READERS`: a selection rule, a
  schedule, a correlated mechanism, a formula, a clip mode, a clip rule, a
  partition). It is reported when the entry ``cfg`` picks does not read it and it was
  set: changed from ``as_given`` (the config as its file gave it, before ``--set``),
  or set in that file away from its default (:func:`base_config`) while the file's
  own pick does not read it either. A field the file set for its own pick is not
  reported when ``--set`` picks another entry.

  Args:
    cfg: the config to run.
    as_given: the config before the command line's changes; None: ``cfg`` itself.
  """
  as_given = cfg if as_given is None else as_given
  defaults = base_config()
  out = []
  for r in READERS:
    reads = r.reads(importlib.import_module(r.module))
    chosen, given = get_field(cfg, r.chooser), get_field(as_given, r.chooser)
    if chosen not in reads:
      continue  # an unknown name: the field rules say so
    for field in dict.fromkeys(f for fields in reads.values() for f in fields):
      if field in reads[chosen]:
        continue
      value, before = get_field(cfg, field), get_field(as_given, field)
      changed = value != before
      if not (changed or (value != get_field(defaults, field)
                          and field not in reads.get(given, ()))):
        continue
      readers = [n for n, fields in reads.items() if field in fields]
      who = (f"every {r.chooser} but {', '.join(repr(n) for n in reads if n not in readers)}"
             if len(readers) > len(reads) / 2 else
             f"only {r.chooser} {' or '.join(map(repr, readers))}")
      out.append(f"{field}={value!r} does nothing: {who} reads it, and this config has "
                 f"{r.chooser}={chosen!r}")
  return out


def is_optimal_t(cfg: ConfigDict) -> bool:
  """Whether ``cfg`` asks for the T search (:data:`OPTIMAL_T`)."""
  return cfg.schedule.name == OPTIMAL_T


def validate(cfg: ConfigDict, *, as_given: ConfigDict | None = None) -> None:
  """Checks values that do not need the data; raises :class:`ConfigError` naming the field.

  The field rules first, then this module's cross-field checks, then (with
  ``as_given``) the fields that do nothing, then each picked mechanism's own
  (:data:`SELECTION_CHECKS`, :data:`OWNER_CHECKS`).

  Args:
    cfg: the config.
    as_given: the config as its file gave it, before the command line's ``--set``:
      with it, a field that does nothing (:func:`unread_fields`) is refused too.
      The commands pass it; a config built in code, e.g. a derived run such as an
      ``optimal_t`` candidate, is not judged for fields it carries along.
  """
  check_fields(cfg)
  _check_client_epsilons(cfg)
  _check_data_source(cfg)
  _check_targets(cfg)
  _check_training(cfg)
  _check_execution(cfg)
  if cfg.privacy.formula == "noise_multiplier" and float(cfg.privacy.noise_multiplier) < 0:
    raise ConfigError(f"privacy.noise_multiplier must be >= 0, got "
                      f"{cfg.privacy.noise_multiplier}")
  if as_given is not None:  # (before the owners' checks: a field that does nothing first)
    unread = unread_fields(cfg, as_given)
    if unread:
      raise ConfigError(unread[0])
  _check_owners(cfg)
