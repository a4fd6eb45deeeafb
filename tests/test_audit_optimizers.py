"""The client optimizers in the audit (issue 47, item 5): the optimizer registry is an
axis of the audit's mechanism enumeration, and a momentum client whose bound is
computed as if it were SGD (``sgd_step_weights``: the plan's step weights are the
learning rates, the upload moves by heavy ball's ``A_j = sum_{s>=j} eta_s beta^(s-j)``)
is caught, while the correct mechanism is not flagged. The full table (every
optimizer on every placement, Adam and a transformation from Python admitted with
SGD's bound) is the benchmark benchmarks/audit_optimizer_table.py."""

import pytest

pytest.importorskip("jax_privacy")

from _helpers import small_config

from fedjax_dp import optimizers
from fedjax_dp.audit import AuditOptions, audit, mechanisms

# Ten local steps at a small rate (heavy ball's weights sum to 4.14 times SGD's), one
# example per client, every client every round, 4 rounds at epsilon 3: a per-round
# certificate of 1.318 that the broken variant's trials pass.
STEPS = {"model.name": "logistic", "rounds": 4, "privacy.epsilon": 3.0,
         "client.local_steps": 10, "client.lr": 0.005, "server.clients_per_round": 10,
         "data.samples_per_client": 1, "client.clip_mode": "step_grad_l2",
         "privacy.placement": "upload", "client.optimizer": "momentum", "client.clip": 0.1}


def test_the_optimizer_axis_is_the_registry(monkeypatch):
  base = small_config(STEPS)
  assert mechanisms.axes()[mechanisms.OPTIMIZER_AXIS] == tuple(optimizers.CLIENT_OPTIMIZERS)
  step_grad = {"client.clip_mode": "step_grad_l2", "privacy.placement": "upload"}
  assert mechanisms.accepted(base, {**step_grad, mechanisms.OPTIMIZER_AXIS: "momentum"})
  # Adam's normalised steps have no step weights: refused where the bound counts them,
  assert not mechanisms.accepted(base, {**step_grad, mechanisms.OPTIMIZER_AXIS: "adam"})
  # and accepted where the optimizer is post-processing (noise on each step's sum).
  assert mechanisms.accepted(base, {"client.clip_mode": "per_example_l2",
                                    "privacy.placement": "step",
                                    mechanisms.OPTIMIZER_AXIS: "adam"})
  # A new optimizer in the registry is on the axis without editing the audit.
  monkeypatch.setitem(optimizers.CLIENT_OPTIMIZERS, "nesterov_copy", optimizers.MOMENTUM)
  assert "nesterov_copy" in mechanisms.axes()[mechanisms.OPTIMIZER_AXIS]


def test_a_momentum_bound_computed_as_sgd_is_caught():
  cfg = small_config(STEPS)
  ok = audit(cfg, AuditOptions(trials=1000))
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  bad = audit(cfg, AuditOptions(trials=1000, variant="sgd_step_weights"))
  # The broken plan's noise is SGD's: sum_j eta_j / sum_j A_j = 1 / 4.14 of the right one.
  assert bad.noise_scale == pytest.approx(ok.noise_scale / 4.1381, rel=1e-3)
  assert bad.epsilon_certified == pytest.approx(ok.epsilon_certified, rel=1e-9)
  assert bad.epsilon_lower > bad.epsilon_certified, bad


@pytest.mark.parametrize("sets,match", [
    ({"client.optimizer": "sgd"}, "other than 'sgd'"),
    ({"client.clip_mode": "update_l2", "privacy.placement": "central"},
     "does not count the local steps"),
    ({"client.local_steps": 1}, "has SGD's step weights")])
def test_sgd_step_weights_is_refused_where_it_is_no_fault(sets, match):
  with pytest.raises(ValueError, match=match):
    audit(small_config(STEPS, **sets), AuditOptions(trials=10, variant="sgd_step_weights"))
