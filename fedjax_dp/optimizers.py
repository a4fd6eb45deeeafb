"""Client and server optimizers: two registries of optax transformations, peers by name.

A client's local steps (``client.optimizer``) and the server's step on the noisy
aggregate (``server.optimizer``) each apply an :class:`optax.GradientTransformation`.
Every registered :class:`Optimizer` builds its transformation WITHOUT a learning
rate: its *direction*, a descent direction computed from a gradient. The learning
rate multiplies afterwards, on the device, as a traced value::

  client step s:  d_s, state = direction.update(G_s, state, w_s)
                  w_{s+1} = w_s - eta_s d_s      (eta_s: the local schedule x the noise
                                                  schedule's lr scale, a sweep lane's lr)
  server round:   g = w - aggregate              (the pseudo-gradient, Reddi et al. 2021)
                  d, state = direction.update(g, state, w)
                  w' = w - server_lr d

so a sweep over learning rates stays one compiled program. For ``sgd`` (identity
direction) the client step is ``w_s - eta_s G_s``, the arithmetic the client always
did; for ``fedavg`` the server step is ``w - server_lr (w - aggregate)``, which is
``w + server_lr (aggregate - w)`` bit for bit (IEEE rounding is symmetric under
negation).

A transformation passed from Python (:func:`from_transformation`) follows optax's
convention instead: it carries its own learning rate and returns updates to ADD. It
is used as the direction ``chain(tx, scale(-1))`` under a unit learning rate, so the
configured learning rate must stay at its default (``host.building`` refuses
another value, naming both).

The client optimizer is inside the sensitivity argument of the clip modes whose
bound counts learning rates x steps (per-example and per-step gradient clipping
with upload noise): a LINEAR optimizer declares its step weights
(:meth:`Optimizer.step_weights`, the ``A_j`` with ``w_{E+1} = w_1 - sum_j A_j G_j``),
which replace the learning rates in that bound; a non-linear one (Adam, a
transformation from Python) has none and is refused there. The server optimizer
reads only the noisy aggregate: post-processing, outside every privacy argument.

This module sits at the models/data floor (docs/architecture.md), so the privacy
layer (the sensitivity checks) and the training floor (the steps) both import it
downward.

References:
  Polyak 1964 (heavy ball); Kingma & Ba 2015 (Adam); Hsu, Qi & Brown 2019,
  "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
  Classification" (FedAvgM), https://arxiv.org/abs/1909.06335; McMahan et al. 2018,
  "Learning Differentially Private Recurrent Language Models" (DP-FedAvg with server
  momentum), https://arxiv.org/abs/1710.06963; Reddi et al. 2021, "Adaptive Federated
  Optimization" (FedAdam, FedYogi), https://arxiv.org/abs/2003.00295.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import optax

PyTree = Any


class Optimizer(NamedTuple):
  """One optimizer: a registry entry, or one chosen with its hyperparameter values.

  Hashable (it is part of the compiled round's static config): two records with the
  same name, values and transformation give the same program. A static value, never
  a pytree argument of a traced function.

  Attributes:
    name: the ``client.optimizer`` / ``server.optimizer`` value.
    summary: one line for the catalog.
    build: ``(**hparams) -> optax.GradientTransformation``, the direction (no
      learning rate; a descent direction from a gradient).
    hparams: ``((field, value), ...)``: the hyperparameters, named as their config
      fields in the side's section (``client.momentum``, ``server.tau``, ...); the
      registry holds the defaults.
    step_weights_fn: a LINEAR optimizer's ``(lrs [E], **hparams) -> A [E]``, the
      weight of each step's gradient in the upload (``w_{E+1} = w_1 - sum_j A_j
      G_j``); None for a non-linear one (normalised steps), which the step-weighted
      clip modes refuse.
    plain_first_step: one step from the initial state equals SGD's exactly (the
      fused one-step path, :func:`fedjax_dp.training.one_step.fusable`, computes it).
    l2_contraction: with ``client.l2_reg = kappa > 0`` a step contracts the
      difference of two runs (``|1 - eta kappa| <= 1``), the argument of
      :func:`fedjax_dp.privacy.clip_modes.base.check_decay`; only plain SGD's does.
    stateful: the direction has state to carry (``sgd``, ``fedavg``: none); a server
      optimizer's is carried beside the model from round to round.
    transformation: a transformation passed from Python (:func:`from_transformation`);
      None for a registered optimizer.
    own_lr: the transformation carries its own learning rate (one from Python): the
      configured one must stay at its default and the step runs at a unit rate.
  """

  name: str
  summary: str
  build: Callable[..., optax.GradientTransformation]
  hparams: tuple[tuple[str, Any], ...] = ()
  step_weights_fn: Callable[..., np.ndarray] | None = None
  plain_first_step: bool = False
  l2_contraction: bool = False
  stateful: bool = True
  transformation: optax.GradientTransformation | None = None
  own_lr: bool = False

  def direction(self) -> optax.GradientTransformation:
    """The transformation a step applies to its gradient (descent direction, no lr)."""
    if self.transformation is not None:
      # optax's convention: updates to add, learning rate included.
      return optax.chain(self.transformation, optax.scale(-1.0))
    return self.build(**dict(self.hparams))

  def with_values(self, values: Mapping[str, Any]) -> Optimizer:
    """This optimizer with its hyperparameters read from ``values`` (a config
    section; a field it lacks keeps the default)."""
    return self._replace(hparams=tuple(
        (k, float(values[k]) if k in values else v) for k, v in self.hparams))

  def step_weights(self, lrs: np.ndarray) -> np.ndarray | None:
    """``[E]`` the weights ``A_j`` of the local steps' gradients in the upload, or
    None (non-linear: no such weights). For ``sgd`` it is ``lrs`` itself."""
    if self.step_weights_fn is None:
      return None
    return self.step_weights_fn(lrs, **dict(self.hparams))

  def init(self, params: PyTree) -> PyTree:
    """The direction's initial state for ``params`` (None when not :attr:`stateful`)."""
    return self.direction().init(params) if self.stateful else None


