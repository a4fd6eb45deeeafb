"""A-DPFL's validation score on the selected clients' data (issue 14 item 3, eq. (15)).

``schedule.validation='clients'``: the run loop scores the new global model on the
union of the round's selected clients' local data and releases it with
``N(0, (z_val / N_sel)^2)``; the accountant charges it in the same round. Checked here:
the exact score against a per-client numpy reference, its sensitivity ``1 / N_sel`` by
a neighbour search, the accountant's extra Gaussian against ``dp_accounting``, the
schedule reading the released score, and the refused configs.
"""

import itertools

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.config import ConfigError
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.data.federated import build_federated_data
from fedjax_dp.models import get_model
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import plan as plan_lib
from fedjax_dp.training import engine

MODEL = get_model("logistic", (3,), 4)
COUNTS = (7, 3, 9, 5)  # client sizes (client 1 is left out of the cohort below)


def _cfg(**sets):
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in sets.items()])


def _data(seed=0):
  rng = np.random.default_rng(seed)
  n = sum(COUNTS)
  x = rng.normal(size=(n, 3)).astype(np.float32)
  y = rng.integers(0, 4, size=n).astype(np.int32)
  bounds = np.cumsum((0,) + COUNTS)
  clients = [np.arange(a, b) for a, b in itertools.pairwise(bounds)]
  return x, y, clients


def _args(idx, sel, seed=0, t=0):
  k = len(idx)
  return engine.RoundArgs(
      idx=jnp.asarray(idx, jnp.int32), sel_mask=jnp.asarray(sel, jnp.float32),
      lr=jnp.zeros(1), clip=jnp.float32(1), noise=jnp.zeros(k), central_noise=jnp.float32(0),
      server_lr=jnp.float32(1), round=jnp.int32(t), seed=jnp.uint32(seed))


IDX, SEL = [2, 0, 3, 3], [1.0, 1.0, 1.0, 0.0]  # a padded slot repeats client 3, masked
N_SEL = COUNTS[2] + COUNTS[0] + COUNTS[3]
score_fn = jax.jit(lambda p, d, a, s: engine.selected_accuracy(MODEL, p, d, a, s))


def test_exact_score_matches_per_client_numpy_reference():
  x, y, clients = _data()
  data = build_federated_data(x, y, clients)
  params = MODEL.init(jax.random.PRNGKey(1))
  released, exact = score_fn(params, data, _args(IDX, SEL), 0.0)
  accs, weights = [], []
  for i in (2, 0, 3):
    logits = np.asarray(MODEL.apply(params, x[clients[i]]))
    accs.append(np.mean(np.argmax(logits, -1) == y[clients[i]]))
    weights.append(len(clients[i]))
  want = np.average(accs, weights=weights)  # count-weighted mean of per-client accuracies
  np.testing.assert_allclose(float(exact), want, rtol=1e-6)
  assert float(released) == float(exact)  # std 0: the exact score
  # with noise: exact + std N(0, 1) from fold_in(round_key, VALIDATION_NOISE_TAG)
  released, _ = score_fn(params, data, _args(IDX, SEL, seed=3, t=5), 0.25)
  key = jax.random.fold_in(engine.round_key(jnp.uint32(3), jnp.int32(5)),
                           engine.VALIDATION_NOISE_TAG)
  np.testing.assert_allclose(float(released),
                             want + 0.25 * float(jax.random.normal(key, ())), rtol=1e-5)
  assert engine.VALIDATION_NOISE_TAG not in (engine.CLIENT_TAG, engine.SERVER_TAG,
                                             engine.STREAM_TAG)


def test_score_sensitivity_neighbour_search():
  """Replacing one example of any client moves the score by at most 1 / N_sel (0 for a
  client outside the cohort); some replacement reaches it (tight)."""
  x, y, clients = _data()
  params = MODEL.init(jax.random.PRNGKey(2))
  base = float(score_fn(params, build_federated_data(x, y, clients), _args(IDX, SEL), 0.0)[1])
  rng = np.random.default_rng(7)
  bound = plan_lib.validation_sensitivity(np.array(COUNTS)[[2, 0, 3]])
  assert bound == pytest.approx(1.0 / N_SEL)
  worst = 0.0
  for _ in range(40):
    j = int(rng.integers(0, len(y)))
    x2, y2 = x.copy(), y.copy()
    x2[j] = rng.normal(size=3) * 3
    y2[j] = rng.integers(0, 4)
    got = float(score_fn(params, build_federated_data(x2, y2, clients), _args(IDX, SEL), 0.0)[1])
    move = abs(got - base)
    assert move <= bound * (1 + 1e-5)
    if j in clients[1]:
      assert move == 0.0
    worst = max(worst, move)
  np.testing.assert_allclose(worst, bound, rtol=1e-5)


