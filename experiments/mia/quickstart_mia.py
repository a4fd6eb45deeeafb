"""Membership inference against the digits quickstart, with and without DP.

Attacks the final global model of ``experiments/configs/quickstart.py`` variants with
the loss-threshold attack (Yeom et al. 2018) and a 25-shadow-model attack (Shokri et
al. 2017), and prints each row beside the largest advantage the run's certified
epsilon allows. Writes ``experiments/mia/results/<name>.csv`` (``--name``, default
``quickstart_mia``; the folder is ``MIA_RESULTS`` where set) and its meta.json.

  python experiments/mia/quickstart_mia.py                      # every setting
  python experiments/mia/quickstart_mia.py --only nodp_t1000 --attacks loss_threshold
  python experiments/mia/quickstart_mia.py --only yuan_mnist_nodp_m30 \
      --data-dir ../shared/datasets/mnist --shadow-group 5 --name yuan_mnist_nodp_mia
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd

from fedjax_dp import reproduction as repro
from fedjax_dp.attacks import membership_inference
from fedjax_dp.config import load_config, override

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = Path(os.environ.get("MIA_RESULTS", os.path.join(HERE, "results")))
CONFIG = os.path.join(HERE, "..", "configs", "quickstart.py")

# name -> overrides of the quickstart config.
NO_DP = ["privacy.epsilon=inf", "privacy.placement=none", "client.clip_mode=none"]
SETTINGS = {
    # Plain FedAvg (no clipping, no noise), trained long: 10 clients x 140 digits.
    "nodp_t1000": NO_DP + ["rounds=1000"],
    # The quickstart as shipped: clipping C = 1 and Wei eq. (10) noise, eps = 8, T = 100.
    "dp_eps8_t100": [],
    "dp_eps1_t100": ["privacy.epsilon=1"],
    # Little data per client (10 x 20 digits): a model that overfits more.
    "nodp_small_t1000": NO_DP + ["rounds=1000", "data.samples_per_client=20"],
    "dp_eps8_small_t100": ["data.samples_per_client=20"],
}
# Yuan et al.'s Table III target without DP (spec section 7.1): MLP 784-32-10 with linear
# activation on MNIST, U = 100 x 600, K = 10, tau = 5 full-batch steps, M = 30. eta is not
# given (0.5 here). Needs the MNIST files: --data-dir; not in the default list.
YUAN_NO_DP = NO_DP + [
    "data.name=mnist", "data.num_clients=100", "data.samples_per_client=600",
    "model.name=mlp_784_32_10_linear", "client.local_steps=5", "client.batch_size=0",
    "client.lr=0.5", "server.clients_per_round=10", "rounds=30", "eval.every=30"]
MNIST_SETTINGS = {"yuan_mnist_nodp_m30": YUAN_NO_DP}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--only", nargs="*", default=list(SETTINGS),
                 choices=list(SETTINGS) + list(MNIST_SETTINGS))
  p.add_argument("--data-dir", default=None,
                 help="MNIST IDX files, for " + ", ".join(MNIST_SETTINGS))
  p.add_argument("--shadow-group", type=int, default=None,
                 help="shadow runs per compiled group (lower it for MNIST: memory)")
  p.add_argument("--attacks", default="loss_threshold,shadow")
  p.add_argument("--num-shadow", type=int, default=25)
  p.add_argument("--name", default="quickstart_mia",
                 help="results/<name>.csv and <name>_meta.json")
  args = p.parse_args()
  start = time.time()
  rows = []
  for name in args.only:
    sets = SETTINGS.get(name) or MNIST_SETTINGS[name]
    if name in MNIST_SETTINGS:
      if not args.data_dir:
        p.error(f"{name} needs --data-dir (the MNIST IDX files)")
      sets = [*sets, f"data.dir={args.data_dir}"]
    cfg = override(load_config(CONFIG), [*sets, "progress=false"])
    cfg.name = name
    repro.note_configs([cfg])
    t = time.time()
    row = membership_inference(cfg, attacks=tuple(args.attacks.split(",")),
                               num_shadow=args.num_shadow, shadow_group=args.shadow_group)
    row["wall_s"] = round(time.time() - t, 1)
    rows.append(row)
    keys = ["final_test_accuracy", "epsilon_certified", "advantage_bound", "accuracy_bound",
            "loss_members", "loss_nonmembers", "shadow_in_sample_accuracy"] + [
        f"{a}_{k}" for a in args.attacks.split(",")
        for k in ("accuracy", "advantage", "auc", "best_accuracy")] + ["wall_s"]
    print(name, {k: round(row[k], 4) if isinstance(row[k], float) else row[k]
                 for k in keys if k in row}, flush=True)
  repro.write_csv(RESULTS, pd.DataFrame(rows), args.name)
  repro.save_meta(RESULTS, args.name, start, only=args.only, attacks=args.attacks,
                  num_shadow=args.num_shadow)


if __name__ == "__main__":
  main()
