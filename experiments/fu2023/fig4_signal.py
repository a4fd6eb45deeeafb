"""Fu et al. Fig. 4, why the reduced federation is harder: signal against noise per round.

One round of Alg. 1 averages b uploads, each E clipped steps plus Gaussian noise of std
``sigma eta E zeta`` per coordinate (Theorem 2). For one local step (E = 1; eta
cancels) the mean upload is ``(1/b) sum_j clip_zeta(g_j)`` plus noise of norm about
``sigma zeta sqrt(p / b)``, where ``g_j`` is client j's full-batch gradient. The noise
does not depend on the clients' data; the signal does: clipped one-image gradients
(``common.CNN_FIG4``) point in many directions and partly cancel, a client's mean
gradient over ~230 images (the paper's FEMNIST writers) is closer to the population's.

This script measures ``||(1/b) sum_j clip_zeta(g_j)||`` for b = 160 clients of n
images (n = 1, 20 and 230, ``writer_like`` clients from real MNIST), at the initial
model and after ``--train-rounds`` noise-free rounds of the Fig. 4 federation, and
sets it against the noise norm of the paper's (b = 350) and our (b = 160) federation
for eps in {10, 20, 30} and T_l in {1, 10}. Writes ``results/fig4_signal.csv``. Run
from the repository root::

  python experiments/fu2023/fig4_signal.py
"""

from __future__ import annotations

import argparse
import math

import common
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from fedjax_dp import experiment
from fedjax_dp.data import load_dataset
from fedjax_dp.data.partition import writer_like
from fedjax_dp.privacy import clipping, formulas


def mean_clipped_gradient_norm(model, params, xs, ys, clip: float, chunk: int = 16) -> float:
  """``||(1/b) sum_j clip(grad L_j(params))||_2`` over clients ``xs [b, n, ...]``."""
  def one(x, y):
    g = jax.grad(lambda p: jnp.mean(model.per_example_loss(model.apply(p, x), y)))(params)
    return clipping.clip_by_norm(g, clip)[0]
  step = jax.jit(lambda x, y: jax.tree_util.tree_map(
      lambda a: jnp.sum(a, 0), jax.vmap(one)(x, y)))
  total = None
  for i in range(0, len(xs), chunk):
    s = step(jnp.asarray(xs[i:i + chunk]), jnp.asarray(ys[i:i + chunk]))
    total = s if total is None else jax.tree_util.tree_map(jnp.add, total, s)
  return float(clipping.tree_norm(total)) / len(xs)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--clients", type=int, default=160, help="b")
  ap.add_argument("--sizes", default="1,20,230", help="images per client")
  ap.add_argument("--train-rounds", type=int, default=20,
                  help="noise-free rounds of the Fig. 4 federation for the trained model")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  start = common.now()
  d = common.CNN_FIG4
  cfg = common.cnn_config(num_clients=d["num_clients"], clients_per_round=d["clients_per_round"],
                          samples_per_client=1, size_sigma=0.0, lr=d["lr"])
  cfg.name = "fu_fig4_signal"
  cfg.rounds = args.train_rounds
  cfg.privacy.epsilon = common.INF
  common.repro.note_configs([cfg])
  trained = experiment.run(cfg).params
  setup = experiment.build(cfg)
  model, zeta = setup.model, float(cfg.client.clip)
  p = model.num_params()
  states = {"init": model.init(jax.random.PRNGKey(args.seed)),
            f"after {args.train_rounds} rounds": trained}

  ds = load_dataset("mnist", common.MNIST_DIR)
  x, y = np.asarray(ds.x_train, np.float32), np.asarray(ds.y_train)
  rows = []
  for n in [int(s) for s in args.sizes.split(",")]:
    # writer_like clients of exactly n images (size_sigma = 0), the first b of them.
    parts = writer_like(y, num_clients=len(y) // n, samples_per_client=n, seed=args.seed,
                        size_sigma=0.0)[:args.clients]
    xs, ys = np.stack([x[i] for i in parts]), np.stack([y[i] for i in parts])
    for state, params in states.items():
      rows.append({"model": state, "images_per_client": n,
                   "signal": mean_clipped_gradient_norm(model, params, xs, ys, zeta)})
  sig = pd.DataFrame(rows)
  sig["signal_over_zeta"] = sig["signal"] / zeta

  noise = []
  for b in (args.clients, 350):
    for eps in (10.0, 20.0, 30.0):
      for t_l in (1, 10):
        sigma = float(formulas.fu_sigma_zcdp(eps, float(cfg.privacy.delta), t_l))
        noise.append({"b": b, "epsilon": eps, "T_l": t_l, "sigma": sigma,
                      "noise": sigma * zeta * math.sqrt(p / b)})
  noise = pd.DataFrame(noise)
  out = sig.merge(noise, how="cross")
  out["snr"] = out["signal"] / out["noise"]
  common.write(out, "fig4_signal")
  pd.set_option("display.width", 200)
  print(f"p = {p}, zeta = {zeta}")
  print(sig.to_string())
  print(noise.to_string())
  common.save_meta("fig4_signal", start, clients=args.clients, sizes=args.sizes,
                   train_rounds=args.train_rounds, seed=args.seed)


if __name__ == "__main__":
  main()
