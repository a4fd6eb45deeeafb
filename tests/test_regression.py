"""Regression end to end: float targets, the linear model, MSE in evaluate and metrics.csv."""

import csv
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_datasets_papers import write_loans

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.data import build_federated_data
from fedjax_dp.models import get_model
from fedjax_dp.privacy import clipping
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine


def test_linear_regression_model_and_evaluate():
  model = get_model("linear_regression", (10,), 0)
  assert model.is_regression and model.num_params() == 11  # Fu et al.: 10 features + bias
  assert not get_model("logistic", (10,), 2).is_regression
  with pytest.raises(ValueError, match="num_classes"):
    get_model("logistic", (10,), 0)
  params = model.init(jax.random.PRNGKey(0))
  assert all(float(jnp.abs(p).sum()) == 0 for p in jax.tree_util.tree_leaves(params))
  rng = np.random.default_rng(0)
  w, b = rng.normal(size=10).astype(np.float32), np.float32(0.3)
  params = {"Dense_0": {"kernel": jnp.asarray(w[:, None]), "bias": jnp.asarray([b])}}
  x = rng.normal(size=(37, 10)).astype(np.float32)
  y = rng.normal(size=37).astype(np.float32)
  mse, acc = engine.evaluate(model, params, jnp.asarray(x), jnp.asarray(y), batch_size=8)
  assert float(mse) == pytest.approx(np.mean((x @ w + b - y) ** 2), rel=1e-5)
  assert math.isnan(float(acc))


def test_federated_data_keeps_float_targets():
  x = np.arange(12, dtype=np.float32).reshape(6, 2)
  y = np.array([0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
  data = build_federated_data(x, y, [np.array([0, 1]), np.array([2, 3, 4])])
  assert data.y.dtype == jnp.float32
  np.testing.assert_allclose(data.y, [[0.5, 1.5, 0.0], [2.5, 3.5, 4.5]])
  labels = build_federated_data(x, np.arange(6), [np.arange(3)])
  assert labels.y.dtype == jnp.int32


def _cfg(tmp_path, **sets):
  write_loans(tmp_path, n=100)
  base = {"data.name": "lending_club", "data.dir": str(tmp_path), "data.partition": "sorted",
          "data.num_clients": "4", "data.samples_per_client": "20",
          "model.name": "linear_regression", "rounds": "30", "client.lr": "0.3",
          "client.local_steps": "2", "client.clip": "5.0", "server.clients_per_round": "4",
          "privacy.epsilon": "50", "privacy.formula": "wei_eq10", "progress": "false"}
  base.update(sets)
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in base.items()])


def test_regression_run_with_clipping_and_noise(tmp_path):
  cfg = _cfg(tmp_path)
  res = experiment.run(cfg, str(tmp_path / "run"))
  s = res.summary
  assert s["task"] == "regression" and s["status"] != "diverged"
  assert s["final_test_accuracy"] is None and s["num_params"] == 6 + 1  # 6 PCs + bias
  # Zero init: the first MSE is near the mean squared rate (~170); training brings it
  # well under the targets' variance (~80) despite clipping and noise.
  ds = experiment.load_dataset("lending_club", str(tmp_path))
  assert s["final_test_loss"] < 0.5 * float(np.mean(ds.y_test ** 2))
  assert max(r["noise_mean"] for r in res.rows) > 0  # noise was on
  with open(tmp_path / "run" / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert all(r["test_accuracy"] == "" for r in rows)
  assert all(math.isfinite(float(r["test_loss"])) for r in rows if r["test_loss"])
  assert (tmp_path / "run" / "metrics.png").stat().st_size > 0
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["task"] == "regression"


def test_regressor_and_classifier_must_match_the_data(tmp_path):
  with pytest.raises(ValueError, match="model.name='logistic' is a classifier"):
    experiment.build(_cfg(tmp_path, **{"model.name": "logistic"}))
  with pytest.raises(config_lib.ConfigError, match="a regressor"):
    experiment.build(config_lib.override(config_lib.base_config(),
                                         ["model.name=linear_regression"]))


def _float_clients(num_clients=6, n=20, features=10, seed=0):
  rng = np.random.default_rng(seed)
  sizes = rng.integers(n // 2, n + 1, num_clients)
  x = rng.normal(size=(sizes.sum(), features)).astype(np.float32)
  y = (x @ rng.normal(size=features) + 10.0).astype(np.float32)  # large targets: clipping bites
  bounds = np.concatenate([[0], np.cumsum(sizes)])
  return build_federated_data(x, y, [np.arange(bounds[i], bounds[i + 1])
                                     for i in range(num_clients)])


def test_regression_round_equals_per_client_loop():
  """The vmapped round on float targets equals a loop over clients (same keys)."""
  from test_engine import _args  # pylint: disable=import-outside-toplevel
  ccfg = client_lib.ClientConfig(2, 6, "per_example_l2", "step")  # minibatches + step noise
  data = _float_clients()
  model = get_model("linear_regression", (10,), 0)
  params = jax.tree_util.tree_map(lambda p: p + 0.05, model.init(jax.random.PRNGKey(0)))
  args = _args([4, 1, 1], [1, 1, 0], [0.05, 0.1, 0.3], lr=[0.05] * ccfg.local_steps)
  got, _ = engine.make_round_fn(model, engine.RoundConfig(ccfg))(params, data, args)
  one_client = jax.jit(client_lib.client_update, static_argnums=(0, 1))
  outs, counts = [], []
  for k, i in enumerate([4, 1]):  # the selected ones; slot 2 is padding
    key = engine.client_keys(args.seed, args.round, jnp.asarray([i]))[0]
    hp = client_lib.ClientHParams(args.lr, args.clip, args.noise[k], args.noise[k])
    outs.append(jax.device_get(one_client(model, ccfg, params, data.x[i], data.y[i],
                                          data.mask[i], key, hp).params))
    counts.append(float(data.counts[i]))
  # The weighted mean in float32 NumPy (as jnp would, without compiling each small op).
  w = (np.asarray(counts) / np.sum(counts)).astype(np.float32)
  want = jax.tree_util.tree_map(lambda *ps: sum(wi * p for wi, p in zip(w, ps)), *outs)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_regression_clipped_sum_changes_by_at_most_c_per_example():
  """The sensitivity claim does not depend on the loss: removing any one example moves
  the clipped gradient sum by at most C (here with targets far from the predictions,
  so every raw per-example gradient is much larger than C)."""
  data = _float_clients(num_clients=1, n=16)
  model = get_model("linear_regression", (10,), 0)
  params = model.init(jax.random.PRNGKey(0))
  x, y, w = data.x[0], data.y[0], data.mask[0]
  clip = 0.5
  clipped_sum = jax.jit(
      lambda weights: clipping.per_example_clipped_grad_sum(model, params, x, y, weights, clip))
  full, _, norms = clipped_sum(w)
  assert float(jnp.min(jnp.where(w > 0, norms, jnp.inf))) > 10 * clip
  for j in range(int(data.counts[0])):
    less, _, _ = clipped_sum(w.at[j].set(0.0))
    diff = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: a - b, full, less))
    norm = float(jnp.sqrt(sum(jnp.sum(d ** 2) for d in diff)))
    assert norm <= clip * (1 + 1e-5)
    assert norm == pytest.approx(clip, rel=1e-4)  # every example is clipped to exactly C
