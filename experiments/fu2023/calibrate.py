"""Fu et al.: the eps = inf baselines, calibrated before any DP verdict.

Two targets, one batched sweep each (:func:`fedjax_dp.calibration_sweep.calibrate`),
at every setting the paper states kept as stated (spec ``fu_practicality.md`` 4.3;
:data:`fedjax_dp.calibration_sweep.STATED`: b / N, E, T, full-batch GD, the clipping
zeta = 150 (LR, L1) and 3 (CNN), the models):

* ``lr``: linear regression on OpenIntro's Lending Club loans, Figs. 1/3's eps = inf
  point (T = 100, E = 1) at the committed federation (N = 1,000 clients of 8 loans,
  b = 100). The paper's noise-free loss, 22.59, is a test MSE on its own 400,000
  loans, whose features it does not describe well enough to rebuild (spec 4.5 item 8);
  on ours the target variance is 24.7, so 22.59 would be a model barely better than
  the mean. The target is therefore the issue's second reading: within 10% of our own
  noise-free optimum, the closed-form least-squares fit on the training loans
  evaluated on the test loans (:func:`lr_optimum`; also reported: the oracle fit on
  the test loans, the lowest test MSE any linear model reaches). Open and swept: eta
  (spec 4.5 item 1; constant, A5). The initialisation stays zero (A10).
* ``cnn``: Fu's CNN on writer-like MNIST at the reduced federation (N = 20 clients of
  ~20 images, b = 2), Table IV's eps = inf point (T = 240, E = 2, T_g = 120; the
  paper's 0.747): no-noise test accuracy >= 0.70. Open and swept: eta.

Beside the LR sweep, :func:`grad_norms` measures the per-step client-gradient L1
norms (the quantity eq. (Clip) bounds by zeta, standing in for the sensitivity xi the
paper calls hard to compute) along the noise-free run at the LR figures' eta
(``common.LR_CALIBRATED``): their
quantiles per round go to ``results/lr_grad_norms.csv``, which says where the stated
zeta = 150 sits among them.

Each choice is made off the test set (``--select-on unassigned``, the default): the
CNN's 20 x 20 images leave most of MNIST's training set to no client, which scores
the grid; the LR federation holds all 8,000 training loans, so its choice is made on
a held-out federation (:func:`fedjax_dp.calibration_sweep.held_out_federation`: the
same N clients with :data:`HOLD_OUT` fewer loans each, scored on the N x
:data:`HOLD_OUT` loans set aside), over :data:`FOLDS` disjoint folds of set-aside
loans (``data.holdout_fold``; 8 folds of 1,000 set every training loan aside once),
each eta scored by the median over the folds: a single fold decided the choice before
(:func:`holdout_leverage`: one set-aside loan far outside the kept loans' range made
most of fold 0's squared error, and larger eta extrapolate further on it). Each
chosen setting then runs on the committed
federation and its test metric is the table's ``test_value``; ``--select-on test``
chooses on the test set (the results made before the split existed).

Writes ``results/baseline_calibration.csv`` (one block per target),
``baseline_calibration_{lr,cnn}.png``, ``lr_grad_norms.csv`` and the meta.json. From
the repository root::

  nice -n 10 python experiments/fu2023/calibrate.py
"""

from __future__ import annotations

import argparse

import common
import numpy as np
import pandas as pd

from fedjax_dp import calibration_sweep as cs

GRIDS = {
    # LR: GD on the mean squared error is stable for eta < 2 / lambda_max(H) = 0.139
    # (H = 2 X^T X / n of our features, lr_optimum's 'hessian_max').
    "lr": {"client.lr": [0.01, 0.02, 0.05, 0.1, 0.13]},
    "cnn": {"client.lr": [0.05, 0.1, 0.2, 0.4]},
}
LR_TOLERANCE = 1.10  # within 10% of our noise-free optimum (issue 22)
CNN_PAPER = 0.747    # Table IV, eps = inf (E* = 2)
CNN_TARGET = 0.70
ROUNDS = {"lr": 100, "cnn": 120}   # T_g: T = 100 with E = 1; T = 240 with E = 2
LOCAL_STEPS = {"lr": 1, "cnn": 2}
HOLD_OUT = {"lr": 1, "cnn": 0}  # examples per client set aside (0: unassigned ones exist)
FOLDS = {"lr": 8, "cnn": 1}  # disjoint held-out folds (8 x 1 of each client's 8 loans)


