"""The accounting events a run releases, as the plan states them.

:class:`PlanEvents` is the part of :class:`fedjax_dp.privacy.plan.PrivacyPlan` that
turns a round's noise multipliers into :class:`fedjax_dp.privacy.accounting.Event` s:
one round (the selection rule's event, E noised steps, the validation release), a
Poisson-minibatch round of client DP-SGD, a whole constant schedule (what the
calibration sizes the noise by), and a correlated mechanism's release (one Gaussian
over the run, or amplified rounds of BandMF). It reads the plan's fields.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedjax_dp.privacy import accounting, correlated


class PlanEvents:
  """The accounting events of a :class:`PrivacyPlan` (one round, the validation
  release, a Poisson-minibatch round, a whole constant schedule); reads the plan's
  fields."""

  def event(self, z: np.ndarray, participated: Any = True,
            val_multiplier: float | None = None) -> accounting.Event:
    """The accounting event of one round for noise multipliers ``z [U]`` (scale /
    sensitivity; ``inf``: no noise). ``participated [U]`` says who took part, for
    rules whose participation is charged as it happened (round robin).

    ``val_multiplier``: the round also releases the validation score on the selected
    clients' data with multiplier ``z_val`` (``schedule.validation='clients'``); the
    round is then one Gaussian of multiplier ``(z^-2 + z_val^-2)^(-1/2)``
    (:func:`fedjax_dp.privacy.validation.validation_sensitivity` proves why)."""
    z = np.asarray(z, np.float64)
    if self.correlated is not None:  # the whole run: one Gaussian (horizon_event)
      return self.horizon_event(z, self.rounds)
    if self.poisson_steps:
      return self.poisson_step_event(z, participated)
    if self.placement == "step":
      # E noised steps inside one selection: the Gaussians' z^-2 add up, so the round is
      # one Gaussian with z / sqrt(E) (exact); Laplace: basic composition, z / E.
      z = z / (math.sqrt(self.steps) if self.mechanism == "gaussian" else self.steps)
    if val_multiplier is not None:
      if self.mechanism != "gaussian" or self.level != "example" \
          or self.placement == "central":
        raise ValueError("the validation release composes only with an example-level "
                         "Gaussian round (check_validation refuses the others)")
      with np.errstate(divide="ignore"):
        z = np.where(np.isinf(z), np.inf, (z ** -2.0 + float(val_multiplier) ** -2.0) ** -0.5)
    level = "client" if self.placement == "central" else self.level
    kw: dict[str, Any] = {"mechanism": self.mechanism, "noise_multiplier": z,
                          "relation": self.adjacency, "level": level}
    rule = self.rule
    kw["participated"] = participated  # a random rule: all, or its eligible clients
    if rule.deterministic:
      kw.update(sampling="round_robin")
    elif self.q >= 1:
      kw.update(sampling="full")
    else:
      kw.update(rule.sampling(level, self.num_clients, self.clients_per_round,
                              self.rule_rate))
    return accounting.Event(**kw)

  def validation_event(self, participated: Any = True) -> accounting.Event:
    """The validation release alone, charged to the clients that took part, unamplified
    (Poisson minibatches, whose rounds claim no selection amplification either; see
    :func:`fedjax_dp.privacy.validation.validation_sensitivity`), under the run's
    relation (its sensitivity ``1 / N_sel`` holds for both)."""
    return accounting.Event(mechanism="gaussian", noise_multiplier=self.val_noise_multiplier,
                            sampling="round_robin", relation=self.adjacency, level="example",
                            participated=participated)

  @property
  def poisson_steps(self) -> bool:
    """Whether clients run DP-SGD with Poisson minibatches (``client.minibatch``)."""
    return self.minibatch == "poisson" and self.placement == "step"

  def poisson_step_event(self, z: np.ndarray, participated: Any = True) -> accounting.Event:
    """One round of client DP-SGD with Poisson minibatches, for multipliers ``z [U]``
    measured against C (``sensitivity``: the norm bound of one clipped gradient).

    The unit is one example of client i. Under ``adjacency='add_remove'`` neighbours
    ADD OR REMOVE it (the adjacency of the Poisson-subsampled Gaussian, Mironov,
    Talwar & Zhang 2019). Under ``'replace_one'`` (a selection rule that needs equal
    label histograms and counts, :attr:`SelectionRule.relation`) they replace it by
    one of the same label: the replaced example joins the batch with probability
    ``q_i`` in both runs and moves the clipped sum by at most 2 C, so the step is the
    replace-one Poisson-subsampled Gaussian, charged with multiplier ``z / 2`` against
    that 2 C (``accounting.Event.sum_of_terms``: each term has norm C). Client i's
    count |D_i|, hence ``q_i = min(1, B / |D_i|)`` and the E steps, are public
    parameters of the mechanism (as DP-SGD treats the dataset size, Abadi et al.
    2016). Each local step releases ``(sum_{x in b} clip_C(g(x)) + N(0, z^2 C^2 I))
    / B`` with b a Poisson sample of rate ``q_i``: adding or removing one example
    changes the clipped sum by at most C (its own clipped gradient, and only when
    it is sampled; the other examples' gradients are taken at the same parameters,
    which the previous steps' outputs fix), so the sum has sensitivity C, the
    release C / B, and the step is the sampled Gaussian mechanism with rate ``q_i``
    and multiplier z. The E steps of a round compose adaptively (``count = E``);
    rounds compose in the rounds client i is selected.

    Client selection is NOT used for amplification (none is claimed for any rule):
    a round in which client i is selected is charged in full, a round in which it
    is not is charged nothing. The selection never reads the clients' examples
    (random rules draw from the round's key; the Wasserstein rules read label
    histograms that the plan treats as public), so the realised selection is a
    public, data-independent schedule and the guarantee holds for it; charging
    every round instead would bound every possible selection at once.
    """
    replace = self.adjacency == "replace_one"
    return accounting.Event(mechanism="gaussian", noise_multiplier=z / 2.0 if replace else z,
                            sampling="poisson", q=self.batch_q, relation=self.adjacency,
                            level="example", participated=participated, count=self.steps,
                            sum_of_terms=replace)

  def horizon_event(self, z: np.ndarray, rounds: int) -> accounting.Event:
    """The event of a constant schedule of ``rounds`` rounds at multiplier ``z``, for
    the client charged most: the most rounds one client can be charged
    (:attr:`SelectionRule.max_participations`: a deterministic rule's most turns, a
    random rule with groups its eligible rounds ``ceil(T / P)``, every round for the
    other random rules). A correlated mechanism is one Gaussian over the run for the
    client with the largest matrix sensitivity (:meth:`correlated_event`), or, amplified
    (:attr:`amplified`), ``ceil(T / P)`` subsampled Gaussians (:meth:`amplified_event`)."""
    rule = self.rule
    count = rule.max_participations(self.num_clients, self.clients_per_round, self.rule_rate,
                                    rounds)
    if self.amplified:
      return self.amplified_event(np.asarray(z, np.float64)).replace(count=count)
    if self.correlated is not None:
      return self.correlated_event(np.asarray(z, np.float64)
                                   / np.sqrt(np.max(self.correlated_sens_sq(rounds))))
    if self.poisson_steps:  # a random rule may select one client in every eligible round
      return self.event(z).replace(count=count * self.steps)
    return self.event(z).replace(count=count)


  def correlated_event(self, z: np.ndarray) -> accounting.Event:
    """A correlated mechanism's release as ONE Gaussian of multipliers ``z = sigma / s``
    (no sampling; the run's relation; the client is the unit: central placement).

    The release ``C G + sigma Delta Z`` moves by at most ``s Delta`` in Frobenius norm
    between neighbours (:mod:`fedjax_dp.privacy.correlated.base`), so it is the Gaussian
    mechanism with multiplier ``sigma / s``, released once (Choquette-Choo et al. 2023,
    Sec. 2; Denisov et al. 2022, Thm. 2.1 for adaptive rows)."""
    return accounting.Event(mechanism="gaussian", noise_multiplier=z, sampling="full",
                            relation=self.adjacency, level="client")

  @property
  def amplified(self) -> bool:
    """Whether a correlated mechanism is accounted by amplification: BandMF under a
    b-min-sep Poisson rule (:attr:`SelectionRule.min_sep_poisson`; ``b <= P`` checked
    by :func:`fedjax_dp.privacy.correlated_setup.check_correlated`)."""
    return self.correlated is not None and self.rule.min_sep_poisson

  @property
  def max_column_norm(self) -> float:
    """``max_j ||C_{:, j}||`` of the correlated strategy (``sqrt max diag(C^T C)``; 1 for
    BandMF's unit-norm band coefficients)."""
    return float(np.sqrt(np.max(np.diag(correlated.gram(self.correlated)))))

  def amplified_event(self, z: np.ndarray, participated: Any = True) -> accounting.Event:
    """One eligible round of BandMF under b-min-sep Poisson sampling, for the noise
    multiplier ``z = sigma`` (noise std / the per-round sensitivity Delta): the
    Poisson-subsampled Gaussian of rate ``server.q`` and multiplier
    ``sigma / max_j ||C_{:, j}||`` at client level, under the run's relation, charged
    in the rounds the client is eligible for (``participated``). Why this bounds the
    release: :mod:`fedjax_dp.privacy.correlated.bandmf` (Choquette-Choo et al. 2023,
    Sec. 4)."""
    kw = self.rule.sampling("client", self.num_clients, self.clients_per_round,
                            self.rule_rate)
    return accounting.Event(mechanism="gaussian",
                            noise_multiplier=np.asarray(z, np.float64) / self.max_column_norm,
                            relation=self.adjacency, level="client",
                            participated=participated, **kw)

  def correlated_sens_sq(self, rounds: int | None = None) -> np.ndarray:
    """``[U]`` each client's ``s_i^2`` over the first ``rounds`` rounds of its realised
    participation (:attr:`patterns`; the Gram matrix of the whole horizon, an upper
    bound for a prefix since the rows of later rounds only add)."""
    r = self.rounds if rounds is None else min(int(rounds), self.rounds)
    cache = self.__dict__.setdefault("_correlated_sens_sq", {})  # calibration asks often
    if r not in cache:
      if self.amplified:  # eligible rounds x the largest column norm^2 (informational)
        eligible = np.maximum(0, -(-(r - self.groups) // self.period))
        cache[r] = eligible * self.max_column_norm ** 2
      else:
        g = correlated.gram(self.correlated)[:r, :r]
        cache[r] = correlated.pattern_sensitivity_sq(g, self.patterns[:, :r])
      cache[r].setflags(write=False)
    return cache[r]
