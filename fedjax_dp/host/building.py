"""Building a run: from a validated config to a :class:`Setup` (before any training).

:func:`build` loads the dataset, partitions it into clients (:func:`partition_clients`),
puts the client data on the device, builds the model, the privacy plan and the
selection rule's side information, then the static round config (:func:`round_config`)
and sizes the client chunk from the free memory. :func:`group_key` says which runs
can share one compiled round.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import compile_cache, optimizers
from fedjax_dp import config as config_lib
from fedjax_dp.config import privacy_inputs
from fedjax_dp.data import build_federated_data, load_dataset, partition_clients, streaming
from fedjax_dp.data.federated import pack_federated_data
from fedjax_dp.data.fingerprint import array_digest, dataset_fingerprint
from fedjax_dp.data.given import Federation
from fedjax_dp.host import overflow
from fedjax_dp.models import get_model
from fedjax_dp.models.adapters import PYTHON_MODEL, check_fits, code_text
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.plan import (
  PrivacyPlan,
  correlated_strategy,
  make_privacy_plan,
  selection_probability,
)
from fedjax_dp.training import memory, rounds

CLIENT_CHUNK_AUTO = -1  # server.client_chunk: choose from the free memory


@dataclasses.dataclass
class Setup:
  """Everything a run needs, built from a config (host and device objects)."""

  config: Any
  model: Any
  data: Any                 # FederatedData on the device (data.placement='host': numpy)
  x_test: jax.Array
  y_test: jax.Array
  round_cfg: rounds.RoundConfig
  privacy: PrivacyPlan
  num_clients: int
  k_slots: int
  selection_weights: np.ndarray | None = None  # [U] SelectionRule.weights, if the rule has
  data_source: dict | None = None  # Dataset.source: the files read and their SHA-256
  # The content of the data loaded (fedjax_dp.data.fingerprint): part of the noise identity.
  data_fingerprint: str | None = None
  # What x_test / y_test are (the dataset's test split, or a seed's or fold's unassigned
  # examples): a compiled group holds one copy of each distinct set and scores every
  # run on its own (host.groups._eval_sets).
  eval_key: str = ""


def data_key(cfg) -> str:
  """Runs with equal keys have equal client data: the ``data`` fields and the seed
  (every partitioner is seeded with ``cfg.seed``)."""
  return json.dumps([cfg.data.to_dict(), int(cfg.seed)], sort_keys=True, default=str)


def round_config(cfg, client_chunk: int = 0) -> rounds.RoundConfig:
  """The static :class:`fedjax_dp.training.rounds.RoundConfig` of a config's round,
  with the privacy plan's parts (the expected fraction, the correlated strategy)."""
  inputs = privacy_inputs.from_config(cfg)
  fraction = selection_probability(inputs) if inputs.server.aggregation == "fixed" else 1.0
  return rounds.round_config(cfg, client_chunk=client_chunk, expected_fraction=fraction,
                             correlated_noise=correlated_strategy(inputs))


def build(cfg, *, cache: dict | None = None, federation: Federation | None = None,
          model: Any = None, client_optimizer: optimizers.Optimizer | None = None,
          server_optimizer: optimizers.Optimizer | None = None) -> Setup:
  """Validates ``cfg`` and builds data, model and privacy plan (before any training).

  Args:
    cfg: the run's config.
    cache: optional dict shared by several builds (a sweep): runs with the same
      :func:`data_key` share one device copy of the client data, and runs of the
      same dataset share the test set.
    federation: the clients' data given from Python
      (:func:`fedjax_dp.data.given.federation`) in place of ``data.name``'s; the
      number of clients and their sizes are its own (``data.num_clients`` must agree,
      ``data.partition`` must be ``'natural'``).
    model: a model given from Python in place of ``model.name``'s: a builder
      ``(input_shape, num_classes) -> Model`` (:class:`fedjax_dp.models.adapters.UserSpec`);
      ``model.name`` must then be ``'python'``.
    client_optimizer, server_optimizer: optimizers given from Python
      (:func:`fedjax_dp.optimizers.from_transformation`) in place of the config's
      ``client.optimizer`` / ``server.optimizer`` (:func:`check_given_optimizers`).
  """
  config_lib.validate(cfg)
  given = (client_optimizer, server_optimizer)
  if any(o is not None for o in given):
    check_given_optimizers(cfg, *given)
  # Before anything compiles (the chunk probe below, the round): a second run of the
  # same shapes loads its programs from disk.
  compile_cache.use(cfg.get("compilation_cache", compile_cache.AUTO))
  # The partitioners, the model zoo and the privacy plan check the values they are
  # given and raise ValueError naming the field: here that is the user's config.
  with config_lib.as_config_errors():
    return _build(cfg, cache, given, federation, model)


