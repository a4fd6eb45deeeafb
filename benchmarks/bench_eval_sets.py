"""Scoring a group whose runs hold different evaluation sets: a set per point vs per row.

  python benchmarks/bench_eval_sets.py [G] [L] [N]

A seed sweep on ``eval.split='unassigned'`` stacks each seed's unassigned examples
``[E, N, ...]``; a row of the group is one cohort, so one seed and one set. This times
:func:`fedjax_dp.training.evaluation.sweep_evaluate_sets` on LeNet-5 (``cnn_yuan``)
with ``which [G, L]`` (each point gathers its own batch: the convolution is grouped
over the lanes) and ``which [G]`` (the row's lanes share each batch), beside
:func:`sweep_evaluate` of the same ``G x L`` points on one shared set (the baseline:
what a single-set group costs). Checks that the two set paths agree, then times 3
interleaved calls of each (the machine may be shared) and prints the medians and the
ratio against the per-point path. Default: G = 3 seeds x L = 3 learning rates,
N = 8,192 images per set (2,048 a batch).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.models import get_model
from fedjax_dp.training import evaluation

G = int(sys.argv[1]) if len(sys.argv) > 1 else 3
L = int(sys.argv[2]) if len(sys.argv) > 2 else 3
N = int(sys.argv[3]) if len(sys.argv) > 3 else 8192


def main() -> None:
  model = get_model("cnn_yuan", (28, 28, 1), 10)
  flat = jax.vmap(model.init)(jax.random.split(jax.random.PRNGKey(0), G * L))
  params = jax.tree_util.tree_map(lambda a: a.reshape((G, L) + a.shape[1:]), flat)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(G, N, 28, 28, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, (G, N)), jnp.int32)
  rows = jnp.arange(G, dtype=jnp.int32)
  cases = {"per_point": jnp.repeat(rows[:, None], L, 1), "per_row": rows, "one_set": None}
  fn_sets = jax.jit(lambda p, w: evaluation.sweep_evaluate_sets(model, p, x, y, w))
  fn_one = jax.jit(lambda p: evaluation.sweep_evaluate(model, p, x[0], y[0]))
  call = {k: (lambda w=w: fn_one(params) if w is None else fn_sets(params, w))
          for k, w in cases.items()}
  outs = {k: jax.block_until_ready(f()) for k, f in call.items()}  # compiles
  diff = float(jnp.abs(outs["per_point"][0] - outs["per_row"][0]).max())
  times = {k: [] for k in call}
  for _ in range(3):
    for k, f in call.items():
      t = time.perf_counter()
      jax.block_until_ready(f())
      times[k].append(time.perf_counter() - t)
  base = float(np.median(times["per_point"]))
  print(f"G={G} L={L} N={N} {jax.devices()[0].device_kind}; per_row vs per_point "
        f"max loss diff {diff:.1e}")
  for k, ts in times.items():
    med = float(np.median(ts))
    print(f"{k:10s} median s/call {med:.3f}  per_point / this {base / med:.2f}x  "
          f"{[round(t, 3) for t in ts]}")


if __name__ == "__main__":
  main()
