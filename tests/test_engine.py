"""The vmapped, jitted round against a sequential per-client reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import toy_federated

from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine


def _toy(num_clients=6, n=20, shape=(4, 4, 1), classes=3, seed=0):
  return toy_federated(num_clients, n, shape, classes, seed), shape, classes


def _args(idx, mask, noise, lr=(0.3,), clip=0.7, central=0.0, t=3, seed=11):
  return engine.RoundArgs(
      idx=jnp.asarray(idx, jnp.int32), sel_mask=jnp.asarray(mask, jnp.float32),
      lr=jnp.asarray(lr, jnp.float32), clip=jnp.float32(clip),
      noise=jnp.asarray(noise, jnp.float32), central_noise=jnp.float32(central),
      server_lr=jnp.float32(1.0), round=jnp.int32(t), seed=jnp.uint32(seed))


def _reference_round(model, cfg, params, data, args):
  """Sequential Python loop over clients with the same keys (no vmap)."""
  idx = np.asarray(args.idx)
  sel = np.asarray(args.sel_mask)
  outs, counts = [], []
  # One client's update, jitted once and called per client: the loop is the reference,
  # not op-by-op dispatch (which recompiles every inner scan on each call).
  update = jax.jit(functools.partial(client_lib.client_update, model, cfg.client))
  for k, i in enumerate(idx):
    if sel[k] == 0:
      continue
    key = engine.client_keys(args.seed, args.round, jnp.asarray([i]))[0]
    hp = client_lib.ClientHParams(args.lr, args.clip, args.noise[k], args.noise[k])
    out = update(params, data.x[i], data.y[i], data.mask[i], key, hp)
    outs.append(jax.device_get(out.params))
    counts.append(float(data.counts[i]))
  # The weighted mean in float32 NumPy (as jnp would, without compiling each small op).
  w = (np.asarray(counts) / np.sum(counts)).astype(np.float32)
  return jax.tree_util.tree_map(lambda *ps: sum(wi * p for wi, p in zip(w, ps)), *outs)


# Every clip mode and noise placement, full batches and minibatches, one and two local
# steps. CNN rounds (im2col convolutions, every clip mode) against the same per-client
# loop: tests/test_conv_round.py.
CASES = [
    client_lib.ClientConfig(1, 0, "per_example_l2", "upload"),
    client_lib.ClientConfig(2, 8, "per_example_l2", "step"),
    client_lib.ClientConfig(2, 0, "per_example_l1", "upload", "laplace"),
    client_lib.ClientConfig(2, 5, "param_l2", "upload"),
    client_lib.ClientConfig(2, 0, "update_l2", "none"),
    client_lib.ClientConfig(2, 0, "step_grad_l1", "upload", "laplace"),
    client_lib.ClientConfig(2, 5, "step_grad_l2", "upload"),
]


@pytest.mark.parametrize("ccfg", CASES)
def test_vmapped_round_equals_per_client_loop(ccfg):
  data, shape, classes = _toy()
  model = get_model("mlp_784_32_10_linear", shape, classes)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = engine.RoundConfig(ccfg)
  args = _args([4, 1, 2, 2], [1, 1, 1, 0], [0.05, 0.1, 0.02, 0.3],
               lr=[0.3] * ccfg.local_steps)
  got, metrics = engine.make_round_fn(model, cfg)(params, data, args)
  want = _reference_round(model, cfg, params, data, args)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  assert float(metrics.num_selected) == 3


def test_client_result_does_not_depend_on_cohort_or_padding():
  data, shape, classes = _toy()
  model = get_model("mlp_784_32_10_linear", shape, classes)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = client_lib.ClientConfig(2, 4, "per_example_l2", "upload")
  update = jax.jit(jax.vmap(client_lib.client_update,
                            in_axes=(None, None, None, 0, 0, 0, 0, 0)), static_argnums=(0, 1))

  def run(ids):
    ids = jnp.asarray(ids)
    keys = engine.client_keys(jnp.uint32(5), jnp.int32(2), ids)
    k = len(ids)
    hp = client_lib.ClientHParams(jnp.full((k, 2), 0.2), jnp.full((k,), 1.0),
                                  jnp.full((k,), 0.1), jnp.full((k,), 0.1))
    return update(model, cfg, params, data.x[ids], data.y[ids], data.mask[ids], keys, hp)

  a = run([3, 0, 5])
  b = run([1, 3, 2, 4, 3])
  for la, lb in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_allclose(la[0], lb[1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(la[0], lb[4], rtol=1e-6, atol=1e-7)


def test_traced_values_never_recompile():
  data, shape, classes = _toy()
  model = get_model("logistic", shape, classes)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "per_example_l2", "upload"))
  fn = engine.make_round_fn(model, cfg)
  rng = np.random.default_rng(0)
  for t in range(6):
    idx = rng.choice(6, 3, replace=False)
    args = _args(idx, [1, 1, 1], rng.uniform(0, 1, 3), lr=[rng.uniform(0.1, 1)],
                 clip=rng.uniform(0.1, 2), t=t, seed=t)
    params, _ = fn(params, data, args)
  assert fn._cache_size() == 1


def test_central_noise_and_no_selected_client():
  data, shape, classes = _toy()
  model = get_model("logistic", shape, classes)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "update_l2", "central"))
  fn = engine.make_round_fn(model, cfg)
  new, m = fn(params, data, _args([0, 0], [0, 0], [0, 0], central=0.0))
  for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)
  assert float(m.num_selected) == 0
  noisy, _ = fn(params, data, _args([0, 0], [0, 0], [0, 0], central=2.0))
  diff = np.concatenate([np.ravel(a - b) for a, b in zip(jax.tree_util.tree_leaves(noisy),
                                                          jax.tree_util.tree_leaves(params))])
  assert abs(np.std(diff) - 2.0) < 0.2


def test_unnormalized_aggregation_shrinks_by_selected_fraction():
  data, shape, classes = _toy()
  model = get_model("logistic", shape, classes)
  params = jax.tree_util.tree_map(jnp.ones_like,
                                  jax.jit(model.init)(jax.random.PRNGKey(0)))
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "none", "none"), "unnormalized")
  new, _ = engine.make_round_fn(model, cfg)(params, data, _args([1, 2], [1, 1], [0, 0],
                                                                lr=[1e-9]))
  frac = float((data.counts[1] + data.counts[2]) / data.counts.sum())
  np.testing.assert_allclose(new["Dense_0"]["bias"], frac, rtol=1e-5)


@pytest.mark.parametrize("selection", ["uniform", "poisson", "round_robin", "all"])
def test_select_clients(selection):
  idx, mask = engine.select_clients(selection, 20, 5, 0.3, seed=1, t=7)
  again, _ = engine.select_clients(selection, 20, 5, 0.3, seed=1, t=7)
  np.testing.assert_array_equal(idx, again)
  chosen = idx[mask > 0]
  assert len(set(chosen.tolist())) == len(chosen)
  if selection in ("uniform", "round_robin"):
    assert len(chosen) == 5
  if selection == "all":
    assert len(chosen) == 20


@pytest.mark.parametrize("u,k", [(20, 5), (23, 5), (7, 7), (10, 1)])
def test_round_robin_visits_every_client_once_per_pass(u, k):
  per_pass = -(-u // k)
  passes = []
  for p in range(3):
    cohorts = [engine.select_clients("round_robin", u, k, 0.0, 4, t)
               for t in range(p * per_pass, (p + 1) * per_pass)]
    seen = np.concatenate([idx[mask > 0] for idx, mask in cohorts])
    np.testing.assert_array_equal(np.sort(seen), np.arange(u))  # each client exactly once
    passes.append(seen)
  if u > k > 1:
    # A fresh permutation per pass (seeded by (seed, pass)): the order changes.
    assert not np.array_equal(passes[0], passes[1])


def test_poisson_selection_rate():
  n = [engine.select_clients("poisson", 200, 0, 0.1, 0, t)[1].sum() for t in range(200)]
  assert abs(np.mean(n) - 20) < 1.0


def test_evaluate_matches_direct_computation():
  rng = np.random.default_rng(0)
  model = get_model("logistic", (4, 4, 1), 3)
  params = jax.jit(model.init)(jax.random.PRNGKey(1))
  x = jnp.asarray(rng.normal(size=(37, 4, 4, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, 37), jnp.int32)
  loss, acc = engine.evaluate(model, params, x, y, batch_size=8)
  logits = model.apply(params, x)
  np.testing.assert_allclose(loss, np.mean(model.per_example_loss(logits, y)), rtol=1e-5)
  np.testing.assert_allclose(acc, np.mean(np.argmax(logits, -1) == y), rtol=1e-6)


def test_sweep_evaluate_sets_scores_each_point_on_its_own_set():
  # Points [G, L] = [2, 3] on three evaluation sets of 37 examples (batches of 8, the
  # last shifted back): each point's (loss, acc) is evaluate() on its own set alone.
  from fedjax_dp.training.evaluation import sweep_evaluate_sets
  rng = np.random.default_rng(0)
  model = get_model("logistic", (4, 4, 1), 3)
  keys = jax.random.split(jax.random.PRNGKey(1), 6)
  flat = jax.vmap(model.init)(keys)
  params = jax.tree_util.tree_map(lambda a: a.reshape((2, 3) + a.shape[1:]), flat)
  x = jnp.asarray(rng.normal(size=(3, 37, 4, 4, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, (3, 37)), jnp.int32)
  fn = jax.jit(lambda p, w: sweep_evaluate_sets(model, p, x, y, w, 8))
  # [G, L]: a set per point; [G]: a set per row, its lanes sharing each batch.
  for which in (jnp.asarray([[2, 0, 1], [1, 1, 0]], jnp.int32), jnp.asarray([2, 0], jnp.int32)):
    loss, acc = fn(params, which)
    assert loss.shape == acc.shape == (2, 3)
    for g in range(2):
      for lane in range(3):
        p = jax.tree_util.tree_map(lambda a, i=(g, lane): a[i], params)
        e = int(which[g, lane] if which.ndim == 2 else which[g])
        ref = engine.evaluate(model, p, x[e], y[e], batch_size=8)
        np.testing.assert_allclose(loss[g, lane], ref[0], rtol=1e-6)
        np.testing.assert_allclose(acc[g, lane], ref[1], rtol=1e-6)


def test_row_sets_names_a_set_per_row_only_when_every_wave_of_the_row_shares_it():
  from fedjax_dp.host.groups import _row_sets
  # Two rows of two lanes, each lane a queue of runs (None: idle in that wave).
  layout = [[[0, 2], [1, None]], [[3], [4]]]
  np.testing.assert_array_equal(_row_sets(layout, [1, 1, 1, 0, 0]), [1, 0])
  assert _row_sets(layout, [1, 1, 0, 0, 0]) is None  # row 0's second wave differs
  assert _row_sets(layout, [1, 0, 1, 0, 0]) is None  # row 0's lanes differ
