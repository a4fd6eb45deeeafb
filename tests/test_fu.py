"""Fu et al.'s client procedure and its accounting (specs/fu_practicality.md).

Per-step clipping of the client's mean gradient (``step_grad_l1``/``step_grad_l2``),
Theorem 1/2 noise (``privacy.formula = fu_thm1 / fu_thm2``), client-level accounting
of round-robin turns, the paper's claimed epsilon beside the certified one, and the
aggregated noise's variance (Corollaries 1.1, 2.1).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import small_config
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.models import get_model
from fedjax_dp.privacy import formulas, mechanisms
from fedjax_dp.training import client as client_lib

REG = get_model("linear_regression", (3,), 1)
FU = {"data.num_clients": 10, "server.clients_per_round": 5, "server.selection": "round_robin",
      "client.clip_mode": "step_grad_l1", "client.clip": 0.5, "client.lr": 0.2,
      "client.local_steps": 2, "privacy.mechanism": "laplace", "privacy.formula": "fu_thm1",
      "privacy.epsilon": 3.0, "rounds": 4}


def _hp(steps, lr, clip, noise=0.0):
  return client_lib.ClientHParams(jnp.full((steps,), lr, jnp.float32), jnp.float32(clip),
                                  jnp.float32(0), jnp.float32(noise))


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


@functools.cache
def _one_step(ord):
  cfg = client_lib.ClientConfig(1, 0, "step_grad_l1" if ord == 1 else "step_grad_l2")
  return jax.jit(lambda p, x, y, m, hp: client_lib.client_update(
      REG, cfg, p, x, y, m, jax.random.PRNGKey(0), hp))


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1e-3, 1e4), ord=st.sampled_from([1, 2]), seed=st.integers(0, 2**16),
       clip=st.floats(0.01, 10.0), n=st.integers(1, 8))
def test_step_grad_clip_bound_holds_for_any_input(scale, ord, seed, clip, n):
  """One step moves the model by at most eta C in the clip's norm, and by exactly the
  unclipped mean gradient step when that is within C."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(8, 3)) * scale, jnp.float32)
  y = jnp.asarray(rng.normal(size=8) * scale, jnp.float32)
  mask = jnp.asarray(np.arange(8) < n, jnp.float32)
  params = REG.init(jax.random.PRNGKey(seed))
  lr = 0.5
  out = _one_step(ord)(params, x, y, mask, _hp(1, lr, clip))
  step = (_flat(params) - _flat(out.params)) / lr
  norm = np.linalg.norm(step, ord)
  assert norm <= clip * (1 + 1e-4)

  def mean_loss(p):
    return jnp.sum(REG.per_example_loss(REG.apply(p, x), y) * mask) / jnp.sum(mask)

  g = _flat(jax.grad(mean_loss)(params)).astype(np.float64)
  gnorm = np.linalg.norm(g, ord)
  want = g * min(1.0, clip / gnorm) if gnorm > 0 else g
  np.testing.assert_allclose(step, want, rtol=2e-3, atol=1e-5 * max(clip, 1.0))
  np.testing.assert_allclose(float(out.grad_norm), gnorm, rtol=2e-3)


def test_fu_thm1_laplace_noise_matches_its_scale():
  """The engine's upload noise under fu_thm1 is Laplace with Theorem 1's scale
  ``beta = T_l eta E zeta / eps`` (KS test on the noise of lr = 0 uploads)."""
  cfg = small_config(FU)
  plan = plan_from_config(cfg, np.full(10, 20))
  beta = plan.noise_scale(cfg.rounds)
  t_l = 2  # 4 rounds, 5 of 10 clients a round: every client twice
  np.testing.assert_allclose(beta, t_l * 0.2 * 2 * 0.5 / 3.0)
  assert plan.describe()["accounting"]["level"] == "client"
  ccfg = client_lib.ClientConfig(2, 0, "step_grad_l1", "upload", "laplace")
  big = get_model("linear_regression", (4000,), 1)
  params = big.init(jax.random.PRNGKey(0))
  x, y = jnp.ones((4, 4000), jnp.float32), jnp.ones(4, jnp.float32)
  hp = client_lib.ClientHParams(jnp.zeros(2, jnp.float32), jnp.float32(0.5), jnp.float32(0),
                                jnp.float32(beta[0]))
  out = client_lib.client_update(big, ccfg, params, x, y, jnp.ones(4), jax.random.PRNGKey(1),
                                 hp)
  noise = _flat(out.params) - _flat(params)
  assert stats.kstest(noise, stats.laplace(scale=beta[0]).cdf).pvalue > 1e-3
  assert stats.kstest(noise, stats.laplace(scale=1.3 * beta[0]).cdf).pvalue < 1e-3


