"""Client-selection rules: each rule's host sampler and the accounting it implies.

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
all            every client                        every client in full
=============  ==================================  ===========================================

Round robin's order is treated as known in advance: nothing is amplified and each
client is charged exactly the rounds it took part in (``Event.participated``). A new
rule (e.g. A-DPFL's deterministic top-K, or probability-proportional sampling) is
one more entry of :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np


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
      ``deterministic``).
    max_participations: ``(U, K, q, T) -> int`` the most rounds one client can
      take part in over T rounds (calibrates deterministic rules; random rules are
      calibrated through their sampling event over T rounds).
    min_cohort: ``(U, K, q) -> int`` the smallest number of clients a round can
      select (0 where a round can be empty).
  """

  sample: Callable[..., np.ndarray]
  slots: Callable[[int, int, float], int]
  q: Callable[[int, int, float], float]
  deterministic: bool
  sampling: Callable[..., dict[str, Any]]
  max_participations: Callable[[int, int, float, int], int]
  min_cohort: Callable[[int, int, float], int]


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


def _uniform(u, k, q, seed, t):
  return np.sort(np.random.default_rng([seed, t]).choice(u, k, replace=False))


def _poisson(u, k, q, seed, t):
  ids = np.flatnonzero(np.random.default_rng([seed, t]).random(u) < q)
  cap = poisson_cap(u, q)
  if ids.size > cap:
    raise RuntimeError(f"Poisson draw of {ids.size} clients exceeds the cap {cap}")
  return ids


def _round_robin(u, k, q, seed, t):
  """Pass ``t // P`` walks a permutation of all U clients seeded by (seed, pass), K
  per round; the last round of a pass takes the remaining ``U - (P - 1) K``."""
  per_pass = rounds_per_pass(u, k)
  p, r = divmod(int(t), per_pass)
  order = np.random.default_rng([seed, p, 1]).permutation(u)  # 1: not a round's stream
  return np.sort(order[r * k:(r + 1) * k])


def _all(u, k, q, seed, t):
  return np.arange(u)


def _random_sampling(client_level: str):
  """Example level: the selection bound (any law with marginal q); client level:
  the rule's own subsampling analysis."""
  def sampling(level, u, k, q):
    if level == "example":
      return {"sampling": "selection", "q": q}
    if client_level == "poisson":
      return {"sampling": "poisson", "q": q}
    return {"sampling": "fixed_size", "population": u, "sample_size": k}
  return sampling


def _full(level, u, k, q):
  return {"sampling": "full"}


RULES: dict[str, SelectionRule] = {
    "uniform": SelectionRule(
        sample=_uniform, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
        deterministic=False, sampling=_random_sampling("fixed_size"),
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k),
    "poisson": SelectionRule(
        sample=_poisson, slots=lambda u, k, q: poisson_cap(u, q), q=lambda u, k, q: float(q),
        deterministic=False, sampling=_random_sampling("poisson"),
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: 0),
    "round_robin": SelectionRule(
        sample=_round_robin, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
        deterministic=True, sampling=_full,
        max_participations=lambda u, k, q, t: -(-t // rounds_per_pass(u, k)),
        min_cohort=lambda u, k, q: u - (rounds_per_pass(u, k) - 1) * k),
    "all": SelectionRule(
        sample=_all, slots=lambda u, k, q: u, q=lambda u, k, q: 1.0,
        deterministic=False, sampling=_full,
        max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: u),
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
