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

# Four rounds of every client, epsilon 2 for the whole run: a certificate a broken
# run's separated trials pass with 500 trials (a perfect attack reaches about 3.7; the
# broken variants here read 2.5-3.7 at seeds 0 and 1, the correct runs 0.0-0.3).
# 20 examples per client: a trial's cost is its clients' examples, while the canary
# (all of the target's examples, on a feature no other example uses) and the
# calibrated noise, both relative to the clip, do not depend on the count.
RUN = {"model.name": "logistic", "client.clip_mode": "update_l2",
       "privacy.placement": "central", "rounds": 4, "privacy.epsilon": 2.0,
       "data.samples_per_client": 20}
TRIALS = 500


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
    ({"server.clip_rule": "median"}, "certified epsilon inf"),
    ({"schedule.name": "crd"}, "open-loop schedule"),
    ({"privacy.placement": "none"}, "adds no noise")])
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


def test_whole_run_audit_of_upload_noise_sees_the_target_s_upload_every_round():
  """Upload placement: the release is every selected client's noisy upload; the canary
  is one example (per-example clipping: example-level adjacency), observed in the
  target's upload of each round. The correct run stays below its certificate, a late
  fault is caught."""
  # 10 examples per client (a trial's cost): the canary is one example at the clip
  # either way; the late fault reads 3.04 and 3.20 at seeds 0 and 1, correct 0.10, 0.01.
  cfg = small_config(RUN, **{"client.clip_mode": "per_example_l2",
                             "privacy.placement": "upload", "server.selection": "uniform",
                             "server.clients_per_round": 10, "data.samples_per_client": 10})
  ok = audit_run(cfg, AuditOptions(trials=TRIALS))
  assert ok.level == "example" and ok.placement == "upload", ok
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  late = audit_run(cfg, AuditOptions(trials=TRIALS, variant="late_noise_div10"))
  assert late.epsilon_lower > late.epsilon_certified, late


@pytest.mark.parametrize("cohort,variant", [(10, "noise_div10"), (5, "no_clip")])
def test_whole_run_audit_of_a_closed_loop_plans_each_trial_from_its_releases(cohort, variant):
  """The private median's clip bound follows each trial's released noisy count: every
  lane is planned by its own server state; the broken variant is caught, the correct
  run is not.

  Five of ten clients per round (a hidden cohort: central noise, uniform rule): the
  count noise (std 100 against a cohort of 5) moves S_t by factors of 10^3, and
  no_clip releases the canary's unclipped update under noise scaled to a tiny S_t in
  some trials' rounds. The projection attack weighs a round that left the target out
  by the same 1 / sigma^2, so those rounds' noise drowned the evidence (1.33 and 1.00
  at seeds 0 and 1, against 2.0); the exact mixture ratio
  (whole_run.mixture_scores) reads 2.55 and 2.33, the correct run 0.00 and 0.00."""
  cfg = small_config(RUN, **{"server.selection": "uniform", "server.clients_per_round": cohort,
                             "server.clip_rule": "private_median",
                             "server.clip_count_std": 100.0})
  ok = audit_run(cfg, AuditOptions(trials=TRIALS))
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  bad = audit_run(cfg, AuditOptions(trials=TRIALS, variant=variant))
  assert bad.epsilon_lower > bad.epsilon_certified, bad


def test_mixture_scores_are_the_likelihood_ratio_and_ignore_a_left_out_round_s_noise():
  """With the target in every round (q = 1) the mixture ratio is the projection
  ``gain <x, m> / sigma^2``; a round that leaves it out (x = rest + noise) scores
  about 0 however small its noise, where the projection grows as 1 / sigma."""
  import numpy as np

  from fedjax_dp.audit.whole_run import Releases, mixture_scores
  rng = np.random.default_rng(0)
  n, t, d, gain = 400, 3, 5, 0.2
  m = rng.normal(size=(n, t, d))
  rest = 0.3 * gain * m
  sigma = np.array([1.0, 1e-3, 1e-6])[None].repeat(n, 0)
  x = rng.normal(size=(n, t, d)) * sigma[:, :, None]
  seen = np.ones((n, t), bool)
  full = mixture_scores(Releases(x, m, rest, seen, sigma, gain), np.ones(t))
  np.testing.assert_allclose(full, gain * np.sum(x * m, 2) / sigma ** 2, rtol=1e-6)
  absent = mixture_scores(Releases(x + rest, m, rest, seen, sigma, gain), np.full(t, 0.5))
  projected = np.abs(np.sum((x + rest) * m, 2)) / sigma ** 2
  assert np.all(np.abs(absent[:, 1:]) < 1e-6) and np.all(projected[:, 1:] > 1e3), absent
  inside = mixture_scores(Releases(x + 0.5 * gain * m, m, rest, seen, sigma, gain),
                          np.full(t, 0.5))
  assert np.all(inside[:, 1:] > 0), inside  # drawn and in: far above any left-out round
  never = mixture_scores(Releases(x, m, rest, seen, sigma, gain), np.zeros(t))
  assert np.all(never == 0.0)


