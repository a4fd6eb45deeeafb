"""Correlated noise across rounds (privacy.mechanism tree / bandmf): strategies and
sensitivities against jax_privacy and the papers, the in-round noise against the
host-side matrix mechanism, its covariance, the accounting, bad configs, resume."""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import QUICKSTART, small_config, toy_federated

from fedjax_dp import cli, experiment
from fedjax_dp.config import ConfigError
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.models import get_model
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import correlated as cn
from fedjax_dp.privacy.correlated import bandmf, tree
from fedjax_dp.privacy.correlated.base import normal_like
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

mf = pytest.importorskip("jax_privacy.matrix_factorization")

CORR = {"privacy.placement": "central", "client.clip_mode": "update_l2",
        "server.selection": "round_robin", "server.aggregation": "fixed",
        "model.name": "logistic", "progress": "false", "eval.every": "50"}


def _tree_prefix_rows(s):
  """``D [T, nodes]``: round t's prefix noise N(t+1) as a sum of tree.matrix's rows."""
  c = tree.matrix(s)
  index = {}
  for r, row in enumerate(c):
    cover = np.flatnonzero(row)
    index[(int(cover[0]), int(cover.size))] = r
  d = np.zeros((s.rounds, c.shape[0]))
  for t in range(s.rounds):
    j, n = divmod(t, s.restart)
    n += 1
    for lvl in range(tree.levels(s.restart)):
      if (n >> lvl) & 1:
        d[t, index[(j * s.restart + ((n >> lvl) - 1) * 2 ** lvl, 2 ** lvl)]] = 1.0
  return d


def test_tree_single_participation_sensitivity_is_sqrt_log2_t_plus_1():
  for t in (8, 16, 64):  # Kairouz et al. 2021: sqrt(ceil(log2 T) + 1)
    s = tree.strategy(t)
    c = tree.matrix(s)
    np.testing.assert_allclose(c.T @ c, tree.gram(s))
    want = np.sqrt(np.ceil(np.log2(t)) + 1)
    assert np.isclose(mf.sensitivity.single_participation_sensitivity(jnp.asarray(c)), want)
    assert np.isclose(np.sqrt(np.max(np.diag(tree.gram(s)))), want)
  s = tree.strategy(10, restart=4)  # restarts: trees of 4, 4, 2 rounds
  np.testing.assert_allclose(np.diag(tree.gram(s)), [3] * 8 + [2, 2])
  assert tree.gram(s)[3, 4] == 0  # rounds of different trees share no node
  # The node-to-prefix map D factorises the prefix workload: D C = A within each tree.
  d, c = _tree_prefix_rows(s), tree.matrix(s)
  a = np.zeros((10, 10))
  for j in range(3):
    lo, hi = 4 * j, min(4 * j + 4, 10)
    a[lo:hi, lo:hi] = np.tril(np.ones((hi - lo, hi - lo)))
  np.testing.assert_allclose(d @ c, a)


