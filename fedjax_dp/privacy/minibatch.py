"""Client DP-SGD with Poisson minibatches (``client.minibatch='poisson'``): the run's
neighbour relation, what its accounting assumes, and the runs it covers."""

from __future__ import annotations

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import clip_modes
from fedjax_dp.privacy import selection as selection_lib
from fedjax_dp.privacy.formulas import registry

POISSON_ASSUMPTION = {
    "add_remove": (
        "client.minibatch='poisson': each client's example count |D_i| (hence q_i = B / "
        "|D_i| and the number of steps) is a public parameter of the mechanism, held fixed "
        "when one example is added or removed (the DP-SGD convention for the dataset size)"),
    "replace_one": (
        "client.minibatch='poisson' under replace-one (the selection rule's assumption "
        "allows no add/remove neighbour): each step is the replace-one Poisson-subsampled "
        "Gaussian (the replaced example is sampled with q_i = B / |D_i| in both runs and "
        "moves the clipped sum by 2 C)"),
}


def run_adjacency(inputs) -> str:
  """The run's one neighbour relation: ``'add_remove'`` for client DP-SGD with Poisson
  minibatches (the relation of the Poisson-subsampled Gaussian) unless the selection
  rule needs another (``SelectionRule.relation``, the A-DPFL rules:
  ``'replace_one'``); every other run is accounted under ``'replace_one'``."""
  rule = selection_lib.get_rule(inputs.server.selection)
  poisson = inputs.client.minibatch == "poisson" and inputs.privacy.placement == "step"
  if poisson and rule.relation is None:
    return "add_remove"
  return "replace_one"


def check_poisson(inputs, mode: clip_modes.ClipMode) -> None:
  """Refuses ``client.minibatch='poisson'`` where its accounting does not apply.

  The Poisson-subsampled Gaussian
  (:meth:`fedjax_dp.privacy.plan.PrivacyPlan.poisson_step_event`) is proved for noise
  on each step's sum of clipped per-example gradients whose proof allows it
  (``Proof.poisson_steps`` of the clip mode: ``per_example_l2``): placement ``'step'``, the
  Gaussian mechanism, and a formula that sizes the noise by our accountant or by a
  multiplier. Elsewhere (noise on the upload after several Poisson steps, Laplace,
  papers' formulas written for other samplings) nothing here bounds it;
  ``placement='none'`` trains without noise.

  Raises:
    ConfigError: naming the field.
  """
  p = inputs.privacy
  if p.placement == "none":
    return
  if p.placement != "step":
    raise ConfigError("client.minibatch='poisson' is accounted for DP-SGD inside the "
                      "clients: it needs privacy.placement='step' (or 'none'), got "
                      f"{p.placement!r}")
  if not mode.proof.poisson_steps:
    modes = [n for n, m in clip_modes.CLIP_MODES.items() if m.proof.poisson_steps]
    raise ConfigError(f"client.minibatch='poisson' needs client.clip_mode in {modes} "
                      f"(the subsampled Gaussian's L2 sensitivity C), got {mode.name!r}")
  if p.mechanism != "gaussian":
    raise ConfigError("client.minibatch='poisson' is accounted as a subsampled Gaussian: "
                      f"privacy.mechanism must be 'gaussian', got {p.mechanism!r}")
  if not registry.get_formula(p.formula).accountant_sized:
    raise ConfigError(f"client.minibatch='poisson' with privacy.formula={p.formula!r}: "
                      "that formula is not written for Poisson minibatches; use one of "
                      f"{registry.accountant_sized()}")
