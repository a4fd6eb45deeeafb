"""What a clip mode is: the :class:`ClipMode` record and the pieces modes share.

A clip mode (``client.clip_mode``) bounds what a client releases. One
:class:`ClipMode` bundles everything the run needs to know about it, so that the
client's computation, the sensitivity the noise is sized with, the accounting
event's privacy unit, the config checks and the audit's canary cannot drift apart
(ARCHITECTURE.md decision 6):

* client side (traced, for ONE client; :func:`fedjax_dp.training.client.client_update` calls
  the three hooks): :attr:`ClipMode.grad` (a local step's gradient sum),
  :attr:`ClipMode.after_step` (the parameters after a step) and
  :attr:`ClipMode.after_local` (the upload after the E steps);
* plan side (host, :func:`fedjax_dp.privacy.plan.make_privacy_plan`): the noise
  placements it has a proven sensitivity for (:attr:`ClipMode.sensitivity`, whose
  proof is in the mode file's docstrings), those where it is an L1 sensitivity
  (Laplace), and the placements at which the privacy unit is the client;
* :attr:`ClipMode.check` refuses the config fields the proof needs but the config
  breaks, naming the field;
* :attr:`ClipMode.canary`: how the audit (:mod:`fedjax_dp.audit.audit`) builds a
  canary pair that reaches the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.errors import ConfigError
from fedjax_dp.models.base import Model
from fedjax_dp.privacy import clipping

PyTree = Any


class SensitivityInputs(NamedTuple):
  """What a sensitivity needs to know of the run (host side, NumPy).

  Attributes:
    clip: C.
    lrs: ``[E]`` the local step sizes ``eta_s``.
    batch: ``[U]`` examples per step b_i (|D_i| for full batch).
    counts: ``[U]`` the clients' example counts |D_i|.
    mechanism: ``'gaussian'`` (L2 sensitivity) or ``'laplace'`` (L1).
    minibatch: ``client.minibatch``.
    num_params: d, or None when the caller did not give it.
    q: a client's per-round selection probability.
    cfg: the run config (``client.l2_reg``, ``server.*`` for central noise).
  """

  clip: float
  lrs: np.ndarray
  batch: np.ndarray
  counts: np.ndarray
  mechanism: str
  minibatch: str
  num_params: int | None
  q: float
  cfg: Any

  @property
  def num_clients(self) -> int:
    return int(self.counts.size)


class Canary(NamedTuple):
  """How the audit builds a canary pair that reaches the mode's bound.

  Attributes:
    sparse: a canary whose gradient lies on one axis (an L1 ball's vertex, where
      the L1 clip bounds the L2 norm by C).
    example_scale: feature scale of an example-level canary (a bound on the model,
      not on one gradient, needs a much larger input to be reached).
    l1_geometry: Laplace noise on this mode is certified with ``2 C sqrt(d)``; its
      audit needs a small model (:data:`fedjax_dp.audit.table.L1_GEOMETRY_SETS`).
  """

  sparse: bool = False
  example_scale: float = 100.0
  l1_geometry: bool = False


GradFn = Callable[..., tuple[PyTree, jax.Array, jax.Array]]


class ClipMode(NamedTuple):
  """One clip mode (module docstring).

  Attributes:
    name: the ``client.clip_mode`` value.
    summary: one line for the catalog.
    grad: ``(model, params, xb, yb, wb, clip, denom, chunk_size) -> (gsum, losses
      [b], mean_norm)``: one local step's (clipped) gradient SUM over the batch
      weighted by ``wb [b]``, the per-example losses, and the norm the client
      reports (0 where the mode has none); ``denom`` is ``max(sum(wb), 1)``.
    after_step: ``(params, clip) -> params`` after each local step.
    after_local: ``(params, global_params, clip) -> (params, update_norm)`` after
      the E steps (the upload before its noise).
    placements: the noise placements (``privacy.placement``) with a proven
      sensitivity (``'none'`` is always allowed).
    sensitivity: ``(placement, SensitivityInputs) -> [U]`` the replace-one
      sensitivity of the noised release at ``placement`` (one of
      :attr:`placements`); raises ValueError naming the field when a proof
      condition fails.
    laplace: the placements at which :attr:`sensitivity` is an L1 sensitivity
      (with ``mechanism='laplace'``), so Laplace noise is bounded there.
    client_level: the placements at which the privacy unit is a client's whole
      dataset (else one example).
    check: ``(cfg) -> None`` refuses config fields the proofs do not cover
      (ConfigError naming the field); called by ``make_privacy_plan``.
    canary: the audit's :class:`Canary`.
    norm: 1 or 2, the norm of the clip (0: none).
    poisson_steps: the Poisson-subsampled Gaussian of client DP-SGD
      (``client.minibatch='poisson'``, placement ``'step'``) is proved for it.
    server_clip: the server's adaptive clip rules (``server.clip_rule``) may re-clip
      its uploads (they are updates clipped to a bound).
    reads: the config fields the mode reads that not every mode reads (the bound
      ``client.clip``; ``()`` for ``none``): a config that sets one away from its
      default while picking a mode that does not read it is refused
      (:func:`fedjax_dp.config.unread_fields`).
  """

  name: str
  summary: str
  grad: GradFn
  sensitivity: Callable[[str, SensitivityInputs], np.ndarray]
  placements: tuple[str, ...] = ()
  laplace: tuple[str, ...] = ()
  client_level: tuple[str, ...] = ()
  after_step: Callable[[PyTree, jax.Array], PyTree] = lambda params, clip: params
  after_local: Callable[..., tuple[PyTree, jax.Array]] = (
      lambda params, global_params, clip: (params, jnp.zeros(())))
  check: Callable[[Any], None] = lambda cfg: None
  canary: Canary = Canary()
  norm: int = 0
  poisson_steps: bool = False
  server_clip: bool = False
  reads: tuple[str, ...] = ("client.clip",)

  def level(self, placement: str) -> str:
    """The privacy unit of the release at ``placement``."""
    return "client" if placement in self.client_level else "example"


# ----------------------------------------------------------------- client pieces
def weighted_grad_sum(model: Model, params, xb, yb, wb) -> tuple[PyTree, jax.Array]:
  """``(sum_j w_j grad l_j, losses [b])``: the step's unclipped gradient sum."""
  def weighted(p):
    losses = model.per_example_loss(model.apply(p, xb), yb)
    return jnp.sum(losses * wb), losses
  return jax.grad(weighted, has_aux=True)(params)


