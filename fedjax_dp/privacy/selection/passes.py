"""Rules that walk passes of ``P = ceil(U / K)`` rounds: round_robin, cyclic, cyclic_poisson.

``round_robin`` (Fu et al.) and ``cyclic`` give deterministic turns known in advance
(charged per client, no amplification); ``cyclic_poisson`` draws each client of
round t's group with rate q: b-min-sep Poisson sampling (Choquette-Choo et al. 2023,
Sec. 4), which amplifies BandMF with ``b <= P`` bands.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.selection.base import (
  SelectionRule,
  check_cohort,
  check_cohort_and_rate,
  full_sampling,
  poisson_cap,
  random_sampling,
  rounds_per_pass,
)


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



def _passes_rule(sample, summary: str) -> SelectionRule:
  """A rule walking passes of ``ceil(U / K)`` rounds, K clients at a time (round robin,
  cyclic: they differ only in the order ``sample`` walks): deterministic turns, one per
  pass, known in advance."""
  return SelectionRule(
      sample=sample, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
      deterministic=True, sampling=full_sampling,
      max_participations=lambda u, k, q, t: -(-t // rounds_per_pass(u, k)),
      min_cohort=lambda u, k, q: u - (rounds_per_pass(u, k) - 1) * k,
      check=check_cohort, period=lambda u, k, q: rounds_per_pass(u, k),
      public_pattern=True, summary=summary)


ROUND_ROBIN = _passes_rule(_round_robin,
                           "passes over a seeded permutation, K clients per round")
CYCLIC = _passes_rule(_cyclic,
                      "one seeded permutation repeated every pass, K clients per round")
CYCLIC_POISSON = SelectionRule(
    sample=_cyclic_poisson, slots=lambda u, k, q: poisson_cap(min(k, u), q),
    q=lambda u, k, q: float(q) * min(k, u) / u,
    deterministic=False, sampling=random_sampling("poisson"),
    max_participations=lambda u, k, q, t: -(-t // rounds_per_pass(u, k)),
    min_cohort=lambda u, k, q: 0, check=check_cohort_and_rate,
    period=lambda u, k, q: rounds_per_pass(u, k), groups=_cyclic_groups,
    min_sep_poisson=True,
    summary="cyclic's groups of K; each client of round t's group with probability "
            "server.q (b-min-sep: amplifies BandMF)",
    reads=("server.q",))
