"""``fedjax-dp``: run | sweep | account | plot | audit | list.

  fedjax-dp run CONFIG --out DIR [--set key=value ...] [--overwrite]
  fedjax-dp sweep CONFIG --grid key=v1,v2,... [--grid ...] [--set key=value ...] --out DIR
  fedjax-dp account --mechanism gaussian --q Q --sigma Z --rounds T --delta D
  fedjax-dp plot RUN_OR_SWEEP_DIR [...] --out FILE.png
  fedjax-dp list
  fedjax-dp audit CONFIG [--set key=value ...] [--trials N] [--variant V] [--out FILE.json]

Re-running the same ``run`` or ``sweep`` command resumes from the last checkpoint
(``checkpoint.every``). Ctrl-C stops between rounds, saves a checkpoint, marks the
run ``interrupted`` and exits with status 130.

Every ``--out`` is checked before anything is loaded or compiled. A run or sweep
directory's ``--overwrite`` removes only the files fedjax-dp wrote there and refuses
if one of them was changed since (``--overwrite-edited`` removes it too); an ``--out``
file (plot, audit) that exists and is not fedjax-dp's unchanged output is replaced
only with ``--overwrite`` (:mod:`fedjax_dp.files.outputs`).

Compiled programs are kept in the user's cache directory, so a second run of the same
shapes starts sooner (:mod:`fedjax_dp.compile_cache`); ``FEDJAX_DP_COMPILATION_CACHE=off``
(or a directory) sets the ``compilation_cache`` field of ``run``, ``sweep`` and ``audit``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path


def _overrides(args) -> list[str]:
  """The ``--set`` overrides, after the environment's compilation-cache switch
  (``FEDJAX_DP_COMPILATION_CACHE=off``, ``auto`` or a directory; a ``--set
  compilation_cache=...`` wins over it). The library reads no environment variable:
  the command line turns it into the config field."""
  from fedjax_dp.compile_cache import ENV
  env = os.environ.get(ENV, "").strip()
  return ([f"compilation_cache={env}"] if env else []) + list(args.set or [])


def _cmd_run(args) -> int:
  from fedjax_dp import config as config_lib
  from fedjax_dp.files import outputs

  overwrite = _overwrite(args)
  given = config_lib.load_config(args.config)
  cfg = config_lib.override(given, _overrides(args))
  config_lib.validate(cfg, as_given=given)  # before the run directory is touched
  if args.no_progress:
    cfg.progress = False
  outputs.check_dir(args.out)  # before the engine is even imported
  from fedjax_dp import experiment

  result = experiment.run(cfg, args.out, overwrite=overwrite)
  s = result.summary
  acc = s["final_test_accuracy"]
  print(json.dumps({k: s[k] for k in ("status", "rounds_run", "final_test_accuracy",
                                      "final_test_loss", "epsilon_claimed",
                                      "epsilon_certified", "privacy_unit", "wall_seconds")},
                   indent=2))
  if "best_rounds" in s:
    print("optimal_t: final test loss per T: " + ", ".join(
        f"T={r['rounds']}: {r['final_test_loss']:.4f}" for r in s["optimal_t"]
        if r["final_test_loss"] is not None) + f"; best T = {s['best_rounds']}")
  metric = f"final test accuracy {acc if acc is None else f'{acc:.4f}'}"
  if s.get("task") == "regression":  # no accuracy: test_loss is the test MSE
    mse = s["final_test_loss"]
    metric = f"final test MSE {mse if mse is None else f'{mse:.4f}'}"
  print(f"{metric} after {s['rounds_run']} "
        f"rounds in {s['wall_seconds']:.1f} s; certified epsilon {s['epsilon_certified']:.3f} "
        f"(claimed {s['epsilon_claimed']:.3f}) at delta {s['delta']:g}, privacy unit "
        f"{s['privacy_unit']}; outputs in {args.out}")
  if s.get("stop_reason") not in (None, "rounds"):
    print(f"stopped early: {s['stop_detail']}")  # why the run is shorter than rounds
  if s.get("noise_fit", 1.0) != 1.0:
    print(f"noise fitted: the schedule's noise x {s['noise_fit']:.4f}, so its planned "
          "rounds certify at most the requested epsilon")
  if s.get("epsilon_warning"):
    print(s["epsilon_warning"], file=sys.stderr)
  return 0 if s["status"] != "diverged" else 3


def _cmd_sweep(args) -> int:
  import time

  from fedjax_dp.files import outputs

  outputs.check_dir(args.out)  # before the engine is even imported
  from fedjax_dp import config as config_lib
  from fedjax_dp import sweep

  given = config_lib.load_config(args.config)
  cfg = config_lib.override(given, _overrides(args))
  grid = sweep.parse_grid(args.grid)
  start = time.time()
  rows = sweep.run_sweep(cfg, grid, args.out, progress=not args.no_progress,
                         overwrite=_overwrite(args), as_given=given)
  last: dict[str, dict] = {}
  for r in rows:
    last[r["point"]] = r
  evaluated: dict[str, dict] = {}
  for r in rows:
    if r["test_accuracy"] is not None:
      evaluated[r["point"]] = r
  print(f"{'point':<40} {'rounds':>6} {'test_acc':>9} {'eps_certified':>13}")
  for name, r in last.items():
    acc = evaluated.get(name, {}).get("test_accuracy")
    acc_text = "-" if acc is None else f"{acc:.4f}"
    print(f"{name:<40} {r['round']:>6} {acc_text:>9} {r['epsilon_certified']:>13.3f}")
  units = sorted({str(r["privacy_unit"]) for r in last.values() if r.get("privacy_unit")})
  print(f"{len(last)} points in {time.time() - start:.1f} s; privacy unit "
        f"{'; '.join(units) or '-'}; per-round rows in {Path(args.out) / 'sweep.csv'}, "
        f"run directories in {Path(args.out) / 'points'}")
  for name in last:
    summary = Path(args.out) / "points" / name / "summary.json"
    warning = json.loads(summary.read_text()).get("epsilon_warning") if summary.exists() else None
    if warning:
      print(f"{name}: {warning}", file=sys.stderr)
  return 0


def _cmd_plot(args) -> int:
  # A directory gets plot.png inside; a name without an image suffix gets .png.
  from matplotlib.backend_bases import FigureCanvasBase

  from fedjax_dp import plotting
  from fedjax_dp.files import outputs
  formats = sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"png"})
  out = outputs.check_file(args.out, "plot.png", ["png", *formats], overwrite=args.overwrite)
  plot = plotting.plot_dirs(args.runs, title=args.title or "", fmt=out.suffix[1:].lower())
  outputs.atomic_write(out, plot.png, owned=True)
  print(f"wrote {out}: {plot.description}")
  return 0


def _overwrite(args) -> bool | str:
  """``--overwrite`` / ``--overwrite-edited`` as :func:`fedjax_dp.files.outputs.claim`
  takes them."""
  from fedjax_dp.files import outputs
  return outputs.EDITED if args.overwrite_edited else args.overwrite


def _cmd_list(args) -> int:
  del args
  from fedjax_dp import catalog

  print(catalog.text())
  return 0


def _version() -> str:
  from importlib import metadata
  try:
    return metadata.version("fedjax_dp")
  except metadata.PackageNotFoundError:  # a source checkout that was never installed
    return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
  """An argparse parser whose errors are one line (``prog: error: message``) rather
  than the usage block; ``--help`` still shows the usage. Subparsers inherit it."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind, field: str, raw: str):
  """``kind(raw)`` or a UserError naming the option (one line, no usage dump)."""
  from fedjax_dp.errors import UserError
  try:
    return kind(raw)
  except ValueError:
    raise UserError(f"{field}: cannot parse {raw!r} as {kind.__name__}") from None


