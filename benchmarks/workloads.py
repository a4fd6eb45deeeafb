"""The benchmark workloads W1-W4, one (workload, method) per process.

  python benchmarks/workloads.py W1/ours [--quick]     # prints one JSON line

``run_all.py`` runs every task in a fresh process (so peak memory and compile
caches are each task's own) and builds the table. Methods:

* ``ours``     -- the engine: one jitted round, clients vmapped (chunked when the
                  configured ``client_chunk`` says so);
* ``loop``     -- the naive JAX way: a Python loop over clients calling a jitted
                  single-client update (the same ``client_update``), then averaging;
* ``torch``    -- a PyTorch loop over clients (``torch_baselines.py``), per-example
                  clipping via ``torch.func`` as the papers' code bases do;
* ``fused``    -- W3's yardstick: one jitted non-private step on all the round's
                  examples as a single batch (no per-client anything);
* ``batched`` / ``one_by_one`` -- W4: one ``run_sweep`` vs ``experiment.run`` per point.

Every task reports seconds per round, client updates per second, effective GFLOP/s
(model training FLOPs = 3 x forward, from XLA's cost analysis, per second), this
machine's fp32 matmul GFLOP/s measured in the same process (the roofline) and the
peak resident memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
import numpy as np
from common import MNIST_DIR, ROOT, matmul_gflops, peak_rss_mb, time_fn, training_gflop

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.data.federated import build_federated_data
from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

W2_CLIENTS, W2_PER_CLIENT, W2_COHORT, W2_STEPS, W2_BATCH = 1000, 50, 50, 5, 10
W3_PER_CLIENT = 16
W4_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
W4_SEEDS = (0, 1, 2, 3)


# ----------------------------------------------------------------------------- helpers


def _record(workload, method, sec_per_round, clients_per_round, gflop_per_round, roofline,
            **extra):
  eff = gflop_per_round / sec_per_round
  return dict(workload=workload, method=method, seconds_per_round=sec_per_round,
              client_updates_per_s=clients_per_round / sec_per_round,
              effective_gflops=eff, roofline_gflops=roofline, roofline_frac=eff / roofline,
              peak_rss_mb=peak_rss_mb(), **extra)


def _args(idx, sel, noise, lr_steps, clip, central=0.0, t=0, seed=0):
  return engine.RoundArgs(
      idx=jnp.asarray(idx, jnp.int32), sel_mask=jnp.asarray(sel, jnp.float32),
      lr=jnp.asarray(lr_steps, jnp.float32), clip=jnp.float32(clip),
      noise=jnp.asarray(noise, jnp.float32), central_noise=jnp.float32(central),
      server_lr=jnp.float32(1.0), round=jnp.int32(t), seed=jnp.uint32(seed))


def _synthetic(num_clients, per_client, shape, classes=10, seed=0):
  """Random data of the given example shape, ``per_client`` examples per client."""
  rng = np.random.default_rng(seed)
  n = num_clients * per_client
  x = rng.normal(size=(n,) + tuple(shape)).astype(np.float32)
  y = rng.integers(0, classes, n).astype(np.int32)
  return build_federated_data(x, y, np.arange(n).reshape(num_clients, per_client))


def _loop_round(model, ccfg, params, data, idx, noise, lr_steps, clip, central=0.0):
  """The naive JAX round: a jitted one-client update called in a Python loop."""
  update = jax.jit(lambda p, x, y, m, key, hp: client_lib.client_update(
      model, ccfg, p, x, y, m, key, hp))
  accumulate = jax.jit(lambda total, new, w: jax.tree_util.tree_map(
      lambda a, b: a + w * b, total, new))
  # Per-client arrays are sliced once, outside the timed round.
  clients = [(data.x[i], data.y[i], data.mask[i]) for i in idx]
  keys = engine.client_keys(jnp.uint32(0), jnp.int32(0), jnp.asarray(idx))
  weights = np.asarray(data.counts)[idx] / np.sum(np.asarray(data.counts)[idx])
  hps = [client_lib.ClientHParams(jnp.asarray(lr_steps, jnp.float32), jnp.float32(clip),
                                  jnp.float32(noise[k]), jnp.float32(noise[k]))
         for k in range(len(idx))]
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  server_noise = jax.jit(lambda key, tree: jax.tree_util.tree_map(
      lambda a: a + central * jax.random.normal(key, a.shape), tree))

  def one_round():
    total = zeros
    for k, (x, y, m) in enumerate(clients):
      out = update(params, x, y, m, keys[k], hps[k])
      total = accumulate(total, out.params, jnp.float32(weights[k]))
    return server_noise(jax.random.PRNGKey(1), total) if central else total

  # Compile every piece on the first client, so that even warmup=0 times no compile.
  first = update(params, *clients[0], keys[0], hps[0])
  jax.block_until_ready(server_noise(jax.random.PRNGKey(1), accumulate(
      zeros, first.params, jnp.float32(1.0))))
  return one_round


# ----------------------------------------------------------------------------- W1


def _w1_setup(chunk: int):
  cfg = config_lib.override(config_lib.load_config(ROOT / "experiments/configs/wei_mnist_mlp.py"), [
      f"data.dir={MNIST_DIR}", "privacy.epsilon=8", "progress=false",
      f"server.client_chunk={chunk}"])
  setup = experiment.build(cfg)
  noise = setup.privacy.noise_scale(cfg.rounds)
  idx, sel = engine.select_clients("uniform", setup.num_clients, cfg.server.clients_per_round,
                                   0.0, 0, 0)
  return cfg, setup, noise, idx, sel


def w1(method: str, quick: bool) -> dict:
  """Wei et al.'s MNIST round: U = K = 50 x 800, MLP 784-256-10, per-example clipping,
  one full-batch step, UDP noise."""
  chunk = {"ours": -1, "ours_all_at_once": 0}.get(method, 0)
  cfg, setup, noise, idx, sel = _w1_setup(chunk)
  model, data = setup.model, setup.data
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  k, n = len(idx), int(np.asarray(data.counts)[0])
  gflop = training_gflop(model, params, k * n)
  roofline = matmul_gflops()
  extra = {}
  if method.startswith("ours"):
    fn = engine.make_round_fn(model, setup.round_cfg)
    args = _args(idx, sel, noise[idx], [cfg.client.lr], cfg.client.clip)
    sec = time_fn(lambda: fn(params, data, args), repeats=5 if quick else 15)
    extra["client_chunk"] = setup.round_cfg.client_chunk
  elif method == "loop":
    one = _loop_round(model, setup.round_cfg.client, params, data, idx, noise[idx],
                      [cfg.client.lr], cfg.client.clip)
    sec = time_fn(one, repeats=3 if quick else 8, warmup=0)
  else:
    import torch_baselines as tb
    xs = np.asarray(data.x)[idx].reshape(k, n, 1, 28, 28)
    ys = np.asarray(data.y)[idx]
    net = tb.mlp((256,), 784, 10)
    tb.per_example_clipped_round(net, xs[:2], ys[:2], cfg.client.lr, cfg.client.clip,
                                 float(noise[0]))()  # warm-up
    one = tb.per_example_clipped_round(net, xs, ys, cfg.client.lr, cfg.client.clip,
                                       float(noise[0]))
    sec = float(np.median([one() for _ in range(1 if quick else 2)]))
  return _record("W1 Wei MNIST (K=50 x 800, MLP, per-example clip, UDP)", method, sec, k,
                 gflop, roofline, **extra)


def _our_round_config(model, ccfg, data, cohort: int, method: str, extra: dict):
  """Our round config: ``'ours'`` picks the client chunk from memory (recorded in
  ``extra``), ``'ours_all_at_once'`` vmaps the whole cohort, ``'ours_unfused'`` is
  ``'ours'`` with one-step fusion off (every client's update formed and clipped
  separately, :mod:`fedjax_dp.training.one_step`)."""
  rcfg = engine.RoundConfig(ccfg, fuse_one_step=method != "ours_unfused")
  if method in ("ours", "ours_unfused"):
    chunk = engine.client_chunk_for_memory(model, rcfg, data, cohort)
    rcfg = dataclasses.replace(rcfg, client_chunk=chunk)
    extra["client_chunk"] = chunk
  return rcfg


# ----------------------------------------------------------------------------- W2


def w2(method: str, quick: bool) -> dict:
  """pfl-research's CIFAR-10 benchmark: 1000 clients x 50 images, 50 per round,
  1 local epoch of batch 10 (5 steps), lr 0.1, simple_cnn; update clipping + central
  Gaussian noise (pfl's central DP). CIFAR-shaped random data."""
  model = get_model("cnn_pfl_cifar10", (32, 32, 3), 10)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _synthetic(W2_CLIENTS, W2_PER_CLIENT, (32, 32, 3))
  idx, sel = engine.select_clients("uniform", W2_CLIENTS, W2_COHORT, 0.0, 0, 0)
  lr, clip, central = [0.1] * W2_STEPS, 1.0, 0.01
  gflop = training_gflop(model, params, W2_COHORT * W2_STEPS * W2_BATCH)
  roofline = matmul_gflops()
  ccfg = client_lib.ClientConfig(W2_STEPS, W2_BATCH, "update_l2", "central")
  extra = {}
  if method.startswith("ours"):
    rcfg = _our_round_config(model, ccfg, data, W2_COHORT, method, extra)
    args = _args(idx, sel, np.zeros(W2_COHORT), lr, clip, central)
    # Compiled ahead, then one timed round: a round takes about a minute on 2 CPU
    # cores (see BENCHMARKS.md).
    start = time.perf_counter()
    fn = engine.make_round_fn(model, rcfg).lower(params, data, args).compile()
    extra["compile_s"] = time.perf_counter() - start
    extra["conv_impl"] = engine.conv_impl_for(rcfg)
    sec = time_fn(lambda: fn(params, data, args), repeats=1 if quick else 3, warmup=0)
  elif method == "loop":
    one = _loop_round(model, ccfg, params, data, idx, np.zeros(W2_COHORT), lr, clip, central)
    sec = time_fn(one, repeats=1, warmup=0)
  else:
    import torch_baselines as tb
    xs = np.asarray(data.x)[idx].transpose(0, 1, 4, 2, 3)  # NHWC -> NCHW
    ys = np.asarray(data.y)[idx]
    one = tb.update_clipped_round(tb.cnn_pfl_cifar10(), xs, ys, 0.1, clip, central,
                                  W2_STEPS, W2_BATCH)
    one()  # warm-up
    sec = float(np.median([one() for _ in range(1 if quick else 3)]))
  return _record("W2 pfl CIFAR-10 (50 of 1000 x 50, CNN, 5 steps x 10, central DP)", method,
                 sec, W2_COHORT, gflop, roofline, **extra)


# ----------------------------------------------------------------------------- W5, W6

# W5: A-DPFL on MNIST (adpfl.md Sec. 5.1, Table 1): N = 1000 clients x 60 examples,
# K = 10 per round, one local epoch of DP-SGD = 3 steps of batch B = 20, C = 4,
# eta = 0.05, Gaussian noise sigma C = 4 on every step's clipped sum; the 3.3 M
# parameter "Deep MNIST" CNN (cnn_adpfl_mnist).
W5 = dict(model="cnn_adpfl_mnist", shape=(28, 28, 1), classes=10, clients=1000, per_client=60,
          cohort=10, steps=3, batch=20, clip=4.0, lr=0.05, noise=4.0, placement="step")
# W6: Fu et al.'s FEMNIST CNN (fu_practicality.md Sec. 4): E = 5 local steps of
# full-batch GD per round, Gaussian noise on the upload. FEMNIST writers hold about
# 200 training images; the paper's b = 350 clients per round is cut to 20 here (the
# time per client is what is compared), with 100 clients to draw from.
# Per-example L2 clipping with C = 3 bounds every step's full-batch gradient by C
# (the paper clips the full-batch gradient itself: the same bound).
W6 = dict(model="cnn_fu_femnist", shape=(28, 28, 1), classes=62, clients=100, per_client=200,
          cohort=20, steps=5, batch=0, clip=3.0, lr=0.05, noise=0.01, placement="upload")


def cnn_dp(workload: str, spec: dict, method: str, quick: bool) -> dict:
  """A CNN round with per-example clipping (W5, W6): ours, the jitted loop, and PyTorch
  with ``torch.func`` per-example gradients, on random data of the paper's shapes."""
  model = get_model(spec["model"], spec["shape"], spec["classes"])
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _synthetic(spec["clients"], spec["per_client"], spec["shape"], spec["classes"])
  k, steps = spec["cohort"], spec["steps"]
  idx, sel = engine.select_clients("uniform", spec["clients"], k, 0.0, 0, 0)
  lr, noise = [spec["lr"]] * steps, np.full(k, spec["noise"])
  batch = spec["batch"] or spec["per_client"]
  gflop = training_gflop(model, params, k * steps * batch)
  roofline = matmul_gflops()
  ccfg = client_lib.ClientConfig(steps, spec["batch"], "per_example_l2", spec["placement"])
  extra = {}
  if method.startswith("ours"):
    rcfg = _our_round_config(model, ccfg, data, k, "ours", extra)
    if method == "ours_conv":
      rcfg = dataclasses.replace(rcfg, conv_impl="conv")
    args = _args(idx, sel, noise, lr, spec["clip"])
    start = time.perf_counter()
    fn = engine.make_round_fn(model, rcfg).lower(params, data, args).compile()
    extra["compile_s"] = time.perf_counter() - start
    extra["conv_impl"] = engine.conv_impl_for(rcfg)
    sec = time_fn(lambda: fn(params, data, args), repeats=2 if quick else 5, warmup=1)
  elif method == "loop":
    one = _loop_round(model, ccfg, params, data, idx, noise, lr, spec["clip"])
    sec = time_fn(one, repeats=1 if quick else 3, warmup=0)
  else:
    import torch_baselines as tb
    xs = np.asarray(data.x)[idx].transpose(0, 1, 4, 2, 3)  # NHWC -> NCHW
    ys = np.asarray(data.y)[idx]
    net = getattr(tb, spec["model"])(spec["classes"])
    noise_kw = ({"step_noise": spec["noise"]} if spec["placement"] == "step"
                else {"upload_noise": spec["noise"]})
    one = tb.dp_sgd_round(net, xs, ys, spec["lr"], spec["clip"], steps, spec["batch"],
                          **noise_kw)
    one()  # warm-up
    sec = float(np.median([one() for _ in range(1 if quick else 3)]))
  return _record(workload, method, sec, k, gflop, roofline, **extra)


def w5(method: str, quick: bool) -> dict:
  return cnn_dp("W5 A-DPFL MNIST (10 of 1000 x 60, 3.3M CNN, DP-SGD 3 x 20, step noise)",
                W5, method, quick)


def w6(method: str, quick: bool) -> dict:
  return cnn_dp("W6 Fu FEMNIST (20 x 200, CNN, E = 5 full-batch, per-example clip, UDP)",
                W6, method, quick)


# ----------------------------------------------------------------------------- W3


def w3(method: str, quick: bool, cohort: int) -> dict:
  """A large cohort: K = U clients per round, 16 MNIST-shaped examples each, logistic
  regression, one full-batch step, update clipping + central Gaussian noise."""
  model = get_model("logistic", (28, 28, 1), 10)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _synthetic(cohort, W3_PER_CLIENT, (28, 28, 1))
  idx, sel = engine.select_clients("all", cohort, cohort, 0.0, 0, 0)
  examples = cohort * W3_PER_CLIENT
  gflop = training_gflop(model, params, examples)
  roofline = matmul_gflops()
  ccfg = client_lib.ClientConfig(1, 0, "update_l2", "central")
  extra = {}
  repeats = 3 if quick else 10
  if method.startswith("ours"):
    rcfg = _our_round_config(model, ccfg, data, cohort, method, extra)
    fn = engine.make_round_fn(model, rcfg)
    args = _args(idx, sel, np.zeros(cohort), [0.1], 1.0, 0.01)
    sec = time_fn(lambda: fn(params, data, args), repeats=repeats)
  elif method == "fused":
    x = data.x.reshape((examples,) + data.x.shape[2:])
    y = data.y.reshape(examples)

    @jax.jit
    def step(p):
      g = jax.grad(lambda q: jnp.mean(model.per_example_loss(model.apply(q, x), y)))(p)
      return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)

    sec = time_fn(lambda: step(params), repeats=repeats)
  elif method == "loop":
    one = _loop_round(model, ccfg, params, data, idx, np.zeros(cohort), [0.1], 1.0, 0.01)
    sec = time_fn(one, repeats=1 if quick else 3, warmup=0)
  else:
    import torch_baselines as tb
    xs = np.asarray(data.x).reshape(cohort, W3_PER_CLIENT, 1, 28, 28)
    one = tb.update_clipped_round(tb.mlp((), 784, 10), xs, np.asarray(data.y), 0.1, 1.0, 0.01)
    one()
    sec = float(np.median([one() for _ in range(1 if quick else 3)]))
  return _record(f"W3 large cohort K={cohort} (logistic, 16 ex, update clip, central DP)",
                 method, sec, cohort, gflop, roofline, **extra)


