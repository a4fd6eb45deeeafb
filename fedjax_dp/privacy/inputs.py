"""What the privacy layer is told about a run: four small frozen records.

The privacy plan (:func:`fedjax_dp.privacy.plan.make_privacy_plan`), the clip modes,
the selection rules, the schedules' checks, the correlated and validation checks, the
sensitivity proofs and the accountants read these records, never a run config, so a
user's own model, federation, loss and optimizers reach the privacy layer without
one:

* :class:`ClientInputs`: what every client does (clip mode, C, its local steps'
  learning rates, batch size and minibatch rule, L2 regulariser, the local steps'
  optimizer);
* :class:`ServerInputs`: what the server does (selection rule, K, the rate q,
  aggregation, the clip rule and its fields);
* :class:`FederationSizes`: the federation's sizes (U, the clients' example counts,
  the model's parameter count d) and the seed the rules' public draws use;
* :class:`PrivacySettings`: the target and the mechanism (epsilon(s), delta,
  mechanism, placement, formula, the horizon T, the correlated mechanism's bands and
  restarts, the schedule and the validation release where a check needs them).

:class:`PrivacyInputs` bundles the four. A run config builds them once
(:func:`fedjax_dp.config.privacy_inputs.from_config`); the Python API builds them
directly. The field names are the config's (``client.clip_mode`` is
``ClientInputs.clip_mode``), so a refusal names the field either way.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import numpy as np

from fedjax_dp import optimizers


def local_learning_rates(lr: float, lr_decay: float, steps: int) -> tuple[float, ...]:
  """``(eta_s)_{s < E}``: the local step sizes ``eta_s = lr * lr_decay**s``."""
  return tuple(float(x) for x in float(lr) * float(lr_decay) ** np.arange(int(steps)))


@dataclasses.dataclass(frozen=True)
class ClientInputs:
  """What every client does in a round (``client.*``).

  Attributes:
    clip_mode: a key of :data:`fedjax_dp.privacy.clip_modes.CLIP_MODES`.
    clip: C.
    lrs: ``(eta_1, ..., eta_E)``, the learning rate of each local step (E = their
      number; :func:`local_learning_rates` for ``lr * lr_decay**s``).
    batch_size: examples per step b (0: the client's whole dataset); the expected
      batch B with ``minibatch='poisson'``.
    minibatch: ``'shuffle'`` (b without replacement) or ``'poisson'`` (each example
      with ``q_i = B / |D_i|``).
    l2_reg: kappa of ``kappa/2 ||w||^2``.
    optimizer: the local steps' :class:`fedjax_dp.optimizers.Optimizer`
      (``client.optimizer``, or one from Python,
      :func:`fedjax_dp.optimizers.from_transformation`). The privacy layer reads only
      what a step-by-step bound needs of it: its name, its step weights (a linear
      optimizer's ``A_j``, None for a non-linear one) and whether a step with
      ``l2_reg > 0`` contracts (:func:`fedjax_dp.privacy.clip_modes.base.check_optimizer`).
  """

  clip_mode: str = "per_example_l2"
  clip: float = 1.0
  lrs: tuple[float, ...] = (0.1,)
  batch_size: int = 0
  minibatch: str = "shuffle"
  l2_reg: float = 0.0
  optimizer: optimizers.Optimizer = optimizers.SGD

  def __post_init__(self):
    lrs = tuple(float(x) for x in np.atleast_1d(np.asarray(self.lrs, np.float64)))
    if not lrs:
      raise ValueError("client.local_steps must be >= 1 (ClientInputs.lrs is empty)")
    object.__setattr__(self, "lrs", lrs)

  @property
  def local_steps(self) -> int:
    """E, the number of local steps."""
    return len(self.lrs)

  @property
  def lr_array(self) -> np.ndarray:
    """``[E]`` float64 the local step sizes."""
    return np.asarray(self.lrs, np.float64)


@dataclasses.dataclass(frozen=True)
class ServerInputs:
  """What the server does in a round (``server.*``).

  Attributes:
    selection: a key of :data:`fedjax_dp.privacy.selection.RULES`.
    clients_per_round: K.
    q: the rate of the Poisson rules (``poisson``, ``cyclic_poisson``).
    aggregation: ``'normalized'``, ``'unnormalized'`` or ``'fixed'``.
    clip_rule: ``'fixed'``, ``'median'`` or ``'private_median'``.
    clip_quantile, clip_lr, clip_count_std: the ``private_median`` rule's fields.
    wasserstein_metric: the A-DPFL rules' ground metric on labels.
  """

  selection: str = "uniform"
  clients_per_round: int = 10
  q: float = 0.0
  aggregation: str = "normalized"
  clip_rule: str = "fixed"
  clip_quantile: float = 0.5
  clip_lr: float = 0.2
  clip_count_std: float = -1.0
  wasserstein_metric: str = "zero_one"


@dataclasses.dataclass(frozen=True, eq=False)
class FederationSizes:
  """The federation's sizes, and the seed of the rules' public draws.

  Attributes:
    num_clients: U, the population the selection rule draws from.
    counts: ``[U]`` float64 (read-only) the clients' example counts |D_i| (public:
      replace-one keeps them); None before the data are read (the config's checks).
    num_params: d (Laplace on an L2 ball needs it); None where it is not known.
    seed: the run seed, from which the rules draw their public patterns and groups.
  """

  num_clients: int
  counts: np.ndarray | None = None
  num_params: int | None = None
  seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, "num_clients", int(self.num_clients))
    if self.counts is not None:
      counts = np.array(self.counts, np.float64)
      if counts.ndim != 1:
        raise ValueError(f"FederationSizes.counts must be [U], got shape {counts.shape}")
      counts.setflags(write=False)
      object.__setattr__(self, "counts", counts)
    if self.num_params is not None:
      object.__setattr__(self, "num_params", int(self.num_params))
    object.__setattr__(self, "seed", int(self.seed))


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
  """The target, the mechanism, and what the checks of a schedule read.

  Attributes:
    mechanism: ``'gaussian'``, ``'laplace'`` or a correlated one (``'tree'``,
      ``'bandmf'``).
    placement: ``'upload'``, ``'step'``, ``'central'`` or ``'none'``.
    formula: a key of :data:`fedjax_dp.privacy.formulas.FORMULAS`.
    epsilon: the per-client target (``inf``: no noise).
    client_epsilons: one target per client (cycled over the clients), or ``()``.
    delta: the target delta.
    noise_multiplier: z of ``formula='noise_multiplier'``.
    rounds: the horizon T.
    bands: BandMF's bands (0: the selection's period).
    tree_restart: the tree's rounds per restart (0: the period, or T).
    enforce_budget: stop before the certified epsilon passes the target.
    schedule: ``schedule.name``.
    schedule_params: the schedule's ``schedule.*`` fields its checks read.
    validation: ``schedule.validation`` as configured (``'server'``/``'clients'``).
    val_noise_multiplier: z_val of the ``'clients'`` validation release.
    eval_every: rounds between two test-set evaluations (the schedules that read
      the test loss check it).
  """

  mechanism: str = "gaussian"
  placement: str = "upload"
  formula: str = "calibrated"
  epsilon: float = 4.0
  client_epsilons: tuple[float, ...] = ()
  delta: float = 1e-3
  noise_multiplier: float = 1.0
  rounds: int = 100
  bands: int = 0
  tree_restart: int = 0
  enforce_budget: bool = False
  schedule: str = "constant"
  schedule_params: Mapping[str, float] = dataclasses.field(default_factory=dict)
  validation: str = "server"
  val_noise_multiplier: float = 1.0
  eval_every: int = 1

  def __post_init__(self):
    object.__setattr__(self, "client_epsilons",
                       tuple(float(e) for e in self.client_epsilons))
    object.__setattr__(self, "schedule_params",
                       types.MappingProxyType(dict(self.schedule_params)))


@dataclasses.dataclass(frozen=True)
class PrivacyInputs:
  """Everything the privacy layer reads of a run (module docstring)."""

  client: ClientInputs
  server: ServerInputs
  federation: FederationSizes
  privacy: PrivacySettings

  def replace(self, **sections) -> PrivacyInputs:
    """A copy with whole sections replaced (``inputs.replace(client=...)``)."""
    return dataclasses.replace(self, **sections)


__all__ = ["ClientInputs", "FederationSizes", "PrivacyInputs", "PrivacySettings",
           "ServerInputs", "local_learning_rates"]
