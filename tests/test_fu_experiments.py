"""The Fu et al. notebook and reproduction scripts: contents and the E-rule grid.

tests/test_notebooks.py executes notebooks/fu2023_iterations.ipynb in SMOKE mode; the
checks here are on what it and experiments/fu2023 hold.
"""

from pathlib import Path

import nbformat
import pandas as pd
from _helpers import load_experiment

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "fu2023_iterations.ipynb"


def _module(name):
  return load_experiment("fu2023", name)


def test_notebook_is_clean_and_holds_the_three_sweeps():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert nb.metadata.kernelspec.name == "python3"
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
  first = next(c.source for c in nb.cells if c.cell_type == "code")
  quick = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
  assert first == next(c.source for c in quick.cells if c.cell_type == "code")
  source = "\n".join(c.source for c in nb.cells)
  for needle in ("run_sweep", "fu_lr_laplace.py", 'os.environ.get("SMOKE")',
                 '"rounds": T_GRID', "client.local_steps={e}", "T^(2/3)",
                 "server.clients_per_round={N}", "optimal_local_steps_asymptotic",
                 "privacy.epsilon"):
    assert needle in source, needle


def test_fig7_rule_points_follow_the_spec():
  """E = round(T^a) >= 1 and T_g = max(1, round(T / E)) (spec A8); E = T is one GI."""
  fig7 = _module("fig7_lr_rule")
  pts = fig7.rule_points([1, 10, 120])
  assert len(pts) == 15
  got = {(rule, t): (e, tg) for rule, t, e, tg in pts}
  assert got["E=1", 120] == (1, 120)
  assert got["E=T", 120] == (120, 1)
  assert got["E=T^(2/3)", 120] == (24, 5)
  assert got["E=T^(1/2)", 10] == (3, 3)
  assert all(e >= 1 and tg >= 1 for _, _, e, tg in pts)


def test_best_per_marks_interior_optima():
  common = _module("common")
  t = pd.DataFrame({"g": [1, 1, 1, 2, 2, 2], "x": [0, 10, 20, 0, 10, 20],
                    "y_mean": [5.0, 1.0, 3.0, 5.0, 4.0, 3.0], "y_std": [0.0] * 6})
  best = common.best_per(t, "g", "x", "y").set_index("g")
  assert best.loc[1, "best_x"] == 10 and best.loc[1, "interior"]
  assert best.loc[2, "best_x"] == 20 and not best.loc[2, "interior"]
  assert best.loc[1, "worst_y"] == 5.0


def test_plateau_verdicts_tell_the_four_shapes_apart():
  common = _module("common")
  seeds = [-0.01, 0.0, 0.01, -0.005, 0.005]
  curves = {  # eps -> mean accuracy at T = 50, 100, 250, 500
      "plateau": [0.30, 0.40, 0.40, 0.41],
      "decline": [0.30, 0.50, 0.45, 0.40],
      "collapse": [0.30, 0.50, 0.30, 0.12],
      "at chance": [0.10, 0.10, 0.10, 0.10],
  }
  rows = [{"privacy.epsilon": k, "T": t, "test_accuracy": m + s}
          for k, ms in curves.items() for t, m in zip([50, 100, 250, 500], ms) for s in seeds]
  v = common.plateau_verdicts(pd.DataFrame(rows), chance=0.1).set_index("privacy.epsilon")
  for k in curves:
    assert v.loc[k, "verdict"] == k
  assert v.loc["collapse", "best_T"] == 100 and v.loc["collapse", "last_T"] == 500
  assert abs(v.loc["collapse", "kept_margin"] - 0.05) < 1e-9
  assert v.loc["plateau", "p_fall"] > 0.05 > v.loc["decline", "p_fall"]


def test_doubling_rounds_scales_the_aggregated_noise_variance():
  """Checklist item 5 (Def. 2, eqs. (2)-(3)): at fixed E, doubling T_g multiplies the
  per-coordinate noise variance by 4 for Laplace (beta ~ T_l, z = 2) and by 2 for the
  Gaussian (sigma ~ sqrt(T_l), z = 1)."""
  import numpy as np

  from fedjax_dp.privacy import formulas
  xi = formulas.fu_sensitivity(0.05, 3, 150.0)
  for t_g in (10, 40):
    t1, t2 = (formulas.fu_participations(100, r, 1000) for r in (t_g, 2 * t_g))
    lap = [2 * formulas.fu_laplace_scale_thm1(3.0, t, xi) ** 2 for t in (t1, t2)]
    gau = [(formulas.fu_sigma_zcdp(20.0, 1e-4, t) * xi) ** 2 for t in (t1, t2)]
    np.testing.assert_allclose(lap[1] / lap[0], 4.0, rtol=1e-12)
    np.testing.assert_allclose(gau[1] / gau[0], 2.0, rtol=1e-12)


def test_test_samples_keeps_a_fixed_subset_and_refuses_negatives():
  import pytest

  from fedjax_dp import config as config_lib
  from fedjax_dp import experiment
  cfg = config_lib.override(config_lib.base_config(), [
      "data.name=digits", "model.name=logistic", "data.test_samples=50", "rounds=1"])
  a, b = experiment.build(cfg), experiment.build(config_lib.override(cfg, ["seed=3"]))
  assert a.x_test.shape[0] == 50
  assert bool((a.y_test == b.y_test).all())
  with pytest.raises(config_lib.ConfigError, match="data.test_samples"):
    experiment.build(config_lib.override(cfg, ["data.test_samples=-1"]))


def test_mean_clipped_gradient_norm_matches_a_per_client_loop():
  import jax
  import jax.numpy as jnp
  import numpy as np

  from fedjax_dp.models import get_model

  sig = _module("fig4_signal")
  model = get_model("cnn_fu_femnist", (8, 8, 1), 4)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  # Four clients in two chunks of 2: one chunk shape, so each clip compiles one step.
  xs = rng.normal(size=(4, 3, 8, 8, 1)).astype(np.float32)
  ys = rng.integers(0, 4, size=(4, 3))
  # The reference in NumPy from one jitted per-client gradient (eager tree maps would
  # compile every small op anew).
  grad_fn = jax.jit(jax.grad(
      lambda p, x, y: jnp.mean(model.per_example_loss(model.apply(p, x), y))))
  grads = [np.concatenate([np.ravel(np.asarray(a, np.float64))
                           for a in jax.tree_util.tree_leaves(grad_fn(params, x, y))])
           for x, y in zip(xs, ys)]
  norms = [float(np.linalg.norm(g)) for g in grads]
  for clip in (1e-3 * min(norms), 0.5 * np.median(norms), 1e3 * max(norms)):
    mean = np.mean([g * min(1.0, clip / n) for g, n in zip(grads, norms)], axis=0)
    got = sig.mean_clipped_gradient_norm(model, params, xs, ys, clip, chunk=2)
    np.testing.assert_allclose(got, float(np.linalg.norm(mean)), rtol=1e-4)
    assert got <= clip * (1 + 1e-5)