# ----------------------------------------------------------------------------- W4


def w4_sets(rounds: int = 100, noise_sampling: str = "per_client") -> list[str]:
  """Linear SVM on MNIST, 50 clients x 128 examples, all 50 per round, one full-batch
  step with per-example clipping and UDP noise (Wei et al.'s SVM setting), as
  ``--set`` overrides of the base config."""
  return ["data.name=mnist", f"data.dir={MNIST_DIR}", "data.num_clients=50",
          "data.samples_per_client=128", "server.clients_per_round=50",
          "model.name=linear_svm", "client.clip_mode=per_example_l2", "client.lr=0.5",
          f"rounds={rounds}", "privacy.placement=upload",
          f"privacy.noise_sampling={noise_sampling}", "server.client_chunk=-1",
          "progress=false"]


def w4_config(rounds: int = 100, noise_sampling: str = "per_client"):
  """:func:`w4_sets` applied to the base config."""
  return config_lib.override(config_lib.base_config(), w4_sets(rounds, noise_sampling))


def _cli_one_by_one(points, sets: list[str], tmp: str) -> None:
  """Each point as its own ``fedjax-dp run`` process, as a shell loop or a job array
  over points would run it (every process imports, loads the data and compiles)."""
  import subprocess
  config = Path(tmp) / "base_config.py"
  config.write_text("from fedjax_dp.config import base_config\n\n\n"
                    "def get_config():\n  return base_config()\n")
  for p in points:
    point_sets = [f"{k}={v}" for k, v in p.values.items()]
    cmd = [sys.executable, "-m", "fedjax_dp.cli", "run", str(config),
           "--out", str(Path(tmp) / p.name)]
    for a in sets + point_sets:
      cmd += ["--set", a]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)


