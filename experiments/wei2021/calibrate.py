"""Wei et al.: the eps = inf baseline of the paper's regime, calibrated before any DP verdict.

The paper's own regime (``common.mlp_config('paper')``): U = K = 50 MNIST clients of
|D_i| = 800 (IID), the MLP 784-256-10, one full-batch step per round (Alg. 1), T = 200,
per-example L2 clipping kept without noise. Everything the paper states stays as
stated (:data:`fedjax_dp.calibration_sweep.STATED`). Two settings are open (spec
``wei_udp_crd.md`` 7.3 items 1-2): eta, swept in one batched sweep
(:func:`fedjax_dp.calibration_sweep.calibrate`), and C, which the paper does not tune
but sets by a rule (below).

The target: the paper prints no number (spec 7.2: "No numerical values ... are
printed"; Figs. 9, 12 and 13 plot accuracy on a 0.1-1.0 axis). We aim at 0.95 test
accuracy without noise after T = 200, the level an MLP 784-256-10 trained on 40,000
MNIST images reaches (our target, not a number of the paper); the committed eta = 0.5
reaches 0.872 (REPRODUCTION.md, "Two regimes").

C is the paper's "median of the norms of the unclipped" gradients over the course of
training (spec 7.1; section 10 item 3: fixed before training from a non-private pilot
run), not a tuned setting. The pilot is one batched sweep of the same eta grid without
clipping (``client.clip_mode = none``); :func:`median_grad_norms` measures the
per-example gradient L2 norms on 2,000 training images at the initial model and at the
final model of every pilot point, and C is the median of the pooled norms (initial and
final model) of the pilot point with the best accuracy: the two ends of training stand
in for "the course of training". The calibration sweep then runs the eta grid clipped
at that C (``results/baseline_calibration_grad_norms.csv`` has every median; the
pilot's accuracies are its ``pilot_test_accuracy`` column).

Writes ``results/baseline_calibration.csv``, ``baseline_calibration_mlp.png`` and the
meta.json. From the repository root::

  nice -n 10 python experiments/wei2021/calibrate.py
"""

from __future__ import annotations

import argparse
import time

import common
import numpy as np
import pandas as pd

from fedjax_dp import calibration_sweep as cs

TARGET = cs.Target("wei2021", "Figs. 5/8/9 MLP, |D_i| = 800, T = 200, no noise (the paper "
                   "prints no value; target 0.95)", "test_accuracy", 0.95)
GRID = {"client.lr": [0.5, 1.0, 2.0, 4.0]}
PROBE = 2000  # training images the gradient norms are measured on


def base_config(rounds: int):
  """The paper regime without noise (clipping kept: C = 1 until the rule sets it)."""
  cfg = common.mlp_config("paper", q=1.0, rounds=rounds)
  cfg.name = "wei_calibration"
  cfg.privacy.epsilon = float("inf")
  cfg.privacy.placement = "none"
  cfg.privacy.noise_sampling = "per_client"  # 'aggregate' describes upload noise
  cfg.eval.every = 20
  cfg.progress = False
  return cfg


def median_grad_norms(cfg, sweep_dir) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
  """Median per-example gradient L2 norm (unclipped, cross-entropy) on :data:`PROBE`
  training images, at the initial model and at each point's final model; and the norms
  themselves by model name."""
  import jax
  import jax.numpy as jnp
  from flax import serialization

  from fedjax_dp.data import load_dataset
  from fedjax_dp.models import get_model
  ds = load_dataset("mnist", cfg.data.dir)
  rng = np.random.default_rng(0)
  idx = rng.choice(len(ds.y_train), PROBE, replace=False)
  x = jnp.asarray(np.asarray(ds.x_train)[idx], jnp.float32)
  y = jnp.asarray(np.asarray(ds.y_train)[idx])
  model = get_model(cfg.model.name, x.shape[1:], 10)

  def loss(p, xi, yi):
    return model.per_example_loss(model.apply(p, xi[None]), yi[None])[0]

  @jax.jit
  def norms(p):
    g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, x, y)
    return jnp.sqrt(sum(jnp.sum(jnp.square(l.reshape(PROBE, -1)), 1)
                        for l in jax.tree_util.tree_leaves(g)))

  init = model.init(jax.random.PRNGKey(cfg.seed))
  found = {"initial": np.asarray(norms(init))}
  for point in sorted((sweep_dir / "points").iterdir()):
    path = point / "model.msgpack"
    if path.is_file():
      found[point.name] = np.asarray(norms(serialization.from_bytes(init, path.read_bytes())))
  out = pd.DataFrame({"model": list(found),
                      "median_grad_l2": [float(np.median(v)) for v in found.values()]})
  return out, found


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--lrs", default=",".join(map(str, GRID["client.lr"])))
  ap.add_argument("--rounds", type=int, default=200,
                  help="T (the paper's 200; fewer only for a quick check)")
  args = ap.parse_args(argv)
  start = time.time()
  pd.set_option("display.width", 200)
  grid = {"client.lr": [float(v) for v in args.lrs.split(",")]}
  # 1. The pilot: no noise, no clipping.
  pilot_cfg = base_config(args.rounds)
  pilot_cfg.client.clip_mode = "none"
  pilot_dir = common.RUNS / f"calibration_pilot_T{args.rounds}"
  pilot = cs.calibration_table(pd.DataFrame(common.repro.run_sweep(pilot_cfg, grid,
                                                                   str(pilot_dir))),
                               grid, TARGET)
  print(pilot.to_string(index=False), flush=True)
  norms, found = median_grad_norms(pilot_cfg, pilot_dir)
  points = [k for k in found if k != "initial"]  # grid order, as the pilot's rows
  best = points[int(np.argmax(pilot["ours"].to_numpy()))]
  clip = float(np.median(np.concatenate([found["initial"], found[best]])))
  norms["pilot_test_accuracy"] = [np.nan, *pilot["ours"].to_numpy()]
  norms["pilot_setting"] = ["", *pilot["setting"]]
  norms["rule_C"] = clip
  common.write(norms, "baseline_calibration_grad_norms")
  print(norms.to_string(index=False), f"\nC by the median rule: {clip:.4g} (pilot {best})",
        flush=True)
  # 2. The calibration: the eta grid clipped at the rule's C.
  cfg = base_config(args.rounds)
  cfg.client.clip = round(clip, 3)
  out = common.RUNS / f"calibration_paper_T{args.rounds}_C{cfg.client.clip:g}"
  table, rows = cs.calibrate(cfg, grid, TARGET, out)
  table["setting"] = table["setting"] + f" client.clip={cfg.client.clip:g}"
  cs.write_calibration(common.RESULTS, table, rows, grid, TARGET,
                       png="baseline_calibration_mlp")
  print(table.to_string(index=False), flush=True)
  common.save_meta("baseline_calibration", start, grid=grid, rounds=args.rounds,
                   probe_images=PROBE, rule_C=cfg.client.clip, pilot_best=best)


if __name__ == "__main__":
  main()
