"""Partitioners: split a training set over clients. Pure numpy, seeded, host side.

Every partitioner takes the training labels ``[N]`` (``iid`` and ``sorted`` also float
regression targets) and returns one int64 array of
indices into the training set per client (``list[np.ndarray]``, each sorted ascending).
No example is given to two clients. Randomness comes only from
``np.random.default_rng(seed)``, so the same arguments give the same split on every
machine.

==============  ===================================================================
``iid``         the same number of uniformly drawn examples per client
``k_classes``   k classes per client in equal amounts, distinct class sets (Wei Fig. 12)
``dirichlet``   per-client label proportions ~ Dir(alpha 1_C) (Hsu et al. 2019)
``unbalanced``  IID, with client sizes given per client (Wei Fig. 13)
``label_skew``  a fraction s of each client's data from one dominant label (A-DPFL)
``writer_like`` log-normal sizes, each client dominated by a few classes (FEMNIST-like)
``sorted``      contiguous bands of the sorted target (Fu et al., regression)
``natural``     the dataset's own clients (FEMNIST writers), see :func:`natural`
==============  ===================================================================

:func:`partition` dispatches by name and checks the arguments, naming the config
field (``data.partition``, ``data.samples_per_client``, ...), before any heavy work;
:func:`partition_clients` reads the method and its arguments from a run's config.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedjax_dp.errors import ConfigError

# Above this many class subsets, k_classes scores a random sample of them per client
# instead of all of them (C(10, 4) = 210 is enumerated; C(100, 5) = 75M is not).
_MAX_ENUMERATED_SUBSETS = 20_000
_SUBSET_CANDIDATES = 512
_SUBSET_ATTEMPTS = 16


# ----------------------------------------------------------------------------- helpers


def _labels(labels) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} and "
                     f"dtype {labels.dtype}.")
  return labels


def _targets(targets) -> np.ndarray:
  """Labels or real-valued regression targets ``[N]`` (finite)."""
  targets = np.asarray(targets)
  if targets.ndim != 1 or not (np.issubdtype(targets.dtype, np.integer)
                               or np.issubdtype(targets.dtype, np.floating)):
    raise ValueError(f"targets must be a 1-D numeric array, got shape {targets.shape} and "
                     f"dtype {targets.dtype}.")
  if np.issubdtype(targets.dtype, np.floating) and not np.all(np.isfinite(targets)):
    raise ValueError("targets must be finite.")
  return targets


def _positive_int(value, field: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{field} must be a positive integer, got {value!r}.")
  return int(value)


def _check_total(total: int, n: int, field: str, detail: str) -> None:
  if total > n:
    raise ValueError(f"{field}: {detail} needs {total} examples, but the training set has "
                     f"only {n}.")


def _default_size(labels: np.ndarray, num_clients: int, samples_per_client) -> int:
  """``samples_per_client``, or ``floor(N / num_clients)`` when it is None (A-DPFL's n_i)."""
  if samples_per_client is None:
    size = len(labels) // num_clients
    if size < 1:
      raise ValueError(f"data.num_clients={num_clients} exceeds the {len(labels)} training "
                       "examples.")
    return size
  return _positive_int(samples_per_client, "data.samples_per_client")


def _finish(chunks) -> list[np.ndarray]:
  return [np.sort(np.asarray(c, np.int64)) for c in chunks]


# ----------------------------------------------------------------------------- iid


def iid(labels, num_clients: int, samples_per_client: int | None = None,
        seed: int = 0) -> list[np.ndarray]:
  """IID: each client gets ``samples_per_client`` examples drawn without replacement.

  The setting of Wei et al. (UDP/CRD) for every figure except 12 and 13
  (``|D_i| = 800``, U = 50) and of A-DPFL's "IID" column (``n_i = floor(N / U)``).

  Args:
    labels: training labels ``[N]`` or regression targets (only their number matters).
    num_clients: U.
    samples_per_client: examples per client; default ``floor(N / U)``.
    seed: seed of ``np.random.default_rng``.

  Returns:
    U sorted int64 index arrays of length ``samples_per_client``.
  """
  labels = _targets(labels)
  num_clients = _positive_int(num_clients, "data.num_clients")
  size = _default_size(labels, num_clients, samples_per_client)
  _check_total(num_clients * size, len(labels), "data.samples_per_client",
               f"{num_clients} clients x {size} samples")
  rng = np.random.default_rng(seed)
  chosen = rng.permutation(len(labels))[:num_clients * size]
  return _finish(chosen.reshape(num_clients, size))


# ----------------------------------------------------------------------------- unbalanced


def group_sizes(groups: Sequence[int] = (400, 600, 800, 1000, 1200),
                clients_per_group: int = 10) -> list[int]:
  """Expands group sizes into per-client sizes, group by group.

  Wei et al. Fig. 13: five groups of 400, 600, 800, 1000 and 1200 samples; the paper does
  not say how many clients each group has, 10 each gives its U = 50.

  Example: ``group_sizes((400, 600), 2) == [400, 400, 600, 600]``.
  """
  clients_per_group = _positive_int(clients_per_group, "data.clients_per_group")
  for g in groups:
    _positive_int(g, "data.groups")
  return [int(g) for g in groups for _ in range(clients_per_group)]


def unbalanced(labels, sizes: Sequence[int], seed: int = 0) -> list[np.ndarray]:
  """IID draws of different sizes: client ``i`` gets ``sizes[i]`` examples.

  Wei et al. Fig. 13 ("unbalanced"): 5 groups of 400/600/800/1000/1200 samples; build
  ``sizes`` with :func:`group_sizes`. Examples are drawn without replacement.

  Args:
    labels: training labels ``[N]``.
    sizes: one positive size per client.
    seed: seed of ``np.random.default_rng``.

  Returns:
    ``len(sizes)`` sorted int64 index arrays, the i-th of length ``sizes[i]``.
  """
  labels = _labels(labels)
  sizes = [_positive_int(s, "data.sizes") for s in sizes]
  if not sizes:
    raise ValueError("data.sizes must name at least one client size.")
  _check_total(sum(sizes), len(labels), "data.group_sizes", f"sizes summing to {sum(sizes)}")
  rng = np.random.default_rng(seed)
  chosen = rng.permutation(len(labels))[:sum(sizes)]
  return _finish(np.split(chosen, np.cumsum(sizes)[:-1]))


# ----------------------------------------------------------------------------- k classes


def _unrank_subset(rank: int, n: int, k: int) -> tuple[int, ...]:
  """The ``rank``-th k-subset of ``range(n)``, lexicographic (combinatorial number system)."""
  subset, c = [], 0
  while k:
    count = math.comb(n - c - 1, k - 1)  # subsets that start with c
    if rank < count:
      subset.append(c)
      k -= 1
    else:
      rank -= count
    c += 1
  return tuple(subset)


def _choose_subsets(capacity: np.ndarray, num_clients: int, k: int, rng: np.random.Generator,
                    jitter: float) -> list[np.ndarray] | None:
  """Greedy choice of distinct k-subsets of classes within per-class capacities.

  Client by client, among unused subsets whose classes all have capacity left, take the
  one with the smallest summed fraction of capacity used *after* taking it, plus uniform
  noise in ``[0, jitter)``. This spreads the load in proportion to the class counts and
  draws on scarce classes last. Returns None when it gets stuck.
  """
  num_classes = len(capacity)
  num_subsets = math.comb(num_classes, k)
  used = np.zeros(num_classes, np.int64)
  enumerate_all = num_subsets <= _MAX_ENUMERATED_SUBSETS
  if enumerate_all:
    all_subsets = np.array(list(itertools.combinations(range(num_classes), k)), np.int64)
    available = np.ones(num_subsets, bool)
  taken: set[tuple[int, ...]] = set()
  subsets = []
  for _ in range(num_clients):
    if enumerate_all:
      rows = np.flatnonzero(available)
      cands = all_subsets[rows]
    else:
      ranks = rng.choice(num_subsets, size=min(_SUBSET_CANDIDATES, num_subsets), replace=False)
      cands = np.array([_unrank_subset(int(r), num_classes, k) for r in ranks], np.int64)
      fresh = np.array([tuple(c) not in taken for c in cands.tolist()], bool)
      rows, cands = None, cands[fresh]
    if not len(cands):
      return None
    feasible = np.all(used[cands] < capacity[cands], axis=1)
    if not feasible.any():
      return None
    fill = ((used[cands] + 1) / np.maximum(capacity[cands], 1)).sum(axis=1)
    score = np.where(feasible, fill + rng.uniform(0, jitter, len(fill)), np.inf)
    best = int(np.argmin(score))
    subset = cands[best]
    if enumerate_all:
      available[rows[best]] = False
    taken.add(tuple(subset.tolist()))
    used[subset] += 1
    subsets.append(subset)
  return subsets


def k_classes(labels, num_clients: int, k: int, samples_per_client: int,
              seed: int = 0) -> list[np.ndarray]:
  """Each client holds exactly ``k`` classes in equal amounts; no two share a class set.

  Wei et al. Fig. 12 (non-IID): "each MT has four kinds of digits with the same amount,
  and the variety is different from all other MTs"; spec resolution: 50 clients, each a
  distinct 4-subset of {0..9} (210 exist), 200 samples per class, ``|D_i| = 800``.

  How subsets are chosen: a randomized greedy (:func:`_choose_subsets`) that keeps every
  class's share of use proportional to its count, retried with more randomness if it
  gets stuck. Uniformly random subsets would use some classes far more than others and
  run out (MNIST class 5 has 5421 examples; 50 x 4 x 200 draws need ~4000 per class on
  average). Examples of each class are shuffled and handed out in chunks of
  ``samples_per_client / k``.

  Args:
    labels: training labels ``[N]``; the classes are the distinct values present.
    num_clients: U, at most C(num_classes, k).
    k: classes per client.
    samples_per_client: examples per client, a multiple of ``k``.
    seed: seed of ``np.random.default_rng``.

  Returns:
    U sorted int64 index arrays of length ``samples_per_client``.

  Raises:
    ValueError: impossible settings (too many clients for distinct subsets,
      ``samples_per_client`` not a multiple of k, not enough examples of a class).
  """
  labels = _labels(labels)
  num_clients = _positive_int(num_clients, "data.num_clients")
  k = _positive_int(k, "data.classes_per_client")
  size = _positive_int(samples_per_client, "data.samples_per_client")
  classes, counts = np.unique(labels, return_counts=True)
  num_classes = len(classes)
  if k > num_classes:
    raise ValueError(f"data.classes_per_client={k} exceeds the {num_classes} classes in the "
                     "training set.")
  if size % k:
    raise ValueError(f"data.samples_per_client={size} must be a multiple of data.classes_per_client={k} "
                     "(equal amounts of each class).")
  num_subsets = math.comb(num_classes, k)
  if num_clients > num_subsets:
    raise ValueError(f"data.num_clients={num_clients} exceeds C({num_classes}, {k}) = "
                     f"{num_subsets}, the number of distinct {k}-class sets.")
  per_class = size // k
  _check_total(num_clients * size, len(labels), "data.samples_per_client",
               f"{num_clients} clients x {size} samples")
  capacity = counts // per_class  # how many clients each class can serve
  if capacity.sum() < num_clients * k:
    raise ValueError(f"data.samples_per_client={size}: {num_clients} clients x {k} classes "
                     f"x {per_class} samples cannot be cut from class counts {counts.tolist()}.")

  rng = np.random.default_rng(seed)
  subsets = None
  for attempt in range(_SUBSET_ATTEMPTS):
    # Attempt 0 is the plain greedy (noise only breaks ties); later attempts add more noise.
    jitter = min(0.5 * attempt, 1.5) + 1e-6
    subsets = _choose_subsets(capacity, num_clients, k, rng, jitter)
    if subsets is not None:
      break
  if subsets is None:
    raise ValueError(f"data.samples_per_client={size}: found no {num_clients} distinct "
                     f"{k}-class sets with {per_class} examples per class in class counts "
                     f"{counts.tolist()} ({_SUBSET_ATTEMPTS} randomized greedy attempts); "
                     "use fewer clients or samples.")

  # Hand out shuffled examples of each class, per_class at a time.
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  cursor = np.zeros(num_classes, np.int64)
  out = []
  for subset in subsets:
    parts = []
    for j in subset:
      parts.append(pools[j][cursor[j]:cursor[j] + per_class])
      cursor[j] += per_class
    out.append(np.concatenate(parts))
  return _finish(out)


# ----------------------------------------------------------------------------- dirichlet


def dirichlet(labels, num_clients: int, alpha: float, seed: int = 0,
              samples_per_client: int | None = None) -> list[np.ndarray]:
  """Per-client label proportions ``p_i ~ Dir(alpha 1_C)``, fixed client size.

  Variant: **Hsu, Qi, Brown (2019), "Measuring the effects of non-identical data
  distribution"**: every client draws its own label distribution ``p_i`` from a
  symmetric Dirichlet over the C classes, then ``samples_per_client`` examples with those
  proportions, without replacement. (Hsu et al. scale a prior: ``Dir(alpha p)``; with
  the near-balanced MNIST/CIFAR-10 prior this is the symmetric form used here.) This is
  *not* the per-class variant ``q_c ~ Dir(alpha 1_U)`` of Yurochkin et al. (2019) /
  Wang et al. (2020), which splits each class over clients and gives clients unequal
  sizes. The fixed size keeps the per-client sensitivity ``2C/|D_i|`` of the UDP papers
  equal across clients.

  Small alpha -> each client dominated by few classes; large alpha -> close to IID.
  When a class runs out, the clients that still want it draw the shortfall from the
  remaining classes in proportion to their own ``p_i``; clients are filled in a random
  order, so no client is systematically last.

  Args:
    labels: training labels ``[N]``.
    num_clients: U.
    alpha: Dirichlet concentration, > 0.
    seed: seed of ``np.random.default_rng``.
    samples_per_client: examples per client; default ``floor(N / U)``.

  Returns:
    U sorted int64 index arrays of length ``samples_per_client``.
  """
  labels = _labels(labels)
  num_clients = _positive_int(num_clients, "data.num_clients")
  if not (isinstance(alpha, (int, float, np.floating, np.integer)) and alpha > 0
          and math.isfinite(alpha)):
    raise ValueError(f"data.alpha must be a positive finite number, got {alpha!r}.")
  size = _default_size(labels, num_clients, samples_per_client)
  _check_total(num_clients * size, len(labels), "data.samples_per_client",
               f"{num_clients} clients x {size} samples")
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  proportions = rng.dirichlet(np.full(len(classes), float(alpha)), size=num_clients)
  return _draw_by_proportions(labels, classes, proportions, np.full(num_clients, size), rng)


def _draw_by_proportions(labels: np.ndarray, classes: np.ndarray, proportions: np.ndarray,
                         sizes: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
  """Client i draws ``sizes[i]`` examples with label proportions ``proportions[i]``.

  Without replacement. When a class runs out, the shortfall is drawn from the remaining
  classes in proportion to the client's own ``p_i`` (uniformly if none of its classes is
  left); clients are filled in a random order, so no client is systematically last.
  """
  num_clients, num_classes = proportions.shape
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  left = np.array([len(p) for p in pools], np.int64)
  cursor = np.zeros(num_classes, np.int64)
  out: list[np.ndarray] = [None] * num_clients  # type: ignore[list-item]
  for i in rng.permutation(num_clients):
    want = np.zeros(num_classes, np.int64)
    need = int(sizes[i])
    p = np.nan_to_num(proportions[i])
    while need:
      weights = np.where(left - want > 0, p, 0.0)
      if weights.sum() <= 0:  # this client's classes are exhausted: fall back to uniform
        weights = (left - want > 0).astype(float)
      draw = rng.multinomial(need, weights / weights.sum())
      draw = np.minimum(draw, left - want)
      want += draw
      need -= int(draw.sum())
    parts = [pools[j][cursor[j]:cursor[j] + want[j]] for j in range(num_classes)]
    cursor += want
    left -= want
    out[i] = np.concatenate(parts)
  return _finish(out)


# ----------------------------------------------------------------------------- writer-like


def writer_sizes(num_clients: int, mean_size: int, size_sigma: float = 0.6,
                 seed: int = 0) -> np.ndarray:
  """Log-normal client sizes with mean about ``mean_size`` (at least 1 each).

  ``size_i = max(1, round(exp(N(log(mean_size) - size_sigma^2 / 2, size_sigma^2))))``;
  the ``- sigma^2 / 2`` shift makes ``mean_size`` the mean, not the median.
  """
  num_clients = _positive_int(num_clients, "data.num_clients")
  mean_size = _positive_int(mean_size, "data.samples_per_client")
  if not (size_sigma >= 0 and math.isfinite(size_sigma)):
    raise ValueError(f"data.size_sigma must be a finite number >= 0, got {size_sigma!r}.")
  rng = np.random.default_rng(seed)
  raw = rng.lognormal(math.log(mean_size) - size_sigma ** 2 / 2, size_sigma, num_clients)
  return np.maximum(1, np.rint(raw)).astype(np.int64)


def writer_like(labels, num_clients: int, samples_per_client: int, seed: int = 0,
                size_sigma: float = 0.6, classes_per_client: int = 3,
                dominance: float = 0.8) -> list[np.ndarray]:
  """Unbalanced non-IID clients, a stand-in for FEMNIST's writers (Fu et al.).

  FEMNIST (LEAF) is "naturally unbalanced and non-IID": each of ~3,500 writers holds a
  different number of images and writes some characters more than others. When the LEAF
  files are not at hand, this partition of an image dataset reproduces both traits:

  * **sizes**: log-normal around ``samples_per_client`` (:func:`writer_sizes`; LEAF's
    writer sizes are roughly log-normal, a few hundred images each with a long tail);
    ``size_sigma=0`` gives equal sizes;
  * **labels**: client i picks ``classes_per_client`` distinct classes at random (its
    "favourite characters") and draws its examples with proportions ``p_i = dominance *
    Uniform(its classes) + (1 - dominance) * Uniform(all classes)``, without replacement
    (a class that runs out is replaced as in :func:`dirichlet`).

  So ``dominance = 0`` is an unbalanced IID split and ``dominance = 1`` gives each client
  only its favourite classes. Not a reproduction of FEMNIST's writer styles (feature
  skew), only of its size and label skew.

  Args:
    labels: training labels ``[N]``.
    num_clients: U.
    samples_per_client: mean client size.
    seed: seed of ``np.random.default_rng``.
    size_sigma: log-normal shape of the sizes (0 = all equal).
    classes_per_client: dominant classes per client, in ``[1, C]``.
    dominance: share of a client's examples drawn from its dominant classes, in [0, 1].

  Returns:
    U sorted int64 index arrays of varying lengths.
  """
  labels = _labels(labels)
  sizes = writer_sizes(num_clients, samples_per_client, size_sigma, seed)
  classes = np.unique(labels)
  k = _positive_int(classes_per_client, "data.classes_per_client")
  if k > len(classes):
    raise ValueError(f"data.classes_per_client={k} exceeds the {len(classes)} classes.")
  if not 0.0 <= float(dominance) <= 1.0:
    raise ValueError(f"data.dominance must lie in [0, 1], got {dominance!r}.")
  _check_total(int(sizes.sum()), len(labels), "data.samples_per_client",
               f"{num_clients} clients of mean size {samples_per_client} (drawn sizes sum "
               f"to {int(sizes.sum())})")
  rng = np.random.default_rng([seed, 1])  # independent of the size draws
  favourite = np.zeros((num_clients, len(classes)))
  for i in range(num_clients):
    favourite[i, rng.choice(len(classes), size=k, replace=False)] = 1.0 / k
  proportions = dominance * favourite + (1.0 - dominance) / len(classes)
  return _draw_by_proportions(labels, classes, proportions, sizes, rng)


# ----------------------------------------------------------------------------- sorted target


def sorted_by_target(labels, num_clients: int, samples_per_client: int | None = None,
                     seed: int = 0) -> list[np.ndarray]:
  """Fu et al.'s non-IID split for regression: contiguous bands of the sorted target.

  Fu et al. Sec. V (spec 4.1, A11): sort the training records by interest rate with a
  stable sort and cut them into N groups of equal size; client i gets group i, so every
  client holds a narrow band of the target. When ``num_clients * samples_per_client`` is
  less than N, a uniformly drawn subset of that size is split (records are then sorted,
  ties kept in index order). Also works on integer labels (clients then hold runs of
  classes).

  Args:
    labels: training targets ``[N]`` (float or integer).
    num_clients: U.
    samples_per_client: records per client; default ``floor(N / U)``.
    seed: seed of ``np.random.default_rng`` (only for the subset).

  Returns:
    U sorted int64 index arrays; client i's targets are all <= client i+1's.
  """
  targets = _targets(labels)
  num_clients = _positive_int(num_clients, "data.num_clients")
  size = _default_size(targets, num_clients, samples_per_client)
  total = num_clients * size
  _check_total(total, len(targets), "data.samples_per_client",
               f"{num_clients} clients x {size} samples")
  chosen = np.arange(len(targets))
  if total < len(targets):
    chosen = np.sort(np.random.default_rng(seed).permutation(len(targets))[:total])
  order = chosen[np.argsort(targets[chosen], kind="stable")]
  return _finish(order.reshape(num_clients, size))


# ----------------------------------------------------------------------------- natural


def natural(labels, num_clients: int, groups, seed: int = 0) -> list[np.ndarray]:
  """The dataset's own clients: one client per distinct value of ``groups``.

  For FEMNIST, ``groups`` is the writer of each training image (LEAF's users), so each
  writer is one client (Fu et al.: N = 3,500 writers). With fewer ``num_clients`` than
  groups, the largest groups are kept (ties by group id), as the Fu spec (A11) allows.

  Args:
    labels: training labels ``[N]`` (only their number is checked).
    num_clients: U, at most the number of groups.
    groups: int ``[N]`` group id per example (``Dataset.train_groups``).
    seed: unused (the split is given by the data); kept for the common signature.

  Returns:
    U sorted int64 index arrays, largest group first.
  """
  del seed
  labels = _targets(labels)
  num_clients = _positive_int(num_clients, "data.num_clients")
  if groups is None:
    raise ValueError("data.partition='natural' needs a dataset with natural clients "
                     "(e.g. femnist's writers); this one has none.")
  groups = np.asarray(groups)
  if groups.shape != labels.shape:
    raise ValueError(f"groups {groups.shape} must give one group per example {labels.shape}.")
  ids, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
  if num_clients > len(ids):
    raise ValueError(f"data.num_clients={num_clients} exceeds the {len(ids)} natural "
                     "clients of the dataset.")
  keep = np.argsort(-counts, kind="stable")[:num_clients]
  order = np.argsort(inverse, kind="stable")
  members = np.split(order, np.cumsum(counts)[:-1])
  return _finish(members[g] for g in keep)


# ----------------------------------------------------------------------------- label skew


def adpfl_skews(num_clients: int, seed: int = 0, evenly_spaced: bool = False) -> np.ndarray:
  """Per-client skews for A-DPFL's Fig. 3 setting (spec adpfl.md section 5.2, step 2).

  Returns ``[num_clients]`` values from {0.0, 0.1, ..., 1.0}: i.i.d. uniform draws, or
  (``evenly_spaced=True``) spread evenly over the clients.
  """
  num_clients = _positive_int(num_clients, "data.num_clients")
  levels = np.round(np.linspace(0.0, 1.0, 11), 1)
  if evenly_spaced:
    return levels[np.arange(num_clients) * 11 // num_clients]
  return np.random.default_rng(seed).choice(levels, size=num_clients)


def label_skew(labels, num_clients: int, s: float | Sequence[float],
               samples_per_client: int | None = None, seed: int = 0,
               remainder: str = "others") -> list[np.ndarray]:
  """A fraction ``s`` of each client's data comes from one dominant label.

  A-DPFL's "redefined non-IID" partition (Sec. 6.1, Fig. 3; spec adpfl.md section 5.2):
  "a 20% skewness means that 20% of the participants' data are divided by labels and
  80% of the data are randomly selected with different labels". The paper leaves the
  details open; the spec's resolution, implemented here:

  1. client i's dominant label is ``classes[i mod C]`` (round robin, so the global
     label marginal stays about balanced);
  2. it gets ``round(s_i n_i)`` examples of its dominant label, without replacement;
  3. the other ``n_i - round(s_i n_i)`` are drawn uniformly at random from the examples
     left over. With ``remainder='others'`` (default) only examples of *other* labels
     qualify, so the dominant fraction is exactly ``round(s_i n_i) / n_i``; note that
     ``s = 0`` then still keeps the dominant label out of the client (use :func:`iid`
     for an IID baseline). ``remainder='all'`` draws from every label (spec step 5),
     so the dominant fraction is at least ``s_i`` and ``s = 0`` is IID.

  ``s`` may be one number for all clients (Hsieh et al. 2020 style) or one per client,
  as in A-DPFL where skew varies by participant (see :func:`adpfl_skews`).

  Step 3 stays exact even when every training example is used (A-DPFL's MNIST setting:
  1000 clients x 60 = 60000): the remainder is dealt out at random, and each example that
  lands on a client whose dominant label it carries is swapped with a random compatible
  one, which always exists when the feasibility checks pass.

  Args:
    labels: training labels ``[N]``.
    num_clients: U.
    s: skew in [0, 1], a scalar or ``[U]``.
    samples_per_client: n_i for every client; default ``floor(N / U)``.
    seed: seed of ``np.random.default_rng``.
    remainder: ``'others'`` or ``'all'``, see step 3.

  Returns:
    U sorted int64 index arrays of length ``samples_per_client``.
  """
  labels = _labels(labels)
  num_clients = _positive_int(num_clients, "data.num_clients")
  size = _default_size(labels, num_clients, samples_per_client)
  if remainder not in ("others", "all"):
    raise ValueError(f"data.remainder must be 'others' or 'all', got {remainder!r}.")
  skew = np.asarray(s, np.float64)
  if skew.ndim == 0:
    skew = np.full(num_clients, float(skew))
  if skew.shape != (num_clients,):
    raise ValueError(f"data.s must be a number or one value per client ({num_clients}), "
                     f"got shape {skew.shape}.")
  if not np.all((skew >= 0) & (skew <= 1)):
    raise ValueError(f"data.s must lie in [0, 1], got values in [{skew.min()}, {skew.max()}].")
  _check_total(num_clients * size, len(labels), "data.samples_per_client",
               f"{num_clients} clients x {size} samples")

  classes, counts = np.unique(labels, return_counts=True)
  num_classes = len(classes)
  dominant = np.arange(num_clients) % num_classes  # position in `classes`
  first = np.rint(skew * size).astype(np.int64)   # dominant-label examples per client
  demand = np.bincount(dominant, weights=first, minlength=num_classes).astype(np.int64)
  if np.any(demand > counts):
    c = int(np.argmax(demand - counts))
    raise ValueError(f"data.s: clients dominated by class {classes[c]} need {demand[c]} of its "
                     f"examples, but there are only {counts[c]}; lower data.s or "
                     "data.samples_per_client.")
  label_pos = np.searchsorted(classes, labels)  # labels as positions in `classes`
  rest = size - first
  if remainder == "others":
    pool_left = counts - demand
    rest_by_class = np.bincount(dominant, weights=rest, minlength=num_classes).astype(np.int64)
    other = pool_left.sum() - pool_left
    if np.any(rest_by_class > other):
      c = int(np.argmax(rest_by_class - other))
      raise ValueError(f"data.s: clients dominated by class {classes[c]} need "
                       f"{rest_by_class[c]} examples of other classes, but only {other[c]} "
                       "are left; lower data.samples_per_client.")

  rng = np.random.default_rng(seed)
  # Phase 1: the dominant-label share.
  pools = [rng.permutation(np.flatnonzero(label_pos == j)) for j in range(num_classes)]
  cursor = np.zeros(num_classes, np.int64)
  head = []
  for i in range(num_clients):
    j = dominant[i]
    head.append(pools[j][cursor[j]:cursor[j] + first[i]])
    cursor[j] += first[i]
  # Phase 2: deal the leftover examples at random to the remaining slots; positions past
  # the slots are unused spares.
  leftover = rng.permutation(np.concatenate([p[cursor[j]:] for j, p in enumerate(pools)]))
  slot_owner = np.repeat(np.arange(num_clients), rest)
  num_slots = len(slot_owner)
  if remainder == "others":
    # -1 (no constraint) for spares.
    slot_dom = np.concatenate([dominant[slot_owner], np.full(len(leftover) - num_slots, -1)])
    _repair_conflicts(leftover, label_pos, slot_dom, rng)
  tails = np.split(leftover[:num_slots], np.cumsum(rest)[:-1])
  return _finish(np.concatenate([h, t]) for h, t in zip(head, tails))


def _repair_conflicts(items: np.ndarray, label_pos: np.ndarray, slot_dom: np.ndarray,
                      rng: np.random.Generator) -> None:
  """Swaps items in place until no item sits in a slot whose forbidden class it carries.

  A conflict (item of class c in a slot forbidding c) is swapped with any position whose
  item is not of class c and whose slot does not forbid c; both end up valid, so every
  swap removes a conflict and creates none. Such a partner exists whenever the slots
  forbidding c are no more than the items of other classes (checked by the caller).
  """
  conflicts = np.flatnonzero(label_pos[items] == slot_dom)
  n = len(items)
  for j in rng.permutation(conflicts):
    c = slot_dom[j]
    if label_pos[items[j]] != c:
      continue  # already fixed: it was the partner of an earlier swap
    partner = -1
    for k in rng.integers(0, n, size=32):  # a random partner is valid ~90% of the time
      if label_pos[items[k]] != c and slot_dom[k] != c:
        partner = int(k)
        break
    if partner < 0:
      valid = np.flatnonzero((label_pos[items] != c) & (slot_dom != c))
      if not len(valid):
        raise ValueError("data.s: no compatible example left to complete the label-skew "
                         "partition; lower data.samples_per_client.")
      partner = int(rng.choice(valid))
    items[j], items[partner] = items[partner], items[j]


# ----------------------------------------------------------------------------- dispatch


def _unbalanced_from_config(labels, num_clients: int, seed: int = 0,
                            sizes: Sequence[int] | None = None,
                            groups: Sequence[int] | None = None,
                            clients_per_group: int | None = None) -> list[np.ndarray]:
  """``unbalanced`` driven by config fields: ``sizes``, or ``groups`` (+ clients per group)."""
  if (sizes is None) == (groups is None):
    raise ValueError("data.partition='unbalanced' needs exactly one of data.sizes (one size "
                     "per client) or data.groups (sizes of equally many clients each).")
  if groups is not None:
    if clients_per_group is None:
      if not groups or num_clients % len(groups):
        raise ValueError(f"data.num_clients={num_clients} is not a multiple of the "
                         f"{len(groups)} data.groups; set data.clients_per_group.")
      clients_per_group = num_clients // len(groups)
    sizes = group_sizes(groups, clients_per_group)
  elif clients_per_group is not None:
    raise ValueError("data.clients_per_group only applies with data.groups.")
  if len(sizes) != num_clients:
    raise ValueError(f"data.num_clients={num_clients}, but the unbalanced sizes describe "
                     f"{len(sizes)} clients.")
  return unbalanced(labels, sizes, seed)


# name -> fn(labels, *, num_clients, seed, **method kwargs)
PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "k_classes": k_classes,
    "dirichlet": dirichlet,
    "unbalanced": _unbalanced_from_config,
    "label_skew": label_skew,
    "writer_like": writer_like,
    "sorted": sorted_by_target,
    "natural": natural,
}


# The config fields each partitioner reads that not every partitioner reads (beyond
# data.num_clients and data.samples_per_client, read by nearly all): a config that sets
# one away from its default with another partition is refused
# (fedjax_dp.config.unread_fields); partition_clients passes them.
PARTITION_READS: dict[str, tuple[str, ...]] = {
    "iid": (), "sorted": (), "natural": (),
    "k_classes": ("data.classes_per_client",),
    "dirichlet": ("data.alpha",),
    "unbalanced": ("data.group_sizes",),
    "label_skew": ("data.skew", "data.skews", "data.skew_scheme", "data.skew_remainder"),
    "writer_like": ("data.classes_per_client", "data.size_sigma", "data.dominance"),
}


def partition(labels, method: str, num_clients: int, seed: int, **kwargs) -> list[np.ndarray]:
  """Splits ``labels`` over ``num_clients`` clients with a registered partitioner.

  Args:
    labels: training labels ``[N]``.
    method: a key of :data:`PARTITIONERS` (config field ``data.partition``).
    num_clients: U.
    seed: seed of ``np.random.default_rng``.
    **kwargs: the method's own fields, e.g. ``samples_per_client=800``, ``k=4``,
      ``alpha=0.5``, ``s=0.8``, ``groups=(400, 600, 800, 1000, 1200)``.

  Returns:
    U sorted int64 index arrays into the training set.

  Raises:
    ValueError: unknown method or keyword, or impossible sizes; the message names the
      config field.
  """
  if method not in PARTITIONERS:
    raise ValueError(f"data.partition={method!r} is not a known partitioner. Known: "
                     f"{', '.join(PARTITIONERS)}.")
  fn = PARTITIONERS[method]
  params = inspect.signature(fn).parameters
  allowed = [p for p in params if p not in ("labels", "num_clients", "seed")]
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"data.partition={method!r} does not take "
                     f"{', '.join('data.' + u for u in unknown)}; it takes "
                     f"{', '.join('data.' + a for a in allowed)}.")
  missing = [p for p, v in params.items() if v.default is inspect.Parameter.empty
             and p not in ("labels", "num_clients", "seed") and p not in kwargs]
  if missing:
    raise ValueError(f"data.partition={method!r} needs {', '.join('data.' + m for m in missing)}.")
  return fn(labels, num_clients=num_clients, seed=seed, **kwargs)


def _skews(cfg):
  """``data.s`` for label_skew: one value, or one per client (``data.skews`` or a scheme)."""
  d = cfg.data
  scheme = d.get("skew_scheme", "constant")
  if scheme != "constant":
    return adpfl_skews(d.num_clients, cfg.seed, evenly_spaced=scheme == "adpfl_even")
  skews = tuple(d.get("skews", ()))
  if skews and len(skews) != d.num_clients:
    raise ConfigError(f"data.skews holds {len(skews)} values, but "
                      f"data.num_clients is {d.num_clients}")
  return np.asarray(skews, np.float64) if skews else d.skew


def holdout_indices(n: int, holdout: int, fold: int = 0) -> np.ndarray:
  """The ``holdout`` training examples (of ``n``) set aside before the partition
  (``data.holdout``): a uniform random subset drawn with a fixed generator (seed 0),
  so every run and seed sets aside the same examples and a validation score read on
  them compares runs on one set. Sorted ``int64`` indices ``[holdout]``.

  ``fold`` (``data.holdout_fold``) picks the fold-th block of ``holdout`` examples of
  the same fixed permutation: folds are disjoint, fold 0 is the set of before, and
  ``n // holdout`` folds set aside every example once (k-fold cross-validation).

  Raises:
    ConfigError: ``holdout`` outside ``[0, n)`` (no client could hold an example), a
      negative ``fold``, or a fold past the permutation's end.
  """
  if not 0 <= holdout < n:
    raise ConfigError(f"data.holdout={holdout} must lie in [0, {n}): the training set "
                      f"has {n} examples and the clients need some")
  if fold < 0 or (fold > 0 and (holdout == 0 or (fold + 1) * holdout > n)):
    raise ConfigError(f"data.holdout_fold={fold} needs 0 <= fold < n // data.holdout "
                      f"(= {n // holdout if holdout else 0} folds of data.holdout={holdout} "
                      f"of the {n} training examples; a fold > 0 needs data.holdout > 0)")
  perm = np.random.default_rng(0).permutation(n)
  return np.sort(perm[fold * holdout:(fold + 1) * holdout]).astype(np.int64)


def partition_clients(cfg, labels, groups=None):
  """The config's partition of the training ``labels`` into clients (index arrays
  into ``labels``): :func:`partition` with the method and arguments ``cfg.data``
  names, seeded by ``cfg.seed``, over the examples :func:`holdout_indices` leaves
  (``data.holdout``, fold ``data.holdout_fold``; all of them at 0)."""
  holdout, fold = int(cfg.data.get("holdout", 0)), int(cfg.data.get("holdout_fold", 0))
  if holdout == 0 and fold == 0:
    return _partition_pool(cfg, labels, groups)
  labels = np.asarray(labels)
  pool = np.setdiff1d(np.arange(len(labels)), holdout_indices(len(labels), holdout, fold))
  parts = _partition_pool(cfg, labels[pool],
                          None if groups is None else np.asarray(groups)[pool])
  return [pool[np.asarray(c, np.int64)] for c in parts]


def _partition_pool(cfg, labels, groups=None):
  """:func:`partition_clients` over the whole of ``labels``."""
  d = cfg.data
  kwargs: dict[str, Any] = {}
  if d.partition == "iid":
    kwargs = {"samples_per_client": d.samples_per_client}
  elif d.partition == "k_classes":
    kwargs = {"k": d.classes_per_client, "samples_per_client": d.samples_per_client}
  elif d.partition == "dirichlet":
    kwargs = {"alpha": d.alpha, "samples_per_client": d.samples_per_client or None}
  elif d.partition == "unbalanced":
    sizes = list(d.group_sizes)
    if d.num_clients % len(sizes):
      raise ConfigError(
          f"data.num_clients ({d.num_clients}) must be a multiple of the number of "
          f"data.group_sizes ({len(sizes)})")
    per = d.num_clients // len(sizes)
    return partition(labels, "unbalanced", d.num_clients, cfg.seed,
                     sizes=[s for s in sizes for _ in range(per)])
  elif d.partition == "label_skew":
    kwargs = {"s": _skews(cfg), "samples_per_client": d.samples_per_client,
              "remainder": d.get("skew_remainder", "others")}
  elif d.partition == "sorted":
    kwargs = {"samples_per_client": d.samples_per_client}
  elif d.partition == "writer_like":
    kwargs = {"samples_per_client": d.samples_per_client, "size_sigma": d.size_sigma,
              "classes_per_client": d.classes_per_client, "dominance": d.dominance}
  elif d.partition == "natural":
    kwargs = {"groups": groups}
  return partition(labels, d.partition, d.num_clients, cfg.seed, **kwargs)
