"""Baseline calibration: the settings a paper does not state, chosen at eps = inf.

A reproduction can only judge a paper's DP claims once its non-private baseline
learns as well as the paper's. Every setting the paper leaves open (learning rate,
local steps, batch size, projection radius, initialisation, ...) is chosen by ONE
batched sweep (:func:`fedjax_dp.reproduction.run_sweep`) of the non-private config
over a grid of those settings, aiming at the paper's own non-private number within
the paper's rounds. A setting the paper states is never tuned:
:func:`check_grid` refuses a grid over any key of the paper's :data:`STATED` list.

The table (:func:`calibration_table`) has one row per grid point with the columns
``paper, figure, metric, direction, paper_value, ours, setting`` (``direction`` is
``higher`` for accuracy, ``lower`` for loss; ``ours`` is the metric after the paper's
rounds), plus ``reaches`` (ours is at least as good as the paper's value) and
``chosen`` (the best point: the setting the DP figures run at). It is written to
``experiments/<paper>/results/baseline_calibration.csv`` with a figure of every
point's curve (:func:`write_calibration`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fedjax_dp import config as config_lib
from fedjax_dp import reproduction as repro

# Settings each paper states (spec section of each paper's Table 1 / Section V-A):
# never in a calibration grid. Keys are config keys; a grid key is refused when it
# equals one of these or lies under one (``privacy`` covers every privacy field).
STATED: dict[str, tuple[str, ...]] = {
    # adpfl.md 5.1, Table 1: sigma_0, k, B, C, eta, N, T (and 60 examples per client).
    "adpfl2022": ("privacy", "schedule.k", "client.batch_size", "client.clip", "client.lr",
                  "data.num_clients", "data.samples_per_client", "rounds"),
    # yuan_amplitude_varying.md 7.1: U, K, tau, C (the projection radius), M. Full-batch
    # GD is stated for the MLP and SVM only (Target.stated); the CNN's batch, whether
    # its parameters are projected, eta and |D_k| are open (7.3 items 1-3, 12).
    "yuan2023": ("privacy", "schedule", "data.num_clients", "server.clients_per_round",
                 "client.local_steps", "client.clip", "rounds"),
    # fu_practicality.md 4.3: N, b, the mechanism, zeta (L1 clip: 150 LR, 3 CNN), full-batch
    # GD with E local steps (E and T are figure axes); eta and the init are open (4.5).
    "fu2023": ("privacy", "data.num_clients", "server.clients_per_round", "rounds",
               "client.local_steps", "client.batch_size", "client.clip", "model.name"),
    # wei_udp_crd.md 7: U = K = 50, |D_i|, T, the MLP 784-256-10, beta and zeta of CRD,
    # one full-batch step per round (Alg. 1); eta and C are open (7.3 item 1, section 8).
    "wei2021": ("privacy", "schedule", "data.num_clients", "server.clients_per_round",
                "data.samples_per_client", "rounds", "model.name", "client.local_steps",
                "client.batch_size"),
}


class Target(NamedTuple):
  """The paper's non-private number a calibration aims at.

  Attributes:
    paper: the reproduction's folder name (``adpfl2022``, ...), a key of
      :data:`STATED`.
    figure: the figure or table the number comes from (``Table 2``, ...).
    metric: the sweep column compared (``test_accuracy`` or ``test_loss``).
    paper_value: the paper's number.
    stated: settings the paper states for this figure only, beside the paper's
      :data:`STATED` ones (e.g. full-batch GD for the MLP, not for the CNN).
    reference_only: ``key=value`` settings the grid shows for comparison but the DP
      figures cannot run at, so a point holding one is never chosen (e.g.
      ``client.clip_mode=none``: it bounds no upload, so no noise can be calibrated
      to it; the row shows what the bound costs).
  """

  paper: str
  figure: str
  metric: str
  paper_value: float
  stated: tuple[str, ...] = ()
  reference_only: tuple[str, ...] = ()

  @property
  def direction(self) -> str:
    """``'lower'`` for a loss, ``'higher'`` otherwise."""
    return "lower" if "loss" in self.metric else "higher"

  def reached(self, value: float) -> bool:
    """Whether ``value`` is at least as good as the paper's."""
    if not math.isfinite(value):
      return False
    return value <= self.paper_value if self.direction == "lower" else value >= self.paper_value