def plain_grad(model, params, xb, yb, wb, clip, denom, chunk_size):
  """The unclipped gradient sum (modes that clip the parameters or the update)."""
  gsum, losses = weighted_grad_sum(model, params, xb, yb, wb)
  return gsum, losses, jnp.zeros(())


def per_example_grad(ord: int) -> GradFn:
  """Every example's gradient clipped to norm C (``ord``) before the sum; reports
  the batch's mean per-example norm."""
  def grad(model, params, xb, yb, wb, clip, denom, chunk_size):
    gsum, losses, norms = clipping.per_example_clipped_grad_sum(
        model, params, xb, yb, wb, clip, ord, chunk_size)
    return gsum, losses, jnp.sum(norms * wb) / denom
  return grad


def step_grad(ord: int) -> GradFn:
  """The step's MEAN gradient clipped to norm C (``ord``); reports its norm."""
  def grad(model, params, xb, yb, wb, clip, denom, chunk_size):
    gsum, losses = weighted_grad_sum(model, params, xb, yb, wb)
    # g <- g min(1, C / ||g||) for the mean g; clipping the sum to C |batch| is the
    # same rescaling (the norm is homogeneous).
    gsum, gnorm = clipping.clip_by_norm(gsum, clip * denom, ord=ord)
    return gsum, losses, gnorm / denom
  return grad


# ----------------------------------------------------------------- plan pieces
def check_decay(inputs: SensitivityInputs) -> None:
  """Several local steps are bounded step by step only if ``|1 - eta kappa| <= 1``.

  Raises:
    ValueError: ``client.l2_reg * client.lr > 2`` with several local steps.
  """
  if inputs.lrs.size > 1 and float(inputs.cfg.client.l2_reg) * float(
      np.max(inputs.lrs)) > 2.0:
    raise ValueError(
        "client.l2_reg * client.lr > 2 with several local steps: the decay factor "
        "|1 - eta kappa| exceeds 1 and the upload's sensitivity is unbounded by "
        "2 C (eta_1 / b + sum eta_s); lower client.l2_reg or client.lr")


def no_sensitivity(placement: str, inputs: SensitivityInputs) -> np.ndarray:
  """For a mode that supports no noise placement."""
  raise ConfigError(f"privacy.placement={placement!r}: no sensitivity is proved")
