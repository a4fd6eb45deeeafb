"""The GPU suite, second edition: ours beside pfl on the same GPU, sweeps, a million
streamed clients and the paper-scale reproductions, in one command.

  python benchmarks/gpu_suite.py --pfl-python /tmp/pflenv/bin/python   # one GPU, < 10 min
  python benchmarks/gpu_suite.py --quick         # tiny shapes, any backend (the tests)
  python benchmarks/gpu_suite.py --no-torch --budget 300 --out /tmp/res --only W2,W2/pfl

Runs in one process on JAX's default device, sections in this order (each is started
only while ``--budget`` seconds, default 540, have not passed; the rest are listed as
skipped, and the CSV is rewritten after every section, so a cut-off run keeps its rows):

* ``paper``: the committed results of ``experiments/*/results`` that were made on a GPU
  (their meta.json's ``device``), regenerated with ``python -m fedjax_dp.reproduction
  regenerate`` and compared with the committed CSVs; Fu Fig. 4 at the paper's
  federation (``experiments/fu2023/results/fig4_cnn_T_paper``, 250 s on one H100) first.
  It reads MNIST from ``../shared/datasets/mnist``. ``--quick`` lists them, runs none.
* ``W2``, ``W7``: our round (W2 with both ``server.conv_impl`` values), the jitted
  per-client loop and the PyTorch loop on the same device, then ``pfl``: pfl-research
  0.6.0 itself on the same GPU (``benchmarks/pfl_w2.py`` in pfl's environment,
  ``--pfl-python``; pfl puts its model on CUDA when torch sees a GPU) for W2 and for
  DP-FedAvg (W7's shapes: MLP 784-256-10, 50 clients x 800, one full-batch step,
  update clipping, central noise). docs/scaling.md says how pfl's wheels are carried.
* ``W4-lanes``: W4's sweep (linear SVM, 50 MNIST-shaped clients x 128, per-example
  clipping, upload noise, evaluation every round, 100 rounds) with 64 and 256 points
  (8 x 8 and 16 x 16 epsilons x seeds) as one ``run_sweep``, against the same points
  one by one (``experiment.run``, programs cached): the first 8 points run, the rest
  projected from their median.
* ``W8-1M``: a federation of 1,000,000 clients x 32 28x28 uint8 images (25 GB) in host
  memory, streamed cohort by cohort (``data.placement=host``'s ``CohortStream``, the next
  cohort prefetched), cohorts of 1,000 and 10,000 (W8's round: MLP, update clipping,
  central noise).
* ``W2/pfl``: 1500 rounds of W2 (pfl's CIFAR-10 benchmark configuration, no evaluation)
  with ``im2col`` (what ``auto`` picks on GPUs).
* ``W1``, ``W3``, ``W5``: the first edition's rows, as budget allows.

Data are random, of the workloads' shapes (BENCHMARKS.md; W4's as MNIST-format files
in a temporary folder): timings do not depend on the values. Each seconds-per-round is
the median of a few rounds after one warm-up round; compiling is timed apart. Writes
``<out>/gpu_<device>.csv``, prints the table and the ``conv_impl`` that measured
faster on W2 (what ``server.conv_impl=auto`` should pick on this device).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import numpy as np
from common import RESULTS, ROOT, print_table, time_fn
from workloads import W2_BATCH, W2_STEPS, W5, _args, _loop_round, _synthetic

from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

# Full shapes (BENCHMARKS.md, "Workloads") and the --quick ones (same code paths).
FULL = {"w1": (50, 800), "w2": (1000, 50, 50, W2_STEPS, W2_BATCH, 32), "w3": (1000, 10000),
        "w5": (W5["clients"], W5["per_client"], W5["cohort"], W5["steps"], W5["batch"], 28),
        "pfl_rounds": 1500, "pfl_impls": ("im2col",), "repeats": 5, "cnn_loop": True,
        "lanes": ((8, 8), (16, 16)), "w4_rounds": 100, "one_by_one": 8, "w4_sets": (),
        "stream": (1_000_000, 32), "cohorts": (1000, 10000), "stream_rounds": 5,
        "pfl_shapes": "full", "pfl_iterations": 6, "paper": True}
QUICK = {"w1": (4, 16), "w2": (8, 12, 2, 1, 4, 6), "w3": (32,), "w5": (8, 8, 2, 1, 4, 4),
         "pfl_rounds": 3, "pfl_impls": ("conv", "im2col"), "repeats": 1, "cnn_loop": False,
         "lanes": ((2, 2),), "w4_rounds": 2, "one_by_one": 2,
         "w4_sets": ("data.num_clients=4", "data.samples_per_client=16",
                     "server.clients_per_round=4", "data.test_samples=100"),
         "stream": (2000, 4), "cohorts": (10, 100), "stream_rounds": 2,
         "pfl_shapes": "tiny", "pfl_iterations": 2, "paper": False}
COLUMNS = ["task", "seconds_per_round", "compile_s", "total_s", "note"]
_COMPILED: dict = {}  # compiled rounds by shapes and configuration
PFL_A100_MINUTES = None  # pfl-research Table 1, CIFAR-10 on one A100: not retrieved


def _torch_device() -> str | None:
  """Where the torch rows run: the GPU when JAX uses one, else the CPU; None without torch."""
  try:
    import torch
  except ImportError:
    return None
  if jax.default_backend() == "gpu":
    return "cuda" if torch.cuda.is_available() else None
  return "cpu"


def _ours(model, ccfg, data, idx, sel, noise, lr, clip, central, conv_impl="auto", repeats=3):
  """Compiles our round (chunk from memory) and times it: (seconds, compile seconds, fn)."""
  rcfg = engine.RoundConfig(ccfg, conv_impl=conv_impl)
  rcfg = engine.RoundConfig(ccfg, conv_impl=conv_impl, client_chunk=engine.client_chunk_for_memory(
      model, rcfg, data, len(idx)))
  args = _args(idx, sel, noise, lr, clip, central)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  # W2's programs serve the 1500 rounds too (same shapes): compiled once.
  key = (model.name, model.input_shape, data.x.shape, ccfg, rcfg.client_chunk, conv_impl,
         len(idx))
  if key not in _COMPILED:
    start = time.perf_counter()
    fn = engine.make_round_fn(model, rcfg).lower(params, data, args).compile()
    _COMPILED[key] = fn, time.perf_counter() - start
  fn, compile_s = _COMPILED[key]
  sec = time_fn(lambda: fn(params, data, args), repeats=repeats, warmup=1)
  return sec, compile_s, (fn, params, data, args)


def _methods(name, model, ccfg, data, idx, sel, noise, lr, clip, central, torch_round,
             sizes, impls=("auto",)):
  """Rows of one workload: ours (one per conv impl), loop, torch."""
  rows = []
  for impl in impls:
    task = f"{name}/ours" if impl == "auto" else f"{name}/ours_{impl}"
    sec, comp, _ = _ours(model, ccfg, data, idx, sel, noise, lr, clip, central, impl,
                         sizes["repeats"])
    rows.append({"task": task, "seconds_per_round": sec, "compile_s": comp,
                     "note": f"conv_impl={impl}" if model.conv else ""})
  # --quick leaves out the CNNs' loops: compiling one CNN client's update takes
  # most of the quick suite's time, and run_all.py runs the same loop code.
  if sizes["cnn_loop"] or not model.conv:
    params = jax.jit(model.init)(jax.random.PRNGKey(0))
    one = _loop_round(model, ccfg, params, data, idx, noise, lr, clip, central)
    rows.append({"task": f"{name}/loop",
                 "seconds_per_round": time_fn(one, sizes["repeats"], 0)})
  device = _torch_device() if sizes["torch"] else None
  if torch_round is not None and device is not None:
    one = torch_round(device)
    one()
    rows.append({"task": f"{name}/torch", "note": f"torch on {device}",
                     "seconds_per_round": float(np.median([one() for _ in range(sizes["repeats"])]))})
  return rows


def _nchw(data, idx):
  return np.asarray(data.x)[idx].transpose(0, 1, 4, 2, 3), np.asarray(data.y)[idx]


def w1_w7(sizes, clip_mode):
  """W1 (per-example clipping, upload noise) or W7 (update clipping, central noise)."""
  import torch_baselines as tb
  k, n = sizes["w1"]
  model = get_model("mlp_784_256_10", (28, 28, 1), 10)
  data = _synthetic(k, n, (28, 28, 1))
  idx, sel = engine.select_clients("uniform", k, k, 0.0, 0, 0)
  w7 = clip_mode == "update_l2"
  ccfg = client_lib.ClientConfig(1, 0, clip_mode, "central" if w7 else "upload")
  noise, central = np.full(k, 0.0 if w7 else 0.01), 0.01 if w7 else 0.0
  xs, ys = np.asarray(data.x)[idx].reshape(k, n, 1, 28, 28), np.asarray(data.y)[idx]

  def torch_round(device):
    if w7:
      return tb.update_clipped_round(tb.mlp((256,), 784, 10), xs, ys, 0.5, 1.0, central,
                                     device=device)
    return tb.per_example_clipped_round(tb.mlp((256,), 784, 10), xs, ys, 0.5, 1.0, 0.01,
                                        device=device)

  return _methods("W7" if w7 else "W1", model, ccfg, data, idx, sel, noise, [0.5], 1.0,
                  central, torch_round, sizes)


def w2_setup(sizes):
  clients, per, cohort, steps, batch, hw = sizes["w2"]
  model = get_model("cnn_pfl_cifar10", (hw, hw, 3), 10)
  data = _synthetic(clients, per, (hw, hw, 3))
  idx, sel = engine.select_clients("uniform", clients, cohort, 0.0, 0, 0)
  ccfg = client_lib.ClientConfig(steps, batch, "update_l2", "central")
  return model, data, idx, sel, ccfg, [0.1] * steps


def w2(sizes):
  import torch_baselines as tb
  model, data, idx, sel, ccfg, lr = w2_setup(sizes)
  xs, ys = _nchw(data, idx)
  hw = sizes["w2"][5]

  def torch_round(device):
    import torch
    net = tb.cnn_pfl_cifar10()
    net[6] = torch.nn.Linear(((hw - 4) // 2) ** 2 * 64, 128)  # the flatten width of hw
    return tb.update_clipped_round(net, xs, ys, 0.1, 1.0, 0.01, ccfg.local_steps,
                                   ccfg.batch_size, device=device)

  return _methods("W2", model, ccfg, data, idx, sel, np.zeros(len(idx)), lr, 1.0, 0.01,
                  torch_round, sizes, impls=("conv", "im2col"))


def w3(sizes):
  import torch_baselines as tb
  rows = []
  for k in sizes["w3"]:
    model = get_model("logistic", (28, 28, 1), 10)
    data = _synthetic(k, 16, (28, 28, 1))
    idx, sel = engine.select_clients("all", k, k, 0.0, 0, 0)
    ccfg = client_lib.ClientConfig(1, 0, "update_l2", "central")
    xs, ys = np.asarray(data.x).reshape(k, 16, 1, 28, 28), np.asarray(data.y)
    # The per-client loops of 10,000 clients are W3's slow baselines; the GPU
    # suite runs them at 1,000 (BENCHMARKS.md has them on CPU).
    small = k == min(sizes["w3"])
    rows += [r for r in _methods(
        f"W3-{k}", model, ccfg, data, idx, sel, np.zeros(k), [0.1], 1.0, 0.01,
        (lambda device, xs=xs, ys=ys: tb.update_clipped_round(
            tb.mlp((), 784, 10), xs, ys, 0.1, 1.0, 0.01, device=device)) if small else None,
        sizes) if small or r["task"].endswith("/ours")]
  return rows


def w5(sizes):
  import torch_baselines as tb
  clients, per, cohort, steps, batch, hw = sizes["w5"]
  model = get_model(W5["model"], (hw, hw, 1), 10)
  data = _synthetic(clients, per, (hw, hw, 1))
  idx, sel = engine.select_clients("uniform", clients, cohort, 0.0, 0, 0)
  ccfg = client_lib.ClientConfig(steps, batch, "per_example_l2", "step")
  xs, ys = _nchw(data, idx)

  def torch_round(device):
    import torch
    net = tb.cnn_adpfl_mnist(10)
    side = ((hw + 1) // 2 + 1) // 2  # two SAME (ceil) pools
    net[7] = torch.nn.Linear(side * side * 64, 1024)
    return tb.dp_sgd_round(net, xs, ys, W5["lr"], W5["clip"], steps, batch,
                           step_noise=W5["noise"], device=device)

  return _methods("W5", model, ccfg, data, idx, sel, np.full(cohort, W5["noise"]),
                  [W5["lr"]] * steps, W5["clip"], 0.0, torch_round, sizes)


def pfl_1500(sizes):
  """Wall time of ``pfl_rounds`` rounds of W2 (pfl's CIFAR-10 benchmark configuration)."""
  model, data, idx0, sel0, ccfg, lr = w2_setup(sizes)
  clients, _, cohort = sizes["w2"][:3]
  rows = []
  for impl in sizes["pfl_impls"]:
    _, comp, (fn, params, _, _) = _ours(model, ccfg, data, idx0, sel0, np.zeros(cohort), lr,
                                        1.0, 0.01, impl, 1)
    rounds = sizes["pfl_rounds"]
    draws = [engine.select_clients("uniform", clients, cohort, 0.0, 0, t) for t in range(rounds)]
    start = time.perf_counter()
    for t, (idx, sel) in enumerate(draws):
      params, _ = fn(params, data, _args(idx, sel, np.zeros(cohort), lr, 1.0, 0.01, t=t))
    jax.block_until_ready(params)
    total = time.perf_counter() - start
    anchor = "" if PFL_A100_MINUTES is None else f"; pfl on one A100: {PFL_A100_MINUTES} min"
    rows.append({"task": f"W2/pfl_{rounds}_{impl}", "total_s": total, "seconds_per_round": total / rounds,
                     "compile_s": comp, "note": f"{rounds} rounds, conv_impl={impl}, no evaluation"
                     f"{anchor or '; pfl A100 minutes not retrieved'}"})
  return rows


def gpu_results() -> list[Path]:
  """The committed results made on a GPU (meta.json ``device`` cuda/gpu/rocm), as
  ``experiments/<paper>/results/<name>`` paths, Fu Fig. 4 at the paper's federation
  first, then by name."""
  import json
  out = []
  for meta in sorted((ROOT / "experiments").glob("*/results/**/*_meta.json")):
    device = str(json.loads(meta.read_text()).get("device", ""))
    if device.startswith(("cuda", "gpu", "rocm")):
      out.append(meta.with_name(meta.name.removesuffix("_meta.json")))
  return sorted(out, key=lambda p: (p.name != "fig4_cnn_T_paper", str(p)))


def _regenerate(result: Path, out: Path):
  """``python -m fedjax_dp.reproduction regenerate`` (in a fresh interpreter): the
  comparison with the committed CSVs."""
  from fedjax_dp import reproduction
  return reproduction.regenerate(result, out)


def paper(sizes):
  """The reproductions' paper-scale runs (made on a GPU), regenerated and compared."""
  import tempfile
  rows = []
  for result in gpu_results():
    task = f"paper/{result.parent.parent.name}/{result.name}"
    if not sizes["paper"]:
      rows.append({"task": task, "note": "listed; --quick regenerates none"})
      continue
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
      table = _regenerate(result, Path(tmp) / "out")
    diff = table["max_abs_diff"].astype(float)
    rows.append({"task": task, "total_s": time.perf_counter() - start,
                 "note": f"regenerated; largest |diff| from the committed CSV {diff.max():.3g} "
                         f"over {len(diff)} columns ({int((diff == 0).sum())} identical)"})
  return rows


def _pfl(sizes, method: str):
  """pfl's seconds per round (``pfl_w2.py METHOD`` in pfl's environment), or a note."""
  import json
  import subprocess
  python = sizes.get("pfl_python")
  if not python:
    return {"note": "skipped: no --pfl-python (pfl's environment, docs/scaling.md)"}
  cmd = [python, str(Path(__file__).resolve().parent / "pfl_w2.py"), method,
         "--rounds", str(sizes["pfl_iterations"]), "--shapes", sizes["pfl_shapes"]]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode or not lines:
    return {"note": f"failed: exit {proc.returncode}: {(proc.stderr or proc.stdout)[-200:]}"}
  out = json.loads(lines[-1])
  return {"seconds_per_round": out["seconds_per_round"],
          "note": f"{out['versions']} on {out.get('device', '?')}, "
                  f"{out.get('torch_threads', '?')} threads"}


def pfl_same_device(sizes):
  """pfl-research itself on JAX's device (pfl uses CUDA when torch sees a GPU): W2 and
  DP-FedAvg (W7's shapes), beside our rows of the same workloads."""
  return [dict({"task": f"{name}/pfl"}, **_pfl(sizes, method))
          for name, method in (("W2", "pfl"), ("W7", "dpfedavg"))]


def write_mnist(folder: Path, seed: int = 0) -> Path:
  """Random images as the four MNIST IDX files (60,000 + 10,000 28x28 uint8)."""
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  for prefix, n in (("train", 60000), ("t10k", 10000)):
    for kind, shape in (("images-idx3", (n, 28, 28)), ("labels-idx1", (n,))):
      data = rng.integers(0, 256 if kind.startswith("images") else 10, shape, dtype=np.uint8)
      header = bytes([0, 0, 8, len(shape)]) + np.asarray(shape, ">u4").tobytes()
      (folder / f"{prefix}-{kind}-ubyte").write_bytes(header + data.tobytes())
  return folder


def w4_lanes(sizes):
  """W4's sweep with 64 and 256 points as one program, against one point at a time."""
  import tempfile

  from workloads import w4_sets

  from fedjax_dp import config as config_lib
  from fedjax_dp import experiment, sweep
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    sets = [s for s in w4_sets(sizes["w4_rounds"]) if not s.startswith("data.dir=")]
    cfg = config_lib.override(config_lib.base_config(), sets + list(sizes["w4_sets"]) + [
        f"data.dir={write_mnist(Path(tmp) / 'mnist')}"])
    for n_eps, n_seeds in sizes["lanes"]:
      grid = {"privacy.epsilon": [float(2 ** (i / 2)) for i in range(n_eps)],
              "seed": list(range(n_seeds))}
      points = sweep.expand(cfg, grid)
      start = time.perf_counter()
      sweep.run_sweep(cfg, grid)
      batched = time.perf_counter() - start
      each = []
      for p in points[:sizes["one_by_one"]]:
        start = time.perf_counter()
        experiment.run(p.config)
        each.append(time.perf_counter() - start)
      # The first point compiles; the others reuse its programs.
      projected = each[0] + (len(points) - 1) * float(np.median(each[1:] or each))
      name = f"W4-lanes/{len(points)}"
      rows += [{"task": f"{name}/batched", "total_s": batched,
                "seconds_per_round": batched / sizes["w4_rounds"],
                "note": f"{n_seeds} cohorts x {n_eps} points, one run_sweep, compile included; "
                        f"{projected / batched:.1f}x faster than one by one"},
               {"task": f"{name}/one_by_one", "total_s": projected,
                "seconds_per_round": projected / sizes["w4_rounds"],
                "note": f"{len(each)} of {len(points)} points run one by one (first "
                        f"{each[0]:.1f} s with compile), the rest projected from their median"}]
  return rows


def stream_1m(sizes):
  """A million clients in host memory, cohorts streamed to the device (W8's round)."""
  import bench_w8_stream as w8

  from fedjax_dp.data import streaming
  u, n = sizes["stream"]
  rng = np.random.default_rng(0)
  start = time.perf_counter()
  x = np.empty((u, n) + w8.SHAPE, np.uint8)
  block = 50_000
  for i in range(0, u, block):
    x[i:i + block] = rng.integers(0, 256, (min(block, u - i), n) + w8.SHAPE, dtype=np.uint8)
  counts = rng.integers(n // 2, n + 1, u).astype(np.int32)
  fed = streaming.FederatedData(x, rng.integers(0, 10, (u, n)).astype(np.int32), counts,
                                streaming.mask_of(counts, n))
  built = time.perf_counter() - start
  rows = []
  for k in sizes["cohorts"]:
    _, round_fn, params = w8._setup(k)
    times: list[float] = []
    w8._stream_rounds(fed, u, k, round_fn, params, list(range(sizes["stream_rounds"] + 2)),
                      times)
    rows.append({"task": f"W8-1M/streamed_k{k}", "seconds_per_round": float(np.median(times[2:])),
                 "note": f"{u:,} clients x {n} uint8 28x28 images in host memory "
                         f"({x.nbytes / 1e9:.2f} GB, built in {built:.0f} s), cohort of {k:,} "
                         "streamed per round, the next prefetched"})
  return rows


SECTIONS = [("paper", paper), ("W2", w2), ("W7", lambda s: w1_w7(s, "update_l2")),
            ("pfl", pfl_same_device), ("W4-lanes", w4_lanes), ("W8-1M", stream_1m),
            ("W2/pfl", pfl_1500), ("W1", lambda s: w1_w7(s, "per_example_l2")), ("W3", w3),
            ("W5", w5)]


def device_name() -> str:
  """A file-name-safe name of JAX's default device, e.g. ``nvidia_h100_80gb_hbm3``."""
  kind = jax.devices()[0].device_kind
  return re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_") or jax.default_backend()


def conv_choice(rows) -> str | None:
  """The conv implementation that ran W2's round faster here (None if not both measured)."""
  sec = {r["task"]: r.get("seconds_per_round") for r in rows}
  a, b = sec.get("W2/ours_conv"), sec.get("W2/ours_im2col")
  if a in (None, "") or b in (None, ""):
    return None
  a, b = float(a), float(b)
  return "conv" if a <= b else "im2col"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU, seconds)")
  parser.add_argument("--budget", type=float, default=540.0,
                      help="start no task after this many seconds (default 540)")
  parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
  parser.add_argument("--out", default=str(RESULTS), help="directory of gpu_<device>.csv")
  parser.add_argument("--only", default="", help="comma-separated sections to run, e.g. W2,W5")
  parser.add_argument("--pfl-python", default="",
                      help="python of pfl's environment (the pfl section; skipped without)")
  args = parser.parse_args(argv)
  only = {s for s in args.only.split(",") if s}
  unknown = only - {name for name, _ in SECTIONS}
  if unknown:
    parser.error(f"--only: unknown sections {sorted(unknown)}; "
                 f"choose from {[name for name, _ in SECTIONS]}")
  sizes = dict(QUICK if args.quick else FULL, torch=not args.no_torch,
               pfl_python=args.pfl_python or None)
  start, rows = time.time(), []
  device = device_name() + ("_quick" if args.quick else "")
  for name, section in SECTIONS:
    if only and name not in only:
      continue
    if time.time() - start > args.budget:
      rows.append({"task": name, "note": f"skipped: past the {args.budget:.0f} s budget"})
      continue
    t = time.time()
    try:
      rows += section(sizes)
    except Exception as e:  # pylint: disable=broad-except
      # One section failing (a library version on the GPU machine, say) must not cost the
      # rows of the others: the lease is short and does not come back.
      rows.append({"task": name, "note": f"failed: {type(e).__name__}: {e}"[:300]})
    print(f"[{time.time() - start:5.0f} s] {name} done in {time.time() - t:.1f} s", flush=True)
    _write(Path(args.out), device, rows)  # after every section: a cut-off run keeps its rows
  print(f"\ndevice: {jax.devices()[0].device_kind} ({jax.default_backend()}); "
        f"took {time.time() - start:.0f} s\n")
  print_table(rows, COLUMNS)
  choice = conv_choice(rows)
  print(f"\nW2 ran faster with conv_impl={choice}: server.conv_impl=auto should pick it "
        f"on {jax.devices()[0].device_kind}")
  print(f"wrote {_write(Path(args.out), device, rows)}")
  return 0


def _write(out: Path, device: str, rows) -> Path:
  """Writes ``<out>/gpu_<device>.csv`` (all rows so far) and returns its path."""
  from fedjax_dp.files.results import write_csv  # pylint: disable=import-outside-toplevel
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"gpu_{device}.csv"
  write_csv(path, [dict(r, device=device) for r in rows], [*COLUMNS, "device"])
  return path


if __name__ == "__main__":
  sys.exit(main())
