"""Seconds per round of Wei et al.'s MNIST setting, and the cost of per-example clipping.

Setting (experiments/configs/wei_mnist_mlp.py): U = K = 50 clients x 800 MNIST
examples, MLP 784-256-10, per-example L2 clipping, one full-batch step per round,
UDP noise on every upload, test-set evaluation every round.

Reports:
* seconds per round (train + evaluation on the 10k test set), median of rounds;
* one client's full-batch step over 800 examples: ghost-clipped vs non-private,
  and the materialised per-example-gradient way (vmap(grad)) for comparison;
* the same ratio at the level of the whole round.

  python benchmarks/bench_wei_round.py   # writes benchmarks/results/wei_round.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
from common import MNIST_DIR, RESULTS, ROOT, machine, print_table, time_fn

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.files.results import write_csv
from fedjax_dp.privacy import clipping
from fedjax_dp.training import engine


def main():
  cfg = config_lib.override(config_lib.load_config(ROOT / "experiments/configs/wei_mnist_mlp.py"),
                            [f"data.dir={MNIST_DIR}", "privacy.epsilon=8", "progress=false"])
  setup = experiment.build(cfg)
  model, data = setup.model, setup.data
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  u = setup.num_clients
  noise = setup.privacy.noise_scale(cfg.rounds)

  def round_args(t):
    idx, sel = engine.select_clients("uniform", u, u, 0.0, 0, t)
    return engine.RoundArgs(jnp.asarray(idx), jnp.asarray(sel), jnp.full((1,), cfg.client.lr),
                            jnp.float32(cfg.client.clip), jnp.asarray(noise[idx], jnp.float32),
                            jnp.float32(0), jnp.float32(1), jnp.int32(t), jnp.uint32(0))

  rows = []
  eval_fn = engine.make_eval_fn(model)
  for clip_mode in ("per_example_l2", "none"):
    rcfg = engine.RoundConfig(setup.round_cfg.client.__class__(
        1, 0, clip_mode, "upload" if clip_mode != "none" else "none"))
    fn = engine.make_round_fn(model, rcfg)
    args = round_args(0)

    def one_round(fn=fn, args=args):
      p, _ = fn(params, data, args)
      return eval_fn(p, setup.x_test, setup.y_test)

    sec = time_fn(one_round, repeats=15)
    rows.append({"what": f"round (K=50 x 800, train+eval), clip={clip_mode}", "seconds": sec})

  # One client's full-batch step: 800 examples.
  x, y, w = data.x[0], data.y[0], data.mask[0]

  @jax.jit
  def nonprivate(p):
    g = jax.grad(lambda p: jnp.sum(model.per_example_loss(model.apply(p, x), y) * w))(p)
    return jax.tree_util.tree_map(lambda a, b: a - 0.5 * b / 800, p, g)

  @jax.jit
  def ghost(p):
    g, _, _ = clipping.per_example_clipped_grad_sum(model, p, x, y, w, 1.0)
    return jax.tree_util.tree_map(lambda a, b: a - 0.5 * b / 800, p, g)

  @jax.jit
  def materialised(p):
    grads = clipping.per_example_grads_reference(model, p, x, y)
    norms = jax.vmap(clipping.tree_norm)(grads)
    c = clipping.clip_factor(norms, 1.0) * w
    g = jax.tree_util.tree_map(lambda a: jnp.tensordot(c, a, axes=1), grads)
    return jax.tree_util.tree_map(lambda a, b: a - 0.5 * b / 800, p, g)

  base = time_fn(lambda: nonprivate(params), repeats=30)
  for name, f in (("non-private", nonprivate), ("ghost-clipped", ghost),
                  ("vmap per-example grads", materialised)):
    sec = base if f is nonprivate else time_fn(lambda f=f: f(params), repeats=30)
    rows.append({"what": f"1 client full-batch step (800 ex), {name}", "seconds": sec,
                     "ratio_vs_nonprivate": sec / base})
  rows[0]["ratio_vs_nonprivate"] = rows[0]["seconds"] / rows[1]["seconds"]
  print(f"machine: {machine()}")
  print_table(rows, ["what", "seconds", "ratio_vs_nonprivate"])
  RESULTS.mkdir(parents=True, exist_ok=True)
  write_csv(RESULTS / "wei_round.csv", [dict(r, machine=machine()) for r in rows])


if __name__ == "__main__":
  main()
