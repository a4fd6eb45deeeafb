"""ONE client's local training, written unbatched; the engine vmaps it over clients.

A client starts from the global model and runs ``local_steps`` steps of full-batch
GD or minibatch SGD by ``lax.scan``, or of another optax direction
(``client.optimizer``, :mod:`fedjax_dp.optimizers`: heavy-ball momentum, Adam, a
transformation passed from Python) whose state starts fresh every round. Privacy
enters in optional places, chosen by :class:`ClientConfig` (static) and
:class:`ClientHParams` (traced per client):

* ``clip_mode`` -- a mode of :data:`fedjax_dp.privacy.clip_modes.CLIP_MODES` (per
  example L2/L1, parameter projection, update clipping, per-step gradient
  clipping: each in its own file there), whose hooks clip each step's gradient,
  the parameters after each step and the upload after the last one;
* ``noise_placement='step'`` adds noise of scale ``step_noise`` to each step's summed
  (clipped) gradient (A-DPFL; DP-SGD);
* ``noise_placement='upload'`` adds noise of scale ``upload_noise`` to the model the
  client uploads (Wei UDP, Yuan, Fu).

Keys: the caller passes this client's key ``fold_in(fold_in(round_key, 0), client_id)``;
step ``s`` uses ``fold_in(key, s)`` and the upload noise ``fold_in(key, UPLOAD_TAG)``,
so a client's result does not depend on which other clients were selected.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp import optimizers
from fedjax_dp.models.base import Model
from fedjax_dp.privacy import (
  clip_modes,
  clipping,  # noqa: F401  (kept as client.clipping for callers)
  mechanisms,
)

PyTree = Any
# The clip-mode registry (a live view: a mode registered at run time is known here).
CLIP_MODES = clip_modes.CLIP_MODES
# How a minibatch is drawn at each local step (``client.minibatch``): ``shuffle`` takes
# ``batch_size`` examples uniformly without replacement; ``poisson`` takes every example
# independently with probability ``q_i = batch_size / |D_i|`` (DP-SGD's sampling, whose
# subsampled-Gaussian accounting is exact; Abadi et al. 2016, Mironov et al. 2019).
MINIBATCHES = ("shuffle", "poisson")
UPLOAD_TAG = 1 << 20  # step keys use fold_in(key, s) with s < UPLOAD_TAG
MAX_UNROLLED_STEPS = 8  # more local steps run as a loop (compile time grows with E)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
  """Static (compile-time) description of local training.

  Attributes:
    local_steps: E, the number of local steps per round.
    batch_size: examples per step; 0 means full batch (all of the client's data).
    clip_mode: a key of :data:`CLIP_MODES`.
    noise_placement: ``'none'``, ``'upload'``, ``'step'`` or ``'central'`` (central is
      applied by the server; the client then does nothing).
    mechanism: ``'gaussian'`` or ``'laplace'``.
    l2_reg: coefficient kappa of ``kappa/2 ||w||^2`` (Wei's SVM, eq. (32)); its
      gradient is data-independent, so it is added after clipping.
    chunk_size: per-example-gradient chunk for models without ghost clipping.
    minibatch: one of :data:`MINIBATCHES`. ``'poisson'`` includes each real example
      independently with ``q_i = min(1, batch_size / |D_i|)`` by a mask over all of
      the client's (padded) examples, so shapes stay fixed and a step costs a pass
      over ``n_max`` examples, not ``batch_size``; the step's (noised) clipped sum is
      divided by the EXPECTED batch size ``batch_size``, never by the realised one
      (which would make the release's scale data dependent).
    optimizer: the local steps' :class:`fedjax_dp.optimizers.Optimizer`
      (``client.optimizer``): its direction of each step's gradient
      ``G = g / b + kappa w`` replaces ``G`` in ``w - eta G``; its state starts from
      the global model every round (FedAvg's convention) and is scanned with the
      parameters. ``sgd`` (the default) is ``w - eta G`` exactly.
  """

  local_steps: int = 1
  batch_size: int = 0
  clip_mode: str = "none"
  noise_placement: str = "none"
  mechanism: str = "gaussian"
  l2_reg: float = 0.0
  chunk_size: int = 64
  minibatch: str = "shuffle"
  optimizer: optimizers.Optimizer = optimizers.SGD

  def __post_init__(self):
    if self.local_steps < 1:
      raise ValueError(f"client.local_steps must be >= 1, got {self.local_steps}")
    if self.batch_size < 0:
      raise ValueError(f"client.batch_size must be >= 0 (0 = full batch), got {self.batch_size}")
    clip_modes.get(self.clip_mode)  # an unknown mode raises, naming the field
    if self.noise_placement not in mechanisms.PLACEMENTS:
      raise ValueError(f"privacy.placement: unknown {self.noise_placement!r}; "
                       f"known: {mechanisms.PLACEMENTS}")
    if self.mechanism not in mechanisms.MECHANISMS:
      raise ValueError(f"privacy.mechanism: unknown {self.mechanism!r}; "
                       f"known: {mechanisms.MECHANISMS}")
    if self.minibatch not in MINIBATCHES:
      raise ValueError(f"client.minibatch: unknown {self.minibatch!r}; known: {MINIBATCHES}")
    if self.minibatch == "poisson" and self.batch_size < 1:
      raise ValueError("client.minibatch='poisson' needs client.batch_size >= 1 (the "
                       "expected batch size B; q_i = B / |D_i|)")


class ClientHParams(NamedTuple):
  """Traced per-client values (changing them never recompiles).

  Attributes:
    lr: ``[E]`` learning rate of each local step (a local schedule), or a scalar.
    clip: clipping threshold C.
    step_noise: noise scale on each step's summed gradient (placement ``'step'``).
    upload_noise: noise scale on the uploaded model (placement ``'upload'``).
    count: the client's example count |D_i| as the mechanism's public parameter
      (``client.minibatch='poisson'``: ``q_i = B / count``); ``None``: ``sum(mask)``.
  """

  lr: jax.Array
  clip: jax.Array
  step_noise: jax.Array
  upload_noise: jax.Array
  count: jax.Array | None = None


class ClientOutput(NamedTuple):
  """What one client returns.

  Attributes:
    params: the uploaded model (after update clipping and upload noise).
    loss: mean training loss of the global model on the client's first batch.
    grad_norm: mean per-example gradient norm in the first step (with ``step_grad_*``:
      the norm of the step's mean gradient; 0 otherwise); useful for choosing C (Wei
      spec section 10 item 3).
    update_norm: ``||w_local - w_global||_2`` before ``update_l2`` clipping (0 for
      other clip modes); the server's adaptive clip rules count it (engine).
  """

  params: PyTree
  loss: jax.Array
  grad_norm: jax.Array
  update_norm: jax.Array | None = None


def _select_batch(key, x, y, mask, batch_size):
  """Draws ``batch_size`` of the client's real examples without replacement.

  Real examples get uniform scores in [0, 1) and padding gets 2, so the smallest
  ``batch_size`` scores are a uniform subset of the real examples (padding is taken
  only when the client has fewer real examples than ``batch_size``; its mask is 0).
  """
  scores = jax.random.uniform(key, mask.shape) + 2.0 * (1.0 - mask)
  idx = jnp.argsort(scores)[:batch_size]
  return x[idx], y[idx], mask[idx]


def poisson_batch_mask(key, mask, batch_size, count=None):
  """``[n_max]`` Poisson minibatch: each real example is in with ``q = min(1, B / n)``.

  ``n`` is the client's example count |D_i| (``count``, default ``sum(mask)``), which
  the accounting treats as a public parameter of the mechanism (as DP-SGD treats the
  dataset size: Abadi et al. 2016); padding is never included. Example j is in iff
  its own uniform draw ``u_j < q``: inclusions are independent across examples and
  steps (fresh keys), and one example's presence never changes another's draw.
  """
  n = jnp.maximum(jnp.sum(mask) if count is None else jnp.asarray(count, jnp.float32), 1.0)
  q = jnp.minimum(batch_size / n, 1.0)
  return mask * (jax.random.uniform(key, mask.shape) < q).astype(mask.dtype)


def client_update(model: Model, cfg: ClientConfig, global_params: PyTree, x: jax.Array,
                  y: jax.Array, mask: jax.Array, key: jax.Array,
                  hp: ClientHParams) -> ClientOutput:
  """Local training of one client.

  Args:
    model: the model.
    cfg: static local-training config.
    global_params: the broadcast global model ``w^t``.
    x: ``[n_max, *input_shape]`` the client's (padded) examples.
    y: ``[n_max]`` labels.
    mask: ``[n_max]`` 1.0 for real examples, 0.0 for padding.
    key: this client's key for this round.
    hp: traced hyper-parameters.

  Returns:
    :class:`ClientOutput`. For one full-batch step with ``per_example_l2`` this is
    Wei et al. Alg. 1 line 9: ``w^t - (eta/|D_i|) sum_m clip(g_m)``, then line 11's
    noise when the placement is ``'upload'``.
  """
  lr = jnp.broadcast_to(jnp.asarray(hp.lr, jnp.float32), (cfg.local_steps,))
  mode = clip_modes.get(cfg.clip_mode)
  # A loss that reads the round's global model (FedProx's proximal term) sees it in
  # every example's loss, so clipping bounds it (fedjax_dp.models.adapters).
  model = model.anchored(global_params)
  direction = cfg.optimizer.direction()

  def step(carry, inputs):
    params, opt_state = carry
    s, lr_s = inputs
    skey = jax.random.fold_in(key, s)
    if cfg.minibatch == "poisson":
      xb, yb = x, y
      wb = poisson_batch_mask(jax.random.fold_in(skey, 0), mask, cfg.batch_size, hp.count)
    elif cfg.batch_size:
      xb, yb, wb = _select_batch(jax.random.fold_in(skey, 0), x, y, mask, cfg.batch_size)
    else:
      xb, yb, wb = x, y, mask
    denom = jnp.maximum(jnp.sum(wb), 1.0)
    # Poisson: divide by the expected size B (a constant), so the step's release is
    # (clipped sum + noise) / B with sensitivity C / B under add/remove of one example.
    gdenom = jnp.float32(cfg.batch_size) if cfg.minibatch == "poisson" else denom
    gsum, losses, mean_norm = mode.client.grad(model, params, xb, yb, wb, hp.clip, denom,
                                        cfg.chunk_size)
    if cfg.noise_placement == "step":
      gsum = mechanisms.add_noise(jax.random.fold_in(skey, 1), gsum, hp.step_noise,
                                  cfg.mechanism)
    grad = jax.tree_util.tree_map(lambda p, g: g / gdenom + cfg.l2_reg * p, params, gsum)
    # The optimizer reads only the step's (noised) clipped gradient and the parameters:
    # sgd's direction is grad itself, so the step is p - lr_s * grad as always.
    d, opt_state = direction.update(grad, opt_state, params)
    new = jax.tree_util.tree_map(lambda p, u: p - lr_s * u, params, d)
    new = mode.client.after_step(new, hp.clip)
    return (new, opt_state), (jnp.sum(losses * wb) / denom, mean_norm)

  steps = jnp.arange(cfg.local_steps)
  # A few local steps are unrolled: XLA (CPU) runs convolution weight gradients
  # inside a loop on a path ~15x slower than outside one (pfl's CIFAR-10 CNN, 5 steps
  # of batch 10: 43 s vs 3.8 s per 50-client round in a jitted per-client loop).
  unroll = cfg.local_steps if cfg.local_steps <= MAX_UNROLLED_STEPS else 1
  carry = (global_params, direction.init(global_params))
  (params, _), (losses, norms) = jax.lax.scan(step, carry, (steps, lr), unroll=unroll)
  params, update_norm = mode.client.after_local(params, global_params, hp.clip)
  if cfg.noise_placement == "upload":
    params = mechanisms.add_noise(jax.random.fold_in(key, UPLOAD_TAG), params,
                                  hp.upload_noise, cfg.mechanism)
  return ClientOutput(params, losses[0], norms[0], update_norm)