def w4(method: str, quick: bool, noise_sampling: str = "per_client") -> dict:
  """32 points (8 epsilons x 4 seeds), 100 rounds each, end to end: one batched sweep,
  or the same points one ``experiment.run`` after another (compiled programs are
  cached across runs, as in a notebook). ``*_files`` write every point's run
  directory (config, metrics, summary, plot); the others keep results in memory."""
  from fedjax_dp import sweep
  del quick  # the workload is defined by its size
  cfg = w4_config(noise_sampling=noise_sampling)
  grid = {"privacy.epsilon": list(W4_EPSILONS), "seed": list(W4_SEEDS)}
  points = sweep.expand(cfg, grid)
  roofline = matmul_gflops()
  files = method.endswith(("_files", "_cli"))
  with tempfile.TemporaryDirectory() as tmp:
    out = tmp if files else None
    start = time.perf_counter()
    if method.startswith("batched"):
      sweep.run_sweep(cfg, grid, out)
    elif method == "one_by_one_cli":
      _cli_one_by_one(points, w4_sets(noise_sampling=noise_sampling), tmp)
    else:
      for p in points:
        experiment.run(p.config, str(Path(tmp) / p.name) if files else None)
    total = time.perf_counter() - start
  model = get_model("linear_svm", (28, 28, 1), 10)
  params = model.init(jax.random.PRNGKey(0))
  rounds = len(points) * int(cfg.rounds)
  gflop = training_gflop(model, params, rounds * 50 * 128)
  rec = _record("W4 sweep of 32 points (eps x seed), linear SVM, 50 x 128, 100 rounds, "
                f"{noise_sampling} upload noise", method, total / int(cfg.rounds), len(points) * 50, gflop / int(cfg.rounds),
                roofline)
  rec["total_s"] = total
  return rec