def _rr_cfg(**sets):
  base = {"server.selection": "round_robin", "data.num_clients": 4,
          "server.clients_per_round": 2, "privacy.formula": "noise_multiplier",
          "privacy.noise_multiplier": 1.3, "privacy.delta": 1e-5, "schedule.name": "adpfl",
          "schedule.validation": "clients", "schedule.val_noise_multiplier": 2.0,
          "client.local_steps": 1, "rounds": 4}
  base.update(sets)
  return _cfg(**base)


@pytest.mark.parametrize("placement", ["upload", "step"])
def test_accountant_charges_exactly_the_extra_gaussian(placement):
  """Per client and per round it took part in: Gaussian(z) of the update and
  Gaussian(z_val) of the score, composed by dp_accounting; without validation only
  the first. Clients outside the cohort pay nothing."""
  cfg = _rr_cfg(**{"privacy.placement": placement})
  counts = np.full(4, 10)
  plan = plan_from_config(cfg, counts)
  assert plan.validation == "clients"
  z = 1.3
  cohorts = [[0, 1], [2, 3], [0, 1]]
  with_val, without = plan.accountant_init(), plan.accountant_init()
  for sel in cohorts:
    noise = np.full(4, z) * plan.sensitivity
    with_val = plan.accountant_step(with_val, noise, selected=np.array(sel), validate=True)
    without = plan.accountant_step(without, noise, selected=np.array(sel))
  eps_val, eps = plan.certified_epsilons(with_val), plan.certified_epsilons(without)
  for i in range(4):
    ref, ref0 = (dp_accounting.rdp.RdpAccountant(orders=list(accounting.DEFAULT_ORDERS))
                 for _ in range(2))
    turns = sum(i in c for c in cohorts)
    ref.compose(dp_accounting.GaussianDpEvent(z), turns)
    ref.compose(dp_accounting.GaussianDpEvent(2.0), turns)
    ref0.compose(dp_accounting.GaussianDpEvent(z), turns)
    np.testing.assert_allclose(eps_val[i], ref.get_epsilon(1e-5), rtol=1e-6)
    np.testing.assert_allclose(eps[i], ref0.get_epsilon(1e-5), rtol=1e-6)
  assert np.all(eps_val > eps)
  # the paper formulas' bookkeeping is not touched
  np.testing.assert_array_equal(with_val.inv_var_sum, without.inv_var_sum)
  # 'server' charges nothing extra even when asked
  srv = plan_from_config(_rr_cfg(**{"schedule.validation": "server"}), counts)
  a = srv.accountant_step(srv.accountant_init(), np.full(4, z) * srv.sensitivity,
                          selected=np.array([0, 1]), validate=True)
  np.testing.assert_allclose(srv.certified_epsilons(a)[0],
                             dp_accounting.rdp.RdpAccountant(
                                 orders=list(accounting.DEFAULT_ORDERS)).compose(
                                     dp_accounting.GaussianDpEvent(z)).get_epsilon(1e-5),
                             rtol=1e-6)


def test_poisson_minibatches_charge_the_score_to_the_cohort():
  """Poisson minibatches: E subsampled-Gaussian steps and one Gaussian(z_val) per round
  a client took part in (dp_accounting), under add/remove (round robin allows it; the
  A-DPFL rules make it replace-one: tests/test_neighbour_relation.py)."""
  cfg = _rr_cfg(**{"client.minibatch": "poisson", "client.batch_size": 5,
                   "client.local_steps": 2, "privacy.placement": "step",
                   "server.selection": "round_robin"})
  counts = np.array([10, 20, 10, 20])
  plan = plan_from_config(cfg, counts)
  assert plan.poisson_steps and plan.validation == "clients"
  state = plan.accountant_init()
  for sel in ([0, 1], [0, 2]):
    state = plan.accountant_step(state, np.full(4, 1.3) * plan.sensitivity,
                                 selected=np.array(sel), validate=True)
  eps = plan.certified_epsilons(state)
  assert eps[3] == 0.0  # never selected
  for i, turns in enumerate((2, 1, 1)):
    ref = dp_accounting.rdp.RdpAccountant(orders=list(accounting.DEFAULT_ORDERS))
    ref.compose(dp_accounting.PoissonSampledDpEvent(
        plan.batch_q[i], dp_accounting.GaussianDpEvent(1.3)), 2 * turns)
    ref.compose(dp_accounting.GaussianDpEvent(2.0), turns)
    np.testing.assert_allclose(eps[i], ref.get_epsilon(1e-5), rtol=1e-6, atol=1e-12)


def test_amplified_rule_charges_the_joint_gaussian():
  """A random rule amplifies the round's single Gaussian of multiplier
  (z^-2 + z_val^-2)^(-1/2) (both releases read the same cohort)."""
  cfg = _rr_cfg(**{"server.selection": "uniform"})
  plan = plan_from_config(cfg, np.full(4, 10))
  z = np.full(4, 1.3)
  joint = (1.3 ** -2 + 2.0 ** -2) ** -0.5
  np.testing.assert_allclose(accounting.event_rdp(plan.event(z, val_multiplier=2.0)),
                             accounting.event_rdp(plan.event(np.full(4, joint))))


