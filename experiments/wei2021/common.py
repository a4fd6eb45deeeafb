"""Shared settings and helpers of the Wei et al. (TMC 2021) reproduction scripts.

Two regimes of the MNIST MLP setting (U = 50, MLP 784-256-10, one full-batch step
per round, per-example clipping C = 1, eta = 0.5, delta = 1e-3, eq. (10) noise):

* ``paper``: |D_i| = 800 as in the paper. Eq. (10)'s sigma is proportional to
  Delta_l = 2 eta C / |D_i| = 1.25e-3, and after averaging 50 uploads the noise
  barely hurts at any epsilon in 4..20 (REPRODUCTION.md, "Where the noise matters").
* ``noise``: |D_i| = 100. Delta_l is 8x larger, so the same epsilon means 8x more
  noise; this is where the paper's phenomena (U-shaped loss in T, CRD helping)
  appear. Everything else is unchanged.
* ``strong``: |D_i| = 25, 32x the paper's noise at equal epsilon: T0 = 200 lies
  beyond the best T at every epsilon in 4..20, the situation CRD is built for (it
  can only shorten T).

All runs use ``privacy.noise_sampling = 'aggregate'`` (the server draws the
Gaussian noise of the weighted sum of the K uploads at once: the same distribution
of the model, K times fewer random numbers; ``engine.RoundConfig``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np
import pandas as pd

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro

# Overridable so that a quick check does not overwrite the committed results.
RESULTS = Path(os.environ.get("WEI2021_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = Path(os.environ.get("WEI2021_RUNS", ROOT / "runs" / "wei2021"))
MNIST_DIR = os.environ.get("FEDJAX_DP_MNIST", str(ROOT.parent / "shared" / "datasets" / "mnist"))
EPSILONS = (4.0, 8.0, 12.0, 16.0, 20.0)
T_GRID = (10, 25, 50, 100, 150, 200, 300)
SAMPLES = {"paper": 800, "noise": 100, "strong": 25}
METHODS = ("constant", "crd", "linear_decay", "optimal_t")
LABELS = {"constant": "original UDP (T=200)", "crd": "UDP with CRD",
          "linear_decay": "Lei's approach (linear decay)", "optimal_t": "optimal UDP (T search)"}


def mlp_config(regime: str = "noise", q: float = 1.0, rounds: int = 200):
  """The MNIST MLP setting of Figs. 5-10, 12-15 (see the module docstring)."""
  cfg = config_lib.load_config(ROOT / "experiments" / "configs" / "wei_mnist_mlp.py")
  cfg.data.dir = MNIST_DIR
  cfg.data.samples_per_client = SAMPLES[regime]
  cfg.server.clients_per_round = round(50 * q)
  cfg.rounds = rounds
  cfg.privacy.noise_sampling = "aggregate"
  cfg.schedule.t_grid = T_GRID
  cfg.eval.every = 10
  cfg.progress = True
  return cfg


def add_setting_args(ap) -> None:
  """``--regime``, ``--lr``, ``--clip`` and ``--tag``: which MNIST MLP setting a figure
  runs (:func:`setting_config`) and the suffix of its output names."""
  ap.add_argument("--regime", choices=sorted(SAMPLES), default="noise",
                  help="|D_i|: paper 800, noise 100, strong 25 (module docstring)")
  ap.add_argument("--lr", type=float, default=None,
                  help="eta (default: the config's 0.5; calibrate.py's choice for a re-run)")
  ap.add_argument("--clip", type=float, default=None,
                  help="C (default: the config's 1; calibrate.py's median rule for a re-run)")
  ap.add_argument("--tag", default="", help="suffix of the output names")


def setting_config(args, q: float = 1.0, rounds: int = 200):
  """:func:`mlp_config` of ``args.regime`` with ``args.lr`` and ``args.clip`` where given."""
  cfg = mlp_config(args.regime, q, rounds)
  if args.lr is not None:
    cfg.client.lr = args.lr
  if args.clip is not None:
    cfg.client.clip = args.clip
  return cfg


def setting_name(base: str, args) -> str:
  """``base`` for the noise regime at the config's eta and C without a tag (the names
  of the first results), else ``<base>_<regime><tag>``."""
  default = args.regime == "noise" and args.lr is None and args.clip is None
  return base if default and not args.tag else f"{base}_{args.regime}{args.tag}"


def setting_meta(cfg) -> dict:
  """What a meta.json records of the setting a figure ran."""
  return dict(samples_per_client=cfg.data.samples_per_client,
              clients_per_round=cfg.server.clients_per_round, lr=cfg.client.lr,
              clip=cfg.client.clip, rounds=cfg.rounds)


def method_sets(method: str) -> list[str]:
  """Overrides that make a method run: CRD watches the test loss every round."""
  return ["eval.every=1"] if method == "crd" else []


def run_methods(cfg, methods, grid, out_dir) -> pd.DataFrame:
  """Runs ``methods`` x ``grid`` as one sweep per evaluation cadence; all rows."""
  frames = []
  for every, group in (("1", [m for m in methods if m == "crd"]),
                       ("10", [m for m in methods if m != "crd"])):
    if not group:
      continue
    g = {"schedule.name": list(group), **grid}
    rows = repro.run_sweep(cfg, g, str(Path(out_dir) / f"eval{every}"),
                           sets=[f"eval.every={every}"])
    frames.append(pd.DataFrame(rows))
  return pd.concat(frames, ignore_index=True)


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
  """The last evaluated row of every point (its final test loss and accuracy), with
  ``rounds_used``: the number of rounds the point ran."""
  ev = df[df["test_loss"].notna()]
  fin = ev.groupby("point", sort=False).tail(1).reset_index(drop=True)
  fin["rounds_used"] = df.groupby("point", sort=False)["round"].max().reindex(
      fin["point"]).to_numpy()
  return fin


def final_table(df: pd.DataFrame, by, cols) -> pd.DataFrame:
  """:func:`mean_std` over seeds of the points' final rows."""
  return mean_std(final_rows(df), by, cols)


