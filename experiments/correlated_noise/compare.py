"""DP-FedAvg vs tree aggregation vs BandMF on Wei et al.'s MNIST MLP (client-level DP).

  python experiments/correlated_noise/compare.py [--quick]

Setting: Wei's MNIST MLP 784-256-10 with one full-batch step per round (eta = 0.5),
but cross-device sized for client-level DP: U = 6000 clients x 10 MNIST examples (iid,
all 60000), K = 300 clients a round, T = 100 rounds, update clipping C = 1, server
step 1 (the model is the prefix sum of the noisy aggregates: the workload BandMF is
optimised for), delta = 1e-3, calibrated noise (the smallest that
the certified accountant brings to epsilon). Methods (one sweep each over
epsilon x seed):

* ``dpfedavg_random``: i.i.d. Gaussian, K of U uniformly at random each round,
  amplified by sampling (fixed-size, client level, Wang-Balle-Kasiviswanathan);
* ``dpfedavg_cyclic``: i.i.d. Gaussian, round robin (passes of U/K = 20 rounds, each
  client once a pass, 5 participations), no amplification;
* ``tree_cyclic``: tree aggregation restarted every pass (Kairouz et al. 2021);
* ``bandmf_cyclic``: BandMF with b = 20 bands (= the pass length; Choquette-Choo et
  al. 2023).

Writes ``results/compare.csv`` (every point's final row), ``results/compare_table.csv``
(mean, std over seeds), ``results/compare.png`` and ``results/compare_meta.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pandas as pd

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro

RESULTS = Path(os.environ.get("CORRELATED_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = Path(os.environ.get("CORRELATED_RUNS", ROOT / "runs" / "correlated_noise"))
MNIST_DIR = os.environ.get("FEDJAX_DP_MNIST", str(ROOT.parent / "shared" / "datasets" / "mnist"))
EPSILONS = (1.0, 4.0, 16.0)
SEEDS = (0, 1, 2)
METHODS = {
    "dpfedavg_random": ["privacy.mechanism=gaussian", "server.selection=uniform"],
    "dpfedavg_cyclic": ["privacy.mechanism=gaussian", "server.selection=round_robin"],
    "tree_cyclic": ["privacy.mechanism=tree", "server.selection=round_robin"],
    "bandmf_cyclic": ["privacy.mechanism=bandmf", "server.selection=round_robin",
                      "privacy.bands=20"],
}


def base_config(rounds: int = 100):
  cfg = config_lib.load_config(ROOT / "experiments" / "configs" / "wei_mnist_mlp.py")
  return config_lib.override(cfg, [
      f"data.dir={MNIST_DIR}", "data.num_clients=6000", "data.samples_per_client=10",
      f"rounds={rounds}", "server.clients_per_round=300", "server.aggregation=fixed", "client.clip_mode=update_l2",
      "client.clip=1.0", "privacy.placement=central", "privacy.formula=calibrated",
      "eval.every=10", "progress=false", "server.client_chunk=0", "checkpoint.every=0"])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="20 rounds, one seed")
  args = parser.parse_args(argv)
  start = time.time()
  rounds, seeds = (20, (0,)) if args.quick else (100, SEEDS)
  cfg = base_config(rounds)
  frames = []
  for method, sets in METHODS.items():
    grid = {"privacy.epsilon": list(EPSILONS), "seed": list(seeds)}
    t0 = time.time()
    rows = repro.run_sweep(cfg, grid, str(RUNS / method), sets=sets)
    df = pd.DataFrame(rows)
    ev = df[df["test_loss"].notna() & (df["test_loss"] != "")]
    fin = ev.groupby("point", sort=False).tail(1).copy()
    fin["method"] = method
    fin["sweep_seconds"] = round(time.time() - t0, 1)
    frames.append(fin)
    print(method, f"{time.time() - t0:.0f} s", flush=True)
  out = pd.concat(frames, ignore_index=True)
  for c in ("test_accuracy", "test_loss", "epsilon_certified", "privacy.epsilon"):
    out[c] = pd.to_numeric(out[c])
  repro.write_csv(RESULTS, out, "compare")
  table = out.groupby(["method", "privacy.epsilon"], sort=False)[
      ["test_accuracy", "test_loss", "epsilon_certified"]].agg(["mean", "std", "count"])
  table.columns = [f"{a}_{b}" for a, b in table.columns]
  table = table.reset_index()
  repro.write_csv(RESULTS, table, "compare_table")
  plt = repro.pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 4))
  for method, t in table.groupby("method", sort=False):
    ax.errorbar(t["privacy.epsilon"], t["test_accuracy_mean"], yerr=t["test_accuracy_std"],
                marker="o", capsize=3, label=method)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("epsilon (client level, delta = 1e-3)")
  ax.set_ylabel(f"final test accuracy (T = {rounds}, {len(seeds)} seeds)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.savefig(RESULTS / "compare.png", dpi=110)
  repro.save_meta(RESULTS, "compare", start, points=len(out), quick=args.quick)
  print(table.to_string())


if __name__ == "__main__":
  main()
