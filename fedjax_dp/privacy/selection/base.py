"""What a selection rule is (:class:`SelectionRule`) and the pieces rules share.

A rule is a host sampler and the accounting it implies
(:mod:`fedjax_dp.privacy.selection` has the table of the registered rules): the
static slot count, the marginal q, the event of a round for a randomly selected
client, the most rounds one client can be charged, the smallest cohort, and the
rule's own checks of :class:`fedjax_dp.privacy.inputs.PrivacyInputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

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
    weights: None, or ``(labels [N], client_indices, num_classes, server) ->
      [U] float64`` (``server``: :class:`fedjax_dp.privacy.inputs.ServerInputs`):
      per-client side information the sampler needs (``sample``'s ``weights``
      argument), computed once from the training labels and the partition when the
      experiment is built. Raises ValueError (naming the field)
      where the data cannot give it.
    assumption: None, or what the certified epsilon assumes beyond the accountant's
      adjacency (stated in ``summary.json``).
    relation: None, or the only neighbour relation the assumption allows
      (``'replace_one'``: the A-DPFL rules need equal label histograms and counts
      between neighbours, which no add/remove neighbour has); the run's accounting
      then uses it for every event (``PrivacyPlan.adjacency``).
    check: ``(inputs) -> None`` refuses the rule's own fields out of range
      (``server.clients_per_round``, ``server.q``) with a ConfigError naming the
      field, from :class:`fedjax_dp.privacy.inputs.PrivacyInputs`;
      :func:`fedjax_dp.privacy.selection.check_config` calls it.
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
    summary: one line for the catalog (``fedjax-dp list``).
    reads: the config fields the rule reads that not every rule reads (dotted keys,
      e.g. ``server.q``): a config that sets one away from its default while picking
      a rule that does not read it is refused (:func:`fedjax_dp.config.unread_fields`).
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
  check: Callable[[Any], None] = lambda inputs: None
  period: Callable[[int, int, float], int] = lambda u, k, q: 1
  public_pattern: bool = False
  groups: Callable[[int, int, float, int], np.ndarray] | None = None
  min_sep_poisson: bool = False
  summary: str = ""
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



def random_sampling(client_level: str):
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


def full_sampling(level, u, k, q):
  """Every client of the cohort in full: no amplification."""
  return {"sampling": "full"}


def check_cohort(inputs) -> None:
  """A rule that draws K clients: ``1 <= K <= U``."""
  u, k = inputs.federation.num_clients, int(inputs.server.clients_per_round)
  if not 1 <= k <= u:
    raise ConfigError(f"server.clients_per_round (K={k}) must be in [1, data.num_clients "
                      f"(U={u})]")


def check_rate(inputs) -> None:
  """Poisson selection: a rate ``0 < q <= 1``."""
  if not 0.0 < float(inputs.server.q) <= 1.0:
    raise ConfigError(f"server.q must be in (0, 1] for Poisson selection, got "
                      f"{inputs.server.q}")


def check_cohort_and_rate(inputs) -> None:
  """cyclic_poisson: groups of ``1 <= K <= U`` clients, each drawn with ``0 < q <= 1``."""
  check_cohort(inputs)
  check_rate(inputs)
