"""A run's privacy, configured in one place: mechanism, sensitivity, sampling, events.

:func:`make_privacy_plan` reads the config once and derives, for every client,
the sensitivity of what it releases, the neighbouring relation and the sampling
that the accountant must assume. The noise the engine adds and the events the
accountant composes both come from this object, so they cannot disagree
(ARCHITECTURE.md decision 6).

What each placement releases and how it is accounted (per client i, per round):

============  =====================  ==============================  =====================
placement     clip_mode              sensitivity Delta_i             event
============  =====================  ==============================  =====================
upload        per_example_l2 / l1    2 C sum_s eta_s / b_i           Gaussian/Laplace,
                                     (Wei eq. (13): 2 eta C / |D_i|  replace-one example,
                                     for one full-batch step)        client selection q
upload        param_l2, update_l2    2 C (the clipped vector moves   same
                                     inside a ball of radius C)
step          per_example_*          2 C per step (summed clipped    E-fold composition,
                                     gradient, replace-one)          client selection q
central       update_l2              2 C max_i p_i (replace-one      client-level, Poisson
                                     client in the weighted mean)    or fixed-size K of U
============  =====================  ==============================  =====================

``b_i`` is the batch size (|D_i| for full batch). For more than one local step with
upload noise the sum over steps is the spec's upper bound (specs/wei_udp_crd.md
section 10 item 4); it assumes the steps' clipped gradients differ in one example
only, which is exact for one step and a heuristic beyond. Minibatch steps are
accounted without example-level subsampling amplification (conservative).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np

from fedjax_dp.privacy import accounting

FORMULAS = ("wei_eq10", "noise_multiplier", "calibrated")


class AccountantState(NamedTuple):
  """Host-side accountant state: certified RDP and the paper formula's bookkeeping.

  Attributes:
    rdp: per-client RDP ``[U, A]``.
    inv_var_sum: ``[U]`` sum over past rounds of ``(scale / Delta_i)^-2``, from which
      the paper formula's claimed epsilon follows (Wei eq. (25) budget view).
    rounds: rounds composed so far.
  """

  rdp: accounting.RdpState
  inv_var_sum: np.ndarray
  rounds: int


@dataclasses.dataclass(frozen=True, eq=False)
class PrivacyPlan:
  """Mechanism + sensitivity + sampling + accounting of one run.

  Attributes:
    mechanism: ``'gaussian'`` or ``'laplace'``.
    placement: ``'upload'``, ``'step'``, ``'central'`` or ``'none'``.
    formula: how the noise scale is set (see :data:`FORMULAS`).
    epsilon: ``[U]`` per-client target epsilon (``inf``: no noise).
    delta: target delta.
    q: per-round selection probability of a client.
    selection: ``'uniform'``, ``'poisson'``, ``'round_robin'`` or ``'all'``.
    sensitivity: ``[U]`` sensitivity of each client's noised release (of the
      aggregate, for ``'central'``).
    steps: noised releases per selected round (E for ``'step'``, else 1).
    noise_multiplier: z for ``formula='noise_multiplier'``.
    num_clients: U.
    clients_per_round: K.
    rounds: the configured horizon T.
  """

  mechanism: str
  placement: str
  formula: str
  epsilon: np.ndarray
  delta: float
  q: float
  selection: str
  sensitivity: np.ndarray
  steps: int
  noise_multiplier: float
  num_clients: int
  clients_per_round: int
  rounds: int

  @property
  def target_epsilon(self) -> float:
    return float(np.min(self.epsilon))

  @property
  def noiseless(self) -> bool:
    return self.placement == "none" or bool(np.all(np.isinf(self.epsilon)))

  # --------------------------------------------------------------- noise
  def noise_scale(self, rounds: int) -> np.ndarray:
    """``[U]`` per-client noise scale (std, or Laplace b) for a constant schedule of
    ``rounds`` rounds, from the configured formula."""
    if self.noiseless:
      return np.zeros(self.num_clients)
    finite = np.isfinite(self.epsilon)
    eps = np.where(finite, self.epsilon, 1.0)
    if self.formula == "wei_eq10":
      from fedjax_dp.privacy import formulas
      scale = formulas.wei_sigma_eq10(eps, self.delta, self.q, rounds, self.sensitivity)
    elif self.formula == "noise_multiplier":
      scale = self.noise_multiplier * self.sensitivity
    else:  # calibrated: our certified accountant meets (eps, delta) after `rounds`
      scale = self._calibrated_multiplier(eps, rounds) * self.sensitivity
    return np.where(finite, scale, 0.0)

  def _calibrated_multiplier(self, eps: np.ndarray, rounds: int) -> np.ndarray:
    """``[U]`` smallest z whose ``rounds`` rounds certify ``eps`` (vectorised)."""
    from fedjax_dp.privacy import calibration
    template = self.event(np.ones(1))
    if self.placement == "step" and self.mechanism == "gaussian":
      scale_back = math.sqrt(self.steps)   # event() divides z by sqrt(E)
    elif self.placement == "step":
      scale_back = float(self.steps)
    else:
      scale_back = 1.0
    z = calibration.calibrate(
        lambda x: [template.replace(noise_multiplier=x / scale_back, count=rounds)],
        eps, self.delta)
    return np.broadcast_to(z, eps.shape)

  # --------------------------------------------------------------- accounting
  def event(self, z: np.ndarray) -> accounting.Event:
    """The accounting event of one round for noise multipliers ``z [U]`` (scale /
    sensitivity). ``inf`` means no noise: nothing certified."""
    z = np.asarray(z, np.float64)
    if self.placement == "step":
      # E noised steps inside one selection: the Gaussians' z^-2 add up, so the round is
      # one Gaussian with z / sqrt(E) (exact); for Laplace use basic composition as count.
      if self.mechanism == "gaussian":
        z = z / math.sqrt(self.steps)
    level = "client" if self.placement == "central" else "example"
    kw: dict[str, Any] = {"mechanism": self.mechanism, "noise_multiplier": z,
                              "relation": "replace_one", "level": level}
    if self.placement == "step" and self.mechanism == "laplace":
      kw["noise_multiplier"] = z / self.steps  # pure-eps composition of E steps
    if self.selection == "all" or self.q >= 1:
      kw.update(sampling="full")
    elif level == "example":
      kw.update(sampling="selection", q=self.q)
    elif self.selection == "poisson":
      kw.update(sampling="poisson", q=self.q)
    elif self.selection == "uniform":
      kw.update(sampling="fixed_size", population=self.num_clients,
                sample_size=self.clients_per_round)
    else:  # round robin, client level: deterministic turns, no amplification
      kw.update(sampling="full")
    return accounting.Event(**kw)

  def accountant_init(self) -> AccountantState:
    return AccountantState(accounting.rdp_init((self.num_clients,)),
                           np.zeros(self.num_clients), 0)

  def device_noise(self, noise: np.ndarray, central_noise: float = 0.0
                   ) -> tuple[np.ndarray, float]:
    """Maps a schedule's per-client noise to what the engine adds.

    Schedules speak in per-client scales ``[U]`` (every client's release has the same
    sensitivity under ``'central'``); with central placement the server adds that
    scale once to the aggregate and clients add nothing.

    Returns:
      ``(client_noise [U], central_noise)``.
    """
    noise = np.asarray(noise, np.float64)
    if self.placement == "central":
      return np.zeros_like(noise), float(max(central_noise, np.max(noise, initial=0.0)))
    return noise, float(central_noise)

  def multipliers(self, noise: np.ndarray, central_noise: float) -> np.ndarray:
    """``[U]`` noise multipliers of a round's plan (``inf`` where no noise)."""
    scale = np.full(self.num_clients, float(central_noise)) if self.placement == "central" \
        else np.asarray(noise, np.float64)
    with np.errstate(divide="ignore"):
      return np.where(scale > 0, scale / self.sensitivity, np.inf)

  def accountant_step(self, state: AccountantState, noise: np.ndarray,
                      central_noise: float = 0.0) -> AccountantState:
    """Composes one round whose plan added ``noise [U]`` (or ``central_noise``)."""
    z = self.multipliers(noise, central_noise)
    if self.noiseless or np.all(np.isinf(z)):
      rdp = state.rdp._replace(rdp=np.full_like(state.rdp.rdp, np.inf))
      return AccountantState(rdp, state.inv_var_sum, state.rounds + 1)
    rdp = accounting.rdp_compose(state.rdp, self.event(z))
    with np.errstate(divide="ignore"):
      inv = np.where(np.isinf(z), np.inf, 1.0 / np.square(z))
    return AccountantState(rdp, state.inv_var_sum + inv, state.rounds + 1)

  def certified_epsilon(self, state: AccountantState) -> float:
    """Worst client's epsilon at ``delta`` by the RDP accountant (inf if no noise)."""
    if np.any(np.isinf(state.rdp.rdp)):
      return math.inf
    if state.rounds == 0:
      return 0.0
    return float(np.max(accounting.rdp_epsilon(state.rdp, self.delta)))

  def claimed_epsilon(self, state: AccountantState) -> float:
    """What the configured paper formula claims after ``state.rounds`` rounds.

    For ``wei_eq10`` this inverts eq. (10)/(25):
    ``eps_i(t) = Delta_i sqrt(2 q ln(1/delta) sum_tau sigma_tau^-2)`` (spec section 3.6);
    for the other formulas the claim is our certified accountant.
    """
    if self.formula != "wei_eq10":
      return self.certified_epsilon(state)
    if np.any(np.isinf(state.inv_var_sum)) or np.any(np.isinf(state.rdp.rdp)):
      return math.inf
    from fedjax_dp.privacy import formulas
    # inv_var_sum holds sum (Delta_i / sigma_tau)^2, i.e. sum sigma^-2 in units of Delta_i.
    return float(np.max(formulas.wei_epsilon_claimed(state.inv_var_sum, self.delta, self.q,
                                                     1.0)))

  def describe(self) -> dict[str, Any]:
    """A JSON-able summary for ``summary.json``."""
    ev = None if self.noiseless else self.event(np.ones(1))
    return {
        "mechanism": self.mechanism, "placement": self.placement, "formula": self.formula,
        "delta": self.delta, "q": self.q, "selection": self.selection, "steps": self.steps,
        "sensitivity_min": float(np.min(self.sensitivity)),
        "sensitivity_max": float(np.max(self.sensitivity)),
        "accounting": None if ev is None else {
            "sampling": ev.sampling, "relation": ev.relation, "level": ev.level,
            "accountant": "rdp (certified, worst client)"}}


