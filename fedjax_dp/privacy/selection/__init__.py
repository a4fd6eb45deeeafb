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
rule is a :class:`~fedjax_dp.privacy.selection.base.SelectionRule` in its own file
(here: :mod:`.per_round`, :mod:`.passes`, :mod:`.wasserstein`) and one entry of
:data:`RULES` (or :func:`register` at run time); a rule whose sampler needs
per-client side information (A-DPFL's scores) names it in
:attr:`SelectionRule.weights`, which the experiment evaluates once on the partition
at build time and hands to every draw.

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

import numpy as np

from fedjax_dp.privacy.selection.base import SelectionRule, poisson_cap, rounds_per_pass
from fedjax_dp.privacy.selection.passes import CYCLIC, CYCLIC_POISSON, ROUND_ROBIN
from fedjax_dp.privacy.selection.per_round import ALL, POISSON, UNIFORM
from fedjax_dp.privacy.selection.wasserstein import (
  PUBLIC_HISTOGRAMS,
  WASSERSTEIN_SAMPLE,
  WASSERSTEIN_TOPK,
  adpfl_heterogeneity,
)

RULES: dict[str, SelectionRule] = {
    "uniform": UNIFORM,
    "poisson": POISSON,
    "round_robin": ROUND_ROBIN,
    "cyclic": CYCLIC,
    "cyclic_poisson": CYCLIC_POISSON,
    "all": ALL,
    "wasserstein_topk": WASSERSTEIN_TOPK,
    "wasserstein_sample": WASSERSTEIN_SAMPLE,
}
SELECTIONS = tuple(RULES)


def get_rule(name: str) -> SelectionRule:
  """The rule called ``name``.

  Raises:
    ValueError: an unknown name (naming ``server.selection``).
  """
  if name not in RULES:
    raise ValueError(f"server.selection: unknown {name!r}; known: {tuple(RULES)}")
  return RULES[name]


def register(name: str, rule: SelectionRule) -> SelectionRule:
  """Adds ``rule`` to :data:`RULES` under a new ``name`` and returns it."""
  if name in RULES:
    raise ValueError(f"server.selection={name!r} is already registered")
  RULES[name] = rule
  return rule


def check_config(inputs) -> None:
  """The configured rule's own checks (:attr:`SelectionRule.check`) of
  :class:`fedjax_dp.privacy.inputs.PrivacyInputs`; an unknown rule is left to the
  config's field rules.

  Raises:
    ConfigError: naming the field.
  """
  rule = RULES.get(inputs.server.selection)
  if rule is not None:
    rule.check(inputs)


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


__all__ = ["PUBLIC_HISTOGRAMS", "RULES", "SELECTIONS", "SelectionRule", "adpfl_heterogeneity",
           "check_config", "cohort_size", "get_rule", "poisson_cap", "register",
           "rounds_per_pass", "select_clients"]
