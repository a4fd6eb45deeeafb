"""Client-selection rules: each rule's host sampler and the accounting it implies.

This module also owns the host's cohort of a round: the static number of client
slots K (:func:`cohort_size`) and the drawn ids padded into those slots with a mask
(:func:`select_clients`), the form the compiled round takes.

A selection rule decides which clients train in round t. What the accountant may
assume depends on the rule, so a rule carries both (ARCHITECTURE.md decision 6):

=============  ==================================  ===========================================
rule           sampler (host, ``rng[seed, t]``)    accounting of one client's round
=============  ==================================  ===========================================
uniform        K of U without replacement          random selection, marginal q = K/U
                                                   (example level: ``"selection"``; client
                                                   level: fixed-size WBK19)
poisson        each client with rate q             example level: ``"selection"``;
                                                   client level: Poisson
round_robin    a fresh permutation of the U        deterministic turns: the clients of the
               clients per pass of ceil(U/K)       round's cohort are charged in full, the
               rounds, K at a time                 others nothing (no amplification)
cyclic         one permutation of the U clients,   as round_robin; a client's turns are
               the same every pass, K at a time    exactly ceil(U/K) rounds apart
cyclic_        cyclic's permutation split into     a client is eligible only every P-th
poisson        P = ceil(U/K) groups of K; round t  round (its group's, known in advance);
               takes each client of group t mod P  each eligible round is the poisson
               independently with rate q           rule's event at rate q, the others
                                                   nothing: ceil(T/P) events over T
                                                   rounds; BandMF with b <= P bands is
                                                   amplified likewise (bandmf.py)
all            every client                        every client in full
wasserstein_   the K clients with the highest A-DPFL  charged per client for the rounds it
topk           score SC_i (smallest W_i); the same    was selected in (no amplification);
               set every round                        label histograms public (below)
wasserstein_   K without replacement with             same as wasserstein_topk
sample         probability proportional to p_i
=============  ==================================  ===========================================

Round robin's order is treated as known in advance: nothing is amplified and each
client is charged exactly the rounds it took part in (``Event.participated``). A new
rule is one more entry of :data:`RULES`; a rule whose sampler needs per-client side
information (A-DPFL's scores) names it in :attr:`SelectionRule.weights`, which the
experiment evaluates once on the partition at build time and hands to every draw.

A-DPFL selection (spec adpfl.md sections 2.3 and 7 items 6-8). Client i's label
histogram ``h_i`` gives its 1-Wasserstein distance ``W_i`` to the global label
marginal, the score ``SC_i = 1 - W_i / RMS(W)`` and ``p_i = softmax(SC)_i``
(:mod:`fedjax_dp.data.heterogeneity`, ground metric ``server.wasserstein_metric``).

Accounting of the A-DPFL rules, and the assumption it rests on:

* The selection is a function of the label histograms, i.e. of private data. Under
  the example-level replace-one adjacency of the accountant, replacing one example
  by one of another label changes ``h_i``, the global marginal, every ``W_j`` and so
  possibly the selected set. Top-K then releases a deterministic function of the
  data (no finite epsilon bounds that), and even a client never selected leaks
  through *who else* was selected. No noise in this engine covers that release, so
  a guarantee without an assumption would have to refuse these rules.
* The certified epsilon therefore assumes, as the paper does implicitly (spec
  section 7 item 8), that **the clients' label histograms are public side
  information**: the guarantee is over adjacent datasets with equal label histograms
  (a replaced example keeps its label; at client level, a replaced client keeps its
  label histogram). Under that assumption the scores, ``p_i`` and the top-K set are
  data-independent. :attr:`SelectionRule.assumption` states it, and
  ``summary.json``'s ``privacy.accounting.assumption`` repeats it.
* Only replace-one neighbours keep the histograms (and the counts ``|D_i|``) equal,
  so a run with these rules is accounted under replace-one in every event
  (:attr:`SelectionRule.relation`), Poisson minibatches included.
* Top-K is then a fixed, known schedule: no amplification; a selected client is
  charged the full round (Gaussian, no subsampling) every round it is selected,
  the others nothing -- the participation-flag event of round robin.
* The sampled variant selects client i with an inclusion probability ``pi_i`` that
  differs per client, and a fixed-size weighted draw without replacement is not
  Poisson sampling, so neither Poisson nor uniform (fixed-size, q = K/U)
  amplification applies as proven. It is accounted like top-K: without
  amplification, charged only the rounds a client was selected in. That is a valid
  upper bound because, given the public histograms, the draw uses only the run's
  seed and is independent of the data: conditioned on the realised cohorts, a round
  in which client i was not selected has an output distribution that does not
  depend on client i's data, and a round in which it was selected is one
  non-subsampled Gaussian release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.data import heterogeneity
from fedjax_dp.errors import ConfigError


class SelectionRule(NamedTuple):
  """A selection rule.

  Attributes:
    sample: ``(U, K, q, seed, t) -> ids`` the clients selected in round t (at most
      ``slots`` of them).
    slots: ``(U, K, q) -> int`` the static number of client slots of a round.
    q: ``(U, K, q) -> float`` a client's marginal per-round selection probability.
    deterministic: participation is charged from the realised cohort (no
      amplification): the accountant is told who took part in each round.
    sampling: ``(level, U, K, q) -> dict`` the :class:`accounting.Event` sampling
      fields for a round of a randomly selected client (unused when
      ``deterministic``); ``q`` is the configured ``server.q`` (the plan's ``rate``).
    max_participations: ``(U, K, q, T) -> int`` the most rounds one client can be
      charged over T rounds: a deterministic rule's most turns, a random rule's
      eligible rounds (T, or ``ceil(T / P)`` with :attr:`groups`); the plan
      calibrates a constant schedule by that many of the rule's events.
    min_cohort: ``(U, K, q) -> int`` the smallest number of clients a round can
      select (0 where a round can be empty).
    weights: None, or ``(labels [N], client_indices, num_classes, server_cfg) ->
      [U] float64``: per-client side information the sampler needs (``sample``'s
      ``weights`` argument), computed once from the training labels and the
      partition when the experiment is built. Raises ValueError (naming the field)
      where the data cannot give it.
    assumption: None, or what the certified epsilon assumes beyond the accountant's
      adjacency (stated in ``summary.json``).
    relation: None, or the only neighbour relation the assumption allows
      (``'replace_one'``: the A-DPFL rules need equal label histograms and counts
      between neighbours, which no add/remove neighbour has); the run's accounting
      then uses it for every event (``PrivacyPlan.adjacency``).
    check: ``(cfg) -> None`` refuses the rule's own fields out of range
      (``server.clients_per_round``, ``server.q``) with a ConfigError naming the
      field; :func:`check_config` calls it.
    period: ``(U, K, q) -> int`` rounds between a client's turns by design (round
      robin and cyclic: the pass ``ceil(U / K)``; 1 otherwise). A correlated
      mechanism sizes its bands and tree restarts by it.
    public_pattern: who takes part in round t is a function of (seed, t) alone, drawn
      without reading data, so each client's participation pattern is public: what a
      correlated mechanism's accounting (one Gaussian over the realised patterns)
      needs. Random rules are excluded: their matrix mechanisms need amplification.
    groups: None, or ``(U, K, q, seed) -> [U] int``: each client's class ``g_i`` in
      ``[0, period)``, a function of the seed alone (drawn without data, so public):
      client i can be selected only in the rounds ``t`` with ``t % period == g_i``.
      A random rule with groups is charged only in those rounds (its sampling event
      with ``participated`` = eligible, never the realised draw), and
      ``max_participations`` counts them. None: every client is eligible every round.
    min_sep_poisson: b-min-sep Poisson sampling (Choquette-Choo et al. 2023, Sec. 4):
      ``groups`` is set, a client's eligible rounds are exactly ``period`` apart, and
      in each of them it is selected independently of everything else with the
      probability its ``sampling`` event states (Poisson, client level). A banded
      matrix mechanism with ``b <= period`` bands is then amplified
      (:mod:`fedjax_dp.privacy.correlated.bandmf`).
    reads: the config fields the rule reads that not every rule reads (dotted keys):
      a config that sets one away from its default while picking a rule that does
      not read it is refused (:func:`fedjax_dp.config.unread_fields`).
  """

  sample: Callable[..., np.ndarray]
  slots: Callable[[int, int, float], int]
  q: Callable[[int, int, float], float]
  deterministic: bool
  sampling: Callable[..., dict[str, Any]]
  max_participations: Callable[[int, int, float, int], int]
  min_cohort: Callable[[int, int, float], int]
  weights: Callable[..., np.ndarray] | None = None
  assumption: str | None = None
  relation: str | None = None
  check: Callable[[Any], None] = lambda cfg: None
  period: Callable[[int, int, float], int] = lambda u, k, q: 1
  public_pattern: bool = False
  groups: Callable[[int, int, float, int], np.ndarray] | None = None
  min_sep_poisson: bool = False
  reads: tuple[str, ...] = ()


def poisson_cap(num_clients: int, q: float) -> int:
  """Static padded cohort size for Poisson sampling: mean + 8 std (+1), at most U.

  A draw above the cap (probability < 1e-15) raises rather than silently dropping
  clients.
  """
  mean = num_clients * q
  return int(min(num_clients, np.ceil(mean + 8.0 * np.sqrt(mean * (1 - q)) + 1)))


def rounds_per_pass(num_clients: int, clients_per_round: int) -> int:
  """Rounds of one round-robin pass: ``ceil(U / K)``."""
  return -(-num_clients // clients_per_round)


def _uniform(u, k, q, seed, t, weights=None):
  return np.sort(np.random.default_rng([seed, t]).choice(u, k, replace=False))


def _poisson(u, k, q, seed, t, weights=None):
  ids = np.flatnonzero(np.random.default_rng([seed, t]).random(u) < q)
  cap = poisson_cap(u, q)
  if ids.size > cap:
    raise RuntimeError(f"Poisson draw of {ids.size} clients exceeds the cap {cap}")
  return ids


def _round_robin(u, k, q, seed, t, weights=None):
  """Pass ``t // P`` walks a permutation of all U clients seeded by (seed, pass), K
  per round; the last round of a pass takes the remaining ``U - (P - 1) K``."""
  per_pass = rounds_per_pass(u, k)
  p, r = divmod(int(t), per_pass)
  order = np.random.default_rng([seed, p, 1]).permutation(u)  # 1: not a round's stream
  return np.sort(order[r * k:(r + 1) * k])


def _cyclic(u, k, q, seed, t, weights=None):
  """One permutation of the U clients seeded by ``seed`` alone, walked K per round and
  repeated every pass: a client's turns are exactly ``P = ceil(U / K)`` rounds apart,
  the b-min-separated participation of Choquette-Choo et al. 2023 (Thm. 2) for
  ``b <= P``. Round robin's fresh order per pass can put a client in the last round of
  one pass and the first of the next."""
  r = int(t) % rounds_per_pass(u, k)
  return np.sort(_cyclic_order(u, seed)[r * k:(r + 1) * k])


def _cyclic_order(u, seed):
  """The one permutation of the U clients that cyclic and cyclic_poisson walk."""
  return np.random.default_rng([seed, 0, 2]).permutation(u)  # 2: not round robin's


def _cyclic_groups(u, k, q, seed):
  """``[U]`` each client's group ``g_i``: its position in the fixed order, K per group
  (``P = ceil(U / K)`` groups, the last one holding ``U - (P - 1) K``)."""
  out = np.empty(u, np.int64)
  out[_cyclic_order(u, seed)] = np.arange(u) // k
  return out


def _cyclic_poisson(u, k, q, seed, t, weights=None):
  """Group ``t mod P`` of the fixed order (as :func:`_cyclic`), each of its clients
  independently with rate q from the round's stream ``rng[seed, t]``: b-min-sep
  Poisson sampling (Choquette-Choo et al. 2023, Sec. 4) with ``b = P``. A client's
  eligible rounds are exactly P apart; whether it is drawn in one of them is
  independent of every other draw and of the data."""
  r = int(t) % rounds_per_pass(u, k)
  group = _cyclic_order(u, seed)[r * k:(r + 1) * k]
  ids = np.sort(group[np.random.default_rng([seed, t]).random(group.size) < q])
  cap = poisson_cap(group.size, q)
  if ids.size > cap:
    raise RuntimeError(f"Poisson draw of {ids.size} clients exceeds the cap {cap}")
  return ids


def _all(u, k, q, seed, t, weights=None):
  return np.arange(u)


def _wasserstein_topk(u, k, q, seed, t, weights=None):
  """The K clients with the highest scores ``weights [U]`` (SC_i): the same set every
  round. Ties are broken at random, by a permutation fixed by the seed alone (not by
  t), so the set stays the same (spec section 2.3)."""
  scores = _check_weights(weights, u, "wasserstein_topk")
  tie = np.random.default_rng([seed, 0, 2]).random(u)  # [seed, 0, 2]: not a round's stream
  order = np.lexsort((tie, -scores))  # last key is primary: highest score first
  return np.sort(order[:k])


def _wasserstein_sample(u, k, q, seed, t, weights=None):
  """K clients without replacement with probability proportional to ``weights [U]``
  (p_i): successive sampling, numpy's ``choice(replace=False, p=p)``."""
  p = _check_weights(weights, u, "wasserstein_sample")
  p = p / p.sum()
  return np.sort(np.random.default_rng([seed, t]).choice(u, k, replace=False, p=p))