def check_given_optimizers(cfg, client: optimizers.Optimizer | None = None,
                           server: optimizers.Optimizer | None = None) -> None:
  """Optimizers given from Python against the config.

  Raises:
    ConfigError: a given optimizer carries its own learning rate (a transformation
      from Python) while the config sets ``client.lr`` / ``server.lr`` to another
      value than its default: one of the two would be ignored.
  """
  defaults = config_lib.base_config()
  for side, opt in (("client", client), ("server", server)):
    if opt is not None and opt.own_lr and float(cfg[side].lr) != float(defaults[side].lr):
      raise config_lib.ConfigError(
          f"{side}.lr={float(cfg[side].lr):g} with {side}.optimizer={opt.name!r} passed from "
          f"Python, which carries its own learning rate: leave {side}.lr at its default "
          f"{float(defaults[side].lr):g}, or put the rate in the transformation only")


def _with_given(fingerprint: str, *parts: str) -> str:
  """The noise identity's data fingerprint with what Python gave and the config does not
  name (a model, an optimizer's transformation): two runs that differ in one never share
  a noise stream (a difference of two releases that share noise cancels it)."""
  return array_digest(np.frombuffer("|".join((fingerprint, *parts)).encode(), np.uint8))


def _given_checks(cfg, federation: Federation | None, model: Any) -> None:
  """A config that disagrees with the objects given from Python (before any data)."""
  if federation is not None:
    if int(cfg.data.num_clients) != federation.num_clients:
      raise config_lib.ConfigError(
          f"data.num_clients={int(cfg.data.num_clients)}, but the federation given holds "
          f"{federation.num_clients} clients: the number of clients comes from the data "
          f"(leave data.num_clients unset or make them agree)")
    if cfg.data.partition != "natural":
      raise config_lib.ConfigError(
          f"data.partition={cfg.data.partition!r} partitions a loaded dataset; a federation "
          f"given from Python holds its own clients (data.partition='natural')")
  if (model is None) == (cfg.model.name == PYTHON_MODEL):
    raise config_lib.ConfigError(
        f"model.name={cfg.model.name!r} " + ("names a model given from Python, but none was "
                                            "given" if model is None else
                                            f"with a model given from Python: set model.name="
                                            f"{PYTHON_MODEL!r}"))


