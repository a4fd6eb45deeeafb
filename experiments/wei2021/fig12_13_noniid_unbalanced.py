"""Wei et al. Figs. 12/13: CRD vs original UDP vs Lei on non-IID and unbalanced MNIST.

MNIST MLP, K = U = 50, T = T0 = 200, beta = 0.9, epsilon in {4, 8, 12, 16, 20}.

* ``--setting noniid`` (Fig. 12): every client holds four digit classes in equal
  amounts and no two clients hold the same set of four (``data.partition =
  k_classes``, k = 4; spec section 7.2), 100 samples per client (noise regime).
* ``--setting unbalanced`` (Fig. 13): five groups of 10 clients with 50, 75, 100,
  125 and 150 samples: the paper's 400/600/800/1000/1200 divided by 8, as in the
  noise regime (``data.partition = unbalanced``). ``--regime paper`` uses the
  paper's sizes.

The paper compares against original UDP and Lei; optimal UDP is left out here
(``--methods`` adds it). Writes ``results/fig12_noniid_<regime>.{csv,png}`` or
``results/fig13_unbalanced_<regime>.{csv,png}``. Run from the repository root::

  python experiments/wei2021/fig12_13_noniid_unbalanced.py --setting noniid
  python experiments/wei2021/fig12_13_noniid_unbalanced.py --setting unbalanced
"""

from __future__ import annotations

import argparse
import time

import common
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--setting", choices=["noniid", "unbalanced"], required=True)
  ap.add_argument("--regime", choices=sorted(common.SAMPLES), default="noise")
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in common.EPSILONS))
  ap.add_argument("--methods", default="constant,crd,linear_decay")
  args = ap.parse_args(argv)
  start = time.time()
  cfg = common.mlp_config(args.regime, 1.0)
  if args.setting == "noniid":
    cfg.data.partition = "k_classes"
    cfg.data.classes_per_client = 4
    fig_no = 12
  else:
    scale = common.SAMPLES[args.regime] / 800
    cfg.data.partition = "unbalanced"
    cfg.data.group_sizes = tuple(int(s * scale) for s in (400, 600, 800, 1000, 1200))
    fig_no = 13
  name = f"fig{fig_no}_{args.setting}_{args.regime}"
  cfg.name = f"wei_{name}"
  methods = args.methods.split(",")
  eps = [float(e) for e in args.epsilons.split(",")]
  df = common.run_methods(cfg, methods, {"privacy.epsilon": eps,
                                         "seed": list(range(args.seeds))},
                          common.RUNS / name)
  fin = common.final_rows(df)
  fin["rounds_used"] = df.groupby("point", sort=False)["round"].max().reindex(
      fin["point"]).to_numpy()
  table = common.mean_std(fin, ["schedule.name", "privacy.epsilon"],
                          ["test_loss", "test_accuracy", "rounds_used", "epsilon_claimed",
                           "epsilon_certified"])
  common.write(table, name)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for m in methods:
    t = table[table["schedule.name"] == m]
    common.errorbar_plot(axes[0], t, "privacy.epsilon", "test_accuracy", common.LABELS[m])
    axes[1].plot(t["privacy.epsilon"], t["epsilon_certified_mean"], "o-", label=common.LABELS[m])
  axes[1].plot(eps, eps, "k:", label="claimed = target")
  axes[0].set_ylabel("final test accuracy")
  axes[1].set_ylabel("certified epsilon (RDP, delta=1e-3)")
  for ax in axes:
    ax.set_xlabel("privacy level epsilon_p (claimed)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Wei et al. Fig. {fig_no}: {args.setting} MNIST ({args.regime} regime, "
               f"mean +- std over {args.seeds} seeds)")
  fig.tight_layout()
  fig.savefig(common.RESULTS / f"{name}.png", dpi=110)
  plt.close(fig)
  print(table.to_string())
  common.save_meta(name, start)


if __name__ == "__main__":
  main()
