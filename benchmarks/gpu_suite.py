"""The GPU suite: W1, W2 (both conv implementations), W3, W5, W7 and pfl's 1500 rounds.

  python benchmarks/gpu_suite.py                 # one GPU, within 9 minutes
  python benchmarks/gpu_suite.py --quick         # tiny shapes, any backend, no CNN loops
  python benchmarks/gpu_suite.py --no-torch --budget 300 --out /tmp/res

Runs in one process on JAX's default device: for each workload our round
(``ours``; W2 twice, ``ours_conv`` and ``ours_im2col``, the two values of
``server.conv_impl``), the jitted per-client loop (``loop``) and the PyTorch loop
on the same device (``torch``, ``cuda`` when JAX runs on a GPU and torch sees one;
skipped without torch). Then ``W2/pfl_1500``: the wall time of pfl-research's
CIFAR-10 benchmark configuration (1000 clients x 50 images, cohort 50, one local
epoch of batch 10, lr 0.1, ``simple_cnn``, central DP) for 1500 rounds of our
engine, to compare with pfl's reported minutes on one A100 (the anchor; the paper's
Table 1 minutes were not retrieved, design/framework_anchors.md, so the column
stays empty until they are). Evaluation is not included (pfl evaluates every 10
rounds).

Data are random, of the workloads' shapes (BENCHMARKS.md): timings do not depend
on the values, and the suite needs no dataset on the GPU machine. Each task's
seconds per round is the median of a few rounds after one warm-up round; compiling
is timed separately. Tasks stop being started once ``--budget`` seconds have
passed (they are then listed as skipped). Writes ``<out>/gpu_<device>.csv`` and
prints the table, then the ``conv_impl`` that measured faster on W2 (what
``server.conv_impl=auto`` should pick on this device).
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
from common import RESULTS, print_table, time_fn
from workloads import W2_BATCH, W2_STEPS, W5, _args, _loop_round, _synthetic

from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

# Full shapes (BENCHMARKS.md, "Workloads") and the --quick ones (same code paths).
FULL = {"w1": (50, 800), "w2": (1000, 50, 50, W2_STEPS, W2_BATCH, 32), "w3": (1000, 10000),
            "w5": (W5["clients"], W5["per_client"], W5["cohort"], W5["steps"], W5["batch"], 28),
            "pfl_rounds": 1500, "repeats": 5, "cnn_loop": True}
QUICK = {"w1": (4, 16), "w2": (8, 12, 2, 1, 4, 6), "w3": (32,), "w5": (8, 8, 2, 1, 4, 4),
             "pfl_rounds": 3, "repeats": 1, "cnn_loop": False}
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
  for impl in ("conv", "im2col"):
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


SECTIONS = [("W1", lambda s: w1_w7(s, "per_example_l2")), ("W2", w2), ("W3", w3), ("W5", w5),
            ("W7", lambda s: w1_w7(s, "update_l2")), ("W2/pfl", pfl_1500)]


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
  args = parser.parse_args(argv)
  only = {s for s in args.only.split(",") if s}
  unknown = only - {name for name, _ in SECTIONS}
  if unknown:
    parser.error(f"--only: unknown sections {sorted(unknown)}; "
                 f"choose from {[name for name, _ in SECTIONS]}")
  sizes = dict(QUICK if args.quick else FULL, torch=not args.no_torch)
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