def _check_weights(weights, u, name):
  if weights is None:
    raise ValueError(f"server.selection={name!r} needs the per-client weights of its rule "
                     "(SelectionRule.weights), computed from the partition at build time")
  w = np.asarray(weights, np.float64)
  if w.shape != (u,) or not np.all(np.isfinite(w)):
    raise ValueError(f"server.selection={name!r}: weights must be finite [U={u}], got "
                     f"shape {w.shape}")
  return w


def adpfl_heterogeneity(labels, client_indices, num_classes, server_cfg) -> dict[str, Any]:
  """:func:`heterogeneity.client_heterogeneity` of a partition with the ground metric
  ``server.wasserstein_metric`` (default ``'zero_one'``).

  Raises:
    ValueError: float (regression) targets, or an unknown metric, naming the field.
  """
  metric = server_cfg.get("wasserstein_metric", "zero_one")
  if metric not in heterogeneity.GROUND_METRICS:
    raise ValueError(f"server.wasserstein_metric: unknown {metric!r}; known: "
                     f"{heterogeneity.GROUND_METRICS}")
  labels = np.asarray(labels)
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"server.selection={server_cfg.selection!r} ranks clients by their "
                     "label histograms and needs class labels, got targets of dtype "
                     f"{labels.dtype}")
  return heterogeneity.client_heterogeneity(labels, client_indices, num_classes, metric)