# ------------------------------------------------------------------ step weights
def sgd_weights(lrs: np.ndarray) -> np.ndarray:
  """SGD: ``A_j = eta_j``, the learning rates themselves (the same array, so a
  sensitivity computed from them is computed exactly as before the optimizers)."""
  return lrs


def heavy_ball_weights(lrs: np.ndarray, momentum: float) -> np.ndarray:
  """``[E]`` heavy-ball step weights ``A_j = sum_{s>=j} eta_s beta^(s-j)``.

  optax's ``trace(beta)`` keeps ``d_s = G_s + beta d_{s-1}`` from ``d_0 = 0``, and the
  step is ``w_{s+1} = w_s - eta_s d_s``. Unrolled, ``d_s = sum_{j<=s} beta^(s-j) G_j``
  and ``w_{E+1} = w_1 - sum_s eta_s sum_{j<=s} beta^(s-j) G_j = w_1 - sum_j A_j G_j``.
  Computed backwards, ``A_E = eta_E`` and ``A_j = eta_j + beta A_{j+1}`` (float64).
  With ``beta = 0`` it is ``lrs``.
  """
  lrs = np.asarray(lrs, np.float64)
  out = np.empty_like(lrs)
  acc = 0.0
  for j in range(lrs.size - 1, -1, -1):
    acc = lrs[j] + momentum * acc
    out[j] = acc
  return out


# ------------------------------------------------------------------ directions
def _sgd() -> optax.GradientTransformation:
  return optax.identity()


def _momentum(momentum: float) -> optax.GradientTransformation:
  return optax.trace(decay=momentum)


def _adam(beta1: float, beta2: float, eps: float) -> optax.GradientTransformation:
  return optax.scale_by_adam(b1=beta1, b2=beta2, eps=eps)


def _yogi(beta1: float, beta2: float, tau: float) -> optax.GradientTransformation:
  # Reddi et al. 2021, Alg. 2 starts the second moment at v_{-1} >= tau^2.
  return optax.scale_by_yogi(b1=beta1, b2=beta2, eps=tau, initial_accumulator_value=tau**2)


def _fedadam(beta1: float, beta2: float, tau: float) -> optax.GradientTransformation:
  return optax.scale_by_adam(b1=beta1, b2=beta2, eps=tau)


# ------------------------------------------------------------------ registries
SGD = Optimizer(
    name="sgd", summary="plain SGD, w - eta G (default)", build=_sgd,
    step_weights_fn=sgd_weights, plain_first_step=True, l2_contraction=True, stateful=False)
