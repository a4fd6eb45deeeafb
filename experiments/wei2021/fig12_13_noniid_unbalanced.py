"""Wei et al. Figs. 12/13: CRD vs original UDP vs Lei on non-IID and unbalanced MNIST.

MNIST MLP, K = U = 50, T = T0 = 200, beta = 0.9, epsilon in {4, 8, 12, 16, 20}.

* ``--setting noniid`` (Fig. 12): every client holds four digit classes in equal
  amounts and no two clients hold the same set of four (``data.partition =
  k_classes``, k = 4; spec section 7.2), 100 samples per client (noise regime).
* ``--setting unbalanced`` (Fig. 13): five groups of 10 clients with 50, 75, 100,
  125 and 150 samples: the paper's 400/600/800/1000/1200 divided by 8, as in the
  noise regime (``data.partition = unbalanced``). ``--regime paper`` uses the
  paper's sizes (800 per client non-IID; 400-1200 unbalanced), with ``--lr`` and
  ``--clip`` the calibrated eta and C.

The paper compares against original UDP and Lei; optimal UDP is left out here
(``--methods`` adds it). Writes ``results/fig12_noniid_<regime>.{csv,png}`` or
``results/fig13_unbalanced_<regime>.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig12_13_noniid_unbalanced.py --setting noniid
  python experiments/wei2021/fig12_13_noniid_unbalanced.py --setting unbalanced
  python experiments/wei2021/fig12_13_noniid_unbalanced.py --setting noniid --regime paper \
      --lr 2 --clip 0.5 --tag _cal                   # the paper's sizes at a calibrated setting
"""

from __future__ import annotations

import argparse
import time

import common


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--setting", choices=["noniid", "unbalanced"], required=True)
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in common.EPSILONS))
  ap.add_argument("--methods", default="constant,crd,linear_decay")
  common.add_setting_args(ap)
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.setting_config(args)
  if args.setting == "noniid":
    cfg.data.partition = "k_classes"
    cfg.data.classes_per_client = 4
    fig_no = 12
  else:
    scale = common.SAMPLES[args.regime] / 800
    cfg.data.partition = "unbalanced"
    cfg.data.group_sizes = tuple(int(s * scale) for s in (400, 600, 800, 1000, 1200))
    fig_no = 13
  name = f"fig{fig_no}_{args.setting}_{args.regime}{args.tag}"
  cfg.name = f"wei_{name}"
  methods = args.methods.split(",")
  eps = [float(e) for e in args.epsilons.split(",")]
  df = common.run_methods(cfg, methods, {"privacy.epsilon": eps,
                                         "seed": list(range(args.seeds))},
                          common.RUNS / name)
  table = common.final_table(df, ["schedule.name", "privacy.epsilon"],
                             ["test_loss", "test_accuracy", "rounds_used", "epsilon_claimed",
                              "epsilon_certified"])
  common.write(table, name)
  common.figure(table, "privacy.epsilon",
                [("test_accuracy", "final test accuracy"),
                 ("epsilon_certified_mean", "certified epsilon (RDP, delta=1e-3)")],
                "schedule.name", f"Wei et al. Fig. {fig_no}: {args.setting} MNIST "
                f"({args.regime} regime, mean +- std over {args.seeds} seeds)", name,
                xlabel="privacy level epsilon_p (claimed)", label=common.LABELS.get,
                extra=lambda axes: axes[1].plot(eps, eps, "k:", label="claimed = target"))
  print(table.to_string())
  common.save_meta(name, start, setting=common.setting_meta(cfg))


if __name__ == "__main__":
  main()
