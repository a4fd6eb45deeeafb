"""A clip mode and a selection rule added by the recipes alone (docs/architecture.md).

Each is one object registered at run time (``monkeypatch.setitem`` on the registry, as
the recipe's registry line), with no edit anywhere else, and runs through the config's
validation, the privacy plan, the sensitivity harness (``tests/test_sensitivity.py``),
the catalog (``fedjax-dp list``) and the audit, which must reach the certified bound's
order and catch a tenth of the noise:

* ``update_linf``: the client's update clipped to L-infinity norm C. The upload lies in
  the cube of half-width C around the shared global model, so two neighbours differ
  by at most 2 C in every coordinate: the L2 sensitivity is ``2 C sqrt(d)``. Its
  canary (:attr:`Canary.input` ``dense_input``, a label flip) puts the two canaries'
  updates at opposite corners of the cube, which reaches that bound.
* ``stratified``: the U clients are cut into K strata of U / K (ids in order); each
  round draws one client of each stratum uniformly, independently of the data. A
  client's marginal selection probability is K / U every round, which is what the
  example-level selection bound charges (it holds for any law with that marginal);
  at client level the client's stratum is a fixed-size draw of 1 of U / K (the other
  strata are independent of its data), charged by the WBK19 bound.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import small_config
from test_sensitivity import N, _cfg, _upload_moves, central_moves

from fedjax_dp import catalog
from fedjax_dp import config as config_lib
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import clip_modes, clipping, selection
from fedjax_dp.privacy.clip_modes import base as clip_base
from fedjax_dp.privacy.selection import base as selection_base

D_HARNESS = 6  # parameters of the harness's 2-feature, 2-class linear SVM


# ----------------------------------------------------------------------------- the mode


def _clip_update_linf(params, global_params, clip):
  """``(w_global + clip_C(w_local - w_global) in L-infinity, ||w_local - w_global||_inf)``."""
  delta = jax.tree_util.tree_map(jnp.subtract, params, global_params)
  delta, norm = clipping.clip_by_norm(delta, clip, ord=math.inf)
  return jax.tree_util.tree_map(jnp.add, global_params, delta), norm


def _linf_sensitivity(placement, inputs):
  """Replace-one (any data): two points of the cube of half-width C around the shared
  global model differ by at most 2 C in each of the d coordinates: ``2 C sqrt(d)`` in
  L2. Needs d."""
  if inputs.num_params is None:
    raise ValueError("client.clip_mode='update_linf' needs the model's parameter count")
  return np.full(inputs.num_clients, 2.0 * inputs.clip * math.sqrt(inputs.num_params))


LINF = clip_modes.ClipMode(
    name="update_linf", summary="the client's update clipped to L-infinity norm C (a test)",
    client=clip_modes.ClientHooks(clip_base.plain_grad, after_local=_clip_update_linf),
    proof=clip_modes.Proof(_linf_sensitivity, placements=("upload",)),
    canary=clip_modes.Canary(input=clip_base.dense_input, flip_input=False,
                             example_scale=1.0))


# ----------------------------------------------------------------------------- the rule


def _stratified(u, k, q, seed, t, weights=None):
  """One client of each of the K strata ``[s U/K, (s+1) U/K)``, uniformly, from the
  round's stream ``rng[seed, t]`` alone."""
  size = u // k
  return np.sort(np.arange(k) * size + np.random.default_rng([seed, t]).integers(0, size, k))


def _check_strata(inputs):
  """K strata of equal size: ``1 <= K <= U`` and K divides U."""
  selection_base.check_cohort(inputs)
  u, k = inputs.federation.num_clients, inputs.server.clients_per_round
  if u % k:
    raise ConfigError(f"server.selection='stratified' needs server.clients_per_round (K={k}) "
                      f"to divide data.num_clients (U={u})")


