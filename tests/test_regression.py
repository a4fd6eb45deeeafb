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
from fedjax_dp import engine, experiment
from fedjax_dp.data import build_federated_data
from fedjax_dp.models import get_model


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
