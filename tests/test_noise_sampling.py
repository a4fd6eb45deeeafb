"""``privacy.noise_sampling``: per-client vs aggregated Gaussian upload noise."""

import dataclasses

import jax
import numpy as np
import pytest
from _helpers import assert_rows_close, small_config, toy_federated

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

SHAPE, CLASSES = (8, 8, 1), 3
IDX, MASK = [4, 1, 2, 2, 0], [1, 1, 1, 0, 1]   # slot 3 is padding (masked out)
NOISE = [0.05, 0.1, 0.02, 0.3, 0.07]


def _base(**sets):
  return small_config({"rounds": "3", "data.num_clients": "5",
                       "data.samples_per_client": "24", "server.clients_per_round": "3",
                       "model.name": "logistic", "progress": "false"}, **sets)


def _args(noise):
  return engine.RoundArgs(
      idx=np.asarray(IDX, np.int32), sel_mask=np.asarray(MASK, np.float32),
      lr=np.asarray([0.3], np.float32), clip=np.float32(0.7),
      noise=np.asarray(noise, np.float32), central_noise=np.float32(0.0),
      server_lr=np.float32(1.0), round=np.int32(3), seed=np.uint32(11),
      data_id=np.int32(0))


def _leaves(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


def _theory_std(data, noise, aggregation):
  counts = np.asarray(data.counts, np.float64)[IDX] * np.asarray(MASK)
  denom = counts.sum() if aggregation == "normalized" else np.sum(data.counts)
  p = counts / denom
  return float(np.sqrt(np.sum((p * np.asarray(noise)) ** 2)))


def _round_cfg(sampling, aggregation="normalized", chunk=0):
  ccfg = client_lib.ClientConfig(1, 0, "per_example_l2", "upload")
  return engine.RoundConfig(ccfg, aggregation, chunk,
                            aggregate_upload_noise=sampling == "aggregate")


# ----------------------------------------------------------------------------- runs


def test_without_noise_both_samplings_give_the_same_rows():
  rows = {s: experiment.run(_base(**{"privacy.epsilon": "inf",
                                     "privacy.noise_sampling": s})).rows
          for s in ("per_client", "aggregate")}
  a, b = rows["per_client"], rows["aggregate"]
  assert len(a) == len(b) == 3
  assert_rows_close(a, b)


def test_with_noise_accounting_and_first_round_agree():
  rows = {s: experiment.run(_base(**{"privacy.epsilon": "4.0",
                                     "privacy.noise_sampling": s})).rows
          for s in ("per_client", "aggregate")}
  a, b = rows["per_client"], rows["aggregate"]
  for ra, rb in zip(a, b):  # the same mechanism: the same privacy accounting
    for c in ("epsilon_claimed", "epsilon_certified", "noise_mean"):
      assert ra[c] == rb[c], c
  # The first round trains the same initial model on the same clients.
  np.testing.assert_allclose(a[0]["train_loss"], b[0]["train_loss"], rtol=1e-6)
  # ... but the noise is drawn differently, so the models differ.
  assert a[0]["update_norm"] != b[0]["update_norm"]


# ----------------------------------------------------------------------------- distribution


@pytest.mark.parametrize("aggregation,chunk", [("normalized", 0), ("unnormalized", 2)])
@pytest.mark.parametrize("sampling", ["per_client", "aggregate"])
def test_model_noise_has_the_weighted_sum_std(sampling, aggregation, chunk):
  """new model - noiseless new model = sum_k p_k n_k ~ N(0, sum_k (p_k sigma_k)^2)."""
  data = toy_federated(6, 20, SHAPE, CLASSES, seed=1)
  model = get_model("mlp_784_256_10", SHAPE, CLASSES)  # 17k parameters
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  fn = engine.make_round_fn(model, _round_cfg(sampling, aggregation, chunk))
  clean, _ = fn(params, data, _args(np.zeros(len(NOISE))))
  noisy, metrics = fn(params, data, _args(NOISE))
  diff = _leaves(noisy) - _leaves(clean)
  assert diff.size > 15000
  want = _theory_std(data, NOISE, aggregation)
  # Relative standard error of a std over n normal samples: 1 / sqrt(2 n) ~ 0.5%.
  np.testing.assert_allclose(diff.std(), want, rtol=0.03)
  assert abs(diff.mean()) < 5 * want / np.sqrt(diff.size)
  assert float(metrics.num_selected) == 4


def test_sweep_lanes_get_their_own_aggregate_noise():
  """In a cohort (lanes share the clients) each lane's noise has its own scale, as in
  its single run."""
  data = toy_federated(6, 20, SHAPE, CLASSES, seed=1)
  model = get_model("mlp_784_256_10", SHAPE, CLASSES)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  round_fn, _ = engine.make_sweep_fns(model, _round_cfg("aggregate"), 2048, None)
  scales = np.asarray([0.0, 1.0, 3.0], np.float32)

  def stacked(tree):
    return jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (1, 3) + np.shape(a)), tree)

  args = jax.tree_util.tree_map(lambda *a: np.stack(a)[None],
                                *[_args(np.asarray(NOISE) * s) for s in scales])
  new, _ = round_fn(stacked(params), data, args, np.ones((1, 3), bool))
  new = jax.device_get(new)
  lane = [_leaves(jax.tree_util.tree_map(lambda a, i=i: a[0, i], new)) for i in range(3)]
  base = _theory_std(data, NOISE, "normalized")
  for i in (1, 2):
    np.testing.assert_allclose((lane[i] - lane[0]).std(), scales[i] * base, rtol=0.03)
  # Each lane is the round a single run of its noise scale computes (same seed and
  # round: the same key, so the same standard-normal draw, scaled).
  single = engine.make_round_fn(model, _round_cfg("aggregate"))
  for i in (1, 2):
    want, _ = single(params, data, _args(np.asarray(NOISE) * scales[i]))
    np.testing.assert_allclose(lane[i], _leaves(want), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("sets", [{"privacy.placement": "central"},
                                  {"privacy.placement": "step"},
                                  {"privacy.mechanism": "laplace"}])
def test_aggregate_needs_gaussian_upload_noise(sets):
  cfg = _base(**{"privacy.noise_sampling": "aggregate", **sets})
  with pytest.raises(config_lib.ConfigError, match="noise_sampling"):
    config_lib.validate(cfg)
  with pytest.raises(config_lib.ConfigError, match="noise_sampling"):
    experiment.run(cfg)
  # The same settings are fine with per-client sampling.
  config_lib.validate(config_lib.override(cfg, ["privacy.noise_sampling=per_client"]))


def test_unknown_noise_sampling_is_a_config_error():
  with pytest.raises(config_lib.ConfigError, match="privacy.noise_sampling"):
    config_lib.validate(_base(**{"privacy.noise_sampling": "per_round"}))


def test_round_config_rejects_aggregate_without_gaussian_upload():
  for placement, mechanism in (("central", "gaussian"), ("upload", "laplace"),
                               ("none", "gaussian")):
    ccfg = client_lib.ClientConfig(1, 0, "per_example_l2", placement, mechanism)
    with pytest.raises(ValueError, match="aggregate"):
      engine.RoundConfig(ccfg, aggregate_upload_noise=True)
  ok = engine.RoundConfig(client_lib.ClientConfig(1, 0, "per_example_l2", "upload"),
                          aggregate_upload_noise=True)
  assert dataclasses.replace(ok, client_chunk=2).aggregate_upload_noise


def test_chunk_from_memory_with_aggregate_noise():
  """``server.client_chunk=-1`` probes the round without noise; aggregated noise must
  not make that probe an invalid config (it raised before)."""
  cfg = _base(**{"privacy.noise_sampling": "aggregate", "server.client_chunk": "-1"})
  setup = experiment.build(cfg)
  assert setup.round_cfg.aggregate_upload_noise
  assert setup.round_cfg.client_chunk >= 0
  assert len(experiment.run(cfg, setup=setup).rows) == 3