def test_lane_plans_equal_the_shared_plan_and_follow_their_own_counts():
  """The per-lane host (closed loops) plans an open-loop run as the shared plan does,
  lane by lane; under the private median each lane's next clip bound follows its own
  released count (server.next_clip), not another lane's."""
  import numpy as np

  from fedjax_dp import experiment
  from fedjax_dp.audit import run_host
  from fedjax_dp.host import server

  seeds, bits = np.asarray([3, 4, 5], np.uint32), np.asarray([0, 1, 0], np.int32)
  cfg = small_config(RUN, **{"server.selection": "uniform", "server.clients_per_round": 5})
  setup = experiment.build(cfg)
  shared = run_host.SharedPlan(cfg, setup, seeds, bits, "none")
  lanes = run_host.LanePlans(cfg, setup, seeds, bits, "none")
  zero = {"train_loss": np.zeros(3), "grad_norm": np.zeros(3), "update_norm": np.zeros(3),
          "num_selected": np.full(3, 5)}
  for t in range(shared.num_rounds):
    a, b = shared.plan(t), lanes.plan(t)
    for f in ("idx", "sel_mask", "lr", "clip", "noise", "central_noise", "seed", "data_id"):
      np.testing.assert_array_equal(getattr(a.args, f), getattr(b.args, f), err_msg=f)
    lanes.record(t, zero, np.zeros(3))
  assert lanes.certified_epsilon() == pytest.approx(shared.certified_epsilon())

  cfg = small_config(RUN, **{"server.selection": "uniform", "server.clients_per_round": 10,
                             "server.clip_rule": "private_median",
                             "server.clip_count_std": 100.0})
  setup = experiment.build(cfg)
  lanes = run_host.LanePlans(cfg, setup, seeds, bits, "none")
  first = lanes.plan(0)
  counts = np.asarray([0.0, 5.0, 10.0])
  lanes.record(0, {**zero, "clip_bound": first.args.clip, "clip_count": counts}, np.zeros(3))
  second = lanes.plan(1)
  clips = second.args.clip
  spec = lanes.specs[0]
  want = [server.next_clip(spec, float(first.args.clip[i]), counts[i]) for i in range(3)]
  np.testing.assert_allclose(clips, want, rtol=1e-6)
  assert len(set(np.round(clips, 6))) == 3
  # The attack weighs each lane's round by the noise its sum gets: the private median
  # scales it with the lane's bound S_t and gives part of the multiplier to the count
  # (before: the plan's multiplier times the base clip, the same for every lane).
  for r in (first, second):
    np.testing.assert_allclose(r.sigma, np.broadcast_to(
        np.asarray(r.args.central_noise)[:, None], r.sigma.shape), rtol=1e-6)
  np.testing.assert_allclose(second.sigma[:, 0] / second.sigma[0, 0],
                             clips / clips[0], rtol=1e-5)


def test_a_deterministic_top_k_rule_puts_the_canary_on_a_client_it_selects():
  """Wasserstein top-K never selects client 0 here: the canary goes to the first client
  round 1 selects, so the attack sees it (before: client 0, a lower bound of 0 for every
  broken variant)."""
  import numpy as np

  from fedjax_dp import experiment
  from fedjax_dp.audit import run_host, whole_run
  from fedjax_dp.host import server

  cfg = small_config(RUN, **{"server.selection": "wasserstein_topk",
                             "server.clients_per_round": 5})
  setup = experiment.build(cfg)
  target = whole_run._target(cfg, setup, AuditOptions())  # pylint: disable=protected-access
  spec = run_host.spec_of(cfg, setup)
  for t in range(int(cfg.rounds)):
    idx, sel = server.cohort(spec, t)
    assert target in set(np.asarray(idx)[np.asarray(sel) > 0].tolist())


def test_a_variants_threshold_never_becomes_the_next_planned_bound():
  """no_clip hands the engine the threshold NO_CLIP, which the device reports as the
  round's bound: the lane records the bound it planned, so the private median's next
  bound (and the noise scaled with it) is the correct run's (before: 1e6 times the
  update, every later round drowned in noise and no_clip read 1.7 at 16000 trials)."""
  import numpy as np

  from fedjax_dp import experiment
  from fedjax_dp.audit import run_host
  from fedjax_dp.host import server

  cfg = small_config(RUN, **{"server.selection": "uniform", "server.clients_per_round": 10,
                             "server.clip_rule": "private_median",
                             "server.clip_count_std": 100.0})
  setup = experiment.build(cfg)
  seeds, bits = np.asarray([3, 4], np.uint32), np.asarray([0, 1], np.int32)
  ok = run_host.LanePlans(cfg, setup, seeds, bits, "none")
  bad = run_host.LanePlans(cfg, setup, seeds, bits, "no_clip")
  counts = np.asarray([4.0, 9.0])
  zero = {"train_loss": np.zeros(2), "grad_norm": np.zeros(2), "update_norm": np.zeros(2),
          "num_selected": np.full(2, 10)}
  for lanes in (ok, bad):
    first = lanes.plan(0)  # the device reports the threshold it got as the bound
    lanes.record(0, {**zero, "clip_bound": first.args.clip, "clip_count": counts}, np.zeros(2))
  good, broken = ok.plan(1), bad.plan(1)
  want = [server.next_clip(ok.specs[0], float(cfg.client.clip), c) for c in counts]
  np.testing.assert_allclose(good.args.clip, want, rtol=1e-6)
  assert np.all(broken.args.clip == run_host.NO_CLIP)  # the fault itself
  np.testing.assert_allclose(broken.sigma, good.sigma, rtol=1e-6)
  np.testing.assert_allclose(broken.args.central_noise, good.args.central_noise, rtol=1e-6)