def _cmd_audit(args) -> int:
  from fedjax_dp import config as config_lib
  from fedjax_dp.errors import UserError
  from fedjax_dp.files import outputs, results

  out = None if args.out is None else outputs.check_file(args.out, "audit.json",
                                                          overwrite=args.overwrite)
  try:
    from fedjax_dp.audit import RUN_VARIANTS, AuditOptions, audit, audit_run
    from fedjax_dp.audit.estimators import INSTALL_HINT, available
  except ImportError as e:  # pragma: no cover - the audit is part of the package
    raise UserError(str(e)) from None
  opts = AuditOptions(
      trials=_number(int, "audit.trials", args.trials),
      significance=_number(float, "audit.significance", args.significance),
      seed=_number(int, "audit.seed", args.seed),
      # The whole run has its own variants (checked by audit_run).
      variant="none" if args.whole_run and args.variant in RUN_VARIANTS else args.variant,
      noise_scale=None if args.noise_scale is None else _number(
          float, "audit.noise_scale", args.noise_scale),
      claimed_sensitivity=None if args.claimed_sensitivity is None else _number(
          float, "audit.claimed_sensitivity", args.claimed_sensitivity),
      certify_run=not args.no_run_certificate)
  try:
    opts.validate()
  except ValueError as e:  # AuditOptions.validate names the option
    raise UserError(str(e)) from None
  if not 0 <= opts.seed < 2**32:  # a numpy seed
    raise UserError(f"audit.seed={opts.seed}: must be an integer in [0, {2**32 - 1}]")
  given = config_lib.load_config(args.config)
  cfg = config_lib.override(given, _overrides(args))
  config_lib.validate(cfg, as_given=given)
  if not available():
    raise UserError(INSTALL_HINT)
  try:
    r = (audit_run(cfg, dataclasses.replace(opts, variant=args.variant)) if args.whole_run
         else audit(cfg, opts))
  except ValueError as e:  # audit() documents ValueError for an option or config it refuses
    if isinstance(e, UserError):
      raise
    raise UserError(str(e)) from e
  print(f"audit of {args.config}: {r.placement} {r.mechanism} noise, {r.clip_mode} clipping, "
        f"{r.level}-level canaries, variant {r.variant}; {r.trials} trials "
        f"({r.trials_in} with the canary), "
        f"{f'every round of {r.rounds}' if args.whole_run else 'one round'}, delta {r.delta:g}")
  print(f"  empirical lower bound  epsilon >= {r.epsilon_lower:.3f}  (Clopper-Pearson, "
        f"confidence {1 - r.significance:.0%}; one-run {r.epsilon_one_run:.3f}; Gaussian-DP "
        f"estimate {r.epsilon_gdp:.3f})")
  run_eps = ("not computed (--no-run-certificate)" if math.isnan(r.epsilon_certified_run)
             else f"{r.epsilon_certified_run:.3f}")
  if args.whole_run:
    print(f"  certified upper bound  epsilon <= {r.epsilon_certified:.3f}  (the run's "
          f"{r.rounds} rounds, its own accountant)")
  else:
      print(f"  certified upper bound  epsilon <= {r.epsilon_certified:.3f}  (this round, the "
          f"run's own accountant; {run_eps} for the run's {r.rounds} rounds)")
  print(f"  ratio lower / upper    {r.ratio:.3f}"
        + ("  -- ABOVE 1: the certificate does not hold" if r.ratio > 1 else ""))
  if out is not None:
    results.write_json(out, r.to_dict(), owned=True)
    print(f"  written to {out}")
  return 0


