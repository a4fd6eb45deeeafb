"""A-DPFL's selection rules (spec adpfl.md sections 2.3 and 7): W-ranked top-K and
sampling K with probability p_i, and the accounting events they imply."""

import itertools
import json

import numpy as np
import pytest
from _helpers import small_config

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.data import heterogeneity
from fedjax_dp.privacy import accounting, selection
from fedjax_dp.privacy.inputs import ServerInputs
from fedjax_dp.training import engine


def _partition(u=8, classes=4, n=30, seed=0):
  """Labels and a partition whose clients have distinct label skews."""
  rng = np.random.default_rng(seed)
  labels, clients, start = [], [], 0
  for i in range(u):
    dominant = np.full(int(n * i / u), i % classes)
    rest = rng.integers(0, classes, n - dominant.size)
    labels.append(np.concatenate([dominant, rest]))
    clients.append(np.arange(start, start + n))
    start += n
  return np.concatenate(labels).astype(np.int32), clients


def _weights(rule, metric="zero_one"):
  labels, clients = _partition()
  server = ServerInputs(selection=rule, wasserstein_metric=metric)
  return selection.get_rule(rule).weights(labels, clients, 4, server), labels, clients


@pytest.mark.parametrize("metric", heterogeneity.GROUND_METRICS)
def test_topk_is_the_same_k_smallest_w_clients_every_round(metric):
  scores, labels, clients = _weights("wasserstein_topk", metric)
  h = heterogeneity.client_heterogeneity(labels, clients, 4, metric)
  w = h["distances"]
  np.testing.assert_allclose(scores, h["scores"])
  k = 3
  want = np.sort(np.argsort(w, kind="stable")[:k])
  assert len(set(np.round(w, 12))) == w.size  # no ties: the answer is unique
  for seed, t in itertools.product((0, 5), range(6)):
    idx, sel = engine.select_clients("wasserstein_topk", w.size, k, 0.0, seed, t,
                                     weights=scores)
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(sel, np.ones(k))


def test_topk_ties_are_broken_by_the_seed_and_stay_fixed_over_rounds():
  scores = np.ones(10)  # IID: every W_i = 0, all scores 1
  sets = {seed: {tuple(engine.select_clients("wasserstein_topk", 10, 4, 0.0, seed, t,
                                              weights=scores)[0]) for t in range(5)}
          for seed in range(6)}
  assert all(len(s) == 1 for s in sets.values())       # the same set every round
  assert len({next(iter(s)) for s in sets.values()}) > 1  # not always the lowest ids


def test_sample_k1_frequencies_match_p_chi_square():
  p, _, _ = _weights("wasserstein_sample")
  np.testing.assert_allclose(p.sum(), 1.0)
  n = 4000
  counts = np.zeros(p.size)
  for t in range(n):
    idx, _ = engine.select_clients("wasserstein_sample", p.size, 1, 0.0, 3, t, weights=p)
    counts[idx] += 1
  chi2 = float(np.sum((counts - n * p) ** 2 / (n * p)))
  assert chi2 < 24.32  # chi-square, 7 degrees of freedom, 0.999 quantile


def _successive_inclusion(p, k):
  """Exact inclusion probabilities of K draws without replacement, each with
  probability proportional to p among the clients not yet drawn (by enumeration)."""
  pi = np.zeros(p.size)
  for order in itertools.permutations(range(p.size), k):
    prob, left = 1.0, 1.0
    for j in order:
      prob *= p[j] / left
      left -= p[j]
    pi[list(order)] += prob
  return pi


def test_sample_k_gt_1_inclusion_matches_successive_sampling():
  p = np.array([0.4, 0.25, 0.15, 0.12, 0.08])
  k, n = 2, 4000
  pi = _successive_inclusion(p, k)
  np.testing.assert_allclose(pi.sum(), k)
  counts = np.zeros(p.size)
  for t in range(n):
    idx, sel = engine.select_clients("wasserstein_sample", p.size, k, 0.0, 1, t, weights=p)
    assert np.unique(idx).size == k and sel.sum() == k
    counts[idx] += 1
  std = np.sqrt(pi * (1 - pi) / n)
  assert np.all(np.abs(counts / n - pi) < 4 * std)
  assert not np.allclose(pi, k * p)  # not proportional to p: no single q describes it


