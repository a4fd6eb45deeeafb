"""The host's cohort of a round: how many client slots, and which clients fill them.

A selection rule (:data:`fedjax_dp.selection.RULES`) samples client ids; this module
gives the round's static slot count K and pads the ids into ``[K]`` slots with a
mask, the form the compiled round takes (:class:`fedjax_dp.rounds.RoundArgs`).
"""

from __future__ import annotations

import numpy as np

from fedjax_dp import selection as selection_lib

SELECTIONS = selection_lib.SELECTIONS


def poisson_cap(num_clients: int, q: float) -> int:
  """Static padded cohort size for Poisson sampling (:func:`selection.poisson_cap`)."""
  return selection_lib.poisson_cap(num_clients, q)


def cohort_size(selection: str, num_clients: int, clients_per_round: int, q: float) -> int:
  """The static number of client slots K of a round for ``selection``."""
  return selection_lib.get_rule(selection).slots(num_clients, clients_per_round, q)


def select_clients(selection: str, num_clients: int, clients_per_round: int, q: float,
                   seed: int, t: int, weights: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Host-side client selection for round ``t`` by the rule ``selection``
  (:data:`fedjax_dp.selection.RULES`).

  A round's cohort depends only on ``(seed, t)`` (``np.random.default_rng([seed, t])``;
  round robin: on ``(seed, pass)``), not on earlier rounds, so a resumed or re-planned
  run draws the same cohorts.

  Args:
    selection: ``'uniform'`` (K of U without replacement; Wei "K-user random
      scheduling"), ``'poisson'`` (each client independently with rate q),
      ``'round_robin'`` (Fu et al.: K at a time through a fresh permutation of the
      U clients per pass of ceil(U/K) rounds), ``'all'``.
    num_clients: U.
    clients_per_round: K (uniform, round_robin).
    q: Poisson rate.
    seed: run seed.
    t: round index.
    weights: ``[U]`` the rule's per-client side information
      (:attr:`fedjax_dp.selection.SelectionRule.weights`; A-DPFL scores or
      probabilities), None for rules without.

  Returns:
    ``(idx [K_slots] int32, mask [K_slots] float32)``.
  """
  rule = selection_lib.get_rule(selection)
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