def _adpfl_weights(field: str):
  def weights(labels, client_indices, num_classes, server_cfg):
    return np.asarray(adpfl_heterogeneity(labels, client_indices, num_classes,
                                          server_cfg)[field], np.float64)
  return weights


PUBLIC_HISTOGRAMS = (
    "the clients' label histograms (which the selection is computed from) are public "
    "side information: the guarantee holds for adjacent datasets with equal label "
    "histograms and counts (replace one example by one of the same label; adding or "
    "removing one changes both, so it is not a neighbour); selection is not amplified "
    "and a client is charged the rounds it was selected in")


def _random_sampling(client_level: str):
  """Example level: the selection bound (any law with marginal inclusion probability
  in the round: K/U for K of U, else the rate q); client level: the rule's own
  subsampling analysis. ``q`` is ``server.q``."""
  def sampling(level, u, k, q):
    if level == "example":
      return {"sampling": "selection", "q": k / u if client_level == "fixed_size" else q}
    if client_level == "poisson":
      return {"sampling": "poisson", "q": q}
    return {"sampling": "fixed_size", "population": u, "sample_size": k}
  return sampling


def _check_cohort(cfg) -> None:
  """A rule that draws K clients: ``1 <= K <= U``."""
  u, k = int(cfg.data.num_clients), int(cfg.server.clients_per_round)
  if not 1 <= k <= u:
    raise ConfigError(f"server.clients_per_round (K={k}) must be in [1, data.num_clients "
                      f"(U={u})]")


