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

from fedjax_dp import cli, engine, experiment
from fedjax_dp import client as client_lib
from fedjax_dp.config import ConfigError
from fedjax_dp.models import get_model
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import correlated as cn
from fedjax_dp.privacy.correlated import bandmf, tree
from fedjax_dp.privacy.correlated.base import normal_like
from fedjax_dp.privacy.plan import make_privacy_plan

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
    st, out = mech.init(s, like), []
    for r in range(t):
      w, st = mech.sample(s, key, r, st, like)
      out.append(w)
    return jnp.stack(out)  # [T, 4]

  w = np.asarray(jax.jit(jax.vmap(one))(jnp.arange(3000)))  # [seeds, T, 4]
  x = np.moveaxis(w, 2, 1).reshape(-1, t)  # coordinates are independent replicates
  np.testing.assert_allclose(np.cov(x.T), want, atol=0.08 * np.max(np.abs(want)) + 0.03)


def _plan(**sets):
  cfg = small_config({**CORR, **sets})
  u = int(cfg.data.num_clients)
  return cfg, make_privacy_plan(cfg, np.full(u, int(cfg.data.samples_per_client)))


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
    ({"privacy.placement": "upload", "client.clip_mode": "param_l2"}, "privacy.placement"),
    ({"schedule.name": "crd"}, "schedule.name"),
    ({"privacy.formula": "wei_eq10"}, "privacy.formula"),
    ({"rounds": "5000"}, "rounds"),
])
def test_bad_configs_are_refused_naming_the_field(sets, field):
  for mech in ("tree", "bandmf"):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
      experiment.build(small_config({**CORR, "privacy.mechanism": mech, **sets}))


def test_resume_with_the_carried_state_is_bit_exact(tmp_path, monkeypatch, capsys):
  args = ["run", str(QUICKSTART), "--no-progress", "--set", "rounds=10",
          "--set", "checkpoint.every=3", "--set", "data.num_clients=6",
          "--set", "data.samples_per_client=30", "--set", "server.clients_per_round=2",
          "--set", "server.client_chunk=0", "--set", "privacy.mechanism=bandmf",
          *[x for k, v in CORR.items() if k != "progress" for x in ("--set", f"{k}={v}")]]
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