# ----------------------------------------------------------------------------- W7


def w7(method: str, quick: bool) -> dict:
  """DP-FedAvg in Wei et al.'s MNIST setting: W1 with update clipping + central Gaussian
  noise (``client.clip_mode=update_l2 privacy.placement=central``, as pfl and Flower
  run DP-FedAvg). ``ours`` uses the CLI's default chunk (from memory),
  ``ours_all_at_once`` chunk 0, ``ours_unfused`` switches one-step fusion off."""
  chunk = {"ours": -1, "ours_unfused": -1}.get(method, 0)
  wei = config_lib.load_config(ROOT / "experiments/configs/wei_mnist_mlp.py")
  cfg = config_lib.override(wei, [
      f"data.dir={MNIST_DIR}", "privacy.epsilon=8", "progress=false",
      "client.clip_mode=update_l2", "privacy.placement=central",
      f"server.client_chunk={chunk}"])
  setup = experiment.build(cfg)
  model, data = setup.model, setup.data
  idx, sel = engine.select_clients("uniform", setup.num_clients, cfg.server.clients_per_round,
                                   0.0, 0, 0)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  k, n = len(idx), int(np.asarray(data.counts)[0])
  gflop = training_gflop(model, params, k * n)
  roofline = matmul_gflops()
  central = 0.01
  extra = {}
  if method.startswith("ours"):
    rcfg = setup.round_cfg
    if method == "ours_unfused":
      rcfg = dataclasses.replace(rcfg, fuse_one_step=False)
    fn = engine.make_round_fn(model, rcfg)
    args = _args(idx, sel, np.zeros(k), [cfg.client.lr], cfg.client.clip, central)
    sec = time_fn(lambda: fn(params, data, args), repeats=5 if quick else 15)
    extra["client_chunk"] = rcfg.client_chunk
  elif method == "loop":
    one = _loop_round(model, setup.round_cfg.client, params, data, idx, np.zeros(k),
                      [cfg.client.lr], cfg.client.clip, central)
    sec = time_fn(one, repeats=3 if quick else 8, warmup=0)
  else:
    import torch_baselines as tb
    xs = np.asarray(data.x)[idx].reshape(k, n, 1, 28, 28)
    one = tb.update_clipped_round(tb.mlp((256,), 784, 10), xs, np.asarray(data.y)[idx],
                                  cfg.client.lr, cfg.client.clip, central)
    one()
    sec = float(np.median([one() for _ in range(1 if quick else 3)]))
  return _record("W7 DP-FedAvg Wei MNIST (K=50 x 800, MLP, update clip, central DP)", method,
                 sec, k, gflop, roofline, **extra)


