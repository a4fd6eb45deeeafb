"""The Python API (fedjax_dp.api): a user's data, model, loss and hook, run and swept
from Python with the CLI's validation, the record naming data and model, and one-line
errors before compute."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fedjax_dp as fd
from fedjax_dp import api, experiment
from fedjax_dp.config import ConfigError
from fedjax_dp.host import groups
from fedjax_dp.models.adapters import UserSpec
from fedjax_dp.training import client as client_lib

U, N, F, C = 20, 12, 6, 3
# All clients at once (server.client_chunk=0): the default (-1) compiles two probe
# rounds per build, which these tiny rounds do not need and the API does not change
# (tests/test_chunking.py covers -1).
SMALL = {"rounds": 2, "server.clients_per_round": 5, "privacy.epsilon": 4.0,
         "progress": False, "client.clip": 1.0, "server.client_chunk": 0}


class Tiny(nn.Module):
  """A user's own flax.linen model (no layers of the project's zoo)."""
  width: int = C

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(self.width)(jnp.tanh(nn.Dense(8)(x)))


def _arrays(seed=0, u=U):
  rng = np.random.default_rng(seed)
  clients = [(rng.normal(size=(N + i % 3, F)).astype(np.float32),
              rng.integers(0, C, N + i % 3)) for i in range(u)]
  test = (rng.normal(size=(40, F)).astype(np.float32), rng.integers(0, C, 40))
  return clients, test


@pytest.fixture(scope="module")
def fed():
  clients, test = _arrays()
  return fd.federation(clients, test, name="toy")


@pytest.fixture
def no_compute(monkeypatch):
  """Fails the test if a round is run (the errors must come before compute)."""
  def refuse(*a, **k):
    raise AssertionError("a round ran before the error")
  monkeypatch.setattr(groups, "run_group", refuse)
  monkeypatch.setattr(experiment, "run_group", refuse)


def test_public_names_only():
  assert not [n for n in experiment.__all__ if n.startswith("_")]
  assert not [n for n in api.__all__ if n.startswith("_")]
  for name in fd.__all__:
    assert getattr(fd, name) is not None
  assert callable(fd.sweep) and hasattr(fd.sweep, "run_sweep")  # module and API function


def test_federation_from_arrays_dicts_and_a_generator_agree(fed):
  clients, test = _arrays()
  dicts = [{"image": x, "label": y} for x, y in clients]
  gen = fd.federation(({"image": d["image"], "label": d["label"]} for d in dicts),
                      {"image": test[0], "label": test[1]}, name="toy",
                      keys=("image", "label"))
  assert gen.fingerprint() == fed.fingerprint()
  assert fed.num_clients == U and list(fed.sizes) == [N + i % 3 for i in range(U)]
  for idx, (x, _) in zip(fed.clients(), clients):
    np.testing.assert_array_equal(fed.x[idx], x)
  assert fd.federation(clients[:-1], test, name="toy").fingerprint() != fed.fingerprint()


@pytest.mark.parametrize("bad,match", [
    ([], "no clients"),
    ([(np.zeros((0, F)), np.zeros(0, int))], "client 0 holds no examples"),
    ([(np.zeros((3, F)), np.zeros(3, int)), (np.zeros((3, F + 1)), np.zeros(3, int))],
     "client 1: examples of shape"),
    ([{"x": np.zeros((3, F))}], "client 0: a dict without"),
    ([(np.zeros((3, F)), np.zeros(2, int))], "same number of examples"),
])
def test_federation_refuses_bad_clients_in_one_line(bad, match):
  with pytest.raises(ValueError, match=match) as e:
    fd.federation(bad, (np.zeros((2, F)), np.zeros(2, int)))
  assert "\n" not in str(e.value)


def test_run_from_arrays_records_data_and_model(fed, tmp_path):
  res = fd.run("quickstart", SMALL, federation=fed, model=Tiny(), out_dir=tmp_path / "r")
  assert list(res.metrics["round"])[-1] == 2
  assert {"test_accuracy", "epsilon_certified"} <= set(res.metrics.columns)
  assert np.isfinite(res.epsilon) and res.epsilon <= 4.0 + 1e-6
  assert res.privacy_unit.startswith("example-level")
  shapes = jax.tree_util.tree_map(np.shape, res.params)
  assert shapes["Dense_0"]["kernel"] == (8, C)
  cfg = json.loads((tmp_path / "r" / "config.json").read_text())
  summary = json.loads((tmp_path / "r" / "summary.json").read_text())
  assert cfg["data"]["name"] == "toy" and cfg["data"]["num_clients"] == U
  assert cfg["data"]["partition"] == "natural" and cfg["model"]["name"] == "python"
  src = summary["data_source"]
  assert src["name"] == "toy" and src["kind"] == "python"
  assert src["x_shape"] == [int(fed.sizes.sum()), F] and src["client_sizes"] == list(fed.sizes)
  assert src["fingerprint"] == fed.fingerprint()
  assert src["model"]["name"] == "Tiny" and src["model"]["kind"] == "flax.linen"
  assert src["model"]["output_shape"] == [C] and len(src["model"]["fingerprint"]) == 32
  # The noise identity hashes the data AND the model.
  assert summary["data_fingerprint"] not in (src["fingerprint"], src["model"]["fingerprint"])


def test_noise_identity_differs_between_models_and_data(fed):
  base = api._given(api._config("quickstart", SMALL), fed, Tiny(), None, None)
  cfg, kw = api._with_clients(base[0], fed, False), base[1]
  a = experiment.build(cfg, **kw).data_fingerprint
  assert experiment.build(cfg, **kw).data_fingerprint == a
  other = {**kw, "model": fd.user_model(Tiny(width=C), loss="hinge")}
  assert experiment.build(cfg, **other).data_fingerprint != a
  clients, test = _arrays(seed=1)
  fed2 = fd.federation(clients, test, name="toy")
  assert experiment.build(cfg, **{**kw, "federation": fed2}).data_fingerprint != a


def test_federation_size_mismatch_names_both_values(fed, no_compute):
  with pytest.raises(ConfigError, match=r"data.num_clients=80, but the federation given "
                                        r"holds 20 clients") as e:
    fd.run("quickstart", {**SMALL, "data.num_clients": 80}, federation=fed, model=Tiny())
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("model,loss,match", [
    (Tiny(width=5), None, r"outputs \[5\] per example, but the labels have 3 classes"),
    (Tiny(width=1), None, r"outputs 1 value \(a regressor\) per example, but the labels"),
    (Tiny(), lambda out, y: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, y)),
     r"returns shape \[\] for 2 examples; a per-example loss must return \[2\]"),
    (Tiny(), lambda out, y: jnp.square(out),
     r"returns shape \[2, 3\] for 2 examples"),
    (Tiny(), "mse", r"loss 'mse' is a regression loss, but the labels are integer classes"),
])
def test_model_and_loss_that_do_not_fit_are_refused_before_compute(fed, no_compute, model,
                                                                   loss, match):
  with pytest.raises(ConfigError, match=match) as e:
    fd.run("quickstart", SMALL, federation=fed, model=model, loss=loss)
  assert "\n" not in str(e.value)


def test_a_config_that_names_a_python_model_without_one_is_refused(no_compute):
  with pytest.raises(ConfigError, match="names a model given from Python, but none"):
    experiment.build(api.make_config("quickstart", {"model.name": "python"}))


def test_cli_validation_runs_on_the_api_path(fed, no_compute):
  with pytest.raises(ConfigError, match="unknown config key 'privacy.epsilonn'"):
    fd.run("quickstart", {"privacy.epsilonn": 4}, federation=fed, model=Tiny())
  with pytest.raises(ConfigError, match="data.partition='iid' partitions a loaded dataset"):
    experiment.build(api.make_config("quickstart", {"model.name": "python",
                                                    "data.num_clients": U}),
                     federation=fed, model=fd.user_model(Tiny()))


def _init_apply():
  def init(key):
    return {"w": 0.1 * jax.random.normal(key, (F, C)), "b": jnp.zeros(C)}

  def apply(params, x):
    return x @ params["w"] + params["b"]
  return init, apply


class NnxTiny(nnx.Module):
  def __init__(self, rngs):
    self.dense = nnx.Linear(F, C, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


@pytest.mark.parametrize("kind", ["nnx_instance", "nnx_factory", "functions"])
def test_nnx_and_init_apply_models_build_and_apply(fed, kind):
  model = {"nnx_instance": NnxTiny(nnx.Rngs(0)), "nnx_factory": NnxTiny,
           "functions": _init_apply()}[kind]
  spec = fd.user_model(model, name=kind)
  m = spec((F,), C)
  params = jax.jit(m.init)(jax.random.PRNGKey(1))
  out = m.apply(params, jnp.asarray(fed.x[:4]))
  assert out.shape == (4, C)
  g = jax.grad(lambda p: jnp.sum(m.losses(p, jnp.asarray(fed.x[:4]),
                                          jnp.asarray(fed.y[:4]))))(params)
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(g))
  assert m.describe()["kind"] == {"functions": "functions"}.get(kind, "flax.nnx")


def test_sweep_over_epsilon_with_an_init_apply_model_and_custom_loss_and_metric(fed):
  def my_loss(out, y):
    return optax.softmax_cross_entropy_with_integer_labels(out, y)

  def top1(out, y):
    return (jnp.argmax(out, -1) == y).astype(jnp.float32)

  res = fd.sweep("quickstart", {"privacy.epsilon": [2.0, 8.0]}, SMALL, federation=fed,
                 model=_init_apply(), loss=my_loss, metrics={"top1": top1})
  assert len(res.runs) == 2 and [p["privacy.epsilon"] for p in res.points] == [2.0, 8.0]
  assert set(res.metrics["privacy.epsilon"]) == {2.0, 8.0}
  table = res.summary()
  assert list(table["epsilon_certified"] <= table["privacy.epsilon"] + 1e-6) == [True, True]
  for r in res.runs:
    assert r.test_metrics["top1"] == pytest.approx(r.accuracy, abs=1e-6)
    assert r.summary["data_source"]["model"]["loss"].endswith("my_loss")


def test_a_loader_by_name_with_a_users_model():
  res = fd.run("quickstart", {**SMALL, "rounds": 1, "data.samples_per_client": 20},
               federation="digits", model=fd.user_model(Tiny(width=10), name="mine"))
  assert res.config.data.name == "digits" and res.config.data.partition == "iid"
  assert res.summary["data_source"]["model"]["name"] == "mine"
  assert res.summary["data_source"]["model"]["input_shape"] == [8, 8, 1]


def test_fedprox_term_reaches_the_clients_loss_and_vmap_equals_a_loop(fed):
  """FedProx's proximal term: zero at the global model, pulls the local steps back
  towards it; vmapped clients equal a per-client loop for a user model."""
  cfg = api.make_config("quickstart", {**SMALL, "client.local_steps": 3,
                                       "client.clip_mode": "per_example_l2"})
  ccfg = experiment.round_config(cfg).client
  ccfg = dataclasses.replace(ccfg, noise_placement="none")
  plain = UserSpec(Tiny(), None, None, "plain")((F,), C)
  prox = UserSpec(Tiny(), None, fd.fedprox(50.0), "prox")((F,), C)
  params = plain.init(jax.random.PRNGKey(0))
  idx = fed.clients()[:4]
  x = jnp.stack([jnp.asarray(fed.x[i[:N]]) for i in idx])
  y = jnp.stack([jnp.asarray(fed.y[i[:N]]) for i in idx])
  mask = jnp.ones((4, N))
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  hp = client_lib.ClientHParams(jnp.full((3,), 0.05, jnp.float32), jnp.float32(10.0),
                                jnp.float32(0), jnp.float32(0))

  def one(model):  # one client's update, compiled once and called per client
    return jax.jit(lambda xi, yi, mi, ki: client_lib.client_update(
        model, ccfg, params, xi, yi, mi, ki, hp).params)

  def upd(model):
    return jax.jit(jax.vmap(lambda xi, yi, mi, ki: client_lib.client_update(
        model, ccfg, params, xi, yi, mi, ki, hp).params))(x, y, mask, keys)

  def dist(a):
    return np.sqrt(sum(float(jnp.sum(jnp.square(u - v))) for u, v in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(params))))

  vm = upd(prox)
  prox_one = one(prox)
  loop = [prox_one(x[k], y[k], mask[k], keys[k]) for k in range(4)]
  for a, *b in zip(jax.tree_util.tree_leaves(vm),
                   *(jax.tree_util.tree_leaves(one) for one in loop)):
    np.testing.assert_allclose(a, np.stack(b), rtol=1e-5, atol=1e-6)
  moved_plain = dist(jax.tree_util.tree_map(lambda v: v[0], upd(plain)))
  moved_prox = dist(jax.tree_util.tree_map(lambda v: v[0], vm))
  assert 0 < moved_prox < moved_plain  # the proximal term pulls back to w_global
  # At the global model the term is zero: the first step's loss is the plain loss.
  np.testing.assert_allclose(prox.anchored(params).losses(params, x[0], y[0]),
                             plain.losses(params, x[0], y[0]), rtol=1e-6)


def test_fedprox_run_from_python(fed):
  res = fd.run("quickstart", {**SMALL, "client.local_steps": 2}, federation=fed,
               model=Tiny(), global_term=fd.fedprox(0.1))
  assert res.summary["data_source"]["model"]["global_term"] == "fedprox(mu=0.1)"
  assert np.isfinite(res.metrics["test_loss"].iloc[-1])


def test_the_cohort_is_checked_against_the_federations_clients(fed, no_compute):
  # quickstart has 10 clients; the federation's 20 are what K=20 is checked against.
  with pytest.raises(AssertionError, match="a round ran"):
    fd.run("quickstart", {**SMALL, "server.clients_per_round": U}, federation=fed,
           model=Tiny())
  with pytest.raises(ConfigError, match=r"server.clients_per_round \(K=21\) must be in "
                                        r"\[1, data.num_clients \(U=20\)\]"):
    fd.run("quickstart", {**SMALL, "server.clients_per_round": U + 1}, federation=fed,
           model=Tiny())


def test_optimizers_from_python_by_name_and_as_optax_transformations(fed):
  res = fd.run("quickstart", {**SMALL, "privacy.placement": "central",
                              "client.clip_mode": "update_l2"}, federation=fed, model=Tiny(),
               server_optimizer=optax.adam(0.05), client_optimizer="momentum")
  assert res.config.client.optimizer == "momentum"
  assert np.isfinite(res.epsilon) and np.isfinite(res.metrics["test_loss"].iloc[-1])
  with pytest.raises(ConfigError, match=r"server.lr=0.5 with server.optimizer='python_server'"):
    fd.run("quickstart", {**SMALL, "server.lr": 0.5}, federation=fed, model=Tiny(),
           server_optimizer=optax.adam(0.05))


def test_a_transformation_from_python_enters_the_noise_identity(fed):
  cfg, kw = api._given(api._config("quickstart", SMALL), fed, Tiny(), None, None)
  cfg = api._with_clients(cfg, fed, False)
  prints = [experiment.build(cfg, **kw, server_optimizer=api._optimizer("server", tx)[1]
                             ).data_fingerprint
            for tx in (optax.adam(0.05), optax.adam(0.05), optax.adam(0.1), optax.sgd(0.05))]
  assert prints[0] == prints[1] and len(set(prints)) == 3
