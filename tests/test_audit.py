"""The empirical privacy audit: estimators against closed forms, correct mechanisms stay
below their certificate, deliberately broken ones are caught (the lower bound passes
the certified epsilon), and ``fedjax-dp audit`` rejects bad input in one line."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

pytest.importorskip("jax_privacy")

from _helpers import small_config

from fedjax_dp import cli
from fedjax_dp.audit import AuditOptions, audit, estimators
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.privacy import accounting

TRIALS = 500
# Small and fast: the quickstart's clients with a linear model and 35 examples each (a
# trial's cost is its clients' examples; the canaries' separation is not: the
# sensitivity and the noise calibrated to it scale together with the count).
FAST = {"model.name": "logistic", "rounds": 100, "data.samples_per_client": 35}
CENTRAL = {**FAST, "client.clip_mode": "update_l2", "privacy.placement": "central"}
# Laplace: the audit's canary is then sparse (one input feature), see canary_pair.
LAPLACE = {"privacy.mechanism": "laplace", "client.clip_mode": "per_example_l1"}


def _audit(sets, **options):
  return audit(small_config(FAST, **sets), AuditOptions(trials=TRIALS, **options))


# ----------------------------------------------------------------------------- estimators


def test_clopper_pearson_upper_closed_form():
  # 0 of n: the bound is 1 - alpha^(1/n) exactly.
  np.testing.assert_allclose(estimators.clopper_pearson_upper(np.array([0]), 50, 0.01),
                             1 - 0.01 ** (1 / 50), rtol=1e-9)
  # k of n: P[Binomial(n, ub) <= k] = alpha.
  ub = estimators.clopper_pearson_upper(np.array([7]), 40, 0.05)
  np.testing.assert_allclose(scipy.stats.binom.cdf(7, 40, ub), 0.05, rtol=1e-6)
  assert estimators.clopper_pearson_upper(np.array([40]), 40, 0.05)[0] == 1.0


def test_gdp_estimate_recovers_mu_of_separated_gaussians():
  rng = np.random.default_rng(0)
  mu = 2.0
  ins, outs = rng.normal(mu, 1, 20000), rng.normal(0, 1, 20000)
  est = estimators.epsilon_gdp(ins, outs, 1e-3, 0.05)
  truth = float(accounting.gaussian_epsilon(mu, 1e-3))
  assert 0.8 * truth < est <= truth * 1.02
  # No signal: no epsilon (jax_privacy 2.0.0's epsilon_from_gdp reports one here).
  assert estimators.epsilon_gdp(rng.normal(0.2, 1, 200), rng.normal(0, 1, 200), 1e-3,
                                0.05) == 0.0


def test_lower_bounds_respect_the_true_epsilon():
  # Gaussian scores with mu = 1: the mechanism is exactly 1-GDP.
  rng = np.random.default_rng(1)
  truth = float(accounting.gaussian_epsilon(1.0, 1e-3))
  est = estimators.estimate(rng.normal(1, 1, 2000), rng.normal(0, 1, 2000), 1e-3, 0.05)
  assert 0 < est.clopper_pearson <= truth
  assert est.one_run <= truth


# ----------------------------------------------------------------------------- mechanisms


@pytest.mark.parametrize("sets", [{}, {"server.clients_per_round": 3},
                                  {"privacy.placement": "step"}, CENTRAL,
                                  LAPLACE, {**LAPLACE, "privacy.placement": "step"}],
                         ids=["upload", "upload_3_of_10", "step", "central",
                              "upload_laplace", "step_laplace"])
def test_correct_mechanisms_stay_below_their_certificate(sets):
  r = _audit(sets)
  assert r.epsilon_lower <= r.epsilon_certified
  assert r.epsilon_certified > 0 and r.trials == TRIALS


@pytest.mark.parametrize("sets,variant", [
    ({}, "noise_div10"), ({}, "no_clip"), ({}, "shared_noise_key"),
    ({"privacy.placement": "step"}, "noise_div10"),
    (CENTRAL, "noise_div10"), (CENTRAL, "no_clip"),
    (LAPLACE, "noise_div10"), ({**LAPLACE, "privacy.placement": "step"}, "noise_div10")],
    ids=["upload-noise_div10", "upload-no_clip", "upload-shared_key", "step-noise_div10",
         "central-noise_div10", "central-no_clip", "upload-laplace-noise_div10",
         "step-laplace-noise_div10"])
def test_broken_mechanisms_are_caught(sets, variant):
  r = _audit(sets, variant=variant)
  assert r.epsilon_lower > r.epsilon_certified, r


def _b1_pair_and_params():
  """B1: one client of 100 identical examples x = e_0 (label 1), linear SVM.

  The bias of class 1 (0.266) puts the margin where one full step (eta = 0.5, C = 1)
  lifts it just past 1 (the hinge is inactive in step 2 and nothing moves), while with
  one label replaced by 2 it stays just below 1 and step 2 moves the model by about
  eta * C again: the upload moves by 0.48, not 2 C sum_s eta_s / b = 0.02.
  """
  x = np.zeros((2, 1, 100, 8, 8, 1), np.float32)
  x[..., 0, 0, 0] = 1.0
  y = np.ones((2, 1, 100), np.int32)
  y[0, 0, 0] = 2  # index 0: the 'out' dataset
  pair = FederatedData(x=jnp.asarray(x), y=jnp.asarray(y),
                       counts=jnp.full((2, 1), 100, jnp.int32),
                       mask=jnp.ones((2, 1, 100), jnp.float32))
  bias = np.zeros(10, np.float32)
  bias[1] = 0.266
  params = {"Dense_0": {"kernel": jnp.zeros((64, 10)), "bias": jnp.asarray(bias)}}
  return pair, params


B1 = {"model.name": "linear_svm", "data.num_clients": 1, "server.clients_per_round": 1,
      "data.samples_per_client": 100, "client.local_steps": 2, "client.lr": 0.5,
      "client.clip": 1.0}


def test_b1_multistep_sensitivity_before_the_fix_is_caught():
  pair, params = _b1_pair_and_params()
  cfg = small_config(FAST, **B1)
  # Before the fix: Delta = 2 C (eta_1 + eta_2) / b = 0.02; noise z = 4 on it.
  broken = audit(cfg, AuditOptions(trials=TRIALS, noise_scale=0.08, claimed_sensitivity=0.02),
                 params=params, pair=pair)
  assert broken.epsilon_lower > broken.epsilon_certified, broken
  # The fixed sensitivity 2 C (eta_1 / b + eta_2) = 1.01 certifies the same noise honestly.
  fixed = audit(cfg, AuditOptions(trials=TRIALS, noise_scale=0.08, claimed_sensitivity=1.01),
                params=params, pair=pair)
  assert fixed.epsilon_lower <= fixed.epsilon_certified, fixed


# ----------------------------------------------------------------------------- CLI


# Bad input to ``fedjax-dp audit``: rows of tests/test_bad_input.py.


def test_cli_audit_prints_and_writes(tmp_path, capsys):
  from _helpers import QUICKSTART
  out = tmp_path / "audit.json"
  assert cli.main(["audit", str(QUICKSTART), "--set", "model.name=logistic", "--set",
                   f"data.samples_per_client={FAST['data.samples_per_client']}", "--trials",
                   str(TRIALS), "--no-run-certificate",
                   "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "empirical lower bound" in text and "certified upper bound" in text and "ratio" in text
  import json
  got = json.loads(out.read_text())
  assert got["trials"] == TRIALS and got["epsilon_certified"] > 0


def test_b3_small_poisson_cohort_before_the_fix_is_caught():
  # B3: Poisson selection (q = 0.5) with central noise. Before the fix the plan sized the
  # noise for a cohort of clients_per_round = U = 10 equal clients, Delta = 2 C / 10,
  # while normalized aggregation divides by the realised cohort's total: Poisson can draw
  # the target alone, and then it moves the aggregate by 2 C. The cohort {0} is one such
  # draw; given it the release is not amplified by selection (the audit certifies it with
  # sampling 'full'), so the old sensitivity claim is audited for that draw.
  cfg = small_config(CENTRAL, **{"server.selection": "poisson", "server.q": 0.5,
                                 "server.clients_per_round": 10,
                                 "server.aggregation": "fixed"})
  old = 2 * float(cfg.client.clip) / 10
  broken = audit(cfg, AuditOptions(trials=TRIALS, noise_scale=3 * old,
                                   claimed_sensitivity=old, aggregation="normalized",
                                   cohort=(0,)))
  assert broken.epsilon_lower > broken.epsilon_certified, broken
  # The fix: 'fixed' aggregation divides by the expected total, Delta = 2 C / (q U).
  fixed = audit(cfg, AuditOptions(trials=TRIALS, noise_scale=3 * old, cohort=(0,)))
  np.testing.assert_allclose(fixed.sensitivity, 2 * float(cfg.client.clip) / 5)
  assert fixed.epsilon_lower <= fixed.epsilon_certified, fixed


ROUND_ROBIN = {"server.selection": "round_robin", "server.clients_per_round": 5}
POISSON_FIXED = {**CENTRAL, "server.selection": "poisson", "server.q": 0.5,
                 "server.aggregation": "fixed"}


@pytest.mark.parametrize("sets,broken", [
    (ROUND_ROBIN, "noise_div10"), ({**CENTRAL, **ROUND_ROBIN}, "no_clip"),
    (POISSON_FIXED, "no_clip")],
    ids=["round_robin-upload", "round_robin-central", "poisson-fixed-central"])
def test_reworked_accounting_is_audited(sets, broken):
  # Round robin is accounted per client from the realised cohorts (the audited round as
  # for a client that takes part); Poisson + central noise needs 'fixed' aggregation.
  ok = _audit(sets, certify_run=True)
  assert 0 < ok.epsilon_certified < ok.epsilon_certified_run
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  bad = _audit(sets, variant=broken)
  assert bad.epsilon_lower > bad.epsilon_certified, bad


@pytest.mark.parametrize("options,match", [
    ({"aggregation": "normalized"}, "needs audit.noise_scale"),
    ({"aggregation": "mean", "noise_scale": 1.0, "claimed_sensitivity": 1.0},
     "audit.aggregation: unknown"),
    ({"cohort": (1, 2)}, "must include audit.target")])
def test_bad_audit_options_are_refused(options, match):
  with pytest.raises(ValueError, match=match):
    AuditOptions(**options).validate()


def test_cohort_option_needs_central_placement():
  with pytest.raises(ValueError, match="audit.cohort needs privacy.placement='central'"):
    _audit({}, cohort=(0,))


def test_sparse_canary_concentrates_the_gradient_difference():
  # One canary example, on one feature, flipped between in and out; nothing else changes.
  from fedjax_dp import experiment
  from fedjax_dp.audit.audit import canary_pair
  setup = experiment.build(small_config(FAST, **LAPLACE))
  pair = canary_pair(setup.data, 0, "example", 10, 100.0, sparse=True)
  x = np.asarray(pair.x)
  assert np.count_nonzero(x[1, 0, 0]) == 1 and x[1, 0, 0].flat[0] == 100.0
  np.testing.assert_array_equal(x[0, 0, 0], -x[1, 0, 0])
  np.testing.assert_array_equal(x[0, :, 1:], x[1, :, 1:])  # the rest untouched
  # The target's noiseless uploads differ mostly in one kernel row (num_classes
  # coordinates); the bias differs a little (the logits +-W x differ at a random init).
  import jax

  from fedjax_dp.audit.audit import _clean_fn
  params = setup.model.init(jax.random.PRNGKey(0))
  clean = _clean_fn(setup.model, setup.round_cfg.client)
  lr, clip = np.full(1, 0.5, np.float32), np.float32(1.0)
  count = jnp.float32(pair.counts[0, 0])
  diff = np.asarray(clean(params, pair, 1, jnp.int32(0), lr, clip, count)
                    - clean(params, pair, 0, jnp.int32(0), lr, clip, count))
  mass = np.sort(np.abs(diff))[::-1]
  assert mass[:10].sum() > 0.95 * mass.sum() > 0, mass[:14]


# ----------------------------------------------------------------------------- issue 19 P4
# Every mechanism the validation accepts is auditable, its certificate is the run's own,
# and each mechanism's broken variants are caught by a canary designed for it.

# Expected batch 5 of 35 examples: the sampling rate 1/7 of the quickstart's 20 of 140.
POISSON_MB = {"privacy.placement": "step", "client.minibatch": "poisson",
              "client.batch_size": 5}
PRIVATE_MEDIAN = {**CENTRAL, "server.clip_rule": "private_median",
                  "server.clip_count_std": 100.0}
ADPFL_CLIENTS = {"schedule.name": "adpfl", "schedule.validation": "clients"}


@pytest.mark.parametrize("sets", [
    {**POISSON_MB, "server.clients_per_round": 5}, {**POISSON_MB, "server.selection": "all"},
    PRIVATE_MEDIAN,
    {"server.selection": "wasserstein_topk", "server.clients_per_round": 5},
    {"server.selection": "wasserstein_sample", "server.clients_per_round": 5}],
    ids=["poisson_minibatch-uniform", "poisson_minibatch-all", "private_median",
         "wasserstein_topk", "wasserstein_sample"])
def test_audit_runs_on_the_mechanisms_it_crashed_on(sets):
  r = audit(small_config(FAST, **sets), AuditOptions(trials=100))
  assert 0 < r.epsilon_certified < np.inf
  assert r.epsilon_lower <= r.epsilon_certified, r


@pytest.mark.parametrize("sets", [ADPFL_CLIENTS, PRIVATE_MEDIAN, POISSON_MB, ROUND_ROBIN],
                         ids=["adpfl-validation_clients", "private_median",
                              "poisson_minibatch", "round_robin"])
def test_certificate_is_the_runs_own(sets):
  # The audit's certificates come from the run's own host loop and accountant: the
  # first round's is the run's first metrics row, the run's is its summary (validation
  # score and clip-count releases included). Before, the audit composed its own events
  # and left the validation score out (0.507 per round, 8.000 for the run, against the
  # run's 87.76 on the quickstart with adpfl).
  from fedjax_dp import experiment
  cfg = small_config(FAST, **{"rounds": 3, "progress": False, "checkpoint.every": 0, **sets})
  run = experiment.run(cfg)
  r = audit(cfg, AuditOptions(trials=20, certify_run=True))
  assert r.epsilon_certified == pytest.approx(run.rows[0]["epsilon_certified"], rel=1e-12)
  assert r.epsilon_certified_run == pytest.approx(run.summary["epsilon_certified"], rel=1e-12)


def test_every_accepted_mechanism_is_enumerated_from_the_registries(monkeypatch):
  from fedjax_dp.audit import mechanisms, table
  from fedjax_dp.privacy import selection
  base = small_config(FAST, **{"server.clients_per_round": 5})
  found = list(mechanisms.enumerate_mechanisms(base))
  chosen = mechanisms.covering(found, table.CORE)
  for axis, values in mechanisms.axes().items():
    for value in values:
      if mechanisms.excluded(axis, value) is None and value != "none":
        assert any(m[axis] == value for m in chosen), (axis, value)
  # Noise needs clipping: clip_mode 'none' is refused with every placement that adds it.
  assert not any(m["client.clip_mode"] == "none" for m in found)
  # Every accepted combination of the core axes is audited once.
  core = {tuple(m[a] for a in table.CORE) for m in found}
  assert core == {tuple(m[a] for a in table.CORE) for m in chosen}
  # A new rule in the registry is enumerated without editing the audit.
  monkeypatch.setitem(selection.RULES, "uniform_copy", selection.RULES["uniform"])
  monkeypatch.setattr("fedjax_dp.training.engine.SELECTIONS", tuple(selection.RULES))
  assert any(m["server.selection"] == "uniform_copy"
             for m in mechanisms.enumerate_mechanisms(base))


L1_GEOMETRY = {"data.name": "lending_club", "model.name": "linear_regression",
               "data.samples_per_client": 80, "privacy.mechanism": "laplace",
               "client.clip_mode": "update_l2"}


@pytest.mark.parametrize("sets,variant,trials", [
    ({**POISSON_MB, "server.clients_per_round": 5}, "noise_div10", 2000),
    ({**ADPFL_CLIENTS, "server.clients_per_round": 5}, "noise_div10", 1000),
    # (the quickstart's 140 examples: on 35 one of four audit seeds fell to the certificate)
    ({**LAPLACE, "client.clip_mode": "step_grad_l1", "data.samples_per_client": 140},
     "noise_div10", TRIALS),
    (L1_GEOMETRY, "noise_div10", 4000), (L1_GEOMETRY, "no_clip", TRIALS)],
    ids=["poisson_minibatch", "validation_clients", "laplace-step_grad_l1",
         "laplace-update_l2-noise_div10", "laplace-update_l2-no_clip"])
def test_broken_variants_are_caught_by_the_mechanisms_canary(sets, variant, trials):
  # Poisson minibatches: an add/remove canary on an input feature no other example
  # uses, attacked on its own coordinates (inclusion-aware: only the trials that
  # sample it move them). Validation score: a canary the initial model classifies
  # correctly in and wrongly out, attacked through the released score. Laplace: one
  # coordinate carries the pair's whole L1 difference.
  cfg = small_config(FAST, **sets)
  ok = audit(cfg, AuditOptions(trials=trials))
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  bad = audit(cfg, AuditOptions(trials=trials, variant=variant))
  assert bad.epsilon_lower > bad.epsilon_certified, bad


CORRELATED = {**CENTRAL, "server.selection": "round_robin", "server.clients_per_round": 5}


@pytest.mark.slow
@pytest.mark.parametrize("mechanism,sets", [
    ("tree", {}), ("bandmf", {}),
    ("bandmf", {"server.selection": "cyclic_poisson", "server.q": 0.5,
                "server.aggregation": "fixed"})],
    ids=["tree", "bandmf", "bandmf-cyclic_poisson"])
def test_correlated_mechanisms_are_audited(mechanism, sets):
  # Round 0 of tree aggregation / BandMF (privacy.mechanism): the certificate after it
  # is the run's accountant (the matrix sensitivity of round 0's column, s^2 = |M_00|);
  # a tenth of the noise is caught. Half the trials do not select the target (round
  # robin, 5 of 10), hence more trials than the central Gaussian's. Amplified BandMF
  # (cyclic_poisson, P = 2, q = 0.5): round 0 is one Poisson-subsampled Gaussian of the
  # target's group, which a quarter of the trials draw (its group is round 0's in half
  # of the trials' orders, then the coin); the draw stays hidden from the adversary.
  # Under a hidden draw the other clients' random cohort hides a tenth of the noise
  # from this attack (as for the poisson rule, test_reworked_accounting_is_audited): the
  # amplified certificate is audited with the draw hidden and a missing clip caught
  # there, and noise/10 is caught with the cohort known (certified unamplified).
  cfg = small_config(FAST, **{**CORRELATED, "privacy.mechanism": mechanism, **sets})
  ok = audit(cfg, AuditOptions(trials=TRIALS))
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  known = {} if not sets else {"cohort": (0,)}
  # (in calls of TRIALS lanes: the program compiled for `ok` runs them)
  bad = audit(cfg, AuditOptions(trials=2000, variant="noise_div10", lanes_per_call=TRIALS,
                                **known))
  assert bad.epsilon_lower > bad.epsilon_certified, bad
  if sets:
    bad = audit(cfg, AuditOptions(trials=TRIALS, variant="no_clip"))
    assert bad.epsilon_lower > bad.epsilon_certified, bad