TASKS = {
    "W1/ours": lambda q: w1("ours", q), "W1/ours_all_at_once": lambda q: w1("ours_all_at_once", q),
    "W1/loop": lambda q: w1("loop", q), "W1/torch": lambda q: w1("torch", q),
    "W2/ours": lambda q: w2("ours", q),
    "W2/loop": lambda q: w2("loop", q), "W2/torch": lambda q: w2("torch", q),
    "W3-1k/ours": lambda q: w3("ours", q, 1000), "W3-1k/fused": lambda q: w3("fused", q, 1000),
    "W3-1k/loop": lambda q: w3("loop", q, 1000), "W3-1k/torch": lambda q: w3("torch", q, 1000),
    "W3-10k/ours": lambda q: w3("ours", q, 10000),
    "W3-10k/ours_all_at_once": lambda q: w3("ours_all", q, 10000),
    "W3-1k/ours_unfused": lambda q: w3("ours_unfused", q, 1000),
    "W3-10k/ours_unfused": lambda q: w3("ours_unfused", q, 10000),
    "W3-10k/fused": lambda q: w3("fused", q, 10000),
    "W3-10k/loop": lambda q: w3("loop", q, 10000), "W3-10k/torch": lambda q: w3("torch", q, 10000),
    "W4/batched": lambda q: w4("batched", q), "W4/one_by_one": lambda q: w4("one_by_one", q),
    "W4/batched_files": lambda q: w4("batched_files", q),
    "W4/one_by_one_files": lambda q: w4("one_by_one_files", q),
    "W4/one_by_one_cli": lambda q: w4("one_by_one_cli", q),
    "W4-agg/batched": lambda q: w4("batched", q, "aggregate"),
    "W4-agg/one_by_one": lambda q: w4("one_by_one", q, "aggregate"),
    "W7/ours": lambda q: w7("ours", q),
    "W7/ours_all_at_once": lambda q: w7("ours_all_at_once", q),
    "W7/ours_unfused": lambda q: w7("ours_unfused", q),
    "W7/loop": lambda q: w7("loop", q), "W7/torch": lambda q: w7("torch", q),
}
TASKS.update({
    "W5/ours": lambda q: w5("ours", q), "W5/ours_conv": lambda q: w5("ours_conv", q),
    "W5/loop": lambda q: w5("loop", q), "W5/torch": lambda q: w5("torch", q),
    "W6/ours": lambda q: w6("ours", q), "W6/ours_conv": lambda q: w6("ours_conv", q),
    "W6/loop": lambda q: w6("loop", q), "W6/torch": lambda q: w6("torch", q),
})


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("task", choices=sorted(TASKS))
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  print(json.dumps(dict(TASKS[args.task](args.quick), task=args.task)))


if __name__ == "__main__":
  main()