def check_grid(paper: str, grid: Mapping[str, Sequence[Any]], stated: Sequence[str] = ()
               ) -> None:
  """Refuses a grid that tunes a setting ``paper`` states (:data:`STATED`, plus the
  figure's own ``stated``).

  Raises:
    config_lib.ConfigError: an unknown paper, or a grid key equal to or under a
      stated key (named).
  """
  if paper not in STATED:
    raise config_lib.ConfigError(f"no stated-settings list for paper {paper!r} "
                                 f"(known: {', '.join(sorted(STATED))})")
  keys = (*STATED[paper], *stated)
  bad = [k for k in grid if any(k == s or k.startswith(s + ".") for s in keys)]
  if bad:
    raise config_lib.ConfigError(f"{paper} states {', '.join(bad)}: a calibration grid "
                                 "tunes only settings the paper leaves open")


def check_non_private(cfg) -> None:
  """Refuses a config that adds noise: calibration runs at eps = inf.

  Raises:
    config_lib.ConfigError: ``privacy.epsilon`` is finite and noise is placed.
  """
  if cfg.privacy.get("placement", "") != "none" and math.isfinite(float(cfg.privacy.epsilon)):
    raise config_lib.ConfigError("a baseline calibration runs without noise: set "
                                 "privacy.epsilon=inf (or privacy.placement=none)")


def setting_text(values: Mapping[str, Any]) -> str:
  """``{'client.lr': 0.1, 'model.name': 'mlp'}`` -> ``'client.lr=0.1 model.name=mlp'``."""
  return " ".join(f"{k}={v}" for k, v in values.items())


def _settings(df: pd.DataFrame, grid: Mapping[str, Sequence[Any]]) -> list[str]:
  """The :func:`setting_text` of every row of ``df`` over the grid's keys."""
  return [setting_text(r) for r in df[list(grid)].to_dict("records")]


FOLD = "data.holdout_fold"