def _plan(rule, u=8, k=3, rounds=5, **sets):
  cfg = config_lib.override(config_lib.base_config(), [f"{a}={b}" for a, b in {
      "data.num_clients": u, "server.selection": rule, "server.clients_per_round": k,
      "rounds": rounds, "privacy.epsilon": 2.0, **sets}.items()])
  return plan_from_config(cfg, np.full(u, 40))


@pytest.mark.parametrize("rule", ["wasserstein_topk", "wasserstein_sample"])
def test_certified_epsilon_is_the_unamplified_composition_of_selected_rounds(rule):
  u, k, rounds = 8, 3, 5
  plan = _plan(rule, u, k, rounds)
  weights, _, _ = _weights(rule)
  noise = plan.noise_scale(rounds)
  state, turns = plan.accountant_init(), np.zeros(u, int)
  for t in range(rounds):
    idx, sel = engine.select_clients(rule, u, k, 0.0, 0, t, weights=weights)
    state = plan.accountant_step(state, noise, selected=idx[sel > 0])
    turns[idx] += 1
  eps = plan.certified_epsilons(state)
  z = noise / plan.sensitivity
  for i in range(u):
    want = 0.0 if turns[i] == 0 else accounting.epsilon(
        [accounting.Event(noise_multiplier=z[i], relation="replace_one", count=turns[i])],
        plan.delta)
    np.testing.assert_allclose(eps[i], want, rtol=1e-9)
  # Calibrated for a client selected every round (max_participations = T).
  assert eps.max() <= 2.0 * (1 + 1e-6)
  if rule == "wasserstein_topk":
    assert set(turns) == {0, rounds}  # K clients every round, the others never
    np.testing.assert_allclose(eps.max(), 2.0, rtol=1e-3)
  info = plan.describe()["accounting"]
  assert info["amplification"].startswith("none")
  assert "label histograms" in info["assumption"] and "public" in info["assumption"]


def test_random_rules_state_no_assumption():
  info = _plan("uniform").describe()["accounting"]
  assert info["assumption"] is None and info["amplification"] == "selection"


def test_bad_input_is_refused_with_the_field_named():
  with pytest.raises(ValueError, match="server.selection='wasserstein_topk' needs"):
    engine.select_clients("wasserstein_topk", 4, 2, 0.0, 0, 0)
  server = ServerInputs(selection="wasserstein_sample")
  with pytest.raises(ValueError, match="needs class labels"):
    selection.get_rule("wasserstein_sample").weights(np.zeros(4, np.float32),
                                                     [np.arange(2), np.arange(2, 4)], 0, server)
  server = ServerInputs(selection="wasserstein_sample", wasserstein_metric="euclid")
  with pytest.raises(ValueError, match="server.wasserstein_metric"):
    selection.get_rule("wasserstein_sample").weights(np.zeros(4, np.int32),
                                                     [np.arange(2), np.arange(2, 4)], 1, server)
  cfg = config_lib.override(config_lib.base_config(), [
      "server.selection=wasserstein_topk", "data.num_clients=4",
      "server.clients_per_round=5"])
  with pytest.raises(config_lib.ConfigError, match="clients_per_round"):
    config_lib.validate(cfg)


TINY = {"rounds": "3", "data.num_clients": "6", "data.samples_per_client": "40",
        "data.partition": "label_skew", "data.skew_scheme": "adpfl_even",
        "server.clients_per_round": "2", "eval.every": "3"}


@pytest.mark.parametrize("rule", ["wasserstein_topk", "wasserstein_sample"])
def test_run_writes_the_assumption_and_selects_k(rule, tmp_path):
  cfg = small_config(TINY, **{"server.selection": rule})
  setup = experiment.build(cfg)
  h = heterogeneity.client_heterogeneity(
      np.asarray(experiment.load_dataset(cfg.data.name, cfg.data.dir).y_train),
      experiment.partition_clients(cfg, np.asarray(
          experiment.load_dataset(cfg.data.name, cfg.data.dir).y_train), None), 10)
  field = "scores" if rule == "wasserstein_topk" else "probabilities"
  np.testing.assert_allclose(setup.selection_weights, h[field])
  res = experiment.run(cfg, str(tmp_path), setup)
  assert [r["num_selected"] for r in res.rows] == [2, 2, 2]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert "public" in summary["privacy"]["accounting"]["assumption"]
  assert summary["privacy"]["selection"] == rule
  assert 0 < summary["epsilon_certified"] <= 8.0 * (1 + 1e-6)
