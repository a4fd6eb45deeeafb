"""Shared settings and helpers of the Yuan et al. (amplitude-varying perturbation) scripts.

The setting of Section V-A (spec ``yuan_amplitude_varying.md`` section 7.1):
U = 100 clients of 600 IID MNIST examples, K = 10 drawn without replacement every
round (q = 0.1), tau = 5 full-batch GD steps with the whole parameter vector
projected onto the ball of radius C = 5 after every step, Gaussian noise of
variance ``Theta(m) = theta^(m-1) sigma^2`` on every upload with sigma from eq. (8)
(``privacy.formula = 'yuan_eq8'``, the paper's ``Delta_s = 2 C / |D_k| = 1/60``),
delta = 1e-3, eps = 10, M = 30 (``experiments/configs/yuan_mnist_mlp.py``).

Every run uses ``privacy.noise_sampling = 'aggregate'``: the server draws the
Gaussian noise of the weighted sum of the K uploads at once (the same distribution
of the global model, K times fewer random numbers; ``engine.RoundConfig``).

The generic table/plot helpers (``mean_std``, ``errorbar_plot``, ``final_rows``) are
those of the Wei reproduction (``experiments/wei2021/common.py``), loaded under
another module name; only the output folder differs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np
import pandas as pd

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro
from fedjax_dp.privacy import calibration, formulas

_spec = importlib.util.spec_from_file_location(
    "wei2021_common", ROOT / "experiments" / "wei2021" / "common.py")
wei_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wei_common)
mean_std = wei_common.mean_std
errorbar_plot = wei_common.errorbar_plot
final_rows = wei_common.final_rows

# Overridable so that a quick check does not overwrite the committed results.
RESULTS = Path(os.environ.get("YUAN2023_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = Path(os.environ.get("YUAN2023_RUNS", ROOT / "runs" / "yuan2023"))
MNIST_DIR = os.environ.get("FEDJAX_DP_MNIST", str(ROOT.parent / "shared" / "datasets" / "mnist"))
CIFAR_DIR = os.environ.get("FEDJAX_DP_CIFAR10")

U, K, TAU, C, DELTA, EPS, M = 100, 10, 5, 5.0, 1e-3, 10.0, 30
Q = K / U
THETAS = (0.9, 0.95, 1.0, 1.05, 1.1)
M_GRID = (5, 10, 13, 17, 20, 25, 30)
# Table II of the paper (minimum test loss over M) and its M* (Fig. 3).
TABLE2_PAPER = {0.9: 1.03783, 0.95: 0.92706, 1.0: 0.94142, 1.05: 0.88862, 1.1: 1.01871}
M_STAR_PAPER = 17


# eta of the MLP chosen by the eps = inf calibration (calibrate.py,
# results/baseline_calibration.csv: no-DP test loss 0.468 at M = 30 against Table II's
# best 0.889; the shipped config's 0.1 reaches 0.571). Figures re-run since the
# calibration use it; the others were committed at 0.1 (REPRODUCTION.md says which).
MLP_LR = 0.3


def mlp_config(rounds: int = M, samples: int = 600):
  """Algorithm 1 on MNIST (module docstring) at the calibrated eta; ``samples``
  examples per client."""
  cfg = config_lib.load_config(ROOT / "experiments" / "configs" / "yuan_mnist_mlp.py")
  cfg.data.dir = MNIST_DIR
  cfg.client.lr = MLP_LR
  cfg.data.samples_per_client = samples
  cfg.rounds = rounds
  cfg.privacy.noise_sampling = "aggregate"
  cfg.checkpoint.every = 0
  cfg.progress = False
  return cfg


# The baselines of spec section 6, as ``--set`` overrides of the MLP config (a sum of
# Laplace draws is not Laplace: every client draws its own noise).
BASELINES = {
    "Lap (b = M Ds / eps)": ["schedule.name=constant", "privacy.mechanism=laplace",
                             "privacy.formula=yuan_laplace", "privacy.noise_sampling=per_client"],
    "Lap (variance-matched)": ["schedule.name=constant", "privacy.mechanism=laplace",
                               "privacy.formula=yuan_laplace_matched",
                               "privacy.noise_sampling=per_client"],
    "no DP": ["privacy.epsilon=inf"],
}


def paper_sensitivity(samples: int = 600) -> float:
  """``Delta_s = 2 C / |D_k|`` (eq. (7), the paper's value)."""
  return 2 * C / samples


def certified_sigma0(theta: float, rounds: int, epsilon: float = EPS, samples: int = 600
                     ) -> float:
  """Base amplitude ``sigma_1`` whose geometric schedule CERTIFIES ``(epsilon, delta)``.

  The RDP accountant (``calibration.calibrate_noise_multiplier`` with ``ratio =
  sqrt(theta)``: the std grows by ``sqrt(theta)`` per round) on the event the runs
  certify (``sampling = 'selection'``, q = K/U, example level), in units of the
  paper's ``Delta_s = 2 C / |D_k|``. Against the true ``param_l2`` sensitivity 2C
  every amplitude would be ``|D_k|`` times larger (spec E7).
  """
  z0 = calibration.calibrate_noise_multiplier(
      epsilon, DELTA, rounds, q=Q, sampling="selection", ratio=math.sqrt(theta))
  return float(z0) * paper_sensitivity(samples)


def eq8_sigma0(theta: float, rounds: int, epsilon: float = EPS, samples: int = 600) -> float:
  """Eq. (8)'s base amplitude as printed."""
  return float(formulas.yuan_sigma_eq8(epsilon, DELTA, Q, rounds, theta,
                                       paper_sensitivity(samples)))


def write(df: pd.DataFrame, name: str) -> Path:
  return repro.write_csv(RESULTS, df, name)


def save_meta(name: str, start: float, **extra) -> None:
  repro.save_meta(RESULTS, name, start, **extra)


plt = repro.pyplot


def savefig(fig, name: str) -> None:
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(RESULTS / f"{name}.png", dpi=110)
  plt().close(fig)


def tag(samples: int) -> str:
  """Output-name suffix of a regime: '' for the paper's 600 examples per client, else
  ``_n<samples>`` (fewer examples: a larger Delta_s = 2 C / |D_k|, more noise at equal eps)."""
  return "" if samples == 600 else f"_n{samples}"


def loss_acc_panels(curve, group: str, label_of, x: str, xlabel: str, title: str, name: str,
                    *, final: bool = True, band: bool = False, style_of=None, mark=None,
                    legend_size: int = 8) -> None:
  """The two-panel figure every Yuan script draws: test loss (left) and accuracy
  (right) against ``x``, one mean +- std curve per ``group`` value of ``curve`` (the
  ``<col>_mean`` / ``<col>_std`` table of :func:`mean_std`); saved as
  ``results/<name>.png``.

  Args:
    label_of: group value -> legend label.
    final: y labels say "final test ..." (values at the last round of each M).
    band: a +-1 std band (per-round curves) instead of error bars.
    style_of: optional label -> line style.
    mark: optional vertical reference line ``(x, label)`` on the loss panel.
  """
  pyplot = plt()
  fig, axes = pyplot.subplots(1, 2, figsize=(11, 4))
  draw = curve_band if band else errorbar_plot
  for key, t in curve.groupby(group, sort=False):
    lab = label_of(key)
    kw = {"ls": style_of(lab)} if style_of else {}
    for ax, col in zip(axes, ("test_loss", "test_accuracy")):
      draw(ax, t, x, col, lab, **kw)
  if mark is not None:
    axes[0].axvline(mark[0], color="gray", ls=":", label=mark[1])
  prefix = "final test" if final else "test"
  axes[0].set_ylabel(f"{prefix} loss")
  axes[1].set_ylabel(f"{prefix} accuracy")
  for ax in axes:
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=legend_size)
  fig.suptitle(title)
  savefig(fig, name)


