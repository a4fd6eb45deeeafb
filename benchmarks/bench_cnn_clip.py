"""A per-example-clipped CNN step against a non-private one (ghost norms for Conv).

For ``cnn_wei_cifar10`` (32x32x3) and ``cnn_fu_femnist`` (28x28x1), one full-batch
gradient step over ``n`` examples, all jitted and measured in the same process:

* ``nonprivate``: ``jax.grad`` of the summed loss;
* ``ghost``: per-example L2 clipping by ghost norms
  (:func:`fedjax_dp.privacy.clipping.per_example_clipped_grad_sum`);
* ``ghost_l1``: the same with the L1 norm (Fu et al.);
* ``vmap``: per-example gradients by ``vmap(grad)`` over chunks of 64 (the path CNNs
  took before Conv layers were ghost-clippable).

  python benchmarks/bench_cnn_clip.py [--n 256] [--repeats 10]
  # writes benchmarks/results/cnn_clip.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
import numpy as np
from common import RESULTS, machine, print_table, time_fn

from fedjax_dp.files.results import write_csv
from fedjax_dp.models.zoo import get_model
from fedjax_dp.privacy import clipping

MODELS = (("cnn_wei_cifar10", (32, 32, 3), 10), ("cnn_fu_femnist", (28, 28, 1), 62))


def _rows(name, shape, classes, args) -> list[dict]:
  """Times one model's clipped and non-private steps, interleaved (one process)."""
  rows = []
  model = get_model(name, shape, classes)
  params = model.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(args.n, *shape)), jnp.float32)
  y = jnp.asarray(rng.integers(0, classes, args.n), jnp.int32)
  w = jnp.ones((args.n,), jnp.float32)

  def nonprivate(p, x, y, w):
    return jax.grad(lambda q: jnp.sum(model.per_example_loss(model.apply(q, x), y) * w))(p)

  plain = type(model)(**{**model.__dict__, "ghost": False})
  fns = {"nonprivate": nonprivate,
         "ghost": lambda p, x, y, w: clipping.per_example_clipped_grad_sum(
             model, p, x, y, w, 1.0, 2)[0],
         "ghost_l1": lambda p, x, y, w: clipping.per_example_clipped_grad_sum(
             model, p, x, y, w, 1.0, 1)[0]}
  if not args.no_vmap:
    fns["vmap"] = lambda p, x, y, w: clipping.per_example_clipped_grad_sum(
        plain, p, x, y, w, 1.0, 2, 64)[0]
  jitted = {k: jax.jit(f) for k, f in fns.items()}
  times = {k: [] for k in jitted}
  for k, f in jitted.items():
    time_fn(lambda f=f: f(params, x, y, w), repeats=1, warmup=1)
  # Interleaved repeats: the machine is shared, so methods are compared round by round.
  for _ in range(3):
    for k, f in jitted.items():
      times[k].append(time_fn(lambda f=f: f(params, x, y, w), repeats=max(1, args.repeats // 3),
                              warmup=0))
  base = float(np.median(times["nonprivate"]))
  for k, ts in times.items():
    sec = float(np.median(ts))
    rows.append({"model": name, "n": args.n, "method": k, "seconds": sec,
                 "vs_nonprivate": sec / base})
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=10)
  ap.add_argument("--no-vmap", action="store_true")
  args = ap.parse_args()
  rows = [r for name, shape, classes in MODELS for r in _rows(name, shape, classes, args)]
  print_table(rows, ["model", "n", "method", "seconds", "vs_nonprivate"])
  RESULTS.mkdir(parents=True, exist_ok=True)
  write_csv(RESULTS / "cnn_clip.csv", rows)
  print(machine())


if __name__ == "__main__":
  main()