def _strata_sampling(level, u, k, q):
  if level == "example":
    return {"sampling": "selection", "q": k / u}
  return {"sampling": "fixed_size", "population": u // k, "sample_size": 1}


STRATIFIED = selection.SelectionRule(
    sample=_stratified, slots=lambda u, k, q: k, q=lambda u, k, q: k / u,
    deterministic=False, sampling=_strata_sampling,
    max_participations=lambda u, k, q, t: t, min_cohort=lambda u, k, q: k,
    check=_check_strata, summary="one client of each of K equal strata, uniformly (a test)")


@pytest.fixture
def recipe(monkeypatch):
  """Both registered by their registry lines alone, for one test."""
  monkeypatch.setitem(clip_modes.CLIP_MODES, LINF.name, LINF)
  monkeypatch.setitem(selection.RULES, "stratified", STRATIFIED)


# ----------------------------------------------------------------------------- tests


def test_the_linf_mode_runs_through_config_plan_and_harness(recipe):
  lr, clip, steps = 0.5, 1.0, 2
  sets = {"client.clip_mode": LINF.name, "client.local_steps": steps, "client.lr": lr,
          "client.clip": clip, "data.num_clients": 1, "server.clients_per_round": 1}
  cfg = _cfg(**sets)
  config_lib.validate(cfg)  # the config's choices read the live registry
  plan = plan_from_config(cfg, np.array([N]), num_params=D_HARNESS)
  np.testing.assert_allclose(plan.sensitivity, 2 * clip * math.sqrt(D_HARNESS))
  assert plan.level == "example"
  d = _upload_moves(cfg, steps, lr, clip, 2, seed=12)
  assert np.all(d <= plan.sensitivity[0] * (1 + 1e-5)), (d.max(), plan.sensitivity[0])
  # Not vacuous (the harness's generic pairs; the canary below reaches the diagonal).
  assert d.max() > 0.25 * plan.sensitivity[0]
  with pytest.raises(ValueError, match="parameter count"):
    plan_from_config(cfg, np.array([N]))
  with pytest.raises(ValueError, match="privacy.mechanism='laplace'"):
    plan_from_config(_cfg(**sets, **{"privacy.mechanism": "laplace"}), np.array([N]),
                     num_params=D_HARNESS)
  with pytest.raises(ValueError, match="client.clip_mode"):
    plan_from_config(_cfg(**sets, **{"privacy.placement": "central"}), np.array([N]),
                     num_params=D_HARNESS)


def test_the_stratified_rule_runs_through_config_plan_and_harness(recipe):
  cfg = _cfg(**{"data.num_clients": 8, "server.selection": "stratified",
                "server.clients_per_round": 4})
  config_lib.validate(cfg)
  plan = plan_from_config(cfg, np.full(8, N))
  assert plan.q == 0.5 and plan.event(np.ones(8)).sampling == "selection"
  ids = [selection.select_clients("stratified", 8, 4, 0.0, 3, t)[0] for t in range(200)]
  assert all(np.array_equal(i // 2, np.arange(4)) for i in ids)  # one per stratum
  np.testing.assert_allclose(np.bincount(np.concatenate(ids), minlength=8) / 200, 0.5,
                             atol=0.1)
  with pytest.raises(ConfigError, match="divide data.num_clients"):
    config_lib.validate(_cfg(**{"data.num_clients": 8, "server.selection": "stratified",
                                "server.clients_per_round": 3}))
  # Central noise: the client-level event, and the normalized aggregate's sensitivity
  # over the cohorts the rule draws.
  central = {"privacy.placement": "central", "client.clip_mode": "update_l2"}
  event = plan_from_config(_cfg(**{"data.num_clients": 8, "server.selection": "stratified",
                                   "server.clients_per_round": 4, **central}),
                           np.full(8, N)).event(np.ones(8))
  assert (event.sampling, event.population, event.sample_size) == ("fixed_size", 2, 1)
  worst, sens = central_moves("update_l2", "stratified", "normalized", 4, 0.0)
  assert 0.0 < worst <= sens * (1 + 1e-5), (worst, sens)


def test_the_catalog_lists_both_from_their_own_summaries(recipe):
  text = catalog.text()
  assert f"\n  update_linf: {LINF.summary}" in text
  assert f"\n  stratified: {STRATIFIED.summary}" in text


# The audit's setting: a linear model of two classes, so a label flip turns the sign of
# every coordinate of the gradient; one round, so its certificate is the run's.
AUDIT = {"model.name": "logistic", "data.name": "digits_odd_even", "rounds": 1,
         "privacy.epsilon": 2.0}
AUDIT_TRIALS = 300
# One example per client: the canary is the client's whole update, which the clip
# scales to a corner of the cube (it binds: lr p > C).
LINF_AUDIT = {"client.clip_mode": "update_linf", "client.clip": 0.01,
              "data.samples_per_client": 1}


def test_the_linf_canary_reaches_the_cube_diagonal(recipe):
  """The mode's canary (its ``Canary`` record alone) makes the two noiseless uploads
  opposite corners of the cube: their distance is the certified sensitivity."""
  from fedjax_dp import experiment
  from fedjax_dp.audit.audit import canary_pair
  from fedjax_dp.training import client as client_lib

  cfg = small_config(AUDIT, **LINF_AUDIT)
  setup = experiment.build(cfg)
  c = LINF.canary
  pair = canary_pair(setup.data, 0, "example", setup.model.num_classes, c.example_scale,
                     flip_input=c.flip_input, input_fn=c.input)
  params = setup.model.init(jax.random.PRNGKey(int(cfg.seed)))
  quiet = dataclasses.replace(setup.round_cfg.client, noise_placement="none")
  hp = client_lib.ClientHParams(jnp.full((1,), float(cfg.client.lr)),
                                jnp.float32(cfg.client.clip), 0.0, 0.0)

  def upload(bit):
    d = jax.tree_util.tree_map(lambda a: a[bit, 0], pair)
    return client_lib.client_update(setup.model, quiet, params, d.x, d.y, d.mask,
                                    jax.random.PRNGKey(0), hp).params

  dist = float(clipping.tree_norm(jax.tree_util.tree_map(jnp.subtract, upload(1),
                                                           upload(0))))
  sens = float(setup.privacy.sensitivity[0])
  assert 0.999 * sens <= dist <= sens * (1 + 1e-5), (dist, sens)


@pytest.mark.parametrize("sets", [
    LINF_AUDIT,
    # Half the trials do not select the target (q = 1/2): a smaller epsilon, so that a
    # tenth of the noise separates the trials that do beyond the certificate.
    {"server.selection": "stratified", "server.clients_per_round": 5,
     "privacy.epsilon": 1.0}],
    ids=["update_linf", "stratified"])
def test_the_audit_stays_below_the_bound_and_catches_a_tenth_of_the_noise(recipe, sets):
  pytest.importorskip("jax_privacy")
  from fedjax_dp.audit import AuditOptions, audit

  cfg = small_config(AUDIT, **sets)
  ok = audit(cfg, AuditOptions(trials=AUDIT_TRIALS))
  assert ok.epsilon_lower <= ok.epsilon_certified, ok
  bad = audit(cfg, AuditOptions(trials=AUDIT_TRIALS, variant="noise_div10"))
  assert bad.epsilon_lower > bad.epsilon_certified, bad
