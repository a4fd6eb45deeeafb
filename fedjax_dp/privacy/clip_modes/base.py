"""What a clip mode is: the :class:`ClipMode` record and the pieces modes share.

A clip mode (``client.clip_mode``) bounds what a client releases. One
:class:`ClipMode` bundles everything the run needs to know about it, so that the
client's computation, the sensitivity the noise is sized with, the accounting
event's privacy unit, the config checks and the audit's canary cannot drift apart
(ARCHITECTURE.md decision 6). Three small records group it:

* :class:`ClientHooks` (traced, for ONE client;
  :func:`fedjax_dp.training.client.client_update` calls them): ``grad`` (a local
  step's gradient sum), ``after_step`` (the parameters after a step), ``after_local``
  (the upload after the E steps), and the optional ``fused`` one-step hook
  (:mod:`fedjax_dp.privacy.fused`);
* :class:`Proof` (host, :func:`fedjax_dp.privacy.plan.make_privacy_plan`): the
  sensitivity at each noise placement it has a proof for (the proofs are in the mode
  file's docstrings), those where it is an L1 sensitivity (Laplace), the placements at
  which the privacy unit is the client, the properties the plan's other owners read
  (Poisson steps, the server's clip rules, the formulas of an upload ball), the
  placements whose bound counts the client optimizer's step weights, and its own
  check of the run's typed inputs;
* :class:`Canary`: how the audit (:mod:`fedjax_dp.audit.audit`) builds a canary pair
  that reaches the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import optimizers
from fedjax_dp.errors import ConfigError
from fedjax_dp.models.base import Model
from fedjax_dp.privacy import clipping
from fedjax_dp.privacy.fused import FusedStep
from fedjax_dp.privacy.inputs import ClientInputs, ServerInputs

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
    client: :class:`fedjax_dp.privacy.inputs.ClientInputs` (``l2_reg``, the mode's
      name, the local steps' ``optimizer``, whose step weights a bound that counts
      learning rates x steps reads: :func:`step_weights`).
    server: :class:`fedjax_dp.privacy.inputs.ServerInputs` (central noise: the
      aggregation, the selection rule, K).
  """

  clip: float
  lrs: np.ndarray
  batch: np.ndarray
  counts: np.ndarray
  mechanism: str
  minibatch: str
  num_params: int | None
  q: float
  client: ClientInputs
  server: ServerInputs

  @property
  def num_clients(self) -> int:
    return int(self.counts.size)


def data_input(rows: np.ndarray, feature: int) -> np.ndarray:
  """The canary's inputs are the client's own examples (then scaled)."""
  return rows


def sparse_input(rows: np.ndarray, feature: int) -> np.ndarray:
  """The canary's inputs are the basis vector of ``feature`` (the input feature no other
  example uses): the pair's gradient difference lies in few coordinates, an L1 ball's
  vertex, where an L1 clip bounds the L2 norm by C and the Laplace test sees it."""
  out = np.zeros_like(rows)
  out.reshape(out.shape[0], -1)[:, feature] = 1.0
  return out


def dense_input(rows: np.ndarray, feature: int) -> np.ndarray:
  """The canary's inputs have every feature equal (all ones): a linear model's gradient
  then has equal magnitude in every coordinate of a class's column, a corner of an
  L-infinity ball (with ``Canary.flip_input=False`` and two classes, the two
  canaries' updates are opposite corners)."""
  return np.ones_like(rows)


class Canary(NamedTuple):
  """How the audit builds a canary pair that reaches the mode's bound
  (:func:`fedjax_dp.audit.audit.canary_pair`): the audit record of a clip mode.

  Attributes:
    input: ``(rows [r, *input_shape], feature) -> rows``: the canary's input rows
      before they are scaled by ``example_scale`` (:func:`data_input`,
      :func:`sparse_input`, :func:`dense_input`, or a new geometry's own); ``feature``
      is the input feature no other example uses.
    example_scale: feature scale of an example-level canary (a bound on the model,
      not on one gradient, needs a much larger input to be reached).
    flip_input: the ``out`` canary negates the input (True) or changes the label
      (False; the gradient's sign pattern flips in every coordinate for two classes).
    l1_geometry: Laplace noise on this mode is certified with ``2 C sqrt(d)``; its
      audit needs a small model (:data:`fedjax_dp.audit.table.L1_GEOMETRY_SETS`).
  """

  input: Callable[[np.ndarray, int], np.ndarray] = data_input
  example_scale: float = 100.0
  flip_input: bool = True
  l1_geometry: bool = False

  @property
  def sparse(self) -> bool:
    """Whether the canary sits on one input feature (:func:`sparse_input`)."""
    return self.input is sparse_input


GradFn = Callable[..., tuple[PyTree, jax.Array, jax.Array]]


def _keep_params(params, clip):
  return params


def _keep_upload(params, global_params, clip):
  return params, jnp.zeros(())


