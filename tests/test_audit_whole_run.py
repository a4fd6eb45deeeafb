"""The whole-run audit (issue 47, Q2): a canary inserted once and observed in every
round's release; the lower bound is for the T-round mechanism the run certifies. A
fault in a later round (a tenth of the noise from round T/2 + 1 on, for correlated
noise the later rows of C^+ Z), which the first-round audit cannot see by
construction, is caught, as are noise/10 and clipping off; the correct mechanisms
stay below the run's certificate."""

import pytest

pytest.importorskip("jax_privacy")

from _helpers import small_config

from fedjax_dp.audit import AuditOptions, audit_run

# Four rounds of every client, epsilon 3 for the whole run: a certificate a broken
# run's separated trials pass with 1000 trials (a perfect attack reaches about 4.4).
# 20 examples per client: a trial's cost is its clients' examples, while the canary
# (all of the target's examples, on a feature no other example uses) and the
# calibrated noise, both relative to the clip, do not depend on the count.
RUN = {"model.name": "logistic", "client.clip_mode": "update_l2",
       "privacy.placement": "central", "rounds": 4, "privacy.epsilon": 3.0,
       "data.samples_per_client": 20}
TRIALS = 1000


@pytest.mark.parametrize("sets", [
    {"server.selection": "uniform", "server.clients_per_round": 10},
    {"privacy.mechanism": "bandmf", "server.selection": "all"}],
    ids=["gaussian", "bandmf"])
def test_whole_run_audit_catches_a_late_round_fault(sets):
  cfg = small_config(RUN, **sets)
  ok = audit_run(cfg, AuditOptions(trials=TRIALS))
  assert ok.rounds == 4 and ok.epsilon_lower <= ok.epsilon_certified, ok
  late = audit_run(cfg, AuditOptions(trials=TRIALS, variant="late_noise_div10"))
  assert late.epsilon_lower > late.epsilon_certified, late


def test_whole_run_audit_catches_noise_div10_and_no_clip():
  cfg = small_config(RUN, **{"server.selection": "uniform", "server.clients_per_round": 10})
  for variant in ("noise_div10", "no_clip"):
    bad = audit_run(cfg, AuditOptions(trials=TRIALS, variant=variant))
    assert bad.epsilon_lower > bad.epsilon_certified, bad


@pytest.mark.parametrize("sets,match", [
    ({"privacy.placement": "upload"}, "privacy.placement='central'"),
    ({"schedule.name": "crd"}, "open-loop schedule")])
def test_whole_run_audit_refuses_what_it_does_not_cover(sets, match):
  with pytest.raises(ValueError, match=match):
    audit_run(small_config(RUN, **sets), AuditOptions(trials=20))


def test_cli_whole_run_audit(capsys):
  from _helpers import QUICKSTART

  from fedjax_dp import cli
  sets = [x for k, v in {**RUN, "server.client_chunk": 0, "server.clients_per_round": 10}.items()
          for x in ("--set", f"{k}={v}")]
  assert cli.main(["audit", str(QUICKSTART), "--whole-run", "--trials", "40",
                   "--variant", "late_noise_div10", *sets]) == 0
  text = capsys.readouterr().out
  assert "every round of 4" in text and "the run's 4 rounds" in text
