"""Yuan et al. (2023), Table III: membership inference with and without DP.

Attacks the final global model of Algorithm 1 (MLP 784-32-10 on MNIST, U = 100,
K = 10, tau = 5, parameter projection C = 5, eq. (8) noise with the geometric
schedule) without DP and at epsilon in {5, 10, 20} x theta in {0.95, 1, 1.05}, with
three attacks (``fedjax_dp.attacks``):

* ``loss_threshold``: Yeom et al. (2018), threshold on the loss, chosen on a
  calibration split (cheap: no shadow models);
* ``shadow``: Shokri et al. (2017), 25 shadow models trained by the target's own
  federated procedure, per-class logistic attack models (the paper's attack);
* ``reference``: offline LiRA (Carlini et al. 2022): the target's logit of p_y on a
  record against the same 25 shadow models' outputs on it when they did not train
  on it (difficulty calibration).

Every attack is reported as balanced accuracy on held-out records with its binomial
standard error, beside the largest accuracy the run's CERTIFIED (epsilon, delta)
allows (``fedjax_dp.attacks.bounds``) and the one the paper's claimed epsilon would
allow (not a certificate: eq. (8) uses Delta_s = 2 C / |D_k|, spec E7).

Two settings (``--settings``; every choice is documented in results/table3_mia.md):

* ``memorise``: 100 clients x 10 records (the federation holds 1000 records), so
  that the non-private model memorises its members; all three attacks, all cells.
* ``memorise_long``: the same without DP only, M = 1000 at eta = 0.1.
* ``paper``: 100 clients x 600 records and M = 30 as in the paper; the non-private
  model does not overfit (test loss below train loss), so no attack can work there;
  the loss-threshold attack only, to show it.

Each setting runs as a few compiled programs: the 9 DP targets are one vmapped
group, and so are their 225 shadow runs (:func:`membership_inference_many`).

  python experiments/yuan2023/table3_mia.py                       # both settings
  YUAN2023_RESULTS=/tmp/t3 python experiments/yuan2023/table3_mia.py \
      --settings memorise --num-shadow 5          # quick, keeps the committed files

Writes results/table3_mia.csv, results/table3_mia.png and the generated part of
results/table3_mia.md (between its ``<!-- table3:begin -->`` / ``end`` markers).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np
import pandas as pd

from fedjax_dp import reproduction as repro
from fedjax_dp.attacks.federated import membership_inference_many
from fedjax_dp.config import load_config, override

HERE = Path(__file__).resolve().parent
RESULTS = Path(os.environ.get("YUAN2023_RESULTS", HERE / "results"))
MNIST_DIR = os.environ.get("FEDJAX_DP_MNIST", str(ROOT.parent / "shared" / "datasets" / "mnist"))
CONFIG = ROOT / "experiments" / "configs" / "yuan_mnist_mlp.py"

EPSILONS = (5.0, 10.0, 20.0)
THETAS = (0.95, 1.0, 1.05)
ATTACKS = ("loss_threshold", "shadow", "reference")
# Table III of the paper (attack success rate; spec section 7.2): (eps, theta) -> rate.
PAPER = {(5.0, 0.95): 0.581, (5.0, 1.0): 0.582, (5.0, 1.05): 0.573,
         (10.0, 0.95): 0.599, (10.0, 1.0): 0.587, (10.0, 1.05): 0.583,
         (20.0, 0.95): 0.607, (20.0, 1.0): 0.602, (20.0, 1.05): 0.596,
         (math.inf, None): 0.993}

# Setting -> samples per client, M, eta, attacks, whether to run the 9 DP cells,
# trials of the no-DP target (seeds 0, 1, ...; the table's row is seed 0). eta
# is not given by the paper. memorise: 0.3 is the largest of {0.1, 0.3, 0.5} at
# which the unclipped model does not diverge (0.5 diverges at round 19).
# memorise_long: no DP only, 10x the rounds at eta = 0.1 (more memorisation); the DP
# cells are left out because eq. (8)'s schedule is meaningless at M = 1000
# (theta^(M-1) = 1.05^999 ~ 1e21 in the variance).
SETTINGS = {
    "memorise": {"samples": 10, "rounds": 100, "lr": 0.3, "attacks": ATTACKS, "dp": True,
                 "trials": 3},
    "memorise_long": {"samples": 10, "rounds": 1000, "lr": 0.1, "attacks": ATTACKS,
                      "dp": False, "trials": 1},
    "paper": {"samples": 600, "rounds": 30, "lr": 0.1, "attacks": ("loss_threshold",),
              "dp": True, "trials": 1},
}


def cell_configs(setting: str):
  """The cells of one setting: ``[(cell, epsilon, theta, clip, cfg)]``.

  Cells: ``nodp`` (plain FedAvg: no projection, no noise), ``nodp_clip5`` (the
  projection onto the C = 5 ball, no noise: isolates what clipping alone does), and
  the 9 DP cells (projection + eq. (8) noise as printed, ``yuan_eq8``).
  """
  s = SETTINGS[setting]
  common = [f"data.dir={MNIST_DIR}", f"data.samples_per_client={s['samples']}",
            f"rounds={s['rounds']}", f"client.lr={s['lr']}", f"eval.every={s['rounds']}",
            "progress=false"]
  base = override(load_config(CONFIG), common)
  cells = []
  for name, sets, clip in (
      ("nodp", ["privacy.epsilon=inf", "privacy.placement=none", "client.clip_mode=none"],
       "none"),
      ("nodp_clip5", ["privacy.epsilon=inf", "privacy.placement=none"], "C=5")):
    cfg = override(base, sets)
    cfg.name = f"{setting}/{name}"
    cells.append((name, math.inf, None, clip, cfg))
  for eps in EPSILONS if s["dp"] else ():
    for theta in THETAS:
      # Aggregate noise sampling: the server draws the noise of the weighted sum of
      # the K uploads at once (same distribution of the model, K times fewer draws).
      cfg = override(base, [f"privacy.epsilon={eps}", f"schedule.theta={theta}",
                            "privacy.noise_sampling=aggregate"])
      cfg.name = f"{setting}/eps{eps:g}_theta{theta:g}"
      cells.append((f"eps{eps:g}_theta{theta:g}", eps, theta, "C=5", cfg))
  return cells


def standard_error(n: int) -> float:
  """Standard error of a balanced accuracy ``(TPR + 1 - FPR) / 2`` on ``n`` members and
  ``n`` non-members: its variance ``(TPR(1-TPR) + FPR(1-FPR)) / (4 n)`` is at most
  ``1 / (8 n)`` (reached at TPR = FPR = 1/2, i.e. at chance). The conservative value:
  the plug-in one understates the spread of a threshold chosen on other records when
  TPR or FPR sits near 0 or 1."""
  return 1.0 / math.sqrt(8.0 * n)


def run_setting(setting: str, num_shadow: int, shadow_group: int | None) -> list[dict]:
  cells = cell_configs(setting)
  attacks = SETTINGS[setting]["attacks"]
  t = time.time()
  rows = membership_inference_many([c[-1] for c in cells], attacks=attacks,
                                   num_shadow=num_shadow, shadow_group=shadow_group)
  # Repeated trials of the no-DP target (other seeds: other partition, client draws,
  # initialisation, shadow draws and evaluation split): the spread across trials.
  trials: dict[str, list[dict]] = {}
  for cell, _, _, _, cfg in cells:
    if cell != "nodp" or SETTINGS[setting]["trials"] <= 1:
      continue
    trials[cell] = [rows[0]]
    for k in range(1, SETTINGS[setting]["trials"]):
      c = override(cfg, [f"seed={k}"])
      trials[cell] += membership_inference_many([c], attacks=attacks, num_shadow=num_shadow,
                                                shadow_group=shadow_group)
  wall = time.time() - t
  out = []
  for (cell, eps, theta, clip, cfg), row in zip(cells, rows):
    r = {"setting": setting, "cell": cell, "epsilon": eps, "theta": theta, "clip": clip,
         "samples_per_client": int(cfg.data.samples_per_client), "rounds": int(cfg.rounds),
         "lr": float(cfg.client.lr),
         # The paper's "no DP" is plain FedAvg: set beside the unclipped cell only.
         "paper_success": None if cell == "nodp_clip5" else PAPER.get((eps, theta))}
    r.update(row)
    for a in attacks:
      r[f"{a}_se"] = standard_error(int(row[f"{a}_num_members"]))
    if cell in trials:
      r["trials"] = len(trials[cell])
      for a in attacks:
        acc = np.asarray([t[f"{a}_accuracy"] for t in trials[cell]])
        r[f"{a}_accuracy_trials"] = " ".join(f"{v:.4f}" for v in acc)
        r[f"{a}_accuracy_trials_mean"] = float(acc.mean())
        r[f"{a}_accuracy_trials_sd"] = float(acc.std(ddof=1))
    r["setting_wall_s"] = round(wall, 1)
    out.append(r)
    print(setting, cell, {k: round(r[k], 3) for k in
                          ["final_test_accuracy", "train_accuracy_members", "loss_members",
                           "loss_nonmembers", "epsilon_claimed", "epsilon_certified",
                           "accuracy_bound"] + [f"{a}_accuracy" for a in attacks]},
          flush=True)
  print(f"{setting}: {wall:.0f} s", flush=True)
  return out


def plot(df: pd.DataFrame, path: Path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  settings = list(dict.fromkeys(df.setting))
  fig, axes = plt.subplots(len(settings), 1, figsize=(11, 3.6 * len(settings)), squeeze=False)
  colors = {"loss_threshold": "C0", "shadow": "C1", "reference": "C2"}
  for ax, setting in zip(axes[:, 0], settings):
    d = df[df.setting == setting].reset_index(drop=True)
    x = np.arange(len(d))
    present = [a for a in ATTACKS if f"{a}_accuracy" in d and d[f"{a}_accuracy"].notna().all()]
    w = 0.8 / max(len(present), 1)
    for j, a in enumerate(present):
      ax.bar(x + (j - (len(present) - 1) / 2) * w, d[f"{a}_accuracy"] - 0.5, w, bottom=0.5,
             yerr=d[f"{a}_se"], color=colors[a], label=a, capsize=2)
    ax.scatter(x, d.paper_success.astype(float), marker="*", s=80, color="k", zorder=5,
               label="paper (Table III)")
    ax.hlines(np.minimum(d.accuracy_bound, 1.0), x - 0.45, x + 0.45, colors="r",
              label="bound from certified eps")
    ax.hlines(np.minimum(d.accuracy_bound_claimed, 1.0), x - 0.45, x + 0.45, colors="m",
              linestyles="dotted", label="bound from claimed eps (not certified)")
    ax.axhline(0.5, color="grey", lw=0.8)
    ax.set_xticks(x, d.cell, rotation=30, fontsize=8)
    ax.set_ylim(0.4, 1.02)
    ax.set_ylabel("balanced attack accuracy")
    r = d.iloc[0]
    ax.set_title(f"{setting}: 100 clients x {r.samples_per_client} MNIST records, "
                 f"M = {r.rounds}, eta = {r.lr:g}", fontsize=10)
  handles, labels = axes[0, 0].get_legend_handles_labels()
  fig.legend(handles, labels, fontsize=8, ncol=3, loc="lower center")
  fig.tight_layout(rect=(0, 0.07, 1, 1))
  fig.savefig(path, dpi=120)


def markdown_table(df: pd.DataFrame, command: str, wall: float) -> str:
  lines = [f"Generated by `{command}` in {wall:.0f} s (2 shared CPU cores, under load).", ""]
  for setting in dict.fromkeys(df.setting):
    d = df[df.setting == setting]
    attacks = [a for a in ATTACKS if f"{a}_accuracy" in d and d[f"{a}_accuracy"].notna().all()]
    r0 = d.iloc[0]
    title = (f"### `{setting}`: 100 x {r0.samples_per_client} records, M = {r0.rounds}, "
             f"eta = {r0.lr:g}; {int(r0.loss_threshold_num_members)} + "
             f"{int(r0.loss_threshold_num_nonmembers)} evaluated records")
    header = ("| cell | test acc | train acc | loss members / non-members | eps claimed | "
              "eps certified | acc bound (certified / claimed) | "
              + " | ".join(f"{a} acc +- SE (AUC)" for a in attacks) + " | paper |")
    lines += [title, "", header,
              "|" + "---|" * (8 + len(attacks))]
    for _, r in d.iterrows():
      cells = [f"{r[f'{a}_accuracy']:.3f} +- {r[f'{a}_se']:.3f} ({r[f'{a}_auc']:.3f})"
               for a in attacks]
      paper = "" if pd.isna(r.paper_success) else f"{r.paper_success:.3f}"
      lines.append(
          f"| {r.cell} | {r.final_test_accuracy:.3f} | {r.train_accuracy_members:.3f} | "
          f"{r.loss_members:.3g} / {r.loss_nonmembers:.3g} | {r.epsilon_claimed:.3g} | "
          f"{r.epsilon_certified:.3g} | {r.accuracy_bound:.4f} / "
          f"{r.accuracy_bound_claimed:.4f} | " + " | ".join(cells) + f" | {paper} |")
    lines.append("")
    for _, r in d.iterrows():
      if "trials" in d and not pd.isna(r.get("trials")):
        lines.append(f"`{r.cell}` over {int(r.trials)} trials (seeds 0..{int(r.trials) - 1}; "
                     "mean +- SD across trials): " + "; ".join(
                         f"{a} {r[f'{a}_accuracy_trials_mean']:.3f} +- "
                         f"{r[f'{a}_accuracy_trials_sd']:.3f} ({r[f'{a}_accuracy_trials']})"
                         for a in attacks) + ".")
        lines.append("")
    lines += [f"Wall time of this setting: {r0.setting_wall_s:.0f} s.", ""]
  return "\n".join(lines)


BEGIN, END = "<!-- table3:begin -->", "<!-- table3:end -->"


def write_markdown(path: Path, generated: str):
  """Replaces the generated part of ``path`` (between the markers) and keeps the rest."""
  text = path.read_text() if path.exists() else f"# Table III\n\n{BEGIN}\n{END}\n"
  if BEGIN not in text or END not in text:
    text += f"\n{BEGIN}\n{END}\n"
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  path.write_text(f"{head}{BEGIN}\n{generated}\n{END}{tail}")


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
  p.add_argument("--num-shadow", type=int, default=25)
  p.add_argument("--shadow-group", type=int, default=None,
                 help="shadow runs per compiled group (default: all of a group at once)")
  p.add_argument("--out", default=str(RESULTS / "table3_mia"),
                 help="path prefix of the .csv, .png and .md outputs")
  args = p.parse_args()
  t = time.time()
  rows = []
  for setting in args.settings:
    rows += run_setting(setting, args.num_shadow, args.shadow_group)
  wall = time.time() - t
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  df = pd.DataFrame(rows)
  df.to_csv(out.with_suffix(".csv"), index=False)
  repro.run_commit()
  repro.note_outputs(out.with_suffix(".csv").name)
  repro.save_meta(out.parent, out.name, t, settings=args.settings, num_shadow=args.num_shadow)
  plot(df, out.with_suffix(".png"))
  command = "python experiments/yuan2023/table3_mia.py " + " ".join(sys.argv[1:])
  write_markdown(out.with_suffix(".md"), markdown_table(df, command.strip(), wall))
  print(f"wrote {out}.csv/.png/.md in {wall:.0f} s")


if __name__ == "__main__":
  main()