class ClientHooks(NamedTuple):
  """What a client computes (traced, for ONE client;
  :func:`fedjax_dp.training.client.client_update` calls the hooks).

  Attributes:
    grad: ``(model, params, xb, yb, wb, clip, denom, chunk_size) -> (gsum, losses
      [b], mean_norm)``: one local step's (clipped) gradient SUM over the batch
      weighted by ``wb [b]``, the per-example losses, and the norm the client
      reports (0 where the mode has none); ``denom`` is ``max(sum(wb), 1)``.
    after_step: ``(params, clip) -> params`` after each local step.
    after_local: ``(params, global_params, clip) -> (params, update_norm)`` after
      the E steps (the upload before its noise).
    fused: None, or the mode's one-step fusion
      (:class:`fedjax_dp.privacy.fused.FusedStep`): a block of clients' one
      full-batch step as one weighted batch
      (:func:`fedjax_dp.training.one_step.block_sum`), equal to the hooks above.
  """

  grad: GradFn
  after_step: Callable[[PyTree, jax.Array], PyTree] = _keep_params
  after_local: Callable[..., tuple[PyTree, jax.Array]] = _keep_upload
  fused: FusedStep | None = None


def _no_check(inputs: Any) -> None:
  """A mode whose proofs need no field beyond the plan's own checks."""


class Proof(NamedTuple):
  """What the mode's sensitivity proof covers (host; the proofs are in the mode
  file's docstrings, read by :func:`fedjax_dp.privacy.plan.make_privacy_plan`).

  Attributes:
    sensitivity: ``(placement, SensitivityInputs) -> [U]`` the replace-one
      sensitivity of the noised release at ``placement`` (one of
      :attr:`placements`); raises ValueError naming the field when a proof
      condition fails.
    placements: the noise placements (``privacy.placement``) with a proven
      sensitivity (``'none'`` is always allowed).
    laplace: the placements at which :attr:`sensitivity` is an L1 sensitivity
      (with ``mechanism='laplace'``), so Laplace noise is bounded there.
    client_level: the placements at which the privacy unit is a client's whole
      dataset (else one example).
    poisson_steps: the Poisson-subsampled Gaussian of client DP-SGD
      (``client.minibatch='poisson'``, placement ``'step'``) is proved for it.
    server_clip: the server's adaptive clip rules (``server.clip_rule``) may re-clip
      its uploads (they are updates clipped to a bound).
    upload_ball: the upload lies in the ball of radius C around a point both
      neighbours share (0, or the global model), whatever the data: its sensitivity
      is the ball's diameter 2 C (Yuan et al.'s Algorithm 1 reading, so their
      formulas admit it).
    step_weighted: the placements at which :attr:`sensitivity` is proved step by step
      and counts the local steps' weights (learning rates x steps): it reads the
      client optimizer's step weights (:func:`step_weights`), and an optimizer
      without them is refused there (:func:`check_optimizer`; from the config's
      checks before any data is read, :func:`fedjax_dp.privacy.clip_modes.check_config`).
    check: ``(inputs) -> None`` refuses, from
      :class:`fedjax_dp.privacy.inputs.PrivacyInputs`, fields the proofs do not cover
      (ConfigError naming the field); called by ``make_privacy_plan`` and by the
      config's validation.
  """

  sensitivity: Callable[[str, SensitivityInputs], np.ndarray]
  placements: tuple[str, ...] = ()
  laplace: tuple[str, ...] = ()
  client_level: tuple[str, ...] = ()
  poisson_steps: bool = False
  server_clip: bool = False
  upload_ball: bool = False
  step_weighted: tuple[str, ...] = ()
  check: Callable[[Any], None] = _no_check


class ClipMode(NamedTuple):
  """One clip mode (module docstring).

  Attributes:
    name: the ``client.clip_mode`` value.
    summary: one line for the catalog (``fedjax-dp list``).
    client: its :class:`ClientHooks` (the client's computation).
    proof: its :class:`Proof` (the sensitivity and what it covers).
    canary: its :class:`Canary` (the audit's canary pair).
    reads: the config fields the mode reads that not every mode reads (the bound
      ``client.clip``; ``()`` for ``none``): a config that sets one away from its
      default while picking a mode that does not read it is refused
      (:func:`fedjax_dp.config.unread_fields`).
  """

  name: str
  summary: str
  client: ClientHooks
  proof: Proof
  canary: Canary = Canary()
  reads: tuple[str, ...] = ("client.clip",)

  def level(self, placement: str) -> str:
    """The privacy unit of the release at ``placement``."""
    return "client" if placement in self.proof.client_level else "example"


# ----------------------------------------------------------------- client pieces
def weighted_grad_sum(model: Model, params, xb, yb, wb) -> tuple[PyTree, jax.Array]:
  """``(sum_j w_j grad l_j, losses [b])``: the step's unclipped gradient sum."""
  def weighted(p):
    losses = model.losses(p, xb, yb)
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
  if inputs.lrs.size > 1 and float(inputs.client.l2_reg) * float(
      np.max(inputs.lrs)) > 2.0:
    raise ValueError(
        "client.l2_reg * client.lr > 2 with several local steps: the decay factor "
        "|1 - eta kappa| exceeds 1 and the upload's sensitivity is unbounded by "
        "2 C (eta_1 / b + sum eta_s); lower client.l2_reg or client.lr")


