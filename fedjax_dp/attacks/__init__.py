"""Privacy attacks that measure what a trained model leaks, beside the certified bounds.

* :mod:`~fedjax_dp.attacks.mia`: membership inference (Yeom et al. loss threshold,
  Shokri et al. shadow models, offline LiRA reference scores of Carlini et al.) on
  any ``apply_fn(params, x) -> logits``.
* :mod:`~fedjax_dp.attacks.bounds`: the largest advantage any attack can have against
  an (epsilon, delta)-DP release.
* :mod:`~fedjax_dp.attacks.federated`: the attacks against engine runs, one call per
  config (:func:`membership_inference`) or per privacy grid
  (:func:`membership_inference_many`: targets and shadows as vmapped programs).
"""

from fedjax_dp.attacks import bounds, metrics, mia
from fedjax_dp.attacks.bounds import accuracy_bound, advantage_bound
from fedjax_dp.attacks.metrics import AttackResult
from fedjax_dp.attacks.mia import (
  fit_shadow_attack,
  loss_threshold_attack,
  reference_scores,
  shadow_attack,
  shadow_draws,
  train_shadow_attack,
  vectorize,
)

__all__ = ["AttackResult", "accuracy_bound", "advantage_bound", "bounds", "fit_shadow_attack",
           "loss_threshold_attack", "membership_inference", "membership_inference_many",
           "metrics", "mia", "reference_scores", "shadow_attack", "shadow_draws",
           "train_shadow_attack", "vectorize"]


def membership_inference(*args, **kwargs):
  """See :func:`fedjax_dp.attacks.federated.membership_inference` (imported lazily: it
  pulls in the engine)."""
  from fedjax_dp.attacks import federated
  return federated.membership_inference(*args, **kwargs)


def membership_inference_many(*args, **kwargs):
  """See :func:`fedjax_dp.attacks.federated.membership_inference_many` (imported lazily)."""
  from fedjax_dp.attacks import federated
  return federated.membership_inference_many(*args, **kwargs)
