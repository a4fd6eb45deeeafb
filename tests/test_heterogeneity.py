"""Heterogeneity measures (A-DPFL eq. (12), spec section 2.3) against scipy and by hand."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import wasserstein_distance

from fedjax_dp.data import heterogeneity as het
from fedjax_dp.data.partition import iid, label_skew

FAST = settings(max_examples=40, deadline=None)


def test_hand_computed_two_clients():
  # Client 0: labels {0, 0, 1, 1}; client 1: {0, 2, 2, 2}. Global: 3/8, 2/8, 3/8.
  labels = np.array([0, 0, 1, 1, 0, 2, 2, 2])
  parts = [np.arange(4), np.arange(4, 8)]
  hists = het.label_histograms(labels, parts)
  np.testing.assert_array_equal(hists, [[2, 2, 0], [1, 0, 3]])
  np.testing.assert_allclose(het.global_distribution(hists), [3 / 8, 2 / 8, 3 / 8])
  # TV: 1/2 (|1/2-3/8| + |1/2-1/4| + |0-3/8|) = 1/2 (1/8 + 2/8 + 3/8) = 3/8; symmetric.
  np.testing.assert_allclose(het.wasserstein_distances(hists), [3 / 8, 3 / 8])
  # Ordinal: CDF diffs at 0 and 1: client 0: 1/2-3/8, 1-5/8 -> 1/8 + 3/8 = 1/2.
  # Client 1: 1/4-3/8, 1/4-5/8 -> 1/8 + 3/8 = 1/2.
  np.testing.assert_allclose(het.wasserstein_distances(hists, metric="ordinal"), [0.5, 0.5])
  w = np.array([0.1, 0.3, 0.0, 0.2])
  c1 = het.heterogeneity_c1(w)
  assert c1 == pytest.approx(np.sqrt((0.01 + 0.09 + 0.04) / 4))
  assert het.heterogeneity_c1(w, lipschitz=2.0) == pytest.approx(2 * c1)
  sc = het.selection_scores(w)
  np.testing.assert_allclose(sc, 1 - w / c1)
  p = het.selection_probabilities(sc)
  assert p.sum() == pytest.approx(1.0)
  assert np.argmax(p) == 2 and np.argmin(p) == 1  # closest to global is most likely


@FAST
@given(st.integers(2, 8), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_ordinal_matches_scipy_and_zero_one_is_tv(num_classes, num_clients, seed):
  rng = np.random.default_rng(seed)
  hists = rng.integers(0, 20, size=(num_clients, num_classes))
  hists[:, 0] += 1  # no empty client
  ref = rng.integers(0, 20, size=num_classes) + 1
  classes = np.arange(num_classes)
  w_ord = het.wasserstein_distances(hists, ref, metric="ordinal")
  w_tv = het.wasserstein_distances(hists, ref)
  for i in range(num_clients):
    expect = wasserstein_distance(classes, classes, u_weights=hists[i], v_weights=ref)
    assert w_ord[i] == pytest.approx(expect, abs=1e-12)
    h, p = hists[i] / hists[i].sum(), ref / ref.sum()
    assert w_tv[i] == pytest.approx(0.5 * np.abs(h - p).sum())
    # W_1 under 0-1 is at most W_1 under |y - y'| (d_01 <= d_ord on distinct integers).
    assert w_tv[i] <= w_ord[i] + 1e-12
  assert np.all((w_tv >= 0) & (w_tv <= 1))


def test_iid_partition_is_near_zero_and_label_skew_is_s_times_tv():
  labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 200))
  out = het.client_heterogeneity(labels, iid(labels, 10, 200, seed=1))
  assert out["distances"].max() < 0.15
  # One dominant label with share exactly 1 (s = 1): h_i is a point mass on c_i; with a
  # balanced global marginal, TV = 1 - 1/10.
  parts = label_skew(labels, 10, 1.0, 100, seed=0)
  out = het.client_heterogeneity(labels, parts)
  np.testing.assert_allclose(out["distances"], 0.9)
  np.testing.assert_allclose(out["scores"], 0.0, atol=1e-12)
  np.testing.assert_allclose(out["probabilities"], 0.1)
  # Varying skews rank clients: larger s -> larger W -> lower selection probability.
  s = np.linspace(0, 1, 10)
  out = het.client_heterogeneity(labels, label_skew(labels, 10, s, 100, seed=0,
                                                    remainder="all"))
  assert np.all(np.diff(out["distances"]) > -0.05)
  assert out["probabilities"][0] > out["probabilities"][-1]


def test_bad_input():
  with pytest.raises(ValueError, match="integer"):
    het.label_histograms(np.array([0.5, 1.0]), [np.array([0])])
  with pytest.raises(ValueError, match="metric"):
    het.wasserstein_distances(np.ones((2, 3)), metric="euclid")
  with pytest.raises(ValueError, match="at least one example"):
    het.wasserstein_distances(np.array([[1, 1], [0, 0]]))
  np.testing.assert_array_equal(het.selection_scores(np.zeros(3)), np.ones(3))


MNIST_DIR = "../shared/datasets/mnist"


@pytest.mark.skipif(not __import__("os").path.isdir(MNIST_DIR), reason="real MNIST not found")
def test_adpfl_mnist_federation_heterogeneity():
  """A-DPFL's MNIST setting (N = 1000, spec 5.2): 60 examples each, W_i from s_i."""
  from fedjax_dp.data import load_dataset
  from fedjax_dp.data.partition import adpfl_skews
  y = load_dataset("mnist", MNIST_DIR).y_train
  skews = adpfl_skews(1000, seed=0)
  parts = label_skew(y, 1000, skews, seed=0, remainder="all")
  assert {len(p) for p in parts} == {60}
  out = het.client_heterogeneity(y, parts)
  # A point mass on one class is at TV ~0.9 from the near-balanced global marginal.
  assert np.all(out["distances"][skews == 1.0] > 0.88)
  # W grows with the skew level: mean W per level is increasing.
  levels = np.unique(skews)
  means = [out["distances"][skews == s].mean() for s in levels]
  assert np.all(np.diff(means) > 0)
  top = np.argsort(-out["probabilities"])[:100]  # the spec's top-K with K = 0.1 N
  assert skews[top].mean() < skews.mean()
