"""DP-FedAvg vs DP-FedAvgM vs DP-FedAdam at equal certified epsilon (client-level DP).

  python experiments/server_optimizers/study.py --task mnist_cnn [--quick]
  python experiments/server_optimizers/study.py --task digits_mlp [--quick]

The mechanism is DP-FedAvg as in McMahan et al. 2018: each selected client's model
update is clipped in L2 to C (``client.clip_mode=update_l2``), the server sums the
clipped updates over a FIXED denominator (``server.aggregation=fixed``: |D_i| / (q |D|),
equal client sizes, so 1 / K) and adds Gaussian noise once to the sum
(``privacy.placement=central``), K of U clients drawn uniformly without replacement
each round; the noise is the smallest whose certified epsilon (client level, RDP of
fixed-size sampling) is at most the target after T rounds. The three methods differ
only in the server's step on the noisy aggregate (post-processing;
fedjax_dp/optimizers.py): ``fedavg`` (w + lr (aggregate - w)), ``fedavgm`` (heavy-ball
momentum 0.9 on the pseudo-gradient; Hsu et al. 2019, McMahan et al. 2018) and
``fedadam`` (Adam on the pseudo-gradient, beta1 0.9, beta2 0.99, tau 1e-3: the config's
defaults, in Reddi et al. 2021's range). All three see the same noise multiplier at
each epsilon: the accounting does not depend on the server step.

Tasks (small federations, sized for a shared 2-core CPU):

* ``mnist_cnn``: real MNIST (``../shared/datasets/mnist``), LeNet-5 (``cnn_yuan``,
  44,426 parameters), U = 400 clients x 20 examples split by a Dirichlet(0.3) over
  labels (non-IID), K = 40 a round (q = 0.1), 2 local SGD steps of batch 5 at client
  lr 0.3, C = 0.5, T = 20 rounds, delta = 1e-3, test accuracy on a fixed subset of
  1,000 MNIST test images.
* ``digits_mlp``: the quickstart's task, scikit-learn's 8x8 digits with the
  quickstart's MLP (``mlp_784_256_10``, 64-256-10 here, 19,210 parameters), U = 140
  clients x 10 examples (IID), K = 28 a round (q = 0.2), 2 local SGD steps of batch 5
  at client lr 0.1, C = 0.5, T = 50 rounds, delta = 1e-3, the 360 held-out digits.

Fixed for all three optimizers (not tuned per optimizer): the client optimizer (SGD),
its learning rate, local steps, batch and C. MNIST's client lr 0.3 was picked in a
pilot at eps = inf (fedavg, server lr 1 and 3, 20 rounds, one seed) on the training
loss: at 0.1 it stayed at 2.15-2.30 (chance), at 0.3 it reached 1.73-2.20.

Protocol. The server learning rate of each optimizer is tuned at eps = inf only (no
noise; clipping and the fixed denominator as under DP): a 3-point grid (x sqrt(10)
apart; extended once by three more half-decades when the best is at an end) x the
3 seeds, picked by the lowest global-model TRAINING loss of the last 5
rounds (``train_loss``: the global model's loss on the selected clients' first batch,
averaged over rounds and seeds), never by the test set. The DP points (eps in 1, 4, 16
x the same 3 seeds) then run at the tuned rate; their eps = inf row is the tuning
run at that rate (the same config, so the same result). The DP points at the other
rates are not run: the study reports what a practitioner who tunes without noise
would get.

Writes, under ``results/`` (``<task>`` is the --task):

* ``<task>_tuning.csv``: one row per (optimizer, server lr, seed) at eps = inf: the
  tuning metric, the final test accuracy (reported, not used) and ``chosen``;
* ``<task>.csv``: every point's final row (optimizer, eps, seed, server lr, test
  accuracy and loss, certified epsilon, noise multiplier);
* ``<task>_table.csv``: mean, std and count over seeds per optimizer and eps;
* ``<task>_curves.csv``: test accuracy every 5 rounds of every reported point;
* ``<task>.png`` (accuracy vs epsilon with std bars; curves vs rounds) and
  ``<task>_meta.json``.

References: McMahan, Ramage, Talwar & Zhang 2018, "Learning Differentially Private
Recurrent Language Models" (ICLR); Reddi et al. 2021, "Adaptive Federated
Optimization" (ICLR); Hsu, Qi & Brown 2019, "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification".
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np
import pandas as pd

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro

RESULTS = Path(os.environ.get("SERVER_OPTIMIZERS_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = Path(os.environ.get("SERVER_OPTIMIZERS_RUNS", ROOT / "runs" / "server_optimizers"))
MNIST_DIR = os.environ.get("FEDJAX_DP_MNIST", str(ROOT.parent / "shared" / "datasets" / "mnist"))
EPSILONS = (1.0, 4.0, 16.0)
SEEDS = (0, 1, 2)
TUNE_LAST = 5  # rounds whose training loss the tuning averages

# Each optimizer's server-lr grid (3 points, x sqrt(10) apart), centred where its
# step has FedAvg's size: momentum 0.9 multiplies a steady step by 1 / (1 - 0.9) = 10;
# Adam's per-coordinate step is about lr whatever the pseudo-gradient's scale.
# The grids are log10 exponents (10 ** e, half-decades).
OPTIMIZERS: dict[str, tuple[list[str], tuple[float, ...]]] = {
    "fedavg": (["server.optimizer=fedavg"], (0.0, 0.5, 1.0)),
    "fedavgm": (["server.optimizer=fedavgm", "server.momentum=0.9"], (-1.0, -0.5, 0.0)),
    "fedadam": (["server.optimizer=fedadam", "server.beta1=0.9", "server.beta2=0.99",
                 "server.tau=1e-3"], (-3.0, -2.5, -2.0)),
}
_COMMON = ["server.aggregation=fixed", "client.clip_mode=update_l2", "privacy.placement=central",
           "privacy.mechanism=gaussian", "privacy.formula=calibrated", "privacy.delta=1e-3",
           "server.selection=uniform", "client.optimizer=sgd", "client.local_steps=2",
           "client.batch_size=5", "client.clip=0.5", "eval.every=5", "progress=false",
           "server.client_chunk=0", "checkpoint.every=0"]


class Task(NamedTuple):
  """One task: its overrides (on the base config), rounds and client learning rate."""
  sets: list[str]
  rounds: int
  client_lr: float


TASKS = {
    "mnist_cnn": Task([
        "data.name=mnist", f"data.dir={MNIST_DIR}", "data.partition=dirichlet",
        "data.alpha=0.3", "data.num_clients=400", "data.samples_per_client=20",
        "data.test_samples=1000", "model.name=cnn_yuan", "server.clients_per_round=40"], 20, 0.3),
    "digits_mlp": Task([
        "data.name=digits", "data.partition=iid", "data.num_clients=140",
        "data.samples_per_client=10", "model.name=mlp_784_256_10",
        "server.clients_per_round=28"], 50, 0.1),
}


def task_config(task: Task, rounds: int, client_lr: float):
  return config_lib.override(config_lib.base_config(), [
      *_COMMON, *task.sets, f"rounds={rounds}", f"client.lr={client_lr}"])


def _sweep(cfg, grid, out: Path, sets) -> pd.DataFrame:
  df = pd.DataFrame(repro.run_sweep(cfg, grid, str(out), sets=sets))
  for c in ("test_accuracy", "test_loss", "train_loss", "epsilon_certified",
            "privacy.epsilon", "server.lr", "round"):
    if c in df:
      df[c] = pd.to_numeric(df[c], errors="coerce")
  return df


def _lrs(exponents) -> list[float]:
  """``10 ** e`` to 3 significant digits (the grid is half-decades)."""
  return [float(f"{10 ** e:.3g}") for e in exponents]


def tune(name: str, cfg, rounds: int, seeds, tag: str) -> tuple[float, pd.DataFrame, pd.DataFrame]:
  """The server-lr grid of ``name`` at eps = inf; returns the chosen lr, the tuning
  rows (one per lr and seed) and every round's rows of the sweeps.

  When the best rate is at an end of the grid, the grid is extended once by three
  more half-decades beyond it (three rates x the seeds: the same lane count, so the
  same compiled program).
  """
  sets, exps = OPTIMIZERS[name]
  frames = []
  for attempt in range(2):
    df = _sweep(cfg, {"server.lr": _lrs(exps), "seed": list(seeds),
                      "privacy.epsilon": [math.inf]},
                RUNS / f"{tag}_{name}_tune{attempt or ''}", sets)
    frames.append(df.assign(point=f"tune{attempt}_" + df["point"].astype(str)))
    df = pd.concat(frames, ignore_index=True)
    last = df[df["round"] > rounds - TUNE_LAST].groupby("point", sort=False)["train_loss"].mean()
    fin = repro.final_rows(df)
    # A diverged lane (nan / inf loss) ranks last.
    loss = last.reindex(fin["point"]).to_numpy()
    fin["tune_train_loss"] = np.where(np.isfinite(loss), loss, np.inf)
    score = fin.groupby("server.lr")["tune_train_loss"].mean()
    chosen = float(score.idxmin())
    tried = sorted(score.index)
    if attempt or chosen not in (tried[0], tried[-1]):
      break
    step = 0.5 if chosen == tried[-1] else -0.5
    end = max(exps) if step > 0 else min(exps)
    exps = tuple(end + step * k for k in (1, 2, 3))
  fin["chosen"] = np.isclose(fin["server.lr"], chosen)
  fin["optimizer"] = name
  return chosen, fin, df


def dp_points(name: str, cfg, lr: float, seeds, tag: str, suffix: str = "") -> pd.DataFrame:
  """Every DP point of ``name`` at server lr ``lr`` (eps in EPSILONS x seeds), run
  under ``RUNS/<tag>_<name>_dp<suffix>``."""
  sets, _ = OPTIMIZERS[name]
  return _sweep(cfg, {"privacy.epsilon": list(EPSILONS), "seed": list(seeds)},
                RUNS / f"{tag}_{name}_dp{suffix}", [*sets, f"server.lr={lr}"])


def plot(table: pd.DataFrame, curves: pd.DataFrame, title: str, path: Path) -> None:
  """Left: final test accuracy vs epsilon (eps = inf at the right), mean +- std over
  seeds. Right: mean test accuracy vs round at eps = 16 (solid) and inf (dashed)."""
  plt = repro.pyplot()
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
  xs = {e: i for i, e in enumerate([*EPSILONS, math.inf])}
  colors = dict(zip(OPTIMIZERS, ("C0", "C1", "C2")))
  for i, (name, t) in enumerate(table.groupby("optimizer", sort=False)):
    x = np.array([xs[e] for e in t["privacy.epsilon"]]) + (i - 1) * 0.06
    ax.errorbar(x, t["test_accuracy_mean"], yerr=np.nan_to_num(t["test_accuracy_std"]),
                marker="o", capsize=3, label=f"DP-{name}",
                color=colors[name])
  ax.set_xticks(list(xs.values()), [("inf" if math.isinf(e) else f"{e:g}") for e in xs])
  ax.set_xlabel("certified epsilon (client level, delta = 1e-3)")
  ax.set_ylabel(f"final test accuracy ({len(SEEDS)} seeds, mean +- std)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  mean = curves.groupby(["optimizer", "privacy.epsilon", "round"], sort=False)[
      "test_accuracy"].mean().reset_index()
  for name in OPTIMIZERS:
    for eps, ls in ((16.0, "-"), (math.inf, "--")):
      c = mean[(mean["optimizer"] == name) & (mean["privacy.epsilon"] == eps)]
      bx.plot(c["round"], c["test_accuracy"], ls, color=colors[name],
              label=f"{name}, eps = {eps:g}")
  bx.set_xlabel("round")
  bx.set_ylabel("test accuracy (mean over seeds)")
  bx.grid(alpha=0.3)
  bx.legend(fontsize=7)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)


KEEP = ["optimizer", "privacy.epsilon", "seed", "server.lr", "round", "test_accuracy",
        "test_loss", "train_loss", "epsilon_certified", "noise_mean", "point"]


def write(name: str, title: str, tuning, finals, curves, start: float, **meta) -> pd.DataFrame:
  """Writes the CSVs, the figure and the meta.json of the optimizers done so far."""
  tuning = pd.concat(tuning, ignore_index=True)
  repro.write_csv(RESULTS, tuning[["optimizer", "server.lr", "seed", "tune_train_loss",
                                   "test_accuracy", "rounds_used", "chosen"]],
                  name + "_tuning")
  out = pd.concat(finals, ignore_index=True)
  cols = [c for c in KEEP if c in out and c != "point"]
  repro.write_csv(RESULTS, out[cols], name)
  table = repro.mean_std(out, ["optimizer", "privacy.epsilon", "server.lr"],
                         ["test_accuracy", "test_loss", "epsilon_certified"])
  order = {n: i for i, n in enumerate(OPTIMIZERS)}
  table = table.sort_values(["optimizer", "privacy.epsilon"],
                            key=lambda s: s.map(order) if s.name == "optimizer" else s)
  repro.write_csv(RESULTS, table, name + "_table")
  curves = pd.concat(curves, ignore_index=True)
  repro.write_csv(RESULTS, curves[[c for c in cols if c in curves]], name + "_curves")
  plot(table, curves, title, RESULTS / f"{name}.png")
  repro.save_meta(RESULTS, name, start, points=len(out), **meta)
  return table


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", choices=sorted(TASKS), default="mnist_cnn")
  parser.add_argument("--quick", action="store_true", help="4 rounds, one seed (a smoke run)")
  args = parser.parse_args(argv)
  start = time.time()
  task = TASKS[args.task]
  rounds, seeds = (4, (0,)) if args.quick else (task.rounds, SEEDS)
  name = args.task + ("_quick" if args.quick else "")
  cfg = task_config(task, rounds, task.client_lr)
  repro.note_decision(repro.decision(
      f"server learning rate per optimizer (grid at eps = inf, lowest training loss of "
      f"the last {TUNE_LAST} rounds averaged over seeds)",
      "the selected clients' training data at eps = inf (no noise; tuning only, not "
      "the test set)"))
  if args.task == "mnist_cnn":
    repro.note_decision(repro.decision(
        "client learning rate 0.3 (pilot at eps = inf, fedavg, 0.1 vs 0.3)",
        "the selected clients' training data at eps = inf (no noise; not the test set)"))
  tuning, finals, curves = [], [], []
  for i, opt in enumerate(OPTIMIZERS):
    t0 = time.time()
    lr, tuned, tune_rows = tune(opt, cfg, rounds, seeds, name)
    tuning.append(tuned)
    print(f"{opt}: server lr {lr:g} ({time.time() - t0:.0f} s)", flush=True)
    dp = dp_points(opt, cfg, lr, seeds, name).assign(**{"server.lr": lr})
    inf_rows = tune_rows[np.isclose(tune_rows["server.lr"], lr)]
    for rows in (inf_rows, dp):
      rows = rows.assign(optimizer=opt)
      finals.append(repro.final_rows(rows))
      curves.append(rows[rows["test_accuracy"].notna()])
    print(f"{opt}: DP points ({time.time() - t0:.0f} s)", flush=True)
    done = list(OPTIMIZERS)[:i + 1]
    table = write(name, f"{args.task}: DP-FedAvg / FedAvgM / FedAdam, T = {rounds}",
                  tuning, finals, curves, start, quick=args.quick, optimizers_done=done,
                  partial=len(done) < len(OPTIMIZERS))
  print(table.to_string(index=False))


if __name__ == "__main__":
  main()