def test_round_robin_client_level_accounting():
  """Each client is charged only for its own turns, at client level, with the
  corrected sensitivity 2 eta E zeta: per turn 2 eps / T_l pure epsilon."""
  cfg = small_config(FU)
  plan = plan_from_config(cfg, np.full(10, 20))
  ev = plan.event(np.ones(10))
  assert (ev.level, ev.sampling, ev.relation) == ("client", "round_robin", "replace_one")
  np.testing.assert_allclose(plan.sensitivity, 2 * 0.2 * 2 * 0.5)
  np.testing.assert_allclose(plan.claimed_sensitivity, 0.2 * 2 * 0.5)
  noise = plan.noise_scale(cfg.rounds)
  state = plan.accountant_step(plan.accountant_init(), noise, selected=np.arange(5))
  eps = plan.certified_epsilons(state)
  assert np.all(eps[5:] == 0) and np.all(eps[:5] > 0)
  # Laplace: the smaller of the RDP bound and basic composition, never above the pure
  # epsilon of the client's turns (2 eps / T_l = 3 each).
  assert np.all(eps[:5] <= 3.0) and np.all(eps[:5] > 2.9)
  state = plan.accountant_step(state, noise, selected=np.arange(5, 10))
  state = plan.accountant_step(state, noise, selected=np.arange(5))
  eps = plan.certified_epsilons(state)
  assert np.all(eps[:5] <= 6.0) and np.all(eps[:5] > 5.9)
  assert np.all(eps[5:] <= 3.0) and np.all(eps[5:] > 2.9)


def test_claimed_and_certified_epsilon_per_round_in_metrics():
  """fu_thm1's claim is t Xi / beta (basic composition, the paper's Xi) after t turns;
  the certified epsilon uses 2 Xi and is about twice the claim."""
  res = experiment.run(small_config(FU, **{"model.name": "logistic", "eval.every": 1}))
  claimed = [r["epsilon_claimed"] for r in res.rows]
  certified = np.array([r["epsilon_certified"] for r in res.rows])
  np.testing.assert_allclose(claimed, [1.5, 1.5, 3.0, 3.0], rtol=1e-6)
  assert np.all(certified > np.asarray(claimed) * 1.5)
  assert np.all(certified <= 2 * np.asarray(claimed) * (1 + 1e-9))  # basic composition
  inf = experiment.run(small_config(FU, **{"model.name": "logistic",
                                           "privacy.epsilon": float("inf"), "rounds": 2}))
  assert all(r["noise_mean"] == 0 and math.isinf(r["epsilon_certified"]) for r in inf.rows)


def test_fu_thm2_noise_and_claim():
  """fu_thm2: std sigma Xi with the zCDP sigma (spec A6); its claim at the horizon is
  the target; the certified epsilon (sensitivity 2 Xi) exceeds it."""
  cfg = small_config(FU, **{"client.clip_mode": "step_grad_l2", "privacy.mechanism": "gaussian",
                            "privacy.formula": "fu_thm2", "privacy.epsilon": 10.0,
                            "privacy.delta": 1e-4})
  plan = plan_from_config(cfg, np.full(10, 20))
  xi = 0.2 * 2 * 0.5
  np.testing.assert_allclose(plan.noise_scale(4), formulas.fu_sigma_zcdp(10.0, 1e-4, 2) * xi)
  state = plan.accountant_init()
  for t in range(4):
    sel = np.arange(5) + 5 * (t % 2)
    state = plan.accountant_step(state, plan.noise_scale(4), selected=sel)
  np.testing.assert_allclose(plan.claimed_epsilon(state), 10.0, rtol=1e-6)
  assert plan.certified_epsilon(state) > 10.0


def test_corollaries_aggregated_noise_variance():
  """Cor 1.1 / 2.1 with balanced clients: E||w^b||^2 = 2 p beta^2 / b (Laplace) and
  p (sigma Xi)^2 / b (Gaussian; the paper's extra factor 2 is erratum E5)."""
  p, b, trials = 50, 5, 400
  keys = jax.random.split(jax.random.PRNGKey(0), trials * b).reshape(trials, b, 2)
  scale = 0.7
  for mech, want in (("laplace", 2 * p * scale**2 / b), ("gaussian", p * scale**2 / b)):
    draw = jax.vmap(jax.vmap(lambda k, m=mech: mechanisms.noise_like(k, jnp.zeros(p), scale, m)))
    w_b = np.asarray(jnp.mean(draw(keys), axis=1), np.float64)  # equal weights n_l / sum n
    got = np.mean(np.sum(w_b**2, axis=1))
    assert abs(got - want) < 0.05 * want, (mech, got, want)


@pytest.mark.parametrize("sets,field", [
    ({"client.clip_mode": "per_example_l1"}, "client.clip_mode"),
    ({"server.selection": "uniform"}, "server.selection"),
    ({"privacy.mechanism": "gaussian"}, "privacy.mechanism"),
    ({"privacy.placement": "central", "client.clip_mode": "update_l2"}, "client.clip_mode"),
    ({"client.clip_mode": "step_grad_l2"}, "step_grad_l1"),
    ({"schedule.name": "linear_decay"}, "schedule.name"),
])
def test_unbounded_combinations_are_refused(sets, field):
  cfg = small_config(FU, **sets)
  with pytest.raises(ValueError, match=field):
    plan_from_config(cfg, np.full(10, 20))
  if field != "step_grad_l1":
    with pytest.raises(config_lib.ConfigError):
      plan_from_config(cfg, np.full(10, 20))
