"""Issue 47, Q1: central noise under a random selection rule (``poisson``,
``cyclic_poisson``) hides the cohort from the adversary. The audit's canary is then
inclusion-aware: its direction is orthogonal to every other client's noiseless update
(so the score sees the target's contribution when it is drawn, and the noise, not which
other clients the lane's cohort drew), and under ``cyclic_poisson`` it sits on a client
eligible in round 1. Before, noise/10 went unseen (lower bound 0.000 against a per-round
certificate of 1.001); now it is caught, for the Gaussian and the amplified BandMF
mechanisms, and the correct mechanisms stay below their certificates."""

import pytest

pytest.importorskip("jax_privacy")

from _helpers import small_config

from fedjax_dp.audit import AuditOptions, audit

# A linear model (fast), client-level canaries at central placement. Four rounds at
# epsilon 3 and q = 0.8: a per-round certificate (about 2) that a tenth of the noise
# passes within a few thousand trials of one hidden Poisson draw each.
HIDDEN = {"model.name": "logistic", "client.clip_mode": "update_l2",
          "privacy.placement": "central", "server.aggregation": "fixed", "server.q": 0.8,
          "rounds": 4, "privacy.epsilon": 3.0}
TRIALS = 3000
# The Gaussian mechanism's trials on 20 examples per client (a trial's cost; the
# client-level canary and the noise, both relative to the clip, do not depend on the
# count). BandMF keeps the quickstart's 140: on 20 its margin over the certificate was
# within the spread of the audit's seeds.
SMALL = {"data.samples_per_client": 20}


@pytest.mark.parametrize("sets", [
    {"server.selection": "poisson", **SMALL},
    {"server.selection": "cyclic_poisson", "server.clients_per_round": 5, **SMALL},
    {"server.selection": "cyclic_poisson", "server.clients_per_round": 5,
     "privacy.mechanism": "bandmf"}],
    ids=["gaussian-poisson", "gaussian-cyclic_poisson", "bandmf-cyclic_poisson"])
def test_noise_div10_is_caught_under_a_hidden_poisson_cohort(sets):
  cfg = small_config(HIDDEN, **sets)
  ok = audit(cfg, AuditOptions(trials=TRIALS))
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  bad = audit(cfg, AuditOptions(trials=TRIALS, variant="noise_div10"))
  assert bad.epsilon_lower > bad.epsilon_certified, bad


def test_cyclic_poisson_canary_sits_in_round_one_group():
  # Under cyclic_poisson client 0 may belong to a group that round 1 never draws; the
  # canary goes to the first client eligible in round 1 instead.
  import importlib

  from fedjax_dp import experiment
  audit_lib = importlib.import_module("fedjax_dp.audit.audit")

  cfg = small_config(HIDDEN, **{"server.selection": "cyclic_poisson",
                                "server.clients_per_round": 5})
  setup = experiment.build(cfg)
  plan = audit_lib._run_plan(cfg, setup, False)  # pylint: disable=protected-access
  target = audit_lib._default_target(setup.privacy, plan, AuditOptions())  # pylint: disable=protected-access
  assert setup.privacy.groups[target] == 0
