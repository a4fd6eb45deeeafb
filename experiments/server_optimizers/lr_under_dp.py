"""Is the server learning rate tuned at eps = inf still the right one under DP?

  python experiments/server_optimizers/lr_under_dp.py --task digits_mlp

study.py runs the DP points only at the rate each optimizer's eps = inf tuning chose
(what a practitioner who tunes without noise gets). This script runs the same DP
points (eps in 1, 4, 16 x the 3 seeds, same configs otherwise) at the rates of that
tuning grid up to ``--below`` half-decades BELOW the chosen one (a smaller server
step scales the noise down with the signal; above the chosen rate the eps = inf loss
already rises), reading the grid from ``results/<task>_tuning.csv``. It chooses
nothing: it reports the final test accuracy at every rate, so REPORT.md can say how
much the eps = inf choice gives up against the best rate at each epsilon (an oracle
that reads the test set, shown for comparison only, never used to pick a result).

Writes ``results/<task>_lr_under_dp.csv`` (every point's final row, the chosen rate's
points read from ``results/<task>.csv``), ``results/<task>_lr_under_dp_table.csv``
(mean, std, count over seeds per optimizer, rate and eps) and
``results/<task>_lr_under_dp_meta.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pandas as pd
import study  # pylint: disable=wrong-import-position

from fedjax_dp import reproduction as repro  # study.py put the repository on the path


def write(name: str, frames, start: float, **meta) -> pd.DataFrame:
  """Writes the CSVs and the meta.json of the points run so far."""
  out = pd.concat(frames, ignore_index=True)
  cols = ["optimizer", "server.lr", "chosen", "privacy.epsilon", "seed", "test_accuracy",
          "test_loss", "epsilon_certified", "noise_mean"]
  repro.write_csv(study.RESULTS, out[cols], name)
  table = repro.mean_std(out, ["optimizer", "server.lr", "chosen", "privacy.epsilon"],
                         ["test_accuracy", "test_loss"])
  repro.write_csv(study.RESULTS, table, name + "_table")
  repro.save_meta(study.RESULTS, name, start, points=len(out), **meta)
  return table


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", choices=sorted(study.TASKS), default="digits_mlp")
  parser.add_argument("--below", type=int, default=1,
                      help="half-decades below the chosen rate to run")
  parser.add_argument("--optimizers", default=",".join(study.OPTIMIZERS),
                      help="comma-separated, in the order to run them")
  args = parser.parse_args(argv)
  start = time.time()
  task = study.TASKS[args.task]
  cfg = study.task_config(task, task.rounds, task.client_lr)
  tuning = pd.read_csv(study.RESULTS / f"{args.task}_tuning.csv")
  chosen = pd.read_csv(study.RESULTS / f"{args.task}.csv")
  chosen = chosen[chosen["privacy.epsilon"] != np.inf].assign(chosen=True)
  name = f"{args.task}_lr_under_dp"
  frames, done = [], []
  for opt in args.optimizers.split(","):
    t = tuning[tuning["optimizer"] == opt]
    if t.empty:
      continue
    frames.append(chosen[chosen["optimizer"] == opt])
    score = t.groupby("server.lr")["tune_train_loss"].mean()
    best = float(t.loc[t["chosen"], "server.lr"].iloc[0])
    lower = [lr for lr in score.index if lr < best * (1 - 1e-6)]
    for lr in sorted(lower)[::-1][:args.below]:
      t0 = time.time()
      rows = study.dp_points(opt, cfg, float(lr), study.SEEDS, args.task,
                             suffix=f"_lr{lr:g}").assign(
          **{"server.lr": float(lr)}, optimizer=opt)
      frames.append(repro.final_rows(rows).assign(chosen=False))
      print(f"{opt} server lr {lr:g}: {time.time() - t0:.0f} s", flush=True)
    done.append(opt)
    table = write(name, frames, start, below=args.below, optimizers_done=done)
  print(table.to_string(index=False))


if __name__ == "__main__":
  main()