def _check_rate(cfg) -> None:
  """Poisson selection: a rate ``0 < q <= 1``."""
  if not 0.0 < float(cfg.server.q) <= 1.0:
    raise ConfigError(f"server.q must be in (0, 1] for Poisson selection, got {cfg.server.q}")


def _check_cohort_and_rate(cfg) -> None:
  """cyclic_poisson: groups of ``1 <= K <= U`` clients, each drawn with ``0 < q <= 1``."""
  _check_cohort(cfg)
  _check_rate(cfg)


def _full(level, u, k, q):
  return {"sampling": "full"}


def _passes_rule(sample) -> SelectionRule:
  """A rule walking passes of ``ceil(U / K)`` rounds, K clients at a time (round robin,
  cyclic: they differ only in the order ``sample`` walks): deterministic turns, one per
  pass, known in advance."""
  return SelectionRule(
      sample=sample, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
      deterministic=True, sampling=_full,
      max_participations=lambda u, k, q, t: -(-t // rounds_per_pass(u, k)),
      min_cohort=lambda u, k, q: u - (rounds_per_pass(u, k) - 1) * k,
      check=_check_cohort, period=lambda u, k, q: rounds_per_pass(u, k),
      public_pattern=True)


RULES: dict[str, SelectionRule] = {
    "uniform": SelectionRule(
        sample=_uniform, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
        deterministic=False, sampling=_random_sampling("fixed_size"),
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k,
        check=_check_cohort),
    "poisson": SelectionRule(
        sample=_poisson, slots=lambda u, k, q: poisson_cap(u, q), q=lambda u, k, q: float(q),
        deterministic=False, sampling=_random_sampling("poisson"),
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: 0,
        check=_check_rate, reads=("server.q",)),
    "round_robin": _passes_rule(_round_robin),
    "cyclic": _passes_rule(_cyclic),
    "cyclic_poisson": SelectionRule(
        sample=_cyclic_poisson, slots=lambda u, k, q: poisson_cap(min(k, u), q),
        q=lambda u, k, q: float(q) * min(k, u) / u,
        deterministic=False, sampling=_random_sampling("poisson"),
        max_participations=lambda u, k, q, t: -(-t // rounds_per_pass(u, k)),
        min_cohort=lambda u, k, q: 0, check=_check_cohort_and_rate,
        period=lambda u, k, q: rounds_per_pass(u, k), groups=_cyclic_groups,
        min_sep_poisson=True, reads=("server.q",)),
    "all": SelectionRule(
        sample=_all, slots=lambda u, k, q: u, q=lambda u, k, q: 1.0,
        deterministic=False, sampling=_full,
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: u,
        public_pattern=True),
    "wasserstein_topk": SelectionRule(
        sample=_wasserstein_topk, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
        deterministic=True, sampling=_full,
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k,
        weights=_adpfl_weights("scores"), assumption=PUBLIC_HISTOGRAMS,
        relation="replace_one", check=_check_cohort, reads=("server.wasserstein_metric",)),
    "wasserstein_sample": SelectionRule(
        sample=_wasserstein_sample, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
        deterministic=True, sampling=_full,
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k,
        weights=_adpfl_weights("probabilities"), assumption=PUBLIC_HISTOGRAMS,
        relation="replace_one", check=_check_cohort, reads=("server.wasserstein_metric",)),
}
SELECTIONS = tuple(RULES)


def get_rule(name: str) -> SelectionRule:
  """The rule called ``name``.

  Raises:
    ValueError: an unknown name (naming ``server.selection``).
  """
  if name not in RULES:
    raise ValueError(f"server.selection: unknown {name!r}; known: {SELECTIONS}")
  return RULES[name]


def check_config(cfg) -> None:
  """The configured rule's own checks (:attr:`SelectionRule.check`); an unknown rule
  is left to the config's field rules.

  Raises:
    ConfigError: naming the field.
  """
  rule = RULES.get(cfg.server.selection)
  if rule is not None:
    rule.check(cfg)


# The host's cohort of a round: the static slot count K, and the drawn ids padded into
# ``[K]`` slots with a mask, the form the compiled round takes
# (:class:`fedjax_dp.training.rounds.RoundArgs`).


def cohort_size(selection: str, num_clients: int, clients_per_round: int, q: float) -> int:
  """The static number of client slots K of a round for ``selection``."""
  return get_rule(selection).slots(num_clients, clients_per_round, q)


def select_clients(selection: str, num_clients: int, clients_per_round: int, q: float,
                   seed: int, t: int, weights: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Host-side client selection for round ``t`` by the rule ``selection``
  (:data:`RULES`).

  A round's cohort depends only on ``(seed, t)`` (``np.random.default_rng([seed, t])``;
  round robin: on ``(seed, pass)``), not on earlier rounds, so a resumed or re-planned
  run draws the same cohorts.

  Args:
    selection: ``'uniform'`` (K of U without replacement; Wei "K-user random
      scheduling"), ``'poisson'`` (each client independently with rate q),
      ``'round_robin'`` (Fu et al.: K at a time through a fresh permutation of the
      U clients per pass of ceil(U/K) rounds), ``'cyclic'`` (one permutation, the
      same every pass), ``'cyclic_poisson'`` (cyclic's group of round t, each of its
      clients with rate q), ``'all'``, and the A-DPFL rules (:data:`RULES`).
    num_clients: U.
    clients_per_round: K (uniform, round_robin, cyclic; cyclic_poisson's group size).
    q: Poisson rate (poisson; cyclic_poisson within the round's group).
    seed: run seed.
    t: round index.
    weights: ``[U]`` the rule's per-client side information
      (:attr:`SelectionRule.weights`; A-DPFL scores or
      probabilities), None for rules without.

  Returns:
    ``(idx [K_slots] int32, mask [K_slots] float32)``.
  """
  rule = get_rule(selection)
  k_slots = rule.slots(num_clients, clients_per_round, q)
  ids = rule.sample(num_clients, clients_per_round, q, seed, t, weights=weights)
  idx = np.zeros(k_slots, np.int32)
  mask = np.zeros(k_slots, np.float32)
  idx[:ids.size] = ids
  mask[:ids.size] = 1.0
  # Padding slots repeat client ids[0] (or 0); they are masked out of every sum.
  if ids.size:
    idx[ids.size:] = ids[0]
  return idx, mask