def check_optimizer(optimizer: optimizers.Optimizer, clip_mode: str, placement: str,
                    l2_reg: float, local_steps: int) -> None:
  """Refuses a client optimizer that a step-by-step bound (:attr:`Proof.step_weighted`)
  does not cover.

  The client's step is ``w_{s+1} = w_s - eta_s d_s`` with ``d_s`` the optimizer's
  direction of ``G_s = g_s + kappa w_s`` (``g_s`` the step's clipped gradient). A
  linear optimizer (one with :attr:`fedjax_dp.optimizers.Optimizer.step_weights_fn`) uploads
  ``w_{E+1} = w_1 - sum_j A_j G_j`` with ``A_j >= 0`` fixed in advance (SGD:
  ``A_j = eta_j``; heavy-ball momentum ``beta``: ``A_j = sum_{s>=j} eta_s beta^(s-j)``,
  :func:`fedjax_dp.optimizers.heavy_ball_weights`). With ``kappa = 0`` two runs on
  neighbouring data start at the same ``w_1``, so ``||w_{E+1} - w'_{E+1}|| <=
  sum_j A_j ||g_j - g'_j||`` by the triangle inequality, in any norm, and each mode's
  per-step bound on ``||g_j - g'_j||`` gives its sensitivity with ``A_j`` in place of
  ``eta_j`` (:func:`step_weights`). With ``kappa > 0`` the argument of
  :func:`check_decay` (each step contracts the difference) is SGD's only: a momentum
  step's difference carries the earlier directions' too, and no contraction of it is
  proved here, so several such steps are refused. One step is SGD's step whatever the
  momentum (``A_1 = eta_1``, ``w_1`` shared).

  Raises:
    ConfigError: a non-linear optimizer (Adam, a transformation from Python: its
      normalised steps are no fixed combination of the clipped gradients), or a
      linear one other than SGD with ``client.l2_reg > 0`` over several steps; one
      line naming ``client.optimizer`` and ``client.clip_mode``.
  """
  where = (f"client.optimizer={optimizer.name!r} with client.clip_mode={clip_mode!r} at "
           f"privacy.placement={placement!r}")
  if optimizer.step_weights_fn is None:
    raise ConfigError(
        f"{where}: the upload's sensitivity is proved step by step (it counts learning "
        "rates x steps x C), and this optimizer's normalised steps are no fixed "
        "combination of the clipped gradients; use client.optimizer='sgd' or 'momentum', "
        "client.clip_mode='update_l2' or 'param_l2', or privacy.placement='step'")
  if local_steps > 1 and l2_reg > 0 and not optimizer.l2_contraction:
    raise ConfigError(
        f"{where} and client.l2_reg={l2_reg:g} over {local_steps} local steps: the "
        "bound's contraction argument (|1 - eta kappa| <= 1) holds for plain SGD only; "
        "set client.l2_reg=0, client.optimizer='sgd' or client.local_steps=1")


def step_weights(placement: str, inputs: SensitivityInputs) -> np.ndarray:
  """``[E]`` the weights ``A_j`` of the local steps' gradients in the upload noised at
  ``placement``, which a step-by-step bound counts where plain SGD's counts ``eta_j``
  (SGD: ``inputs.lrs`` itself, so its sensitivity is computed exactly as before).
  Checks the optimizer (:func:`check_optimizer`) and the decay (:func:`check_decay`)
  first.

  Raises:
    ValueError: naming the field (:func:`check_optimizer`, :func:`check_decay`).
  """
  c = inputs.client
  check_optimizer(c.optimizer, c.clip_mode, placement, float(c.l2_reg), int(inputs.lrs.size))
  check_decay(inputs)
  return c.optimizer.step_weights(inputs.lrs)


def check_step_weighted(mode: ClipMode, inputs: Any) -> None:
  """The client optimizer of :class:`fedjax_dp.privacy.inputs.PrivacyInputs` where
  ``mode``'s bound at the configured placement counts the local steps
  (:attr:`Proof.step_weighted`): :func:`check_optimizer`, before any data is read.

  Raises:
    ConfigError: naming ``client.optimizer`` and ``client.clip_mode``.
  """
  c, placement = inputs.client, inputs.privacy.placement
  if placement in mode.proof.step_weighted:
    check_optimizer(c.optimizer, mode.name, placement, float(c.l2_reg), c.local_steps)


def no_sensitivity(placement: str, inputs: SensitivityInputs) -> np.ndarray:
  """For a mode that supports no noise placement."""
  raise ConfigError(f"privacy.placement={placement!r}: no sensitivity is proved")