MOMENTUM = Optimizer(
    name="momentum",
    summary="heavy ball (optax.trace): d = G + beta d, w - eta d; linear, "
            "so per-example/per-step clipping with upload noise admits it",
    build=_momentum, hparams=(("momentum", 0.9),), step_weights_fn=heavy_ball_weights,
    plain_first_step=True)
ADAM = Optimizer(
    name="adam",
    summary="Adam (optax.scale_by_adam, bias-corrected); normalised steps: refused "
            "where a bound counts learning rates x steps",
    build=_adam, hparams=(("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8)))

# ``client.optimizer``: the local steps' direction, state fresh from the global model
# each round (FedAvg's convention: local state is not carried across rounds).
CLIENT_OPTIMIZERS: dict[str, Optimizer] = {"sgd": SGD, "momentum": MOMENTUM, "adam": ADAM}

FEDAVG = Optimizer(
    name="fedavg", summary="w + server_lr (aggregate - w) (default; McMahan et al. 2017)",
    build=_sgd, stateful=False)
FEDAVGM = Optimizer(
    name="fedavgm",
    summary="server momentum on the aggregate's pseudo-gradient (Hsu et al. 2019; "
            "DP-FedAvgM, McMahan et al. 2018)",
    build=_momentum, hparams=(("momentum", 0.9),))
FEDADAM = Optimizer(
    name="fedadam",
    summary="Adam on the pseudo-gradient, tau its epsilon (Reddi et al. 2021; optax's "
            "bias correction)",
    build=_fedadam, hparams=(("beta1", 0.9), ("beta2", 0.99), ("tau", 1e-3)))
FEDYOGI = Optimizer(
    name="fedyogi",
    summary="Yogi on the pseudo-gradient, tau its epsilon, v_0 = tau^2 (Reddi et al. "
            "2021; optax's bias correction)",
    build=_yogi, hparams=(("beta1", 0.9), ("beta2", 0.99), ("tau", 1e-3)))

# ``server.optimizer``: the server's step on the noisy aggregate. Its state is carried
# on the device beside the model (training.rounds.CarriedParams), per sweep lane,
# checkpointed with it and never written to model.msgpack.
SERVER_OPTIMIZERS: dict[str, Optimizer] = {
    "fedavg": FEDAVG, "fedavgm": FEDAVGM, "fedadam": FEDADAM, "fedyogi": FEDYOGI}

# The config fields of each side's hyperparameters (every registered optimizer's).
CLIENT_FIELDS = tuple(dict.fromkeys(k for o in CLIENT_OPTIMIZERS.values() for k, _ in o.hparams))
SERVER_FIELDS = tuple(dict.fromkeys(k for o in SERVER_OPTIMIZERS.values() for k, _ in o.hparams))


def _chosen(registry: Mapping[str, Optimizer], side: str, section: Mapping[str, Any]
            ) -> Optimizer:
  name = section.get("optimizer", next(iter(registry)))
  if name not in registry:
    raise ValueError(f"{side}.optimizer: unknown {name!r}; known: {tuple(registry)}")
  return registry[name].with_values(section)


def client_optimizer(section: Mapping[str, Any]) -> Optimizer:
  """The client optimizer a config's ``client`` section names, with its values."""
  return _chosen(CLIENT_OPTIMIZERS, "client", section)


def server_optimizer(section: Mapping[str, Any]) -> Optimizer:
  """The server optimizer a config's ``server`` section names, with its values."""
  return _chosen(SERVER_OPTIMIZERS, "server", section)


def from_transformation(tx: optax.GradientTransformation, name: str = "custom") -> Optimizer:
  """An optimizer from any ``optax.GradientTransformation`` (client or server side).

  The transformation follows optax's convention: it maps a gradient (the server's:
  the pseudo-gradient ``w - aggregate``) to updates that are ADDED to the
  parameters, its learning rate included (``optax.adam(1e-3)``, a chain, a schedule).
  It is non-linear as far as the privacy layer knows (no step weights), so it is
  refused where a clip mode's bound counts learning rates x steps.

  Args:
    tx: the transformation (``init``/``update``).
    name: how the run's records name it.

  Raises:
    TypeError: ``tx`` has no ``init`` and ``update``.
  """
  if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
    raise TypeError(f"from_transformation: expected an optax.GradientTransformation "
                    f"(init, update), got {type(tx).__name__}")
  return Optimizer(name=name, summary="an optax transformation passed from Python",
                   build=_sgd, transformation=tx, own_lr=True)