def _replicates(fin: pd.DataFrame, grid: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
  """One row per setting of the final rows ``fin`` over seeds (averaged) and folds of
  ``data.holdout_fold`` (the median of the folds' seed means: one fold whose held-out
  examples include an outlier decides a mean over folds, not their median)."""
  folded = FOLD in fin.columns and FOLD not in grid and fin[FOLD].nunique() > 1
  keys = ["setting", FOLD] if folded else ["setting"]
  g = fin.groupby(keys, sort=False)
  per = pd.DataFrame({"ours": g["ours"].mean(), "ours_std": g["ours"].std(),
                      "seeds": g["ours"].count(), "round": g["round"].max()}).reset_index()
  if not folded:
    return per
  g = per.groupby("setting", sort=False)
  return pd.DataFrame({"ours": g["ours"].median(), "ours_std": g["ours"].std(),
                       "seeds": g["seeds"].min(), "round": g["round"].max(),
                       "folds": g["ours"].count(), "ours_fold_mean": g["ours"].mean()}
                      ).reset_index()


def calibration_table(rows: pd.DataFrame, grid: Mapping[str, Sequence[Any]], target: Target
                      ) -> pd.DataFrame:
  """One row per grid point: its metric after the last round, whether it reaches the
  paper's number, and the chosen point: the best one without a ``target.reference_only``
  setting.

  Args:
    rows: the sweep's rows (one per point and round). With a ``seed`` column that is
      not a grid key, each grid point's seeds are averaged (:func:`calibrate`'s
      ``seeds``); with a ``data.holdout_fold`` column that is not one, ``ours`` is the
      median over the folds of their seed means (:func:`calibrate`'s ``folds``).
    grid: the grid swept (its keys are ``rows``' setting columns).
    target: what the paper reports.

  Returns:
    Columns ``paper, figure, metric, direction, paper_value, ours, setting, rounds,
    reaches, chosen``, in grid order; over several seeds ``ours`` is their mean, and
    ``ours_std`` (sample std) and ``seeds`` follow ``ours``; over several folds
    ``ours_std`` is the folds' std, and ``folds`` and ``ours_fold_mean`` follow. The
    choice and ``reaches`` go by ``ours``: a setting that trains in one seed and fails
    in another is not chosen over one that trains in all.
  """
  fin = repro.final_rows(rows)
  fin["setting"] = _settings(fin, grid)
  fin["ours"] = pd.to_numeric(fin[target.metric], errors="coerce")
  replicated = any(k in fin.columns and k not in grid and fin[k].nunique() > 1
                   for k in ("seed", FOLD))
  if replicated:
    fin = _replicates(fin, grid)
  table = pd.DataFrame({
      "paper": target.paper, "figure": target.figure, "metric": target.metric,
      "direction": target.direction, "paper_value": target.paper_value,
      "ours": fin["ours"].to_numpy()})
  if replicated:
    for col in ("ours_std", "seeds", "folds", "ours_fold_mean"):
      if col in fin:
        table[col] = fin[col].to_numpy()
  table["setting"], table["rounds"] = fin["setting"].to_numpy(), fin["round"].to_numpy()
  table["reaches"] = [target.reached(float(v)) for v in table["ours"]]
  score = table["ours"] if target.direction == "higher" else -table["ours"]
  runnable = [not set(target.reference_only) & set(s.split()) for s in table["setting"]]
  score = score.where(runnable)
  table["chosen"] = False
  if score.notna().any():
    table.loc[score.idxmax(), "chosen"] = True
  return table


def calibrate(cfg, grid: Mapping[str, Sequence[Any]], target: Target,
              out_dir: str | Path | None = None, seeds: int = 1,
              test_overrides: Sequence[str] = (), folds: int = 1
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
  """Runs the calibration sweep and tabulates it.

  Args:
    cfg: the paper's non-private config at the paper's stated settings and rounds.
    grid: ``{config key: values}`` over settings the paper leaves open.
    target: the paper's number (:class:`Target`).
    out_dir: the sweep's run directory (finished points are read back); None keeps
      everything in memory.
    seeds: seeds per grid point (0 .. seeds - 1, in the same batched sweep); the
      table averages them. More than one where a setting near the edge of stability
      trains in some seeds and not in others.
    test_overrides: ``key=value`` overrides of the chosen setting's run on the test
      set (after a choice on ``eval.split='unassigned'``): :func:`held_out_federation`'s,
      which give the clients back the examples the calibration set aside.
    folds: with ``cfg.data.holdout`` set aside (:func:`held_out_federation`), the
      number of disjoint held-out folds (``data.holdout_fold`` 0 .. folds - 1, in the
      same batched sweep); each setting is scored by the median over the folds
      (k-fold cross-validation where ``folds * data.holdout`` is the pool).

  Returns:
    (:func:`calibration_table`, the sweep's rows).

  Raises:
    config_lib.ConfigError: the grid tunes a stated setting, ``cfg`` adds noise, or
      ``folds > 1`` without examples set aside (all before any compute).
  """
  check_grid(target.paper, grid, target.stated)
  check_non_private(cfg)
  if seeds < 1 or "seed" in grid:
    raise config_lib.ConfigError(f"calibrate: seeds must be >= 1 and not a grid key "
                                 f"(got seeds={seeds}, grid keys {sorted(grid)})")
  swept = {**grid, "seed": list(range(seeds))} if seeds > 1 else dict(grid)
  held = repro.eval_reads(cfg) == repro.READS_UNASSIGNED
  aside = int(cfg.data.get("holdout", 0))
  if folds > 1:
    if not (held and aside) or FOLD in grid:
      raise config_lib.ConfigError(
          f"calibrate: folds={folds} needs eval.split='unassigned' with data.holdout > 0 "
          f"(held_out_federation) and {FOLD} not a grid key (got eval.split="
          f"{cfg.eval.get('split', 'test')!r}, data.holdout={aside})")
    swept[FOLD] = list(range(folds))
  # What the choice reads (the test set, or with eval.split='unassigned' the training
  # examples no client holds): recorded in the meta.json.
  repro.note_decision(repro.decision(
      f"eps = inf calibration: the grid point of best final {target.metric}"
      + (f" (median over {folds} disjoint held-out folds)" if folds > 1 else "")
      + (" on the training examples no client holds" if held else "")
      + (f" ({aside} set aside before the partition, data.holdout; the chosen setting "
         f"then runs with {' '.join(test_overrides)})" if held and aside else ""),
      repro.eval_reads(cfg)))
  rows = pd.DataFrame(repro.run_sweep(cfg, swept, None if out_dir is None else str(out_dir)))
  table = calibration_table(rows, grid, target)
  table["selected_on"] = str(cfg.eval.get("split", "test"))  # what `ours` was read on
  if held:
    table = test_at_chosen(cfg, table, target, seeds, out_dir, test_overrides)
  return table, rows


def held_out_federation(cfg, per_client: int) -> tuple[Any, list[str]]:
  """A calibration's federation where every example is some client's: ``cfg`` with
  ``per_client`` fewer examples per client and that many per client set aside
  (``data.holdout``), evaluated on them (``eval.split='unassigned'``), and the
  overrides that run the chosen setting on the paper's federation and test set.

  The choice is then made on a federation of the same clients with ``per_client``
  fewer examples each (a standard validation split), never on the test set.

  Raises:
    config_lib.ConfigError: a partition whose client sizes are not
      ``data.samples_per_client`` (``unbalanced``, ``natural``), or ``per_client``
      outside ``[1, data.samples_per_client)``.
  """
  d = cfg.data
  size = int(d.samples_per_client)
  if d.partition in ("unbalanced", "natural") or not 1 <= per_client < size:
    raise config_lib.ConfigError(
        f"held_out_federation: needs a partition of data.samples_per_client examples per "
        f"client and 1 <= per_client < {size} (got data.partition={d.partition!r}, "
        f"per_client={per_client})")
  sets = [f"data.samples_per_client={size - per_client}",
          f"data.holdout={per_client * int(d.num_clients)}", "eval.split=unassigned"]
  back = [f"data.samples_per_client={size}", f"data.holdout={int(d.get('holdout', 0))}",
          f"{FOLD}={int(d.get('holdout_fold', 0))}"]
  return config_lib.override(cfg, sets), back


def selection_config(cfg, select_on: str, per_client: int = 0) -> tuple[Any, list[str]]:
  """A calibration script's config for ``--select-on`` (:func:`add_select_arg`) and the
  overrides of its chosen setting's test run (:func:`calibrate`'s ``test_overrides``):
  the test set; the training examples no client holds; or, with ``per_client > 0``
  (a partition that uses every example), :func:`held_out_federation`'s."""
  if select_on == "unassigned" and per_client > 0:
    return held_out_federation(cfg, per_client)
  return config_lib.override(cfg, [f"eval.split={select_on}"]), []


def test_at_chosen(cfg, table: pd.DataFrame, target: Target, seeds: int = 1,
                   out_dir: str | Path | None = None, overrides: Sequence[str] = ()
                   ) -> pd.DataFrame:
  """``table`` (chosen on ``eval.split='unassigned'``) with the chosen setting's
  metric on the test set: one more run of that setting per seed (with ``overrides``),
  evaluated on the test split, which nothing chooses from. Columns ``test_value``
  (and ``test_value_std`` over several seeds) are NaN but on the chosen row; ``ours``
  and ``reaches`` stay the held-out split's."""
  table = table.copy()
  table["test_value"] = math.nan
  if seeds > 1:
    table["test_value_std"] = math.nan
  if not table["chosen"].any():
    return table
  i = table.index[table["chosen"]][0]
  test_cfg = config_lib.override(cfg, [*parse_setting(table.at[i, "setting"]), *overrides,
                                       "eval.split=test"])
  runs = None if out_dir is None else str(Path(out_dir) / "test_at_chosen")
  rows = pd.DataFrame(repro.run_sweep(test_cfg, {"seed": list(range(seeds))} if seeds > 1
                                      else {"seed": [int(cfg.seed)]}, runs))
  final = pd.to_numeric(repro.final_rows(rows)[target.metric], errors="coerce")
  table.at[i, "test_value"] = float(final.mean())
  if seeds > 1:
    table.at[i, "test_value_std"] = float(final.std())
  return table


def run_control(cfg, grid: Mapping[str, Sequence[Any]], target: Target, label: str,
                out_dir: str | Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
  """A control: the calibrated config with a setting the paper states changed
  (e.g. a larger learning rate), to explain a baseline that stays below the paper.

  Never a calibration: nothing is chosen, and the rows' ``figure`` says ``[control:
  label]``; they go to their own CSV (``baseline_control.csv``), not to the
  calibration table.

  Raises:
    config_lib.ConfigError: ``cfg`` adds noise.
  """
  check_non_private(cfg)
  rows = pd.DataFrame(repro.run_sweep(cfg, grid, None if out_dir is None else str(out_dir)))
  control = target._replace(figure=f"{target.figure} [control: {label}]")
  table = calibration_table(rows, grid, control)
  table["chosen"] = False
  return table, rows


SELECT_ON = ("unassigned", "test")


def add_select_arg(ap) -> None:
  """A calibration script's ``--select-on``: the split its choices read
  (``eval.split``; default the training examples no client holds)."""
  ap.add_argument("--select-on", choices=SELECT_ON, default=SELECT_ON[0],
                  help="where the grid point is chosen: 'unassigned' (the training "
                  "examples no client holds; the chosen setting is then run once on the "
                  "test set) or 'test' (the test set)")


def select_suffix(select_on: str) -> str:
  """The run folders' suffix of a choice on ``select_on`` ('' for the test set: the
  folders of the results made before the split existed)."""
  return "" if select_on == "test" else f"_sel-{select_on}"


def parse_setting(text: str) -> list[str]:
  """A table's ``setting`` back to ``key=value`` overrides (inverse of
  :func:`setting_text`)."""
  return text.split()


def merge_table(path: Path, table: pd.DataFrame) -> pd.DataFrame:
  """``table`` with the rows of the other figures already in ``path`` kept first
  (one CSV per paper, one block per calibrated figure)."""
  if not path.is_file():
    return table
  old = pd.read_csv(path)
  keep = old[~old["figure"].isin(set(table["figure"]))]
  return pd.concat([keep, table], ignore_index=True)


def plot_calibration(ax, rows: pd.DataFrame, table: pd.DataFrame, grid, target: Target) -> None:
  """Every setting's metric against the round (the mean over seeds; the chosen one
  bold), and the paper's number as a dashed line."""
  ev = rows[rows[target.metric].notna()].copy()
  ev["setting"] = _settings(ev, grid)
  curves = ev.groupby(["setting", "round"], sort=False)[target.metric].mean()
  for setting, chosen in zip(table["setting"], table["chosen"]):
    # A script may append settings it fixed before the sweep to the label (Wei's clip
    # C from the median rule): the curves are keyed by the grid's settings alone.
    t = curves.loc[" ".join(o for o in parse_setting(setting) if o.split("=", 1)[0] in grid)]
    ax.plot(t.index, t.to_numpy(), lw=2.5 if chosen else 1,
            alpha=1 if chosen else 0.6, label=setting + (" (chosen)" if chosen else ""))
  seeds = f", mean of {int(table['seeds'].iloc[0])} seeds" if "seeds" in table else ""
  ax.axhline(target.paper_value, ls="--", color="k", label=f"paper: {target.paper_value:g}")
  ax.set_xlabel("round")
  ax.set_ylabel(target.metric)
  ax.set_title(f"{target.paper} {target.figure}: eps = inf calibration{seeds}", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=6)


def write_calibration(results_dir: Path, table: pd.DataFrame, rows: pd.DataFrame, grid,
                      target: Target, png: str, name: str = "baseline_calibration") -> Path:
  """Writes ``results_dir/<name>.csv`` (merged with the paper's other calibrated
  figures) and ``results_dir/<png>.png``; returns the CSV's path."""
  results_dir.mkdir(parents=True, exist_ok=True)
  merged = merge_table(results_dir / f"{name}.csv", table)
  path = repro.write_csv(results_dir, merged, name)
  plt = repro.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  plot_calibration(ax, rows, table, grid, target)
  fig.tight_layout()
  fig.savefig(results_dir / f"{png}.png", dpi=110)
  plt.close(fig)
  return path