def test_bandmf_strategy_and_minsep_sensitivity_match_jax_privacy():
  n, bands = 32, 4
  ours = np.asarray(bandmf.optimal_coefs(n, bands))
  # The same objective as jax_privacy's (McKenna et al. 2024), and a minimum of it: no
  # better than its start (the square root of A) or nearby points. (jax_privacy's own
  # optimiser agrees to 1e-6 on these; it takes ~15 s to run, so it is not rerun here.)
  loss = lambda c: float(mf.toeplitz.loss(jnp.asarray(c, jnp.float32), n))
  assert np.isclose(float(bandmf.prefix_loss(jnp.asarray(ours, jnp.float32), n)), loss(ours),
                    rtol=1e-5)
  start = np.asarray(mf.toeplitz.optimal_max_error_strategy_coefs(bands))
  assert loss(ours) < loss(start)
  rng = np.random.default_rng(0)
  assert all(loss(ours) <= loss(ours + 0.01 * rng.normal(size=bands)) for _ in range(5))
  assert np.isclose(np.linalg.norm(ours), 1.0)
  s = bandmf.strategy(n, bands)
  c = np.asarray(mf.toeplitz.materialize_lower_triangular(jnp.asarray(ours), n))
  np.testing.assert_allclose(bandmf.matrix(s), c, atol=1e-6)
  g = bandmf.gram(s)
  for sep, k in ((4, 8), (8, 3), (2, 5), (1, 7)):  # min-sep b >= bands and < bands
    pattern = np.zeros(n, bool)
    pattern[np.arange(k) * sep] = True  # the worst case for non-negative decreasing c
    want = mf.toeplitz.minsep_sensitivity_squared(jnp.asarray(ours), sep, k, n=n)
    assert np.isclose(cn.pattern_sensitivity_sq(g, pattern), float(want), rtol=1e-5)
  # Choquette-Choo et al. 2023, Thm. 2: participations >= b apart give k ||c||^2.
  pattern = np.zeros(n, bool)
  pattern[::bands] = True
  assert np.isclose(cn.pattern_sensitivity_sq(g, pattern), n // bands, rtol=1e-6)


def _run_samples(s, key, like, rounds):
  mech = cn.get(s.name)
  step = jax.jit(lambda t, st: mech.sample(s, key, t, st, like))
  state, out = mech.init(s, like), []
  for t in range(rounds):
    w, state = step(jnp.int32(t), state)
    out.append(np.asarray(w))
  return np.stack(out)


def test_in_round_noise_reproduces_the_host_matrix_mechanism():
  key, like = jax.random.PRNGKey(3), jnp.zeros(5)
  s = bandmf.strategy(12, 3)
  z = np.stack([np.asarray(normal_like(jax.random.fold_in(key, t), like)) for t in range(12)])
  want = np.linalg.solve(bandmf.matrix(s), z)  # C^{-1} Z, one row per round
  np.testing.assert_allclose(_run_samples(s, key, like, 12), want, rtol=1e-5, atol=1e-5)
  s = tree.strategy(11, restart=5)
  got = _run_samples(s, key, like, 11)
  prefix = np.stack([np.asarray(x) for x in tree.node_noise(s, key, like)])  # N(n)
  for t in range(11):  # the applied noise telescopes to the prefix noise within a tree
    start = t - t % 5
    np.testing.assert_allclose(got[start:t + 1].sum(0), prefix[t], rtol=1e-5, atol=1e-5)


def test_compiled_round_carries_the_bandmf_state():
  """Rounds with no client selected move the model by exactly server_lr * sigma * w_t:
  the compiled round's carried state gives C^{-1} Z, row by row."""
  s = bandmf.strategy(6, 3)
  model = get_model("logistic", (4, 4, 1), 3)
  params = model.init(jax.random.PRNGKey(0))
  data = toy_federated(4, n=8)
  ccfg = client_lib.ClientConfig(clip_mode="update_l2", noise_placement="central")
  rcfg = engine.RoundConfig(ccfg, aggregation="fixed", expected_fraction=0.5, correlated=s)
  fn = jax.jit(lambda p, a: engine.round_step(model, rcfg, p, data, a))
  p = engine.carried_params(rcfg, params)
  flat = lambda x: np.concatenate([np.ravel(v) for v in jax.tree_util.tree_leaves(x)])
  steps, seed, stream = [], 7, 0
  for t in range(6):
    args = engine.RoundArgs(idx=jnp.zeros(2, jnp.int32), sel_mask=jnp.zeros(2),
                            lr=jnp.full((1,), 0.1), clip=jnp.float32(1.0),
                            noise=jnp.zeros(2), central_noise=jnp.float32(0.5),
                            server_lr=jnp.float32(1.0), round=jnp.int32(t),
                            seed=jnp.uint32(seed), stream=stream)
    new, _ = fn(p, args)
    steps.append((flat(new.model) - flat(p.model)) / 0.5)
    p = new
  key = engine.correlated_key(jnp.uint32(seed), stream)
  z = np.stack([flat(normal_like(jax.random.fold_in(key, t), params)) for t in range(6)])
  np.testing.assert_allclose(np.stack(steps), np.linalg.solve(bandmf.matrix(s), z),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["bandmf", "tree"])
def test_noise_covariance_across_rounds(name):
  t = 8
  s = bandmf.strategy(t, 3) if name == "bandmf" else tree.strategy(t, restart=8)
  if name == "bandmf":
    inv = np.linalg.inv(bandmf.matrix(s))
    want = inv @ inv.T
  else:  # g_hat_t = N(t+1) - N(t): the differences of the node-to-prefix map D
    d = _tree_prefix_rows(s)
    diff = d - np.vstack([np.zeros((1, d.shape[1])), d[:-1]])
    want = diff @ diff.T
  mech, like = cn.get(name), jnp.zeros(4)

  def one(seed):
    key = jax.random.PRNGKey(seed)

    def body(st, r):  # the round traced, as in the compiled round (one trace, not T)
      w, st = mech.sample(s, key, r, st, like)
      return st, w

    return jax.lax.scan(body, mech.init(s, like), jnp.arange(t))[1]  # [T, 4]

  w = np.asarray(jax.jit(jax.vmap(one))(jnp.arange(3000)))  # [seeds, T, 4]
  x = np.moveaxis(w, 2, 1).reshape(-1, t)  # coordinates are independent replicates
  np.testing.assert_allclose(np.cov(x.T), want, atol=0.08 * np.max(np.abs(want)) + 0.03)


def _plan(**sets):
  cfg = small_config({**CORR, **sets})
  u = int(cfg.data.num_clients)
  return cfg, plan_from_config(cfg, np.full(u, int(cfg.data.samples_per_client)))


def test_certified_epsilon_is_one_gaussian_over_the_run():
  _, plan = _plan(**{"privacy.mechanism": "bandmf", "rounds": "20",
                       "server.clients_per_round": "2", "privacy.formula": "noise_multiplier",
                       "privacy.noise_multiplier": "3.0"})
  assert plan.correlated.coefs and len(plan.correlated.coefs) == 5  # bands: the pass U/K
  acct = plan.accountant_init()
  for t in range(20):
    ids = np.flatnonzero(plan.patterns[:, t])
    acct = plan.accountant_step(acct, np.zeros(10), 3.0 * float(plan.sensitivity[0]), ids)
  s_sq = cn.pattern_sensitivity_sq(cn.gram(plan.correlated), plan.patterns)
  np.testing.assert_allclose(acct.sens_sq, s_sq, rtol=1e-12)
  want = accounting.epsilon([accounting.Event(
      "gaussian", noise_multiplier=3.0 / np.sqrt(s_sq.max()), sampling="full",
      relation="replace_one", level="client")], plan.delta)
  assert np.isclose(plan.certified_epsilon(acct), want, rtol=1e-9)
  # The calibrated noise meets the target exactly for the worst client.
  _, plan = _plan(**{"privacy.mechanism": "tree", "rounds": "16",
                       "server.clients_per_round": "2", "privacy.epsilon": "4"})
  z = float(plan.noise_scale(16)[0] / plan.sensitivity[0])
  ev = plan.horizon_event(z, 16)
  assert np.isclose(accounting.epsilon([ev], plan.delta), 4.0, rtol=1e-3)


def test_single_participation_tree_is_charged_log2_t_plus_1():
  # 8 clients, one per round, 8 rounds, one tree: each client once, s^2 = log2(8) + 1.
  _, plan = _plan(**{"privacy.mechanism": "tree", "rounds": "8", "data.num_clients": "8",
                     "server.clients_per_round": "1", "privacy.tree_restart": "8"})
  np.testing.assert_allclose(plan.correlated_sens_sq(), 4.0)


@pytest.mark.parametrize("sets,field", [
    ({"server.selection": "uniform"}, "server.selection"),
    ({"server.selection": "poisson", "server.q": "0.5"}, "server.selection"),
    ({"server.selection": "cyclic_poisson", "server.q": "0"}, "server.q"),
    ({"server.selection": "cyclic_poisson", "server.q": "1.5"}, "server.q"),
    ({"server.selection": "cyclic_poisson", "server.q": "0.5",
      "server.clients_per_round": "11"}, "server.clients_per_round"),
    ({"privacy.placement": "upload", "client.clip_mode": "param_l2"}, "privacy.placement"),
    ({"schedule.name": "crd"}, "schedule.name"),
    ({"privacy.formula": "wei_eq10"}, "privacy.formula"),
    ({"rounds": "5000"}, "rounds"),
])
def test_bad_configs_are_refused_naming_the_field(sets, field):
  for mech in ("tree", "bandmf"):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
      experiment.build(small_config({**CORR, "privacy.mechanism": mech, **sets}))


@pytest.mark.parametrize("selection", [{"server.selection": "round_robin"},
                                       {"server.selection": "cyclic_poisson", "server.q": "0.5"}],
                         ids=["round_robin", "cyclic_poisson"])
def test_resume_with_the_carried_state_is_bit_exact(tmp_path, monkeypatch, capsys, selection):
  corr = {**CORR, **selection}  # (server.q only where the rule reads it)
  args = ["run", str(QUICKSTART), "--no-progress", "--set", "rounds=10",
          "--set", "checkpoint.every=3", "--set", "data.num_clients=6",
          "--set", "data.samples_per_client=30", "--set", "server.clients_per_round=2",
          "--set", "server.client_chunk=0", "--set", "privacy.mechanism=bandmf",
          *[x for k, v in corr.items() if k != "progress" for x in ("--set", f"{k}={v}")]]
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  assert cli.main([*args, "--out", str(full)]) == 0
  record = experiment.RunLoop.record

  def interrupting_record(self, *a, **k):
    record(self, *a, **k)
    if self.t == 5:
      os.kill(os.getpid(), signal.SIGINT)

  monkeypatch.setattr(experiment.RunLoop, "record", interrupting_record)
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    assert cli.main([*args, "--out", str(resumed)]) == 130
  finally:
    signal.signal(signal.SIGINT, before)
  monkeypatch.setattr(experiment.RunLoop, "record", record)
  assert cli.main([*args, "--out", str(resumed)]) == 0
  ma, mb = ((d / "metrics.csv").read_text().splitlines() for d in (full, resumed))
  strip = lambda rows: [",".join(r.split(",")[:-1]) for r in rows]
  header = ma[0].split(",")
  assert header[-1] == "wall_s" and strip(ma) == strip(mb)
  assert (full / "model.msgpack").read_bytes() == (resumed / "model.msgpack").read_bytes()
  sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, resumed))
  assert sa["epsilon_certified"] == sb["epsilon_certified"]