def _run_cfg(validation, **sets):
  base = {"data.num_clients": 4, "data.samples_per_client": 20, "server.clients_per_round": 2,
          "server.selection": "round_robin", "model.name": "logistic", "rounds": 4,
          "privacy.formula": "noise_multiplier", "privacy.noise_multiplier": 0.8,
          "schedule.name": "adpfl", "schedule.validation": validation,
          "schedule.alpha": 0.02, "schedule.val_noise_multiplier": 1.5, "eval.every": 4,
          "server.client_chunk": 0, "progress": "false"}
  base.update(sets)
  return _cfg(**base)


def test_schedule_reads_the_released_client_score():
  """validation='clients': every round carries val_accuracy (eval.every=4 gives no test
  accuracy before round 4), the noise follows eq. (15) on those scores, and the
  certified epsilon includes the score's release."""
  res = experiment.run(_run_cfg("clients"))
  rows = res.rows
  assert len(rows) == 4 and all(r["val_accuracy"] != "" for r in rows)
  assert res.summary["privacy"]["validation"] == "clients"
  prev, m, sigma0 = 0.0, 0, rows[0]["noise_mean"]
  for r, nxt in itertools.pairwise(rows):
    m += int(r["val_accuracy"] - prev <= 0.02)
    prev = r["val_accuracy"]
    np.testing.assert_allclose(nxt["noise_mean"], sigma0 * 0.7 ** m, rtol=1e-9)
  srv = experiment.run(_run_cfg("server", **{"eval.every": 1}))
  assert "val_accuracy" not in srv.rows[0]
  # same rounds and noise on the first round; the client score costs epsilon
  assert rows[0]["epsilon_certified"] > srv.rows[0]["epsilon_certified"]


@pytest.mark.parametrize("sets,match", [
    ({"schedule.validation": "test"}, "schedule.validation"),
    ({"schedule.val_noise_multiplier": 0.0}, "val_noise_multiplier"),
    ({"schedule.val_noise_multiplier": -1.0}, "val_noise_multiplier"),
    ({"privacy.mechanism": "laplace", "client.clip_mode": "per_example_l1"},
     "privacy.mechanism"),
    ({"privacy.placement": "central", "client.clip_mode": "update_l2",
      "server.selection": "uniform"}, "client-level"),
])
def test_bad_config_is_refused(sets, match):
  with pytest.raises(ConfigError, match=match):
    cfg = _rr_cfg(**sets)
    config_lib.validate(cfg)
    plan_from_config(cfg, np.full(4, 10))


def test_privacy_off_allows_noiseless_score():
  cfg = _rr_cfg(**{"privacy.placement": "none", "schedule.val_noise_multiplier": 0.0})
  plan = plan_from_config(cfg, np.full(4, 10))
  assert plan.noiseless and plan.validation == "clients"
  # other schedules never release a score
  assert plan_from_config(_rr_cfg(**{"schedule.name": "constant"}),
                           np.full(4, 10)).validation == "server"


@pytest.mark.parametrize("every", [1, 2])
def test_paper_epsilon_of_charges_the_score_as_the_run_loop_does(every):
  """fedjax_dp.papers.adpfl.epsilon_of (A-DPFL's planned budgets, equal_epsilon.py) on
  a noise pattern equals the run loop's certified epsilon for that pattern, the
  released client scores included: the host loop (no training) with alpha = -1 never
  reduces sigma (a score gain is never <= -1), so its pattern is all ones."""
  from fedjax_dp.papers import adpfl
  cfg = adpfl.method_config(adpfl.paper_config(
      "mnist", "noniid", data_dir="../shared/datasets/mnist", rounds=5, num_clients=40,
      samples=60, clients=4, validation="clients"), "adpfl")
  cfg.schedule.alpha, cfg.schedule.adjust_every = -1.0, float(every)
  cfg.model.name = "logistic"
  loop = experiment.RunLoop(cfg, experiment.build(cfg), None)
  while (a := loop.plan_round()) is not None:
    loop.record({"train_loss": 0.0, "grad_norm": 0.0, "update_norm": 0.0,
                 "num_selected": float(a.sel_mask.sum())}, (0.0, 0.0),
                0.0, 0.0 if loop.wants_validation else None)
  certified = loop.rows[-1]["epsilon_certified"]
  np.testing.assert_allclose(adpfl.epsilon_of(cfg, np.ones(5)), certified, rtol=1e-9)
  cfg.schedule.validation = "server"
  assert adpfl.epsilon_of(cfg, np.ones(5)) < certified  # the score's releases cost
