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
clipping (``client.clip_mode = none``). :func:`median_grad_norms` measures the
per-example gradient L2 norms on 2,000 training images (:data:`PROBE`) at a model.

* ``--norms ends`` (the first design, kept so its committed result can be re-made):
  the norms at the initial model and at each pilot point's final model; C is the
  median of the pooled norms (initial and final model) of the pilot point with the
  best accuracy: the two ends of training stand in for "the course of training".
* ``--norms rounds`` (the paper's rule as written): the norms at EVERY model a round
  computes its gradients at (the initial model and the model after each round
  1 .. T-1, :func:`each_round_model`); C is the median of the pooled per-round norms
  of the best pilot point. ``results/baseline_calibration<tag>_grad_norms_per_round.csv``
  has every point's per-round median and quartiles.

The calibration sweep then runs the eta grid (``--cal-lrs``, default the pilot's)
clipped at that C (``results/baseline_calibration<tag>_grad_norms.csv`` has every
median; the pilot's accuracies are its ``pilot_<split>_accuracy`` column).

Writes ``results/baseline_calibration<tag>.csv``, ``baseline_calibration<tag>_mlp.png``
and the meta.json. From the repository root::

  nice -n 10 python experiments/wei2021/calibrate.py                     # two ends (first run)
  nice -n 19 python experiments/wei2021/calibrate.py --norms rounds \
      --cal-lrs 0.5,1,2,4,8,16 --tag _rounds                             # every round
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import common
import numpy as np
import pandas as pd

from fedjax_dp import calibration_sweep as cs

TARGET = cs.Target("wei2021", "Figs. 5/8/9 MLP, |D_i| = 800, T = 200, no noise (the paper "
                   "prints no value; target 0.95)", "test_accuracy", 0.95)
GRID = {"client.lr": [0.5, 1.0, 2.0, 4.0]}
PROBE = 2000  # training images the gradient norms are measured on
CHUNK = 250  # of them per per-example-gradient batch (memory)


def base_config(rounds: int, select_on: str = "test"):
  """The paper regime without noise (clipping kept: C = 1 until the rule sets it),
  evaluated on ``select_on`` (``eval.split``: what the pilot's and the calibration's
  choices read)."""
  cfg = common.mlp_config("paper", q=1.0, rounds=rounds)
  cfg.name = "wei_calibration"
  cfg.eval.split = select_on
  cfg.privacy.epsilon = float("inf")
  cfg.privacy.placement = "none"
  cfg.privacy.noise_sampling = "per_client"  # 'aggregate' describes upload noise
  cfg.eval.every = 20
  cfg.progress = False
  return cfg


def probe_norms(cfg):
  """The initial model and a jitted ``params -> [PROBE]`` per-example gradient L2 norms
  (unclipped, cross-entropy) on :data:`PROBE` training images (drawn once, seed 0),
  computed in chunks of :data:`CHUNK` so the per-example gradients stay small."""
  import jax
  import jax.numpy as jnp

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

  def chunk_norms(p, xy):
    g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, *xy)
    return jnp.sqrt(sum(jnp.sum(jnp.square(l.reshape(CHUNK, -1)), 1)
                        for l in jax.tree_util.tree_leaves(g)))

  @jax.jit
  def norms(p):
    xy = (x.reshape(-1, CHUNK, *x.shape[1:]), y.reshape(-1, CHUNK))
    return jax.lax.map(lambda c: chunk_norms(p, c), xy).reshape(-1)

  return model.init(jax.random.PRNGKey(cfg.seed)), norms


def median_grad_norms(cfg, sweep_dir) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
  """Median per-example gradient L2 norm on :data:`PROBE` training images at the
  initial model and at each point's final model (``--norms ends``); and the norms
  themselves by model name."""
  from flax import serialization
  init, norms = probe_norms(cfg)
  found = {"initial": np.asarray(norms(init))}
  for point in sorted((sweep_dir / "points").iterdir()):
    path = point / "model.msgpack"
    if path.is_file():
      found[point.name] = np.asarray(norms(serialization.from_bytes(init, path.read_bytes())))
  out = pd.DataFrame({"model": list(found),
                      "median_grad_l2": [float(np.median(v)) for v in found.values()]})
  return out, found


@contextlib.contextmanager
def each_round_model(callback):
  """Within this context ``callback(loop, params)`` sees every run's model after each
  round it checkpoints (``checkpoint.every = 1``: after rounds 1 .. T-1; the last
  round's model is the final one, at which no gradient is computed).

  The engine exposes no per-round hook (a run keeps only its final model), so this
  wraps :meth:`fedjax_dp.host.run_loop.RunLoop.save_checkpoint` for the pilot only;
  the training itself is untouched (the pilot has no noise).
  """
  from fedjax_dp.host import run_loop
  original = run_loop.RunLoop.save_checkpoint

  def save_checkpoint(loop, params, wall):
    callback(loop, params)
    original(loop, params, wall)

  run_loop.RunLoop.save_checkpoint = save_checkpoint
  try:
    yield
  finally:
    run_loop.RunLoop.save_checkpoint = original


def round_grad_norms(cfg, grid, sweep_dir: Path, norms_dir: Path
                     ) -> tuple[pd.DataFrame, dict[str, np.ndarray], pd.DataFrame]:
  """Runs the unclipped pilot with the per-example gradient norms on :data:`PROBE`
  images at every model a round computes its gradients at (``--norms rounds``).

  Each model's norms are saved as ``norms_dir/lr=<eta>/<round>.npy`` as they come (a
  resumed pilot continues from its checkpoint and keeps the files of the rounds
  before it), so the pooled median covers every round 0 .. T-1 however often the
  pilot was interrupted.

  Returns:
    (the pilot's sweep rows, ``{point name: the norms pooled over its rounds}``
    with ``'initial'`` the initial model's, one row per point and round: median and
    quartiles).
  """
  init, norms = probe_norms(cfg)
  initial = np.asarray(norms(init))

  def save(loop, params):
    path = norms_dir / f"lr={float(loop.cfg.client.lr):g}" / f"{int(loop.t):04d}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.asarray(norms(params)))

  cfg = cfg.copy_and_resolve_references()
  cfg.checkpoint.every = 1
  with each_round_model(save):
    rows = pd.DataFrame(common.repro.run_sweep(cfg, grid, str(sweep_dir)))
  found, table = {"initial": initial}, []
  for point, lr in rows.drop_duplicates("point")[["point", "client.lr"]].itertuples(
      index=False):
    last = int(rows.loc[rows["point"] == point, "round"].max())
    per_round = [initial]
    for t in range(1, last):
      path = norms_dir / f"lr={float(lr):g}" / f"{t:04d}.npy"
      if not path.is_file():
        raise FileNotFoundError(f"{path}: the pilot's norms after round {t} are missing "
                                f"(remove {sweep_dir} and {norms_dir} to run it again)")
      per_round.append(np.load(path))
    found[point] = np.concatenate(per_round)
    for t, v in enumerate(per_round):
      q25, q50, q75 = np.quantile(v, [0.25, 0.5, 0.75])
      table.append({"point": point, "client.lr": lr, "round": t, "median_grad_l2": q50,
                    "q25_grad_l2": q25, "q75_grad_l2": q75})
  return rows, found, pd.DataFrame(table)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--lrs", default=",".join(map(str, GRID["client.lr"])),
                  help="the pilot's eta grid (and the calibration's, without --cal-lrs)")
  ap.add_argument("--cal-lrs", default=None, help="the clipped calibration's eta grid")
  ap.add_argument("--norms", choices=["ends", "rounds"], default="ends",
                  help="where the median rule reads the norms: the initial and final "
                  "models (the first design) or every round's model (the rule as written)")
  ap.add_argument("--tag", default="", help="suffix of the output names")
  ap.add_argument("--rounds", type=int, default=200,
                  help="T (the paper's 200; fewer only for a quick check)")
  cs.add_select_arg(ap)
  args = ap.parse_args(argv)
  sel = cs.select_suffix(args.select_on)  # (run folders of another split's choice)
  start = time.time()
  pd.set_option("display.width", 200)
  grid = {"client.lr": [float(v) for v in args.lrs.split(",")]}
  cal_grid = {"client.lr": [float(v) for v in (args.cal_lrs or args.lrs).split(",")]}
  name = f"baseline_calibration{args.tag}"
  # 1. The pilot: no noise, no clipping.
  pilot_cfg = base_config(args.rounds, args.select_on)
  pilot_cfg.client.clip_mode = "none"
  if args.norms == "ends":
    pilot_dir = common.RUNS / f"calibration_pilot_T{args.rounds}{sel}"
    rows = pd.DataFrame(common.repro.run_sweep(pilot_cfg, grid, str(pilot_dir)))
  else:
    pilot_dir = common.RUNS / f"calibration_pilot_rounds_T{args.rounds}{sel}"
    rows, found, per_round = round_grad_norms(pilot_cfg, grid, pilot_dir,
                                              common.RUNS / f"{pilot_dir.name}_norms")
    common.write(per_round, f"{name}_grad_norms_per_round")
  pilot = cs.calibration_table(rows, grid, TARGET)
  print(pilot.to_string(index=False), flush=True)
  if args.norms == "ends":
    norms, found = median_grad_norms(pilot_cfg, pilot_dir)
  else:
    norms = pd.DataFrame({"model": list(found), "median_grad_l2": [
        float(np.median(v)) for v in found.values()]})
  points = [k for k in found if k != "initial"]  # grid order, as the pilot's rows
  best = points[int(np.argmax(pilot["ours"].to_numpy()))]
  pooled = found[best] if args.norms == "rounds" else np.concatenate(
      [found["initial"], found[best]])
  clip = float(np.median(pooled))
  # (the pilot's best point, whose norms give C, is chosen on the same split)
  norms[f"pilot_{args.select_on}_accuracy"] = [np.nan, *pilot["ours"].to_numpy()]
  norms["pilot_setting"] = ["", *pilot["setting"]]
  norms["rule_C"] = clip
  common.write(norms, f"{name}_grad_norms")
  print(norms.to_string(index=False), f"\nC by the median rule ({args.norms}): {clip:.4g} "
        f"(pilot {best})", flush=True)
  # 2. The calibration: the eta grid clipped at the rule's C.
  cfg = base_config(args.rounds, args.select_on)
  cfg.client.clip = round(clip, 3)
  out = common.RUNS / f"calibration_paper_T{args.rounds}_C{cfg.client.clip:g}{args.tag}{sel}"
  table, rows = cs.calibrate(cfg, cal_grid, TARGET, out)
  table["setting"] = table["setting"] + f" client.clip={cfg.client.clip:g}"
  cs.write_calibration(common.RESULTS, table, rows, cal_grid, TARGET,
                       png=f"{name}_mlp", name=name)
  print(table.to_string(index=False), flush=True)
  common.save_meta(name, start, grid=grid, cal_grid=cal_grid, norms=args.norms,
                   rounds=args.rounds, probe_images=PROBE, rule_C=cfg.client.clip,
                   pilot_best=best, select_on=args.select_on)


if __name__ == "__main__":
  main()