def crd_sweep(cfg, grid, name) -> pd.DataFrame:
  """A CRD-only sweep (evaluation after every round) over ``grid``; all rows."""
  rows = repro.run_sweep(cfg, grid, str(RUNS / name),
                         sets=["schedule.name=crd", "eval.every=1"])
  return pd.DataFrame(rows)


def figure(table, x, panels, group, title, name, xlabel=None, label=None, extra=None):
  """One errorbar panel per ``(column, ylabel)`` of ``panels``, a line per ``group``
  value (``label(value)`` its legend); ``extra(axes)`` draws more before the figure
  is saved as ``results/<name>.png``. Columns with ``_mean``/``_std`` get error bars."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
  axes = np.atleast_1d(axes)
  for key, t in table.groupby(group, sort=False):
    for ax, (col, _) in zip(axes, panels):
      if f"{col}_mean" in t:
        errorbar_plot(ax, t, x, col, label(key) if label else f"{group}={key:g}")
      else:
        ax.plot(t[x], t[col], "o-", label=label(key) if label else f"{group}={key:g}")
  for ax, (_, ylabel) in zip(axes, panels):
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
  if extra is not None:
    extra(axes)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(RESULTS / f"{name}.png", dpi=110)
  plt.close(fig)


def optimal_t_tables(sweep_dir: Path) -> pd.DataFrame:
  """Every optimal_t point's candidate table (loss vs T) with the point's values."""
  meta = json.loads((sweep_dir / "sweep.json").read_text())
  frames = []
  for p in meta["points"]:
    path = sweep_dir / "points" / p["name"] / "optimal_t.csv"
    if path.exists():
      t = pd.read_csv(path)
      for k, v in p["values"].items():
        t[k] = v
      frames.append(t)
  return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def write(df: pd.DataFrame, name: str) -> Path:
  return repro.write_csv(RESULTS, df, name)


def save_meta(name: str, start: float, **extra) -> None:
  repro.save_meta(RESULTS, name, start, **extra)


def mean_std(df: pd.DataFrame, by, cols) -> pd.DataFrame:
  """Mean, std and count of ``cols`` per ``by`` group (over seeds)."""
  agg = df.groupby(by)[list(cols)].agg(["mean", "std", "count"])
  agg.columns = [f"{c}_{s}" for c, s in agg.columns]
  return agg.reset_index()


def errorbar_plot(ax, table, x, y, label, **kw):
  ax.errorbar(table[x], table[f"{y}_mean"], yerr=np.nan_to_num(table[f"{y}_std"]),
              marker="o", capsize=3, label=label, **kw)