_FILE_OVERWRITE_HELP = ("replace the --out file even if fedjax-dp did not write it, or "
                        "wrote it and it was changed since (without it, only fedjax-dp's own "
                        "unchanged output is replaced)")


def _overwrite_options(p: argparse.ArgumentParser, what: str) -> None:
  p.add_argument("--overwrite", action="store_true",
                 help=f"replace an existing {what} directory instead of resuming it (removes "
                 "only the files fedjax-dp wrote there, and refuses if one of them was "
                 "changed since it wrote it)")
  p.add_argument("--overwrite-edited", action="store_true",
                 help="like --overwrite, and also removes the files fedjax-dp wrote there "
                 "that were changed since (an edited config.json, a replaced metrics.png)")


_CONFIG_HELP = ("Python file with get_config(), or a shipped config's name "
                "(fedjax_dp/configs: quickstart, wei_mnist_mlp, ...)")


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(
      prog="fedjax-dp", description="Differentially private federated learning in JAX.")
  parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
  sub = parser.add_subparsers(dest="command", required=True)

  p = sub.add_parser("run", help="run one experiment from a config file")
  p.add_argument("config", help=_CONFIG_HELP)
  p.add_argument("--out", required=True,
                 help="run directory to write (an existing one of the same config resumes)")
  p.add_argument("--set", action="append", metavar="KEY=VALUE",
                 help="override a config field (repeatable), e.g. --set privacy.epsilon=8")
  _overwrite_options(p, "run")
  p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
  p.set_defaults(func=_cmd_run)

  p = sub.add_parser("sweep", help="run the product of config grids, batched on the device",
                     description="Runs every combination of the --grid values; points that "
                     "share array shapes run as one vmapped program. Re-running the same "
                     "command skips finished points.")
  p.add_argument("config", help=_CONFIG_HELP)
  p.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                 help="a config field and its values (repeatable; the product is run), "
                 "e.g. --grid privacy.epsilon=1,4,16 --grid seed=0,1,2")
  p.add_argument("--set", action="append", metavar="KEY=VALUE",
                 help="override a config field for every point (repeatable)")
  p.add_argument("--out", required=True, help="sweep directory (sweep.csv, points/...)")
  _overwrite_options(p, "sweep")
  p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
  p.set_defaults(func=_cmd_sweep)

  p = sub.add_parser("audit", help="empirical lower bound on epsilon beside the certified one",
                     description="Runs the configured mechanism on canary trials (lanes of one "
                     "compiled program) and prints an empirical lower bound on epsilon, the "
                     "certified upper bound and their ratio (docs/privacy.md).")
  p.add_argument("config", help=_CONFIG_HELP)
  p.add_argument("--set", action="append", metavar="KEY=VALUE",
                 help="override a config field (repeatable)")
  p.add_argument("--trials", default="1000", help="canary trials (default 1000)")
  p.add_argument("--significance", default="0.05",
                 help="failure probability of the lower bound (default 0.05)")
  p.add_argument("--seed", default="0", help="seed of the trials (default 0)")
  p.add_argument("--variant", default="none",
                 help="break the mechanism on purpose: none, noise_div10, no_clip, "
                 "shared_noise_key, sgd_step_weights (the bound computed with SGD's "
                 "step weights while the clients step with client.optimizer); with "
                 "--whole-run also late_noise_div10, band_state_dropped")
  p.add_argument("--whole-run", action="store_true",
                 help="audit the whole run: every trial runs all its rounds and the "
                 "adversary sees every round's release (the global model, central "
                 "placement; the target's upload, upload and step placement)")
  p.add_argument("--noise-scale", default=None, help="run with this noise scale instead")
  p.add_argument("--claimed-sensitivity", default=None,
                 help="certify with this sensitivity instead of the plan's")
  p.add_argument("--no-run-certificate", action="store_true",
                 help="do not run the configured run for its whole-run certificate")
  p.add_argument("--out", default=None, help="write the result as JSON to this file (an "
                 "existing directory: DIR/audit.json)")
  p.add_argument("--overwrite", action="store_true", help=_FILE_OVERWRITE_HELP)
  p.set_defaults(func=_cmd_audit)

  p = sub.add_parser("plot", help="plot run and sweep directories: test loss, accuracy, "
                     "epsilon", description="One line per run, or per sweep point (points "
                     "differing only in seed: their mean, with a min-max band). Panels: test "
                     "loss (MSE for regressions), test accuracy, certified (solid) and claimed "
                     "(dashed) epsilon.")
  p.add_argument("runs", nargs="+", metavar="DIR", help="run or sweep directories")
  p.add_argument("--out", required=True, help="the image file to write, PNG unless its "
                 "suffix names another format matplotlib writes (an existing "
                 "directory: DIR/plot.png; no suffix: .png is appended); the path written is "
                 "printed")
  p.add_argument("--title", default=None, help="first title line (default: the config names)")
  p.add_argument("--overwrite", action="store_true", help=_FILE_OVERWRITE_HELP)
  p.set_defaults(func=_cmd_plot)

  p = sub.add_parser("list", help="datasets (and where they are), models, schedules, "
                     "formulas, selection rules, clip modes")
  p.set_defaults(func=_cmd_list)

  try:
    from fedjax_dp import account_cli
  except ImportError:  # pragma: no cover - the accountant CLI is part of the package
    account_cli = None
  if account_cli is not None:
    account_cli.register(sub)
  return parser


def _one_line(error: Exception) -> str:
  return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  from fedjax_dp.errors import UserError
  # Only errors caused by the input (a config value, a file, an option) become one
  # line; anything else is an internal error and keeps its traceback.
  try:
    return args.func(args)
  except UserError as e:
    print(f"fedjax-dp: error: {_one_line(e)}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"fedjax-dp: interrupted; re-run the same command to resume from "
          f"{getattr(args, 'out', None) or 'the last checkpoint'}", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