def test_cyclic_selection_separates_turns_by_the_pass_and_bandmf_charges_k():
  """server.selection=cyclic: one fixed order, so each client's turns are exactly
  P = ceil(U / K) rounds apart; with bands b = P BandMF's columns of one client are
  orthogonal, and its sensitivity is at most sqrt(k) for k turns (Choquette-Choo et
  al. 2023, Thm. 2), at most round robin's (whose fresh order per pass can put two
  turns closer than b)."""
  sets = {"privacy.mechanism": "bandmf", "rounds": "40", "server.clients_per_round": "3",
          "privacy.formula": "noise_multiplier", "privacy.noise_multiplier": "2.0"}
  _, cyc = _plan(**sets, **{"server.selection": "cyclic"})
  _, rr = _plan(**sets)
  p = -(-10 // 3)
  assert len(cyc.correlated.coefs) == p
  for row in cyc.patterns:
    turns = np.flatnonzero(row)
    assert len(turns) == 10 and set(np.diff(turns)) == {p}
  s_cyc = cn.pattern_sensitivity_sq(cn.gram(cyc.correlated), cyc.patterns)
  s_rr = cn.pattern_sensitivity_sq(cn.gram(rr.correlated), rr.patterns)
  assert s_cyc.max() <= 10 + 1e-9 and s_cyc.max() <= s_rr.max() + 1e-9
  gram = cn.gram(cyc.correlated)
  for row in cyc.patterns:  # orthogonal columns: the sum of the squared norms
    turns = np.flatnonzero(row)
    assert np.isclose(s_cyc[np.flatnonzero((cyc.patterns == row).all(1))[0]],
                      np.diag(gram)[turns].sum())


# Amplified BandMF: server.selection=cyclic_poisson (b-min-sep Poisson sampling,
# Choquette-Choo et al. 2023, Sec. 4; the argument is bandmf.py's docstring).
AMP = {"server.selection": "cyclic_poisson", "server.q": "0.5", "rounds": "42",
       "server.clients_per_round": "3", "privacy.formula": "noise_multiplier",
       "privacy.noise_multiplier": "2.0"}


def test_cyclic_poisson_draws_each_client_only_in_its_groups_rounds_at_rate_q():
  from fedjax_dp.privacy import selection
  rule = selection.RULES["cyclic_poisson"]
  u, k, q, seed, t_max = 10, 3, 0.3, 5, 2000
  p = selection.rounds_per_pass(u, k)
  assert (rule.deterministic, rule.public_pattern, rule.min_sep_poisson) == (False, False, True)
  assert rule.period(u, k, q) == p == 4
  assert rule.slots(u, k, q) == selection.poisson_cap(k, q)
  groups = rule.groups(u, k, q, seed)
  np.testing.assert_array_equal(np.bincount(groups), [3, 3, 3, 1])  # the last: U - (P-1) K
  hits = np.zeros(u)
  for t in range(t_max):
    ids = rule.sample(u, k, q, seed, t)
    assert np.all(groups[ids] == t % p)  # only the round's group
    # ... which is cyclic's cohort of the same round (one fixed order).
    assert set(ids) <= set(selection.RULES["cyclic"].sample(u, k, q, seed, t))
    idx, mask = selection.select_clients("cyclic_poisson", u, k, q, seed, t)
    assert idx.size == rule.slots(u, k, q) and sorted(idx[mask > 0]) == sorted(ids)
    hits[ids] += 1
  eligible = np.array([len(range(g, t_max, p)) for g in groups])
  rate = hits / eligible  # each client's draws in its eligible rounds: about q
  assert np.all(np.abs(rate - q) < 4 * np.sqrt(q * (1 - q) / eligible)), rate
  assert abs(hits.sum() / eligible.sum() - q) < 0.02


def _amplified_want(plan, counts, sigma):
  """The composition of ``counts`` Poisson-subsampled Gaussians of rate q and multiplier
  sigma / max column norm, written out independently of the plan."""
  c = bandmf.matrix(plan.correlated)
  m = np.max(np.linalg.norm(c, axis=0))
  return accounting.epsilon([accounting.Event(
      "gaussian", noise_multiplier=sigma / m, sampling="poisson", q=0.5,
      relation="replace_one", level="client", count=counts)], plan.delta)


def test_amplified_bandmf_is_charged_ceil_t_over_p_subsampled_gaussians():
  _, plan = _plan(**{**AMP, "privacy.mechanism": "bandmf"})
  p, t = 4, 42
  assert plan.amplified and plan.period == p and len(plan.correlated.coefs) == p
  c = bandmf.matrix(plan.correlated)
  assert np.isclose(np.max(np.linalg.norm(c, axis=0)), 1.0)  # unit-norm band coefficients
  assert np.isclose(plan.max_column_norm, 1.0)
  acct = plan.accountant_init()
  rng = np.random.default_rng(0)
  for r in range(t):  # the realised draw is never read: any ids give the same epsilon
    ids = rng.choice(10, 2, replace=False)
    acct = plan.accountant_step(acct, np.zeros(10), 2.0 * float(plan.sensitivity[0]), ids)
  eligible = np.array([len(range(g, t, p)) for g in plan.groups])  # 11 or 10
  assert set(eligible) == {11, 10}
  got = plan.certified_epsilons(acct)
  for n in (10, 11):
    np.testing.assert_allclose(got[eligible == n], _amplified_want(plan, n, 2.0), rtol=1e-9)
  assert np.isclose(plan.certified_epsilon(acct), _amplified_want(plan, 11, 2.0), rtol=1e-9)
  ev = plan.horizon_event(2.0, t)  # what calibration composes: ceil(T / P) rounds
  assert int(ev.count) == 11 and np.isclose(accounting.epsilon([ev], plan.delta),
                                            _amplified_want(plan, 11, 2.0), rtol=1e-9)
  # Smaller than the unamplified BandMF of cyclic at the same sigma (one Gaussian, s^2 = k).
  _, cyc = _plan(**{**AMP, "privacy.mechanism": "bandmf", "server.selection": "cyclic"})
  unamp = accounting.epsilon([cyc.horizon_event(2.0, t)], cyc.delta)
  assert 10 < cyc.correlated_sens_sq().max() <= 11 + 1e-9  # 11 turns, the last columns short
  assert plan.certified_epsilon(acct) < unamp
  assert plan.describe()["correlated"]["amplification"].startswith("b-min-sep Poisson")


def test_cyclic_poisson_gaussian_is_charged_only_its_eligible_rounds():
  _, plan = _plan(**{**AMP, "privacy.mechanism": "gaussian"})
  acct = plan.accountant_init()
  for _ in range(42):
    acct = plan.accountant_step(acct, np.zeros(10), 2.0 * float(plan.sensitivity[0]))
  eligible = np.array([len(range(g, 42, 4)) for g in plan.groups])
  want = {n: accounting.epsilon([accounting.Event(
      "gaussian", noise_multiplier=2.0, sampling="poisson", q=0.5, relation="replace_one",
      level="client", count=n)], plan.delta) for n in (10, 11)}
  np.testing.assert_allclose(plan.certified_epsilons(acct),
                             [want[n] for n in eligible], rtol=1e-9)
  assert np.isclose(accounting.epsilon([plan.horizon_event(2.0, 42)], plan.delta), want[11])
  # The poisson rule at the same rate is charged every round: more.
  _, poi = _plan(**{**AMP, "privacy.mechanism": "gaussian", "server.selection": "poisson"})
  assert accounting.epsilon([poi.horizon_event(2.0, 42)], poi.delta) > want[11]


@pytest.mark.parametrize("sets,field", [
    ({"privacy.bands": "5"}, "privacy.bands"),  # P = 4: columns of one client overlap
    ({"privacy.mechanism": "tree"}, "privacy.mechanism"),  # not banded
    ({"server.aggregation": "normalized"}, "server.aggregation"),  # a cohort of one
])
def test_amplified_bandmf_refuses_what_the_theorem_does_not_cover(sets, field):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    experiment.build(small_config({**CORR, **AMP, "privacy.mechanism": "bandmf", **sets}))
  # b <= P is accepted (b = P by default, and fewer).
  experiment.build(small_config({**CORR, **AMP, "privacy.mechanism": "bandmf",
                                 "privacy.bands": "2"}))


def test_amplified_bandmf_calibrates_to_the_target_and_runs():
  sets = {**CORR, **AMP, "privacy.mechanism": "bandmf", "privacy.formula": "calibrated",
          "privacy.epsilon": "2", "rounds": "12"}
  cfg = small_config(sets)
  plan = plan_from_config(cfg, np.full(10, int(cfg.data.samples_per_client)))
  z = float(plan.noise_scale(12)[0] / plan.sensitivity[0])
  assert np.isclose(_amplified_want(plan, 3, z), 2.0, rtol=1e-3)  # ceil(12 / 4) rounds
  run = experiment.run(cfg)
  assert len(run.rows) == 12
  assert run.summary["epsilon_certified"] <= 2.0 * (1 + 1e-9)
  assert np.isclose(run.summary["epsilon_certified"], 2.0, rtol=1e-3)
  # Each round's cohort is a Poisson draw inside its group (sizes vary, some can be 0).
  assert all(0 <= int(r["num_selected"]) <= 3 for r in run.rows)