def selection_probability(cfg) -> float:
  """A client's per-round selection probability for the configured selection."""
  u = int(cfg.data.num_clients)
  sel = cfg.server.selection
  if sel == "all":
    return 1.0
  if sel == "poisson":
    return float(cfg.server.q)
  return int(cfg.server.clients_per_round) / u


def make_privacy_plan(cfg, counts: np.ndarray) -> PrivacyPlan:
  """Builds the :class:`PrivacyPlan` of a config for clients with ``counts [U]`` examples.

  Raises:
    ValueError: a placement/clipping combination without a sensitivity, naming the
      fields.
  """
  counts = np.asarray(counts, np.float64)
  u = counts.size
  placement, clip_mode = cfg.privacy.placement, cfg.client.clip_mode
  if cfg.privacy.formula not in FORMULAS:
    raise ValueError(f"privacy.formula: unknown {cfg.privacy.formula!r}; known: {FORMULAS}")
  eps = np.full(u, float(cfg.privacy.epsilon))
  if len(cfg.privacy.client_epsilons):
    eps = np.resize(np.asarray(cfg.privacy.client_epsilons, np.float64), u)
  clip = float(cfg.client.clip)
  steps = int(cfg.client.local_steps)
  lr_sum = float(np.sum(cfg.client.lr * cfg.client.lr_decay ** np.arange(steps)))
  batch = np.minimum(counts, cfg.client.batch_size) if cfg.client.batch_size else counts
  per_example = clip_mode in ("per_example_l2", "per_example_l1")
  if placement == "none":
    sens = np.ones(u)
  elif placement == "upload":
    if per_example:
      sens = 2.0 * clip * lr_sum / batch   # Wei eq. (13) for one full-batch step
    elif clip_mode in ("param_l2", "update_l2"):
      sens = np.full(u, 2.0 * clip)
    else:
      raise ValueError("privacy.placement='upload' needs client.clip_mode in per_example_l2, "
                       f"per_example_l1, param_l2 or update_l2 (got {clip_mode!r}): without "
                       "clipping the upload has no bounded sensitivity")
  elif placement == "step":
    if not per_example:
      raise ValueError("privacy.placement='step' needs a per-example client.clip_mode, "
                       f"got {clip_mode!r}")
    sens = np.full(u, 2.0 * clip)
  elif placement == "central":
    if clip_mode != "update_l2":
      raise ValueError("privacy.placement='central' needs client.clip_mode='update_l2', "
                       f"got {clip_mode!r}")
    k = u if cfg.server.selection == "all" else int(cfg.server.clients_per_round)
    if cfg.server.aggregation == "normalized":
      # Weights |D_i| / sum of the cohort's |D_j|; bound by the largest client over the
      # smallest possible cohort total.
      smallest = np.sort(counts)[:max(k, 1)]
      p_max = float(np.max(counts) / (np.sum(smallest) - smallest[-1] + np.max(counts)))
    else:
      p_max = float(np.max(counts) / np.sum(counts))
    sens = np.full(u, 2.0 * clip * p_max)
  else:
    raise ValueError(f"privacy.placement: unknown {placement!r}")
  if cfg.privacy.mechanism == "laplace" and clip_mode not in ("per_example_l1",) \
      and placement != "none" and np.any(np.isfinite(eps)):
    raise ValueError("privacy.mechanism='laplace' needs L1 sensitivity: use "
                     "client.clip_mode='per_example_l1'")
  return PrivacyPlan(
      mechanism=cfg.privacy.mechanism, placement=placement, formula=cfg.privacy.formula,
      epsilon=eps, delta=float(cfg.privacy.delta), q=selection_probability(cfg),
      selection=cfg.server.selection, sensitivity=sens,
      steps=steps if placement == "step" else 1,
      noise_multiplier=float(cfg.privacy.noise_multiplier), num_clients=u,
      clients_per_round=int(cfg.server.clients_per_round), rounds=int(cfg.rounds))