def _build(cfg, cache: dict | None, given: tuple, federation: Federation | None = None,
           given_model: Any = None) -> Setup:
  """Builds down the floors: this module's own checks and keys; the data (dataset,
  partition, device copy, test set) and the model; the cohort slots and the privacy
  plan (selection, privacy); then the static round and its chunk size (training)."""
  if cfg.server.selection not in selection_lib.RULES:
    raise config_lib.ConfigError(f"server.selection: unknown {cfg.server.selection!r}; "
                                 f"known: {tuple(selection_lib.RULES)}")
  chunk = int(cfg.server.client_chunk)
  if chunk < CLIENT_CHUNK_AUTO:
    raise config_lib.ConfigError(f"server.client_chunk must be >= 0 (0 = all at once) or "
                                 f"{CLIENT_CHUNK_AUTO} (from free memory), got {chunk}")
  _given_checks(cfg, federation, given_model)
  cache = {} if cache is None else cache
  ds, clients, data, x_test, y_test, fingerprint, eval_key = _data(cfg, cache, federation)
  regression = ds.is_regression
  source = ds.source
  if given_model is None:
    model = get_model(cfg.model.name, ds.x_train.shape[1:], ds.num_classes)
  else:
    model = given_model(ds.x_train.shape[1:], ds.num_classes)
    check_fits(model, np.asarray(ds.x_train[:2]), np.asarray(ds.y_train[:2]))
    source = {**(source or {}), "model": model.describe()}
    fingerprint = _with_given(fingerprint, source["model"]["fingerprint"])
  num_params = model.num_params()
  if model.is_regression != regression:
    kinds = ("a classifier", "a regressor")
    raise config_lib.ConfigError(
        f"model.name={cfg.model.name!r} is {kinds[model.is_regression]}, but data.name="
        f"{cfg.data.name!r} has {'float regression targets' if regression else 'labels'}")
  # The optimizers (the given ones, else the config's): the plan's bound reads the
  # client's, the round applies both.
  opts = (given[0] or optimizers.client_optimizer(cfg.client),
          given[1] or optimizers.server_optimizer(cfg.server))
  if any(o is not None for o in given):  # (the config does not describe them)
    fingerprint = _with_given(fingerprint, *(code_text(o.transformation) for o in given
                                             if o is not None))
  u = len(clients)
  n_eps = len(cfg.privacy.client_epsilons)
  if n_eps and n_eps != u:  # (natural partitions: U comes from the data)
    raise config_lib.ConfigError(f"privacy.client_epsilons holds {n_eps} values, but the "
                                 f"partition has {u} clients (give one per client)")
  inputs = privacy_inputs.from_config(cfg, list(map(len, clients)), num_params,
                                      client_optimizer=opts[0])
  k_slots = selection_lib.cohort_size(cfg.server.selection, u, cfg.server.clients_per_round,
                                      cfg.server.q)
  weights = None
  rule = selection_lib.get_rule(cfg.server.selection)
  if rule.weights is not None:  # side information of the rule, from the partition (once)
    try:
      weights = rule.weights(np.asarray(ds.y_train), clients, ds.num_classes, inputs.server)
    except ValueError as e:
      raise config_lib.ConfigError(str(e)) from e
  privacy = make_privacy_plan(inputs)
  overflow.check(cfg, privacy, inputs.federation.counts, num_params)  # before compiling
  if privacy.validation == "clients" and model.is_regression:
    raise config_lib.ConfigError("schedule.validation='clients' scores accuracy, which a "
                                 "regressor does not have; use schedule.validation='server'")
  fraction = selection_probability(inputs) if inputs.server.aggregation == "fixed" else 1.0
  round_cfg = rounds.round_config(cfg, expected_fraction=fraction,
                                  correlated_noise=privacy.correlated,
                                  client_optimizer=opts[0], server_optimizer=opts[1])
  if chunk == CLIENT_CHUNK_AUTO:  # compiles the round: only once every check has passed
    chunk = memory.client_chunk_for_memory(model, round_cfg, data, k_slots)
  round_cfg = dataclasses.replace(round_cfg, client_chunk=chunk)
  return Setup(cfg, model, data, x_test, y_test, round_cfg, privacy, u, k_slots, weights,
               source, fingerprint, eval_key)


