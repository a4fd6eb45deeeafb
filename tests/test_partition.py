"""Partitioners: property tests (hypothesis) and the papers' settings."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedjax_dp.data import PARTITIONERS, partition
from fedjax_dp.data.partition import (
  adpfl_skews,
  dirichlet,
  group_sizes,
  iid,
  k_classes,
  label_skew,
  sorted_by_target,
  unbalanced,
  writer_like,
)

FAST = settings(max_examples=30, deadline=None)


def balanced_labels(num_classes, per_class, seed=0):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def assert_disjoint_valid(parts, n):
  flat = np.concatenate(parts)
  assert flat.dtype == np.int64
  assert len(np.unique(flat)) == len(flat), "an example was given to two clients"
  assert flat.size == 0 or (flat.min() >= 0 and flat.max() < n)


def same(a, b):
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@st.composite
def random_labels(draw, min_n=1, max_n=400):
  n = draw(st.integers(min_n, max_n))
  num_classes = draw(st.integers(1, 10))
  return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, num_classes, n)


# ----------------------------------------------------------------------------- properties


@FAST
@given(labels=random_labels(), num_clients=st.integers(1, 20), spc=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_iid_properties(labels, num_clients, spc, seed):
  if num_clients * spc > len(labels):
    with pytest.raises(ValueError, match="data.samples_per_client"):
      iid(labels, num_clients, spc, seed)
    return
  parts = iid(labels, num_clients, spc, seed)
  assert [len(p) for p in parts] == [spc] * num_clients
  assert_disjoint_valid(parts, len(labels))
  assert same(parts, iid(labels, num_clients, spc, seed))


@FAST
@given(labels=random_labels(), sizes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
       seed=st.integers(0, 2**31))
def test_unbalanced_properties(labels, sizes, seed):
  if sum(sizes) > len(labels):
    with pytest.raises(ValueError, match="data.group_sizes"):
      unbalanced(labels, sizes, seed)
    return
  parts = unbalanced(labels, sizes, seed)
  assert [len(p) for p in parts] == sizes
  assert_disjoint_valid(parts, len(labels))
  assert same(parts, unbalanced(labels, sizes, seed))


@FAST
@given(num_classes=st.integers(2, 10), data=st.data(), seed=st.integers(0, 2**31))
def test_k_classes_properties(num_classes, data, seed):
  k = data.draw(st.integers(1, num_classes))
  num_clients = data.draw(st.integers(1, min(12, math.comb(num_classes, k))))
  per_class = data.draw(st.integers(1, 6))
  labels = balanced_labels(num_classes, num_clients * per_class, seed)  # always enough
  parts = k_classes(labels, num_clients, k, k * per_class, seed)
  assert_disjoint_valid(parts, len(labels))
  class_sets = []
  for p in parts:
    classes, counts = np.unique(labels[p], return_counts=True)
    assert len(classes) == k and np.all(counts == per_class)
    class_sets.append(tuple(classes))
  assert len(set(class_sets)) == num_clients, "two clients share a class set"
  assert same(parts, k_classes(labels, num_clients, k, k * per_class, seed))


@FAST
@given(labels=random_labels(min_n=10), num_clients=st.integers(1, 15),
       alpha=st.floats(0.01, 100.0), seed=st.integers(0, 2**31))
def test_dirichlet_properties(labels, num_clients, alpha, seed):
  spc = len(labels) // num_clients
  if spc == 0:
    return
  parts = dirichlet(labels, num_clients, alpha, seed, samples_per_client=spc)
  assert [len(p) for p in parts] == [spc] * num_clients
  assert_disjoint_valid(parts, len(labels))
  assert same(parts, dirichlet(labels, num_clients, alpha, seed, samples_per_client=spc))


@FAST
@given(num_classes=st.integers(2, 10), per_client_class=st.integers(1, 4),
       size=st.integers(1, 30), data=st.data(), seed=st.integers(0, 2**31))
def test_label_skew_properties(num_classes, per_client_class, size, data, seed):
  # Every example is used (the hardest case, as in A-DPFL's MNIST setting).
  num_clients = num_classes * per_client_class
  labels = balanced_labels(num_classes, per_client_class * size, seed)
  s = np.array(data.draw(st.lists(st.floats(0, 1), min_size=num_clients,
                                  max_size=num_clients)))
  first = np.rint(s * size)
  dominant = np.arange(num_clients) % num_classes
  rest = np.bincount(dominant, weights=size - first, minlength=num_classes)
  feasible = np.all(rest <= rest.sum() - rest)  # leftovers of other classes suffice
  if not feasible:
    with pytest.raises(ValueError, match="data.s"):
      label_skew(labels, num_clients, s, size, seed)
    return
  parts = label_skew(labels, num_clients, s, size, seed)
  assert [len(p) for p in parts] == [size] * num_clients
  assert_disjoint_valid(parts, len(labels))
  frac = np.array([np.mean(labels[p] == i % num_classes) for i, p in enumerate(parts)])
  np.testing.assert_allclose(frac, first / size)  # exactly s, up to rounding s * n_i
  assert np.all(np.abs(frac - s) <= 0.5 / size + 1e-12)
  assert same(parts, label_skew(labels, num_clients, s, size, seed))
  loose = label_skew(labels, num_clients, s, size, seed, remainder="all")
  assert_disjoint_valid(loose, len(labels))
  frac_all = np.array([np.mean(labels[p] == i % num_classes) for i, p in enumerate(loose)])
  assert np.all(frac_all >= first / size - 1e-12)


# ----------------------------------------------------------------------------- seeds


LABELS = balanced_labels(10, 300)
CASES = {
    "iid": {"samples_per_client": 50},
    "k_classes": {"k": 4, "samples_per_client": 40},
    "dirichlet": {"alpha": 0.5, "samples_per_client": 50},
    "unbalanced": {"groups": (40, 60, 80, 100, 120)},
    "label_skew": {"s": 0.5, "samples_per_client": 50},
    "writer_like": {"samples_per_client": 40},
    "sorted": {"samples_per_client": 40},
}


def test_every_partitioner_has_a_case():
  # 'natural' is given by the data (no randomness): tested in test_datasets_papers.py.
  assert set(CASES) | {"natural"} == set(PARTITIONERS)


@pytest.mark.parametrize("method", sorted(CASES))
def test_seed_determines_split(method):
  a = partition(LABELS, method, 20, seed=1, **CASES[method])
  assert same(a, partition(LABELS, method, 20, seed=1, **CASES[method]))
  assert not same(a, partition(LABELS, method, 20, seed=2, **CASES[method]))
  assert_disjoint_valid(a, len(LABELS))


# ----------------------------------------------------------------------------- papers


def test_wei_fig12_k_classes_on_mnist_sized_labels():
  # MNIST's training label counts; 50 clients x 4 distinct digits x 200 = 800 each.
  counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
  labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), counts))
  parts = partition(labels, "k_classes", 50, seed=0, k=4, samples_per_client=800)
  sets = set()
  for p in parts:
    classes, counts = np.unique(labels[p], return_counts=True)
    assert len(classes) == 4 and np.all(counts == 200)
    sets.add(tuple(classes))
  assert len(sets) == 50


def test_wei_fig13_groups():
  assert group_sizes((400, 600), 2) == [400, 400, 600, 600]
  labels = balanced_labels(10, 4000)
  parts = partition(labels, "unbalanced", 50, seed=0, groups=(400, 600, 800, 1000, 1200))
  assert [len(p) for p in parts] == [400] * 10 + [600] * 10 + [800] * 10 + [1000] * 10 + [1200] * 10
  assert_disjoint_valid(parts, len(labels))


def test_adpfl_full_usage_varying_skew():
  # A-DPFL MNIST shape, scaled down: N clients x floor(n/N), every example used.
  labels = balanced_labels(10, 600)
  skews = adpfl_skews(100, seed=3)
  assert set(np.round(skews, 1)) <= set(np.round(np.linspace(0, 1, 11), 1))
  parts = partition(labels, "label_skew", 100, seed=0, s=skews)
  assert sum(len(p) for p in parts) == len(labels)
  assert_disjoint_valid(parts, len(labels))
  frac = [np.mean(labels[p] == i % 10) for i, p in enumerate(parts)]
  np.testing.assert_allclose(frac, np.rint(skews * 60) / 60)
  even = adpfl_skews(22, evenly_spaced=True)
  assert even[0] == 0.0 and even[-1] == 1.0 and np.all(np.diff(even) >= 0)


def test_dirichlet_alpha_controls_heterogeneity():
  labels = balanced_labels(10, 500)

  def mean_classes(alpha):
    parts = dirichlet(labels, 50, alpha, seed=0, samples_per_client=100)
    return np.mean([len(np.unique(labels[p])) for p in parts])

  assert mean_classes(0.05) < 4
  assert mean_classes(100.0) > 9


# ----------------------------------------------------------------------------- errors


def test_dispatcher_errors_name_the_field():
  with pytest.raises(ValueError, match=r"data\.partition='shards'.*iid"):
    partition(LABELS, "shards", 10, 0)
  with pytest.raises(ValueError, match=r"data\.alpha"):
    partition(LABELS, "iid", 10, 0, alpha=0.5)
  with pytest.raises(ValueError, match=r"needs data\.k"):
    partition(LABELS, "k_classes", 10, 0, samples_per_client=8)
  with pytest.raises(ValueError, match=r"data\.sizes"):
    partition(LABELS, "unbalanced", 10, 0)
  with pytest.raises(ValueError, match=r"data\.num_clients"):
    partition(LABELS, "unbalanced", 7, 0, groups=(1, 2))
  with pytest.raises(ValueError, match=r"data\.num_clients=3"):
    partition(LABELS, "unbalanced", 3, 0, sizes=[1, 2])
  with pytest.raises(ValueError, match=r"data\.alpha"):
    partition(LABELS, "dirichlet", 10, 0, alpha=0.0)
  with pytest.raises(ValueError, match=r"data\.s must lie"):
    partition(LABELS, "label_skew", 10, 0, s=1.5)
  with pytest.raises(ValueError, match=r"data\.s"):
    partition(LABELS, "label_skew", 10, 0, s=[0.1, 0.2])


def test_too_many_samples_fails_before_heavy_work(monkeypatch):
  """The sizes are checked before anything is drawn. Asserted by making every random
  draw fail, not by a wall-clock bound: a loaded machine (the suite beside other work)
  can take a second for anything, and the heavy work is the draws, whose size the
  request sets."""

  class NoDraws:
    def __getattr__(self, name):
      raise AssertionError(f"rng.{name} was called before the sizes were checked")

  monkeypatch.setattr(np.random, "default_rng", lambda *a, **k: NoDraws())
  for method, kw in [("iid", {}), ("dirichlet", {"alpha": 1.0}), ("label_skew", {"s": 0.3}),
                     ("k_classes", {"k": 2})]:
    with pytest.raises(ValueError, match=r"data\.(samples_per_client|num_clients)"):
      partition(LABELS, method, 40, 0, samples_per_client=10**6, **kw)
  with pytest.raises(ValueError, match=r"data\.samples_per_client"):
    partition(LABELS, "iid", 10**6, 0, samples_per_client=10**3)


def test_k_classes_impossible_settings():
  with pytest.raises(ValueError, match=r"data\.num_clients=211.*C\(10, 4\) = 210"):
    k_classes(LABELS, 211, 4, 4, 0)
  with pytest.raises(ValueError, match=r"data\.samples_per_client=10.*multiple of data\.classes_per_client=4"):
    k_classes(LABELS, 5, 4, 10, 0)
  with pytest.raises(ValueError, match=r"data\.classes_per_client=11"):
    k_classes(LABELS, 5, 11, 11, 0)
  # 7 clients x 4 classes need 28 class slots of 90 examples; class 0 (50 examples) gives
  # none and the other nine give 3 each: 27.
  scarce = np.repeat(np.arange(10), [50] + [300] * 9)
  with pytest.raises(ValueError, match=r"data\.samples_per_client=360.*cannot be cut"):
    k_classes(scarce, 7, 4, 360, 0)
  # Tight but feasible: every class serves exactly two clients.
  tight = balanced_labels(10, 300)
  parts = k_classes(tight, 5, 4, 600, 0)
  assert np.all(np.bincount(np.concatenate([np.unique(tight[p]) for p in parts])) == 2)


def test_label_skew_impossible_settings():
  labels = np.array([0] * 5 + [1] * 15)
  with pytest.raises(ValueError, match=r"data\.s: clients dominated by class 0 need 10"):
    label_skew(labels, 2, [1.0, 0.0], 10, 0)
  # Client 1 (dominant 1) needs 5 examples of class 0, but client 0 took all 5.
  with pytest.raises(ValueError, match=r"data\.s: clients dominated by class 1 need 5 examples "
                     r"of other classes, but only 0"):
    label_skew(labels, 2, [1.0, 0.0], 5, 0)
  with pytest.raises(ValueError, match=r"data\.remainder"):
    label_skew(labels, 2, 0.5, 5, 0, remainder="some")


# ----------------------------------------------------------------------------- paper settings


def test_writer_like_sizes_vary_and_clients_are_dominated():
  labels = balanced_labels(10, 800)
  parts = partition(labels, "writer_like", 40, 3, samples_per_client=100,
                    classes_per_client=2, dominance=0.9)
  assert_disjoint_valid(parts, len(labels))
  sizes = np.array([len(p) for p in parts])
  assert sizes.std() > 20 and abs(sizes.mean() - 100) < 25  # log-normal around the mean
  top2 = [np.sort(np.bincount(labels[p], minlength=10))[-2:].sum() / len(p) for p in parts]
  assert np.mean(top2) > 0.85  # ~0.9 + 0.1 * 2/10 expected
  assert same(parts, writer_like(labels, 40, 100, seed=3, classes_per_client=2,
                                 dominance=0.9))
  equal = writer_like(labels, 10, 50, size_sigma=0.0, dominance=0.0)
  assert [len(p) for p in equal] == [50] * 10
  with pytest.raises(ValueError, match="data.dominance"):
    writer_like(labels, 10, 50, dominance=1.5)
  with pytest.raises(ValueError, match="data.classes_per_client=11"):
    writer_like(labels, 10, 50, classes_per_client=11)


def test_sorted_by_target_bands_and_float_targets():
  targets = np.random.default_rng(0).normal(size=1000)
  parts = sorted_by_target(targets, 10, 80, seed=1)
  assert_disjoint_valid(parts, 1000)
  assert [len(p) for p in parts] == [80] * 10
  for a, b in itertools.pairwise(parts):
    assert targets[a].max() <= targets[b].min()
  # With every record used, the bands are exactly the sorted order.
  full = sorted_by_target(targets, 10)
  np.testing.assert_array_equal(np.concatenate([np.sort(targets[p]) for p in full]),
                                np.sort(targets))
  # iid accepts float targets too; label partitioners refuse them.
  assert [len(p) for p in iid(targets, 5, 10)] == [10] * 5
  with pytest.raises(ValueError, match="integer"):
    partition(targets, "label_skew", 5, 0, s=0.5)
  with pytest.raises(ValueError, match="finite"):
    sorted_by_target(np.array([0.0, np.nan]), 1)


def _dominant_share(labels, parts):
  return np.array([np.mean(labels[p] == i % 10) for i, p in enumerate(parts)])


@pytest.mark.parametrize("remainder", ["others", "all"])
def test_adpfl_per_client_skews_follow_the_spec(remainder):
  """Spec adpfl.md 5.2: n_i = floor(N / U), c_i = i mod 10, round(s_i n_i) of class c_i."""
  labels = balanced_labels(10, 600)  # 6000 examples: the MNIST setting scaled by 1/10
  skews = adpfl_skews(100, seed=4)
  parts = label_skew(labels, 100, skews, seed=0, remainder=remainder)
  assert [len(p) for p in parts] == [60] * 100  # floor(6000 / 100), every example used
  assert_disjoint_valid(parts, len(labels))
  share = _dominant_share(labels, parts)
  first = np.rint(skews * 60) / 60
  if remainder == "others":
    np.testing.assert_allclose(share, first)
  else:  # the rest is drawn from all labels: at least s_i, about s_i + (1 - s_i) / 10
    assert np.all(share >= first - 1e-12)
    assert abs(np.mean(share - first - (1 - first) / 10)) < 0.03
  # s = 0 with the spec's remainder is IID.
  iid_like = label_skew(labels, 100, 0.0, seed=0, remainder="all")
  assert abs(np.mean(_dominant_share(labels, iid_like)) - 0.1) < 0.02


def test_skews_from_config():
  from fedjax_dp import config as config_lib
  from fedjax_dp import experiment
  labels = balanced_labels(10, 100)
  cfg = config_lib.base_config()
  cfg.data.partition, cfg.data.num_clients, cfg.data.samples_per_client = "label_skew", 10, 50
  cfg.data.skews = tuple(np.arange(10) / 10)
  parts = experiment.partition_clients(cfg, labels)
  np.testing.assert_allclose(_dominant_share(labels, parts), np.arange(10) / 10, atol=1e-9)
  cfg.data.skews = (0.5, 0.5)
  with pytest.raises(config_lib.ConfigError, match="data.skews holds 2 values"):
    experiment.partition_clients(cfg, labels)
  cfg.data.skews, cfg.data.skew_scheme, cfg.data.skew_remainder = (), "adpfl_even", "all"
  parts = experiment.partition_clients(cfg, labels)
  expect = adpfl_skews(10, evenly_spaced=True)
  assert np.all(_dominant_share(labels, parts) >= expect - 1e-12)
  cfg.data.skew_scheme = "zipf"
  with pytest.raises(config_lib.ConfigError, match="data.skew_scheme"):
    config_lib.validate(cfg)
