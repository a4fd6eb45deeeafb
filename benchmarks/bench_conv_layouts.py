"""CNN round layouts on W2's shapes: vmap vs scan over clients, conv vs im2col.

  python benchmarks/bench_conv_layouts.py [K] [vmap_conv,vmap_im2col,scan_conv,scan_im2col]

Compiles each layout, checks that all give the same new model (max difference to the
first), then times 3 interleaved rounds of each (the machine is shared) and prints
the medians. See docs/scaling.md, "Convolutional models".
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
import numpy as np
from workloads import _args, _synthetic

from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

K = int(sys.argv[1]) if len(sys.argv) > 1 else 10
methods = (sys.argv[2].split(",") if len(sys.argv) > 2
           else ["vmap_conv", "vmap_im2col", "scan_conv", "scan_im2col"])
model = get_model("cnn_pfl_cifar10", (32, 32, 3), 10)
params = jax.jit(model.init)(jax.random.PRNGKey(0))
data = _synthetic(200, 50, (32, 32, 3))
idx, sel = engine.select_clients("uniform", 200, K, 0.0, 0, 0)
ccfg = client_lib.ClientConfig(5, 10, "update_l2", "central")
args = _args(idx, sel, np.zeros(K), [0.1] * 5, 1.0, 0.01)
fns, outs = {}, {}
for m in methods:
  layout, impl = m.split("_")
  cfg = engine.RoundConfig(ccfg, client_chunk=1 if layout == "scan" else 0, conv_impl=impl)
  f = jax.jit(lambda p, d, a, cfg=cfg: engine.round_step(model, cfg, p, d, a))
  t = time.perf_counter()
  c = f.lower(params, data, args).compile()
  ct = time.perf_counter() - t
  fns[m] = c
  outs[m] = c(params, data, args)
  print(m, "compile", round(ct, 2), flush=True)
times = {m: [] for m in methods}
for r in range(3):
  for m in methods:
    t = time.perf_counter()
    jax.block_until_ready(fns[m](params, data, args))
    times[m].append(time.perf_counter() - t)
for m in methods:
  print(m, "median s/round", round(float(np.median(times[m])), 3), [round(x, 3) for x in times[m]])
ref = outs[methods[0]][0]
for m in methods[1:]:
  diff = max(float(jnp.abs(a - b).max()) for a, b in
             zip(jax.tree_util.tree_leaves(outs[m][0]), jax.tree_util.tree_leaves(ref)))
  print(m, "max diff vs", methods[0], diff)