def _data(cfg, cache: dict, federation: Federation | None = None):
  """The dataset, its clients' indices and packed data, the evaluation set, the data's
  content fingerprint and the evaluation set's key (shared through ``cache`` by the
  runs of a sweep that read the same ones). A federation given from Python is the
  dataset, its clients as given."""
  key = data_key(cfg)
  if federation is None:
    ds = load_dataset(cfg.data.name, cfg.data.dir)
    fkey = ("fingerprint", ds.name, cfg.data.dir)
    if fkey not in cache:
      cache[fkey] = dataset_fingerprint(ds)
  else:
    fkey = ("given", id(federation))
    if fkey not in cache:  # (the federation itself is held, so its id stays its own)
      cache[fkey] = (federation.fingerprint(), federation.dataset(), federation)
    ds = cache[fkey][1]
    key = json.dumps(["given", cache[fkey][0]])
  if ("clients", key) not in cache:
    clients = (partition_clients(cfg, np.asarray(ds.y_train), ds.train_groups)
               if federation is None else federation.clients())
    # data.placement='host': the packed arrays stay in host memory; groups.run_group
    # streams each round's cohort to the device (fedjax_dp.data.streaming).
    pack = (pack_federated_data if cfg.data.get("placement", "device") == "host"
            else build_federated_data)
    cache["clients", key] = (clients, pack(ds.x_train, ds.y_train, clients))
  clients, data = cache["clients", key]
  n_test = int(cfg.data.get("test_samples", 0))
  split = str(cfg.eval.get("split", "test"))
  test_key = (key if federation is not None or split != "test" else cfg.data.name,
              cfg.data.dir, n_test, split)
  if ("test", test_key) not in cache:
    x_t, y_t = _eval_split(ds, clients, split, federation is not None)
    if 0 < n_test < len(y_t):
      # The same subset for every run and seed (seed 0), so runs stay comparable.
      keep = np.sort(np.random.default_rng(0).permutation(len(y_t))[:n_test])
      x_t, y_t = x_t[keep], y_t[keep]
    cache["test", test_key] = (jnp.asarray(x_t), jnp.asarray(y_t))
  fingerprint = cache[fkey] if federation is None else cache[fkey][0]
  return (ds, clients, data, *cache["test", test_key], fingerprint,
          json.dumps(list(test_key), default=str))


def _eval_split(ds, clients, split: str, given: bool) -> tuple[np.ndarray, np.ndarray]:
  """``(x, y)`` the run evaluates on: the test split, or (``'unassigned'``) the
  training examples the partition gave no client, in their order in the pool.

  Raises:
    ValueError: ``'unassigned'`` with a federation given from Python (its clients are
      all its training data) or a partition that uses every training example.
  """
  if split == "test":
    return np.asarray(ds.x_test), np.asarray(ds.y_test)
  if given:
    raise ValueError("eval.split='unassigned' needs a dataset partitioned by the run; a "
                     "federation given from Python has no unassigned examples (hold some "
                     "out yourself and pass them as its test set)")
  used = np.zeros(len(ds.y_train), bool)
  for c in clients:
    used[np.asarray(c, np.int64)] = True
  rest = np.flatnonzero(~used)
  if rest.size == 0:
    raise ValueError(f"eval.split='unassigned': the partition gives all {used.size} "
                     "training examples to clients; set data.holdout (examples set "
                     "aside before the partition) or lower data.num_clients or "
                     "data.samples_per_client to hold some out")
  return np.asarray(ds.x_train)[rest], np.asarray(ds.y_train)[rest]


def same_program(a: Setup, b: Setup) -> bool:
  """Whether two runs can share one compiled round (all static parts and shapes)."""
  return group_key(a) == group_key(b)


def group_key(s: Setup) -> tuple:
  """What fixes a run's compiled round: model, static round config, cohort slots,
  data and test-set shapes, evaluation batch. Everything else (seed, epsilon, learning
  rates, clip norm, schedules, T, which evaluation set of that shape) is a traced value
  or host-side."""
  return (s.model, s.round_cfg, s.k_slots, s.data.x.shape, s.data.y.shape,
          s.x_test.shape, int(s.config.eval.batch_size),
          streaming.is_host(s.data))
