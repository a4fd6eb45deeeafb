"""Membership-inference attacks: metrics, the DP bound, known-answer attacks, plumbing."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import small_config

from fedjax_dp.attacks import bounds, metrics, mia

# ----------------------------------------------------------------------------- metrics


def test_auc_and_best_threshold_on_known_scores():
  assert metrics.auc([2, 3, 4], [0, 1]) == 1.0
  assert metrics.auc([0, 1], [2, 3, 4]) == 0.0
  assert metrics.auc([1, 1], [1, 1]) == 0.5
  assert metrics.auc([0, 2], [1, 1]) == 0.5
  thr, adv = metrics.best_threshold([2, 3, 4], [0, 1])
  assert 1 < thr <= 2 and adv == 1.0
  res = metrics.evaluate(thr, [2, 3, 4], [0, 1], held_out=False)
  assert res.accuracy == 1.0 and res.tpr == 1.0 and res.fpr == 0.0
  assert not res.threshold_held_out
  # A threshold chosen elsewhere is applied as is, the oracle reported beside it.
  res = metrics.evaluate(3.5, [2, 3, 4], [0, 1], held_out=True)
  assert res.tpr == pytest.approx(1 / 3) and res.best_accuracy == 1.0
  with pytest.raises(ValueError, match="NaN"):
    metrics.auc([np.nan], [1.0])


def test_calibrated_threshold_uses_only_the_calibration_split():
  # Calibration says "members score >= 5"; on the evaluation split that rule is wrong,
  # and the held-out accuracy shows it while the oracle (in-sample) accuracy does not.
  res = metrics.calibrated([6, 7, 8], [0, 1, 2], [1, 2, 3], [-3, -2, -1])
  assert res.threshold_held_out and 3 < res.threshold < 6
  assert res.accuracy == 0.5 and res.best_accuracy == 1.0


def test_auc_matches_sklearn_with_ties():
  from sklearn.metrics import roc_auc_score

  rng = np.random.default_rng(1)
  a, b = rng.integers(0, 6, 50), rng.integers(0, 5, 70)
  want = roc_auc_score(np.r_[np.ones(50), np.zeros(70)], np.r_[a, b])
  assert metrics.auc(a, b) == pytest.approx(want)


def test_best_threshold_matches_exhaustive_search():
  rng = np.random.default_rng(0)
  a, b = rng.normal(0.5, 1, 37).round(1), rng.normal(0, 1, 41).round(1)
  _, adv = metrics.best_threshold(a, b)
  want = max(np.mean(a >= t) - np.mean(b >= t) for t in np.concatenate([a, b, [np.inf]]))
  assert adv == pytest.approx(want)


# ----------------------------------------------------------------------------- DP bound


def _region_max_advantage(eps, delta, n=1001):
  """Brute force over a grid of (FPR, TPR) points: the largest TPR - FPR among points
  satisfying all four (eps, delta)-DP testing constraints (Kairouz et al. 2015)."""
  g = np.linspace(0, 1, n)
  fpr, tpr = np.meshgrid(g, g, indexing="ij")
  e = math.exp(eps)
  alpha, beta = fpr, 1 - tpr  # type I and type II errors of the test "member"
  tol = 1e-12
  ok = ((alpha + e * beta >= 1 - delta - tol) & (e * alpha + beta >= 1 - delta - tol)
        & (1 - alpha + e * (1 - beta) >= 1 - delta - tol)
        & (e * (1 - alpha) + 1 - beta >= 1 - delta - tol))
  return float(np.max(np.where(ok, tpr - fpr, -1)))


@pytest.mark.parametrize("eps,delta", [(0.0, 0.0), (0.1, 0.0), (0.5, 1e-3), (1.0, 0.05),
                                       (2.0, 1e-5), (3.0, 0.2), (5.0, 1e-3)])
def test_advantage_bound_is_the_max_over_the_dp_region(eps, delta):
  bound = bounds.advantage_bound(eps, delta)
  assert bound == pytest.approx((math.exp(eps) - 1 + 2 * delta) / (math.exp(eps) + 1))
  brute = _region_max_advantage(eps, delta)
  assert brute <= bound + 1e-9            # no feasible point beats it
  assert brute >= bound - 2e-3            # and the grid gets within its spacing of it
  # The region's upper edge attains it (at FPR = (1 - delta) / (e^eps + 1)).
  fpr = np.linspace(0, 1, 20001)
  assert np.max(bounds.max_tpr(fpr, eps, delta) - fpr) == pytest.approx(bound, abs=1e-4)
  assert bounds.accuracy_bound(eps, delta) == pytest.approx(0.5 + bound / 2)


def test_advantage_bound_edges_and_real_mechanisms():
  assert bounds.advantage_bound(math.inf, 1e-3) == 1.0
  assert bounds.advantage_bound(800.0, 0.0) == 1.0
  assert bounds.advantage_bound(0.0, 0.0) == 0.0
  np.testing.assert_allclose(bounds.advantage_bound(np.array([0.0, 1.0]), 0.0),
                             [0.0, math.tanh(0.5)])
  with pytest.raises(ValueError, match="epsilon"):
    bounds.advantage_bound(-1.0)
  with pytest.raises(ValueError, match="delta"):
    bounds.advantage_bound(1.0, 1.5)
  # Randomized response (truth w.p. e^eps / (1 + e^eps)) is eps-DP and attains it.
  for eps in (0.3, 1.0, 4.0):
    p = math.exp(eps) / (1 + math.exp(eps))
    assert 2 * p - 1 == pytest.approx(bounds.advantage_bound(eps, 0.0))
  # Gaussian mechanism, sensitivity 1, std s: the best test's advantage is
  # 2 Phi(1 / (2 s)) - 1; it is (eps, delta(eps))-DP with Balle & Wang's exact delta.
  phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))
  for s in (0.5, 1.0, 3.0):
    adv = 2 * phi(1 / (2 * s)) - 1
    for eps in (0.1, 0.5, 1.0, 2.0):
      delta = phi(1 / (2 * s) - eps * s) - math.exp(eps) * phi(-1 / (2 * s) - eps * s)
      assert adv <= bounds.advantage_bound(eps, max(delta, 0.0)) + 1e-12


# ----------------------------------------------------------------------------- known answers

N_POOL, DIM, CLASSES = 600, 32, 4


def _pool(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(N_POOL, DIM)).astype(np.float32)
  y = rng.integers(0, CLASSES, N_POOL).astype(np.int32)
  return x, y


def _lookup_apply(params, x):
  """A model that memorises its members: logit 20 on a stored record's label when x is
  one of its stored records, uniform logits otherwise."""
  mem_x, mem_y = params
  d = jnp.sum((x[:, None, :] - mem_x[None]) ** 2, axis=-1)        # [n, m]
  hit = jnp.min(d, axis=1) < 1e-6
  label = mem_y[jnp.argmin(d, axis=1)]
  return jnp.where(hit[:, None], 20.0 * jax.nn.one_hot(label, CLASSES), 0.0)


def test_loss_threshold_attack_on_a_memorising_model_is_perfect():
  x, y = _pool()
  members = np.arange(300)
  params = (jnp.asarray(x[members]), jnp.asarray(y[members]))
  loss = mia.per_example_loss(_lookup_apply, params, x, y, batch_size=128)
  res = mia.loss_threshold_attack(loss[:300], loss[300:], seed=1)
  assert res.threshold_held_out
  assert res.num_members == res.num_nonmembers == 150
  assert res.accuracy == 1.0 and res.advantage == 1.0 and res.auc == 1.0


def test_loss_threshold_attack_on_an_independent_model_is_chance():
  x, y = _pool(1)
  # Trained on other data (here: a fixed random linear model): membership is invisible.
  w = jax.random.normal(jax.random.PRNGKey(0), (DIM, CLASSES))
  loss = mia.per_example_loss(lambda p, xx: xx @ p, w, x, y)
  res = mia.loss_threshold_attack(loss[:300], loss[300:], seed=2)
  n = res.num_members
  # Accuracy = (TPR + 1 - FPR) / 2 has variance <= 1 / (8 n) at a fixed threshold.
  assert abs(res.accuracy - 0.5) < 4 / math.sqrt(8 * n)
  assert abs(res.auc - 0.5) < 4 * math.sqrt((2 * n + 1) / (12 * n * n))


def test_balanced_split_is_disjoint_and_balanced():
  s = mia.balanced_split(np.arange(100), np.arange(100, 130), calibration_fraction=0.5,
                         seed=3)
  assert len(s.calib_members) == len(s.calib_nonmembers) == 15
  assert len(s.eval_members) == len(s.eval_nonmembers) == 15
  allm = np.concatenate([s.calib_members, s.eval_members])
  assert len(np.unique(allm)) == 30 and allm.max() < 100
  assert np.intersect1d(s.calib_nonmembers, s.eval_nonmembers).size == 0
  with pytest.raises(ValueError, match="calibration_fraction"):
    mia.balanced_split(np.arange(4), np.arange(4), calibration_fraction=1.0)
  with pytest.raises(ValueError, match="too few"):
    mia.balanced_split(np.arange(4), np.arange(0), calibration_fraction=0.5)


# ----------------------------------------------------------------------------- shadow attack


def _linear_apply(params, x):
  return x @ params["w"] + params["b"]


def _train_linear(seed, x, y):
  """Full-batch GD on a linear softmax model: 132 parameters memorise 40 random points."""
  key = jax.random.PRNGKey(seed)
  p = {"w": 0.01 * jax.random.normal(key, (DIM, CLASSES)), "b": jnp.zeros(CLASSES)}

  def loss(p):
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(_linear_apply(p, x)),
                                         y[:, None], axis=1))

  def step(p, _):
    return jax.tree_util.tree_map(lambda a, g: a - 2.0 * g, p, jax.grad(loss)(p)), None

  return jax.lax.scan(step, p, None, length=300)[0]


def test_shadow_attack_batched_equals_loop_and_detects_memorisation():
  x, y = _pool(2)
  pool_x, pool_y = x[:400], y[:400]           # the attacker's data
  target_x, target_y = x[400:440], y[400:440]  # the target's 40 members
  out_x, out_y = x[440:480], y[440:480]        # 40 non-members
  kw = {"num_shadow": 3, "seed": 5}
  batched = mia.train_shadow_attack(_linear_apply, mia.vectorize(_train_linear), pool_x,
                                    pool_y, 40, batched=True, **kw)
  looped = mia.train_shadow_attack(_linear_apply, jax.jit(_train_linear), pool_x, pool_y,
                                   40, **kw)
  assert batched.num_shadow == 3 and batched.per_class and len(batched.models) == CLASSES
  lp = mia.log_probs(_linear_apply, _train_linear(7, target_x, target_y), x)
  np.testing.assert_allclose(batched.predict(lp, y), looped.predict(lp, y), atol=1e-4)
  target = jax.jit(_train_linear)(7, target_x, target_y)
  res = mia.shadow_attack(batched, _linear_apply, target, target_x, target_y, out_x, out_y)
  assert res.threshold_held_out and res.num_members == 40
  assert res.accuracy > 0.85 and res.auc > 0.9
  single = mia.train_shadow_attack(_linear_apply, mia.vectorize(_train_linear), pool_x,
                                   pool_y, 40, batched=True, per_class=False, **kw)
  assert list(single.models) == [-1]
  assert mia.shadow_attack(single, _linear_apply, target, target_x, target_y, out_x,
                           out_y).accuracy > 0.85
  with pytest.raises(ValueError, match="train_size"):
    mia.train_shadow_attack(_linear_apply, _train_linear, pool_x, pool_y, 400)


def test_reference_stats_on_hand_made_logits():
  # 3 shadow models x 4 records; shadow s trained on record s (record 3: none).
  logit = np.array([[9.0, 1.0, 2.0, 0.0],
                    [3.0, 9.0, 4.0, 2.0],
                    [5.0, 3.0, 9.0, 4.0]])
  ref = mia.reference_stats(logit, np.array([[0], [1], [2]]))
  np.testing.assert_array_equal(ref.out_count, [2, 2, 2, 3])
  np.testing.assert_allclose(ref.out_mean, [4.0, 2.0, 3.0, 2.0])
  # Pooled deviations: (+-1) x 6 and (-2, 0, 2); dof = 1 + 1 + 1 + 2.
  assert ref.out_std == pytest.approx(math.sqrt((6 + 8) / 5))
  ins_all = np.array([[0, 1, 2, 3]] * 3)
  assert np.isnan(mia.reference_stats(logit, ins_all).out_mean).all()


def test_reference_attack_detects_memorisation_and_scores_unseen_records_zero():
  x, y = _pool(2)
  # The attacker's pool holds the candidates (LiRA's setting): 480 records, shadows on
  # 40 each; the target trains on records 400..439, records 440..479 are out.
  ins, seeds = mia.shadow_draws(480, 40, 4, 5)
  assert ins.shape == (4, 40) and len(np.unique(ins[0])) == 40
  stacked = mia.vectorize(_train_linear)(seeds, x[ins], y[ins])
  attack = mia.fit_shadow_attack(_linear_apply, stacked, x[:480], y[:480], ins, seed=5)
  assert attack.reference is not None and attack.reference.out_std > 0
  target = jax.jit(_train_linear)(7, x[400:440], y[400:440])
  lp = mia.log_probs(_linear_apply, target, x[:480])
  sc = mia.reference_scores(attack, lp, y[:480], np.arange(480))
  res = metrics.evaluate(metrics.best_threshold(sc[400:420], sc[440:460])[0], sc[420:440],
                         sc[460:480], held_out=True)
  assert res.auc > 0.85 and res.accuracy > 0.8
  # A record every shadow model trained on has no reference: score 0.
  forced = attack._replace(reference=attack.reference._replace(
      out_mean=np.full(480, np.nan)))
  np.testing.assert_array_equal(mia.reference_scores(forced, lp[:3], y[:3], np.arange(3)), 0)
  with pytest.raises(ValueError, match="reference"):
    mia.reference_scores(attack._replace(reference=None), lp, y[:480], np.arange(480))


def test_fit_logistic_separates_and_matches_the_closed_form_direction():
  rng = np.random.default_rng(0)
  f = rng.normal(size=(400, 2))
  lab = f[:, 0] + 0.3 * rng.normal(size=400) > 0
  m = mia.fit_logistic(f, lab)
  assert np.mean((m.predict(f) >= 0.5) == lab) > 0.9
  assert m.w[0] > 5 * abs(m.w[1])


# ----------------------------------------------------------------------------- engine runs


def test_membership_inference_on_a_federated_run():
  from fedjax_dp.attacks import federated

  # The tiny config of test_sweep / test_noise_sampling (its programs compile once).
  small = {"rounds": "3", "data.num_clients": "5", "data.samples_per_client": "24",
           "server.clients_per_round": "3", "model.name": "logistic", "progress": "false"}
  cfg = small_config(small)
  cfg2 = small_config(small, **{"privacy.epsilon": "2"})
  # A privacy grid is one call: targets in one program, shadows in another; the rows
  # share the evaluation split and the shadow draws, each with its own epsilon.
  rows = federated.membership_inference_many([cfg, cfg2], num_shadow=1, max_per_side=60)
  assert [r["epsilon_target"] for r in rows] == [8.0, 2.0]
  assert rows[1]["epsilon_certified"] < rows[0]["epsilon_certified"]
  for row in rows:
    assert row["num_members_pool"] == 120
    assert row["accounting_level"] == "example"
    assert 0 < row["epsilon_certified"] < math.inf
    assert row["advantage_bound"] == pytest.approx(
        bounds.advantage_bound(row["epsilon_certified"], row["delta"]))
    assert row["advantage_bound_claimed"] == pytest.approx(
        bounds.advantage_bound(row["epsilon_claimed"], row["delta"]))
    for name in ("loss_threshold", "shadow", "reference"):
      assert row[f"{name}_threshold_held_out"] is True
      assert row[f"{name}_num_members"] == row[f"{name}_num_nonmembers"] == 30
      assert 0 <= row[f"{name}_accuracy"] <= 1
    assert row["shadow_models"] == 1
    assert 0 <= row["train_accuracy_members"] <= 1
  with pytest.raises(ValueError, match="unknown"):
    federated.membership_inference(cfg, attacks=("nope",))
  with pytest.raises(ValueError, match="share data"):
    federated.membership_inference_many([cfg, small_config(small, seed="9")])


def test_federated_train_fn_refuses_records_the_partition_leaves_out():
  from fedjax_dp.attacks import federated

  cfg = small_config({"rounds": 1, "progress": False, "data.num_clients": 2,
                      "data.samples_per_client": 10, "server.clients_per_round": 2})
  train = federated.federated_train_fn(cfg)
  x = np.zeros((1, 30, 8, 8, 1), np.float32)
  y = np.tile(np.arange(10, dtype=np.int32), 3)[None]
  with pytest.raises(ValueError, match="uses 20 of the 30"):
    train(np.array([1]), x, y)
