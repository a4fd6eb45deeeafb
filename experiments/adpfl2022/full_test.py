"""Scores the final models of a Table 2 run on the full 10,000-image MNIST test set.

A run with ``--test-samples n`` evaluates (and scores the eq. (15) decay) on a fixed
subset of n test images; this re-scores each run's final ``model.msgpack`` on all of
them, so the reported accuracy does not rest only on the subset that drove the decay.
Writes ``results/<name>_fulltest.csv``. Run from the repository root::

  python experiments/adpfl2022/full_test.py table2_cnn_adpfl_mnist_k10_test2000_cnn_adpfl_mnist_e0
"""

from __future__ import annotations

import argparse
import json
import time

import common
import flax.serialization
import jax
import ml_collections
import pandas as pd

from fedjax_dp import experiment
from fedjax_dp.training import engine


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("name", help="results name of the Table 2 run, e.g. "
                               "table2_cnn_adpfl_mnist_k10_test2000_cnn_adpfl_mnist_e0")
  ap.add_argument("--dataset", default="mnist")
  args = ap.parse_args(argv)
  start = time.time()
  run_root = common.RUNS / f"{args.name}_{args.dataset}"
  rows, cache = [], {}
  for run_dir in sorted(p for p in run_root.iterdir() if (p / "model.msgpack").exists()):
    cfg = ml_collections.ConfigDict(json.loads((run_dir / "config.json").read_text()))
    common.repro.note_configs([cfg])
    # The run's own subset first: reproducing its last logged accuracy checks the load.
    sub = experiment.build(cfg, cache=cache)
    template = sub.model.init(jax.random.PRNGKey(0))
    params = flax.serialization.from_bytes(template, (run_dir / "model.msgpack").read_bytes())
    _, sub_acc = engine.evaluate(sub.model, params, sub.x_test, sub.y_test)
    cfg.data.test_samples = 0
    full = experiment.build(cfg, cache=cache)
    loss, acc = engine.evaluate(full.model, params, full.x_test, full.y_test)
    rows.append({"run": run_dir.name, "subset_samples": int(sub.y_test.shape[0]),
                 "subset_accuracy": float(sub_acc), "test_samples": int(full.y_test.shape[0]),
                 "test_loss": float(loss), "test_accuracy": float(acc)})
    print(rows[-1])
  df = pd.DataFrame(rows)
  df["partition"] = df["run"].str.split("_").str[0]
  common.write(df, f"{args.name}_fulltest")
  print(common.mean_std(df, ["partition"], ["test_accuracy"]).to_string())
  common.save_meta(f"{args.name}_fulltest", start, runs=str(run_root.name),
                   note="re-scores the final models of the named Table 2 run (its runs "
                        "folder) on the full test set; no training")


if __name__ == "__main__":
  main()
