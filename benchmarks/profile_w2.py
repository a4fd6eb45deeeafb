"""Where one W2 round's time goes on this machine: a per-op profile by category.

  python benchmarks/profile_w2.py [--clients 50] [--rounds 2] [--chunk -1] [--top 25]

Builds the engine's W2 round (``cnn_pfl_cifar10``, ``--clients`` clients x 5 steps of
batch 10, update clipping + central noise, ``conv_impl`` as ``auto`` picks, the client
chunk as the engine picks unless ``--chunk``), compiles it,
runs it once untraced, then ``--rounds`` rounds under ``jax.profiler.trace`` (a
Perfetto trace). XLA:CPU records one trace event per executed HLO op (thunk), named
after the optimised HLO instruction, so each event is looked up in the compiled
module's text (``compiled.as_text()``) and put in a category by what the op computes
(a ``dot`` inside it, its opcode) and where it came from (its ``op_name`` metadata:
layer, forward or ``transpose(...)`` = backward). For that, the model's pooling and
im2col unfold are wrapped in ``jax.named_scope`` while traced (the same ops).

Op times are summed per category and divided by the traced rounds. Ops run with
intra-op threads and independent ops may overlap on the 2 cores, so the sum of op
times need not equal the wall time; both are printed. See docs/scaling.md, "CNN
speed steps on CPU (W2)".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import numpy as np
from workloads import W2_BATCH, W2_CLIENTS, W2_PER_CLIENT, W2_STEPS, _args, _synthetic

from fedjax_dp.models import get_model, layers, zoo
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine

_COMP = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_INSTR = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_OPNAME = re.compile(r'op_name="([^"]*)"')


@contextlib.contextmanager
def named_scopes():
  """Wraps the unfold and the pooling in named scopes while the round is traced."""
  saved = layers.unfold, zoo.max_pool

  def scoped(name, f):
    def g(*a, **k):
      with jax.named_scope(name):
        return f(*a, **k)
    return g

  layers.unfold, zoo.max_pool = scoped("unfold", saved[0]), scoped("max_pool", saved[1])
  try:
    yield
  finally:
    layers.unfold, zoo.max_pool = saved


def parse_hlo(text: str):
  """Instruction name -> (opcode, op_name, {(opcode, op_name)} of the ops fused in it)."""
  comps, instrs, current = {}, {}, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m:
      current = m.group(1)
      comps[current] = []
      continue
    m = _INSTR.match(line)
    if m and current is not None:
      name, opcode = m.group(1), m.group(3)
      calls = _CALLS.search(line)
      op = _OPNAME.search(line)
      op_name = op.group(1) if op else ""
      comps[current].append((opcode, op_name))
      instrs[name] = (opcode, op_name, calls.group(1) if calls else None)
  out = {}
  for name, (opcode, op_name, calls) in instrs.items():
    inner = set(comps.get(calls, ())) if opcode == "fusion" and calls else set()
    out[name] = (opcode, op_name, inner)
  return out


def category(opcode: str, op_name: str, inner: set) -> str:
  """The profile category of one executed op (a fusion: by the ops fused in it).

  Backward ops are named ``transpose(jvp(ConvNet))/...``: the unfold's transpose is
  recognised by its pads/adds under a Conv layer, the pooling's by its selects; XLA
  fuses both into the ReLU's backward select (which also recomputes the forward ReLU
  mask), so a backward fusion is put where its transposed ops come from.
  """
  codes = {c for c, _ in inner} if inner else {opcode}
  names = {n for _, n in inner} | {op_name}
  layer = next((x for x in ("Conv_0", "Conv_1", "Dense_0", "Dense_1") if f"/{x}/" in op_name),
               None)
  backward = "transpose(" in op_name  # the fusion's root
  if codes & {"dot", "convolution"}:
    return f"matmul {layer or '?'} {'backward' if backward else 'forward'}"
  bwd_names = [n for n in names if "transpose(" in n]
  col2im = [m.group(1) for m in (re.search(r"(Conv_\d)/(unfold/)?(pad|add_any|split)", n)
                                 for n in bwd_names) if m]
  if backward and col2im:
    return f"im2col unfold {col2im[0]}, backward (pads + adds, fused with ReLU backward)"
  if backward and any("max_pool" in n or "jit(_where)" in n for n in bwd_names):
    return "max pooling, backward (selects + pads, fused with ReLU backward)"
  if any("/unfold/" in n for n in names):
    return f"im2col unfold {layer or '?'}, forward (slices + concatenate)"
  if any("max_pool" in n for n in names):
    return "max pooling, forward (selects)"
  if any(r in n for n in names for r in ("threefry", "_normal", "_uniform", "random")):
    return "random numbers (batch selection, central noise)"
  if codes <= {"copy", "transpose", "bitcast", "parameter"}:
    return "copies / transposes"
  if any("ConvNet" in n for n in names):
    return "model elementwise (bias, ReLU, loss; forward + backward)"
  if codes <= {"broadcast", "parameter", "constant", "bitcast"}:
    return "broadcasts (global model to clients, zeros)"
  return "other (SGD update, batch gather, clipping, aggregation, noise add)"


def build(clients: int, chunk: int = -1):
  model = get_model("cnn_pfl_cifar10", (32, 32, 3), 10)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  data = _synthetic(W2_CLIENTS, W2_PER_CLIENT, (32, 32, 3))
  idx, sel = engine.select_clients("uniform", W2_CLIENTS, clients, 0.0, 0, 0)
  ccfg = client_lib.ClientConfig(W2_STEPS, W2_BATCH, "update_l2", "central")
  rcfg = engine.RoundConfig(ccfg)
  if chunk < 0:
    chunk = engine.client_chunk_for_memory(model, rcfg, data, clients)
  rcfg = engine.RoundConfig(ccfg, client_chunk=chunk)
  args = _args(idx, sel, np.zeros(clients), [0.1] * W2_STEPS, 1.0, 0.01)
  with named_scopes():
    compiled = engine.make_round_fn(model, rcfg).lower(params, data, args).compile()
  return compiled, (params, data, args), chunk, engine.conv_impl_for(rcfg)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--chunk", type=int, default=-1,
                      help="client_chunk; -1 (default): engine.client_chunk_for_memory")
  parser.add_argument("--top", type=int, default=25, help="also list the N slowest ops")
  parser.add_argument("--trace-dir", default=None)
  args = parser.parse_args(argv)
  start = time.perf_counter()
  compiled, inputs, chunk, impl = build(args.clients, args.chunk)
  print(f"W2 round, {args.clients} clients, client_chunk={chunk}, conv_impl={impl}: "
        f"compiled in {time.perf_counter() - start:.1f} s", flush=True)
  ops = parse_hlo(compiled.as_text())
  jax.block_until_ready(compiled(*inputs))
  start = time.perf_counter()
  jax.block_until_ready(compiled(*inputs))
  untraced = time.perf_counter() - start
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="profile_w2_")
  walls = []
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(args.rounds):
      start = time.perf_counter()
      jax.block_until_ready(compiled(*inputs))
      walls.append(time.perf_counter() - start)
  path = max(glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True))
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  per_cat = collections.defaultdict(float)
  per_op = collections.defaultdict(float)
  for e in events:
    name = e.get("name")
    if e.get("ph") != "X" or name not in ops:
      continue
    opcode, op_name, inner = ops[name]
    if opcode in ("while", "call", "conditional"):  # their bodies' ops are events too
      continue
    sec = e.get("dur", 0.0) / 1e6 / args.rounds
    per_cat[category(opcode, op_name, inner)] += sec
    per_op[name] += sec
  total = sum(per_cat.values())
  wall = float(np.median(walls))
  print(f"untraced round {untraced:.3f} s; traced rounds {', '.join(f'{w:.3f}' for w in walls)} s;"
        f" sum of op times per round {total:.3f} s")
  print("\n| category | s / round | share of op time |\n|---|---|---|")
  for cat, sec in sorted(per_cat.items(), key=lambda kv: -kv[1]):
    print(f"| {cat} | {sec:.3f} | {100 * sec / total:.1f}% |")
  print(f"| **all ops** | **{total:.3f}** | 100% (wall {wall:.3f} s) |")
  if args.top:
    print(f"\nslowest {args.top} ops (s / round, category, op_name):")
    for name, sec in sorted(per_op.items(), key=lambda kv: -kv[1])[:args.top]:
      opcode, op_name, inner = ops[name]
      print(f"  {sec:7.3f}  {name:32s} {category(opcode, op_name, inner)[:40]:40s} {op_name[:90]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
