"""W7's round (DP-FedAvg, Wei's MNIST setting) fused vs per-client, timed in turns.

  python benchmarks/bench_w7_round.py [--chunks 1,5,0] [--turns 6]
      [--previous-one-step path/to/one_step.py]

All variants are compiled first, then timed in turns (3 calls each per turn) in the
same process, so a shared machine's load hits them alike; prints the median and
the minimum per variant. ``--previous-one-step`` also times the round with another
version of ``fedjax_dp/training/one_step.py`` (e.g. from an older checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
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
from fedjax_dp.training import engine, one_step, rounds


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--chunks", default="-1", help="client chunks; -1 = from memory")
  parser.add_argument("--turns", type=int, default=6)
  parser.add_argument("--previous-one-step", default="")
  args = parser.parse_args(argv)
  wei = config_lib.load_config(ROOT / "experiments/configs/wei_mnist_mlp.py")
  cfg = config_lib.override(wei, [
      f"data.dir={MNIST_DIR}", "progress=false", "client.clip_mode=update_l2",
      "privacy.placement=central", "server.client_chunk=-1"])
  setup = experiment.build(cfg)
  model, data = setup.model, setup.data
  idx, sel = engine.select_clients("uniform", 50, 50, 0.0, 0, 0)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  round_args = _args(idx, sel, np.zeros(50), [0.5], 1.0, 0.01)
  modules = {"fused": one_step}
  if args.previous_one_step:
    spec = importlib.util.spec_from_file_location("previous_one_step", args.previous_one_step)
    modules["previous fused"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modules["previous fused"])

  fns = {}
  for c in (int(v) for v in args.chunks.split(",")):
    chunk = setup.round_cfg.client_chunk if c == -1 else c
    rcfg = dataclasses.replace(setup.round_cfg, client_chunk=chunk)
    variants = [(name, mod, rcfg) for name, mod in modules.items()]
    variants.append(("per-client", one_step, dataclasses.replace(rcfg, fuse_one_step=False)))
    for name, mod, rc in variants:
      rounds.one_step = mod  # read when the round is traced, below
      fn = jax.jit(lambda p, d, a, rc=rc: engine.round_step(model, rc, p, d, a))
      jax.block_until_ready(fn(params, data, round_args))
      fns[f"{name} chunk={chunk}"] = fn
  rounds.one_step = one_step
  times = {k: [] for k in fns}
  for _ in range(args.turns):
    for k, fn in fns.items():
      for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(fn(params, data, round_args))
        times[k].append(time.perf_counter() - start)
  for k, v in times.items():
    print(f"{k:28s} median {np.median(v):.4f} s  min {np.min(v):.4f} s  ({len(v)} rounds)")


if __name__ == "__main__":
  main()
