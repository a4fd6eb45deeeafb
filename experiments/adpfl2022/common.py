"""Shared settings and helpers of the A-DPFL reproduction scripts (spec adpfl.md).

The paper's setting, its four methods, the reductions on the 2-core CPU and the
noise units are :mod:`fedjax_dp.papers.adpfl` (re-exported here, so that the
notebook, which runs from an installed package, uses the same code). Added here:
where the data, runs and results are, seeds as the scripts say (3 for Table 2, 1
elsewhere), and the scripts' command-line flags.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pandas as pd

from fedjax_dp import reproduction as repro
from fedjax_dp.papers import adpfl
from fedjax_dp.papers.adpfl import (  # noqa: F401  (the scripts' names)
    ALPHA,
    CLIENTS_PER_ROUND,
    K_DECAY,
    LABELS,
    METHODS,
    ROUNDS,
    SIGMA0,
    calibrate_multiplier,
    certified,
    epsilon_of,
    final,
    has_clfl,
    method_config,
    paper_sigma,
)

# The eps = inf calibration's pick (calibrate.py, results/baseline_calibration.csv):
# LeNet-5 with 60 local steps reaches 0.954 after T = 50 (target 0.97, not met; the
# controls are in REPRODUCTION.md). Every figure runs at it by default;
# ``--model mlp_784_256_10 --local-steps 0`` is the pre-calibration setting (the MLP,
# one local epoch of 3 steps).
MODEL = "cnn_yuan"
LOCAL_STEPS = 60

RESULTS = Path(os.environ.get("ADPFL2022_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = Path(os.environ.get("ADPFL2022_RUNS", ROOT / "runs" / "adpfl2022"))
MNIST_DIR = os.environ.get("FEDJAX_DP_MNIST", str(ROOT.parent / "shared" / "datasets" / "mnist"))
CIFAR_DIR = os.environ.get("FEDJAX_DP_CIFAR10")

# Table 2 (spec section 5.3, E2): the paper's accuracies of A-DPFL.
TABLE2_CLAIM = {("mnist", "iid"): 0.989, ("mnist", "noniid"): 0.942,
                ("cifar10", "iid"): 0.704, ("cifar10", "noniid"): 0.641}
CIFAR_MESSAGE = (
    "CIFAR-10 rows skipped: no CIFAR-10 data here (no registry we reach ships it). Where the "
    "data is, run with FEDJAX_DP_CIFAR10=/path/to/cifar-10-batches-py and --dataset cifar10, "
    "e.g. FEDJAX_DP_CIFAR10=... python experiments/adpfl2022/table2.py --dataset cifar10")


# Where A-DPFL's decay reads its score S_t: the selected clients' local data, noised and
# charged ('clients', the paper's collaborators' validation accuracy). Results made
# before 2026-12-02 read the test accuracy ('server'), the set they report on.
VALIDATION = "clients"


def paper_config(dataset: str = "mnist", partition: str = "noniid", *, model: str = MODEL,
                 local_steps: int = LOCAL_STEPS, **kwargs):
  """:func:`fedjax_dp.papers.adpfl.paper_config` with this machine's data: MNIST from
  ``FEDJAX_DP_MNIST`` (default ../shared/datasets/mnist), CIFAR-10 from
  ``FEDJAX_DP_CIFAR10`` (none: the CIFAR rows are skipped with :data:`CIFAR_MESSAGE`),
  at the calibrated ``model`` and ``local_steps`` (0: one local epoch, Table 1's
  reading before the calibration)."""
  if dataset == "cifar10" and not CIFAR_DIR:
    raise SystemExit(CIFAR_MESSAGE)
  data_dir = MNIST_DIR if dataset == "mnist" else CIFAR_DIR
  cfg = adpfl.paper_config(dataset, partition, data_dir=data_dir, model=model, **kwargs)
  if local_steps:
    cfg.client.local_steps = int(local_steps)
  return cfg


def setting_tag(args) -> str:
  """``""`` at the calibrated model and local steps, else ``_<model>_e<local steps>``,
  and ``_val<where>`` off :data:`VALIDATION`: runs off the default setting keep their
  own files."""
  val = "" if args.validation == VALIDATION else f"_val{args.validation}"
  if (args.model, args.local_steps) == (MODEL, LOCAL_STEPS):
    return val
  return f"_{args.model}_e{args.local_steps}{val}"



def run_configs(cfgs: dict, name: str, *, keep: bool = True) -> pd.DataFrame:
  """:func:`fedjax_dp.papers.adpfl.run_configs` under ``RUNS/name/<label>`` (runs
  finished there before are read back); ``keep=False`` writes nothing."""
  repro.note_configs(cfgs)
  return adpfl.run_configs(cfgs, RUNS / name if keep else None)


def _wei():
  """The Wei et al. reproduction's helpers (``mean_std``, ``errorbar_plot``)."""
  path = ROOT / "experiments" / "wei2021" / "common.py"
  spec = importlib.util.spec_from_file_location("wei2021_common", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


mean_std = _wei().mean_std


def write(df: pd.DataFrame, name: str) -> Path:
  return repro.write_csv(RESULTS, df, name)


def save_meta(name: str, start: float, **extra) -> None:
  repro.save_meta(RESULTS, name, start, **extra)


plt = repro.pyplot


def add_args(ap, seeds: int = 1):
  """The reduction flags every script shares."""
  ap.add_argument("--clients", type=int, default=CLIENTS_PER_ROUND, help="K per round")
  ap.add_argument("--model", default=MODEL)
  ap.add_argument("--local-steps", type=int, default=LOCAL_STEPS,
                  help="client.local_steps (0 = one local epoch)")
  ap.add_argument("--rounds", type=int, default=ROUNDS)
  ap.add_argument("--seeds", type=int, default=seeds)
  ap.add_argument("--dataset", choices=["mnist", "cifar10"], default="mnist")
  ap.add_argument("--test-samples", type=int, default=0,
                  help="evaluate (and score the decay) on a fixed subset of this many test "
                       "examples; 0 = all (data.test_samples)")
  ap.add_argument("--client-chunk", type=int, default=0,
                  help="server.client_chunk (0 = all K at once, -1 = from free memory)")
  ap.add_argument("--conv-impl", choices=["auto", "conv", "im2col"], default="auto",
                  help="server.conv_impl for CNNs")
  ap.add_argument("--validation", choices=["clients", "server"], default=VALIDATION,
                  help="where A-DPFL's decay reads its score: the selected clients' data "
                       "(noised, charged) or the test set (for comparison only)")
  return ap


def apply_args(cfg, args):
  """``cfg`` with the evaluation-subset, validation and speed flags of :func:`add_args`."""
  cfg.schedule.validation = args.validation
  cfg.data.test_samples = int(args.test_samples)
  cfg.server.client_chunk = int(args.client_chunk)
  cfg.server.conv_impl = args.conv_impl
  return cfg