def label(theta: float) -> str:
  return f"theta={theta:g}"


def seeds(n: int) -> list[int]:
  return list(range(n))


def run_grid(cfg, grid, name, sets=()) -> pd.DataFrame:
  """One sweep (one compiled program per shape) into ``RUNS/name``; all rows."""
  rows = repro.run_sweep(cfg, grid, str(RUNS / name), sets=list(sets))
  return pd.DataFrame(rows)


def run_points(cfg, points: Sequence[Mapping[str, Any]], n_seeds: int, name: str
               ) -> pd.DataFrame:
  """Runs every point (``{config key: value}`` over ``cfg``) x ``n_seeds`` seeds as ONE
  batched program (:func:`fedjax_dp.experiment.run_batched`: runs of one shape share
  a compiled round) under ``RUNS/name/<point>/<seed>`` (finished runs are read back):
  for points that are no product grid (each M its own eps). Returns the last metrics
  row of every run with the point's values and its ``seed``."""
  from fedjax_dp import experiment, sweep
  todo, dirs, values = [], [], []
  for i, point in enumerate(points):
    sets = [f"{k}={v!r}" for k, v in point.items()]
    for p in sweep.expand(cfg, {"seed": seeds(n_seeds)}, sets):
      todo.append(p.config)
      dirs.append(RUNS / name / f"{i:03d}" / p.name)
      values.append({**point, "seed": int(p.config.seed)})
  repro.note_configs(todo)
  results = experiment.run_batched(todo, dirs)
  return pd.DataFrame([{**r.rows[-1], **v} for v, r in zip(values, results)])


def equal_certified_epsilon(theta: float, rounds: int, epsilon: float, samples: int = 600
                            ) -> float:
  """The ``privacy.epsilon`` at which eq. (8)'s base amplitude equals the one that
  CERTIFIES ``epsilon`` (:func:`certified_sigma0`, the paper's Delta_s): eq. (8)'s
  sigma is proportional to ``1 / epsilon``, so ``epsilon sigma_eq8 / sigma_cert``."""
  return epsilon * eq8_sigma0(theta, rounds, epsilon, samples) / certified_sigma0(
      theta, rounds, epsilon, samples)


def curve_band(ax, table, x, y, lab, **kw):
  """Mean line with a +-1 std band (over seeds) of ``table``'s ``y_mean``/``y_std``."""
  mu, sd = table[f"{y}_mean"].to_numpy(), np.nan_to_num(table[f"{y}_std"].to_numpy())
  line, = ax.plot(table[x], mu, label=lab, **kw)
  ax.fill_between(table[x], mu - sd, mu + sd, color=line.get_color(), alpha=0.2)