def lr_optimum() -> dict[str, float]:
  """Test MSE of the closed-form least-squares fit (10 PCA features + bias) on the
  training loans, of the oracle fit on the test loans, the test target's variance and
  the largest eigenvalue of the training MSE's Hessian."""
  from fedjax_dp.data import load_dataset
  ds = load_dataset("lending_club", None)
  x, y, xt, yt = (np.asarray(a, np.float64) for a in (ds.x_train, ds.y_train, ds.x_test,
                                                       ds.y_test))
  a, at = np.c_[x, np.ones(len(x))], np.c_[xt, np.ones(len(xt))]
  theta = np.linalg.lstsq(a, y, rcond=None)[0]
  oracle = np.linalg.lstsq(at, yt, rcond=None)[0]
  return {"ols_train_fit_test_mse": float(np.mean((at @ theta - yt) ** 2)),
          "ols_train_mse": float(np.mean((a @ theta - y) ** 2)),
          "oracle_test_fit_test_mse": float(np.mean((at @ oracle - yt) ** 2)),
          "test_target_variance": float(np.var(yt)),
          "hessian_max": float(np.linalg.eigvalsh(2 * a.T @ a / len(a)).max())}


def holdout_leverage(per_client: int, num_clients: int, folds: int = 1
                     ) -> dict[str, float | list[float]]:
  """What the LR's held-out score is made of: the closed-form least-squares fit on the
  loans the held-out federation keeps, its mean squared error on the
  ``per_client * num_clients`` loans set aside (``data.holdout``, fold 0), that error
  without its largest term, the largest term, and the largest absolute feature among
  the set-aside and among the kept loans (a high-leverage loan decides a mean); and
  the fit's held-out error in each of ``folds`` folds (``data.holdout_fold``)."""
  from fedjax_dp.data import load_dataset
  from fedjax_dp.data.partition import holdout_indices
  ds = load_dataset("lending_club", None)
  x, y = np.asarray(ds.x_train, np.float64), np.asarray(ds.y_train, np.float64)
  a = np.c_[x, np.ones(len(x))]

  def fold_mse(fold: int) -> float:
    held = holdout_indices(len(y), per_client * num_clients, fold)
    kept = np.setdiff1d(np.arange(len(y)), held)
    theta = np.linalg.lstsq(a[kept], y[kept], rcond=None)[0]
    return float(np.mean((a[held] @ theta - y[held]) ** 2))

  held = holdout_indices(len(y), per_client * num_clients)
  kept = np.setdiff1d(np.arange(len(y)), held)
  theta = np.linalg.lstsq(a[kept], y[kept], rcond=None)[0]
  sq = (a[held] @ theta - y[held]) ** 2
  err, worst = np.sort(sq), held[np.argmax(sq)]
  # the worst loan's features against the largest each feature reaches among kept loans
  reach = np.abs(x[worst]) / np.abs(x[kept]).max(0)
  return {"heldout_ols_mse": float(err.mean()), "heldout_ols_mse_without_largest":
          float(err[:-1].mean()), "heldout_largest_sq_error": float(err[-1]),
          "heldout_largest_feature_over_kept_max": float(reach.max()),
          "test_feature_abs_max": float(np.abs(np.asarray(ds.x_test)).max()),
          "kept_feature_abs_max": float(np.abs(x[kept]).max()),
          "heldout_ols_mse_per_fold": [fold_mse(f) for f in range(folds)]}


def grad_norms(cfg, lr: float, seed: int = 0) -> pd.DataFrame:
  """Per-step client-gradient L1 norms along the noise-free LR run at ``lr``.

  The run is Alg. 1 with E = 1 in closed form (numpy): each round, b clients by round
  robin reshuffled every pass (its own permutation, ``seed``), each full-batch mean-MSE
  gradient at the global model clipped to L1 norm ``cfg.client.clip``, the model moved
  by ``lr`` times their mean (equal client sizes: A3's weights are equal).

  Returns:
    One row per round: the quantiles (50, 90, 99, max) of the b clients' unclipped L1
    norms and the share clipped at zeta.
  """
  from fedjax_dp.data import load_dataset
  from fedjax_dp.data.partition import partition
  ds = load_dataset("lending_club", None)
  x, y = np.asarray(ds.x_train, np.float64), np.asarray(ds.y_train, np.float64)
  n, b, zeta = cfg.data.num_clients, cfg.server.clients_per_round, float(cfg.client.clip)
  clients = partition(ds.y_train, "sorted", n, cfg.seed,
                      samples_per_client=cfg.data.samples_per_client)
  a = np.c_[x, np.ones(len(x))]
  xs = np.stack([a[c] for c in clients])          # [N, n_l, 11]
  ys = np.stack([y[c] for c in clients])          # [N, n_l]
  rng = np.random.default_rng(seed)
  theta, rows, perm = np.zeros(a.shape[1]), [], np.arange(n)
  groups = n // b
  for t in range(cfg.rounds):
    if t % groups == 0:
      perm = rng.permutation(n)
    sel = perm[(t % groups) * b:(t % groups + 1) * b]
    resid = np.einsum("cnp,p->cn", xs[sel], theta) - ys[sel]
    g = 2 * np.einsum("cnp,cn->cp", xs[sel], resid) / ys.shape[1]
    l1 = np.abs(g).sum(1)
    rows.append({"round": t + 1, "l1_median": np.median(l1), "l1_q90": np.quantile(l1, 0.9),
                 "l1_q99": np.quantile(l1, 0.99), "l1_max": l1.max(),
                 "clipped_share": float(np.mean(l1 > zeta))})
    theta = theta - lr * (g / np.maximum(1.0, l1 / zeta)[:, None]).mean(0)
  return pd.DataFrame(rows)


