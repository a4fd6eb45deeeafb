"""Wei et al. Fig. 11: CIFAR-10 CNN, CRD vs original UDP vs Lei vs optimal UDP.

U = 50, K = 30 (q = 0.6), 800 images per client, T0 = 200, beta = 0.9, epsilon in
{4, 8, 12, 16, 20}; the one-conv CNN ``cnn_wei_cifar10`` (the paper gives kernel 5
and padding 4 only; the rest is assumed, see the model's docstring). CIFAR-10 is
read from ``--data-dir`` (the python batches) or through tensorflow-datasets when
its data are already prepared; without either the script says so and exits 0
without writing anything (nothing can be downloaded here).

Writes ``results/fig11_cifar10.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig11_cifar.py [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import time

import common

from fedjax_dp.data import DatasetUnavailableError, load_dataset


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--data-dir", default=None)
  ap.add_argument("--seeds", type=int, default=1)
  ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in common.EPSILONS))
  args = ap.parse_args(argv)
  try:
    load_dataset("cifar10", args.data_dir)
  except DatasetUnavailableError as e:
    print(f"Fig. 11 skipped: CIFAR-10 is not available on this machine ({e})")
    return 0
  start = time.time()
  cfg = common.mlp_config("paper", 0.6)
  cfg.name = "wei_fig11_cifar10"
  cfg.data.name = "cifar10"
  cfg.data.dir = args.data_dir
  cfg.model.name = "cnn_wei_cifar10"
  cfg.client.lr = 0.1
  eps = [float(e) for e in args.epsilons.split(",")]
  df = common.run_methods(cfg, list(common.METHODS), {"privacy.epsilon": eps,
                                                      "seed": list(range(args.seeds))},
                          common.RUNS / "fig11_cifar10")
  fin = common.final_rows(df)
  table = common.mean_std(fin, ["schedule.name", "privacy.epsilon"],
                          ["test_loss", "test_accuracy", "epsilon_certified"])
  common.write(table, "fig11_cifar10")
  print(table.to_string())
  common.save_meta("fig11_cifar10", start)
  return 0


if __name__ == "__main__":
  sys.exit(main())
