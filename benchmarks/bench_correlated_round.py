"""W7's round with correlated noise (tree, BandMF) vs DP-FedAvg's i.i.d. noise.

  python benchmarks/bench_correlated_round.py [--bands 8,32] [--turns 6] [--rounds 100]

W7 (DP-FedAvg in Wei et al.'s MNIST setting: 50 clients x 800 examples, MLP 784-256-10,
update clipping, central noise; ``benchmarks/workloads.py:w7``) with the central noise
drawn i.i.d. (``privacy.mechanism=gaussian``), by BandMF with b bands (the round reads
and shifts the carried ``w_{t-1..t-b+1}``) and by tree aggregation (``floor(log2 R) + 1``
node draws a round). Every client takes part in every round (round robin with K = U,
the participation the correlated mechanisms are accounted for; the round's cost does
not depend on the rule). All variants are compiled first and timed in turns (3 calls
each per turn) in one process, so a shared machine's load hits them alike; prints the
median and minimum seconds per round and each variant's median over DP-FedAvg's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import numpy as np
from common import MNIST_DIR, ROOT
from workloads import _args

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.training import engine


def _variant(sets: list[str], rounds: int):
  wei = config_lib.load_config(ROOT / "experiments/configs/wei_mnist_mlp.py")
  cfg = config_lib.override(wei, [
      f"data.dir={MNIST_DIR}", "privacy.epsilon=8", "progress=false",
      "client.clip_mode=update_l2", "privacy.placement=central", "server.client_chunk=0",
      "server.selection=round_robin", "server.aggregation=fixed", "privacy.formula=calibrated",
      f"rounds={rounds}", *sets])
  return experiment.build(cfg)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--bands", default="8,32")
  parser.add_argument("--turns", type=int, default=6)
  parser.add_argument("--rounds", type=int, default=100)
  args = parser.parse_args(argv)
  variants = {"dp-fedavg (gaussian)": ["privacy.mechanism=gaussian"]}
  for b in (int(v) for v in args.bands.split(",") if v):
    variants[f"bandmf b={b}"] = ["privacy.mechanism=bandmf", f"privacy.bands={b}"]
  variants["tree"] = ["privacy.mechanism=tree"]
  fns = {}
  for name, sets in variants.items():
    setup = _variant(sets, args.rounds)
    u = setup.num_clients
    idx, sel = engine.select_clients("round_robin", u, u, 0.0, 0, 0)
    params = engine.carried_params(setup.round_cfg,
                                   jax.jit(setup.model.init)(jax.random.PRNGKey(0)))
    round_args = _args(idx, sel, np.zeros(len(idx)), [0.5], 1.0, 0.01, t=5)
    fn = jax.jit(lambda p, d, a, m=setup.model, rc=setup.round_cfg:
                 engine.round_step(m, rc, p, d, a))
    jax.block_until_ready(fn(params, setup.data, round_args))
    fns[name] = (fn, params, setup.data, round_args)
  times = {k: [] for k in fns}
  for _ in range(args.turns):
    for k, (fn, p, d, a) in fns.items():
      for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(fn(p, d, a))
        times[k].append(time.perf_counter() - start)
  base = np.median(times["dp-fedavg (gaussian)"])
  print(f"device {jax.devices()[0].platform}; {args.turns} turns x 3 rounds per variant")
  for k, v in times.items():
    print(f"{k:24s} median {np.median(v):.4f} s  min {np.min(v):.4f} s  "
          f"ratio {np.median(v) / base:.3f}")


if __name__ == "__main__":
  main()