def base_config(which: str):
  """The no-noise config of ``which`` at the paper's stated settings (and the
  committed reduced federations)."""
  cfg = common.lr_config() if which == "lr" else common.cnn_config()
  cfg.name = f"fu_calibration_{which}"
  cfg.rounds = ROUNDS[which]
  cfg.client.local_steps = LOCAL_STEPS[which]
  cfg.privacy.epsilon = common.INF
  cfg.eval.every = 5 if which == "lr" else 20
  return cfg


def target(which: str, opt: dict[str, float] | None = None) -> cs.Target:
  if which == "lr":
    best = opt["ols_train_fit_test_mse"]
    return cs.Target("fu2023", "Figs. 1/3 LR eps = inf (T = 100, E = 1; paper 22.59 on its "
                     f"data; target 1.1 x our least-squares test MSE {best:.3f})",
                     "test_loss", LR_TOLERANCE * best)
  return cs.Target("fu2023", "Table IV CNN eps = inf (T = 240, E = 2; paper 0.747; target "
                   "0.70 at N = 20, b = 2)", "test_accuracy", CNN_TARGET)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", choices=list(GRIDS), nargs="*", default=list(GRIDS))
  cs.add_select_arg(ap)
  args = ap.parse_args(argv)
  start = common.now()
  extra = {}
  for which in args.only:
    opt = lr_optimum() if which == "lr" else None
    tgt = target(which, opt)
    cfg = base_config(which)
    cal, back = cs.selection_config(cfg, args.select_on, HOLD_OUT[which])
    runs = f"calibration_{which}_T{cfg.rounds}{cs.select_suffix(args.select_on)}"
    folds = FOLDS[which] if back else 1
    if folds > 1:
      runs += f"_folds{folds}"
    table, rows = cs.calibrate(cal, GRIDS[which], tgt, common.RUNS / runs,
                               test_overrides=back, folds=folds)
    cs.write_calibration(common.RESULTS, table, rows, GRIDS[which], tgt,
                         png=f"baseline_calibration_{which}")
    pd.set_option("display.width", 200)
    print(table.to_string(index=False), flush=True)
    if which == "lr":
      chosen = float(table.loc[table["chosen"], "setting"].iloc[0].split("=")[1])
      # The norms zeta is judged against: along the run at the eta the LR figures use.
      norms = grad_norms(cfg, common.LR_CALIBRATED)
      common.write(norms, "lr_grad_norms")
      late = norms[norms["round"] > 10]
      test_col = "test_value" if "test_value" in table else "ours"
      extra["lr"] = {**opt, "chosen_lr": chosen, "figures_lr": common.LR_CALIBRATED,
                     "grad_norms_lr": common.LR_CALIBRATED, "ratio_to_optimum": float(
          table.loc[table["chosen"], test_col].iloc[0]) / opt["ols_train_fit_test_mse"],
                     "grad_l1_median_after_round10": float(late["l1_median"].median()),
                     "grad_l1_q99_after_round10": float(late["l1_q99"].median()),
                     "grad_l1_round1_max": float(norms["l1_max"].iloc[0]),
                     "clipped_share_mean": float(norms["clipped_share"].mean())}
      if back:  # chosen on a held-out federation: what its score is made of
        extra["lr"].update(holdout_leverage(HOLD_OUT["lr"], cfg.data.num_clients, folds))
      print(extra["lr"], flush=True)
  common.save_meta("baseline_calibration", start, only=args.only, grids=GRIDS,
                   rounds=ROUNDS, local_steps=LOCAL_STEPS, select_on=args.select_on,
                   hold_out_per_client=HOLD_OUT, holdout_folds=FOLDS, **extra)


if __name__ == "__main__":
  main()
