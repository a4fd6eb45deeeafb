"""W2's round and jitted loop with and without each CNN speed step, in one process.

  python benchmarks/bench_cnn_steps.py [--turns 3] [--variants nhwc_unfold,cnhw_unfold]

Every variant is compiled first (ours: the engine's round at W2's configuration;
loop: the jitted one-client update called per client), then the variants are timed
in turns (one round each per turn; the machine is shared) and the medians printed,
with the largest difference of each variant's new model to the first variant's.
Variants patch the model code while it is traced, so all run the same engine:

* ``flax_pool``: ``flax.linen.max_pool`` (``lax.reduce_window``), the code before;
* ``reshape_pool``: :func:`fedjax_dp.models.layers.max_pool` (reshape and max);
* ``nhwc_unfold``: :func:`fedjax_dp.models.layers.conv_im2col` (the unfold as
  ``[n, H', W', kh kw C]``, features minor), the code;
* ``cnhw_unfold``, ``cnhw_t_unfold``: the unfold features first, ``[kh kw C, n, H',
  W']`` (:func:`unfold_cnhw`: a concatenation along the major axis), the matmul
  contracting that axis with the output ``[n, H', W', O]`` (``cnhw``) or computed as
  ``[O, n, H', W']`` and transposed (``cnhw_t``);
* ``chunk<B>`` (ours only): the code with ``client_chunk=B``: the 50 clients as a
  ``lax.scan`` over chunks of B vmapped clients (``ours`` lets memory pick the chunk:
  0, all 50 at once);
* ``ynn_off``, ``onednn`` (ours only): the code, compiled with XLA:CPU's YNNPACK dot
  fusions off (XLA's own dot emitter), or off with oneDNN on (``compiler_options``);
* ``conv0_xla``: the first convolution (3 input channels, whose unfold costs per byte
  about 7x the second's) as XLA's convolution (``lax.conv_general_dilated``), the
  second as the code's im2col matmul.

The first local step peeled out of the scan (shared global model, no per-client
broadcast; ``client.PEEL_FIRST_STEP``) was measured with this script at commit
6d8d3b2 (variants ``scan_steps``, ``peel_step``) and not adopted.

See docs/scaling.md, "CNN speed steps".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from workloads import (
  W2_BATCH,
  W2_CLIENTS,
  W2_COHORT,
  W2_PER_CLIENT,
  W2_STEPS,
  _args,
  _loop_round,
  _our_round_config,
  _synthetic,
)

from fedjax_dp.models import get_model, layers, zoo
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

XLA_OPTIONS = {
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "onednn": {"xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_use_onednn": True},
}


def _flax_pool(x, window, padding):
  return nn.max_pool(x, (window, window), strides=(window, window), padding=padding)


def unfold_cnhw(x, kernel_size, padding):
  """``moveaxis(layers.unfold(x), -1, 0)``, built along the major axis:
  ``[n, H, W, C] -> [kh kw C, n, H', W']``."""
  kh, kw = kernel_size
  pads = (jax.lax.padtype_to_pads(x.shape[1:3], kernel_size, (1, 1), padding)
          if isinstance(padding, str) else [tuple(p) for p in padding])
  xp = jnp.pad(jnp.transpose(x, (3, 0, 1, 2)), [(0, 0), (0, 0), *pads])
  h_out, w_out = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
  cols = [xp[:, :, i:i + h_out, j:j + w_out] for i in range(kh) for j in range(kw)]
  return jnp.concatenate(cols, axis=0)


def _conv_cnhw(x, kernel, padding):
  kh, kw, _, o = kernel.shape
  cols = unfold_cnhw(x, (kh, kw), padding)
  return jax.lax.dot_general(cols, kernel.reshape(-1, o), (((0,), (0,)), ((), ())))


def _conv_cnhw_t(x, kernel, padding):
  kh, kw, _, o = kernel.shape
  cols = unfold_cnhw(x, (kh, kw), padding)
  y = jax.lax.dot_general(kernel.reshape(-1, o), cols, (((0,), (0,)), ((), ())))
  return jnp.transpose(y, (1, 2, 3, 0))


def _conv0_xla(x, kernel, padding, _im2col=layers.conv_im2col):
  if kernel.shape[2] != 3:
    return _im2col(x, kernel, padding)
  return jax.lax.conv_general_dilated(x, kernel, (1, 1), padding,
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


@contextlib.contextmanager
def variant(name: str):
  """Patches the model code for one variant while it is traced."""
  saved = zoo.max_pool, layers.conv_im2col
  if name == "flax_pool":
    zoo.max_pool = _flax_pool
  layers.conv_im2col = {"cnhw_unfold": _conv_cnhw, "cnhw_t_unfold": _conv_cnhw_t,
                        "conv0_xla": _conv0_xla}.get(name, layers.conv_im2col)
  try:
    yield
  finally:
    zoo.max_pool, layers.conv_im2col = saved


def build(name: str, method: str):
  """Compiles one (variant, method); returns a call running one round and its output."""
  model = get_model("cnn_pfl_cifar10", (32, 32, 3), 10)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _synthetic(W2_CLIENTS, W2_PER_CLIENT, (32, 32, 3))
  idx, sel = engine.select_clients("uniform", W2_CLIENTS, W2_COHORT, 0.0, 0, 0)
  lr, clip, central = [0.1] * W2_STEPS, 1.0, 0.01
  ccfg = client_lib.ClientConfig(W2_STEPS, W2_BATCH, "update_l2", "central")
  with variant(name):
    if method == "ours":
      rcfg = _our_round_config(model, ccfg, data, W2_COHORT, "ours", {})
      if name.startswith("chunk"):
        rcfg = dataclasses.replace(rcfg, client_chunk=int(name[len("chunk"):]))
      args = _args(idx, sel, np.zeros(W2_COHORT), lr, clip, central)
      fn = engine.make_round_fn(model, rcfg).lower(params, data, args).compile(
          compiler_options=XLA_OPTIONS.get(name))
      return lambda: fn(params, data, args)[0]
    return _loop_round(model, ccfg, params, data, idx, np.zeros(W2_COHORT), lr, clip, central)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--turns", type=int, default=3)
  parser.add_argument("--variants", default="nhwc_unfold,cnhw_unfold,cnhw_t_unfold")
  parser.add_argument("--methods", default="ours,loop")
  args = parser.parse_args(argv)
  runs = {}
  for m in args.methods.split(","):
    for v in args.variants.split(","):
      start = time.perf_counter()
      runs[(v, m)] = build(v, m)
      print(f"{v}/{m}: compiled in {time.perf_counter() - start:.1f} s", flush=True)
  outs = {k: jax.block_until_ready(f()) for k, f in runs.items()}
  times = {k: [] for k in runs}
  for _ in range(args.turns):
    for k, f in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(f())
      times[k].append(time.perf_counter() - start)
  first = {}
  for (v, m), ts in times.items():
    ref = first.setdefault(m, outs[(v, m)])
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(
        jax.tree_util.tree_leaves(outs[(v, m)]), jax.tree_util.tree_leaves(ref)))
    print(f"{v}/{m}: median {np.median(ts):.3f} s/round, min {min(ts):.3f} "
          f"({', '.join(f'{t:.2f}' for t in ts)}); max |diff| to the first variant {diff:.2e}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
