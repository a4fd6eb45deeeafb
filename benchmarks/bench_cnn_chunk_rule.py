"""The CNN rounds (W2, W5, W6) at the client chunk of the memory-only rule and of the
cache rule, in one process.

  python benchmarks/bench_cnn_chunk_rule.py [--workloads W2,W5,W6] [--turns 3]

``engine.client_chunk_for_memory`` caps the chunk on CPU so a chunk's temporaries
fit a quarter of the last-level cache; since this change also for CNNs whose
convolutions run as ``im2col`` (before: all-dense models only). For each workload
this compiles our round at the chunk the rule picks without the cache cap
(``cache_bytes=0``, the rule before) and with it, then times one round of each per
turn (interleaved), prints the medians and the largest difference of the new models.
See docs/scaling.md, "CNN speed steps on CPU (W2)".
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
import numpy as np
from workloads import (
  W2_BATCH,
  W2_CLIENTS,
  W2_COHORT,
  W2_PER_CLIENT,
  W2_STEPS,
  W5,
  W6,
  _args,
  _synthetic,
)

from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine


def setup(name: str):
  """(model, params, data, round config, args) of one workload's round."""
  if name == "W2":
    spec = {"model": "cnn_pfl_cifar10", "shape": (32, 32, 3), "classes": 10,
            "clients": W2_CLIENTS, "per_client": W2_PER_CLIENT, "cohort": W2_COHORT,
            "steps": W2_STEPS, "batch": W2_BATCH, "clip": 1.0, "lr": 0.1, "noise": 0.0,
            "placement": "central", "mode": "update_l2"}
  else:
    spec = {**{"W5": W5, "W6": W6}[name], "mode": "per_example_l2"}
  model = get_model(spec["model"], spec["shape"], spec["classes"])
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _synthetic(spec["clients"], spec["per_client"], spec["shape"], spec["classes"])
  k = spec["cohort"]
  idx, sel = engine.select_clients("uniform", spec["clients"], k, 0.0, 0, 0)
  ccfg = client_lib.ClientConfig(spec["steps"], spec["batch"], spec["mode"], spec["placement"])
  rcfg = engine.RoundConfig(ccfg)
  central = 0.01 if name == "W2" else 0.0
  args = _args(idx, sel, np.full(k, spec["noise"]), [spec["lr"]] * spec["steps"], spec["clip"],
               central)
  return model, params, data, rcfg, args, k


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workloads", default="W2,W5,W6")
  parser.add_argument("--turns", type=int, default=3)
  args = parser.parse_args(argv)
  runs = {}
  for name in args.workloads.split(","):
    model, params, data, rcfg, rargs, k = setup(name)
    for rule, cache in (("memory", 0), ("cache", None)):
      chunk = engine.client_chunk_for_memory(model, rcfg, data, k, cache_bytes=cache)
      cfg = dataclasses.replace(rcfg, client_chunk=chunk)
      start = time.perf_counter()
      fn = engine.make_round_fn(model, cfg).lower(params, data, rargs).compile()
      print(f"{name}/{rule} rule: client_chunk={chunk}, compiled in "
            f"{time.perf_counter() - start:.1f} s", flush=True)
      runs[(name, rule, chunk)] = (lambda fn=fn, p=params, d=data, a=rargs: fn(p, d, a)[0])
  outs = {key: jax.block_until_ready(f()) for key, f in runs.items()}
  times = {key: [] for key in runs}
  for _ in range(args.turns):
    for key, f in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(f())
      times[key].append(time.perf_counter() - start)
  for (name, rule, chunk), ts in times.items():
    ref = outs[(name, "memory", next(c for n, r, c in runs if n == name and r == "memory"))]
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(
        jax.tree_util.tree_leaves(outs[(name, rule, chunk)]), jax.tree_util.tree_leaves(ref)))
    print(f"{name}/{rule} rule (client_chunk={chunk}): median {np.median(ts):.3f} s/round "
          f"({', '.join(f'{t:.2f}' for t in ts)}); max |diff| to the memory rule {diff:.2e}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
