"""``fedjax-dp account``: epsilon of a mechanism over rounds, or the noise for a budget.

Examples::

  # DP-SGD on MNIST (q = 256/60000, 60 epochs): certified RDP and PLD epsilon
  fedjax-dp account --mechanism gaussian --q 0.0042667 --sigma 1.1 --rounds 14063 --delta 1e-5
  # noise multiplier for (8, 1e-3) over 200 full-participation rounds
  fedjax-dp account --mechanism gaussian --q 1 --rounds 200 --delta 1e-3 --epsilon 8
  # Wei et al. eq. (10): what the paper claims vs what is certified
  fedjax-dp account --q 1 --sigma 13.1413 --rounds 200 --delta 1e-3 --formula wei10

``--sigma`` is the noise multiplier: Gaussian std / L2 sensitivity, or Laplace
scale / L1 sensitivity. ``--ratio r`` gives the geometric schedule
``sigma_t = sigma r^t``; ``--sigmas`` an explicit per-round list.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

import numpy as np

from fedjax_dp.errors import UserError

# Longest schedule accounted: a per-round array of this many multipliers is built.
MAX_ROUNDS = 10_000_000

FORMULAS = ("wei10", "wei10-corrected", "yuan8", "yuan8-corrected", "fu-thm1", "fu-thm2",
            "fu-zcdp", "adpfl")


def help_text(doc: str | None = None) -> str:
  """The module docstring as plain text for ``--help``: reST's double backticks
  dropped and ``Examples::`` ended with one colon (the layout is kept)."""
  text = (__doc__ if doc is None else doc).replace("``", "")
  return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def register(subparsers) -> argparse.ArgumentParser:
  """Adds the ``account`` subcommand to an argparse ``subparsers`` object."""
  p = subparsers.add_parser(
      "account", help="privacy accounting: epsilon for a noise schedule, or the noise for a budget",
      description=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
  add_arguments(p)
  p.set_defaults(func=run_account)
  return p


def add_arguments(p: argparse.ArgumentParser) -> None:
  """The ``account`` options (shared by ``fedjax-dp account`` and ``python -m``)."""
  p.add_argument("--mechanism", choices=("gaussian", "laplace"), default="gaussian")
  p.add_argument("--q", type=float, default=1.0,
                 help="sampling/selection probability per round (default 1)")
  p.add_argument("--sigma", type=float, help="noise multiplier (first round with --ratio)")
  p.add_argument("--sigmas", type=str,
                 help="comma-separated per-round noise multipliers (overrides --sigma/--rounds)")
  p.add_argument("--ratio", type=float, default=1.0,
                 help="geometric schedule sigma_t = sigma * ratio^t (default 1: constant)")
  p.add_argument("--rounds", type=int, help="number of rounds (compositions)")
  p.add_argument("--delta", type=float, required=True)
  p.add_argument("--epsilon", type=float,
                 help="calibrate: print the noise multiplier that spends this epsilon")
  p.add_argument("--sampling", choices=("full", "round_robin", "poisson", "fixed_size",
                                        "selection"),
                 help="default: full if q = 1, fixed_size with --population, else poisson")
  p.add_argument("--relation", choices=("add_remove", "replace_one"), default=None,
                 help="neighbouring relation (default add_remove; replace_one for fixed_size)")
  p.add_argument("--level", choices=("example", "client"), default="example")
  p.add_argument("--population", type=int, help="U (fixed_size sampling)")
  p.add_argument("--sample-size", type=int, help="K (fixed_size sampling)")
  p.add_argument("--fixed-size-method", choices=("wor", "poisson_reduction"), default="wor")
  p.add_argument("--accountants", default="rdp,pld,exact",
                 help="comma-separated subset of rdp,pld,exact (default all that apply)")
  p.add_argument("--pld-discretization", type=float, default=1e-4)
  p.add_argument("--formula", choices=FORMULAS,
                 help="also print the paper formula's claim (sensitivity 1, i.e. multiplier units)")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _schedule(args) -> np.ndarray:
  if args.sigmas:
    parts = [s.strip() for s in args.sigmas.split(",")]
    try:
      z = np.array([float(s) for s in parts])
    except ValueError:
      raise UserError(f"--sigmas must be comma-separated numbers, got {args.sigmas!r}") from None
    if not (z.size and np.all(np.isfinite(z)) and np.all(z > 0)):
      raise UserError(f"--sigmas must be finite numbers > 0, got {args.sigmas!r}")
    return z
  if args.sigma is None:
    raise UserError("give --sigma (or --sigmas), or --epsilon to calibrate")
  if args.rounds is None:
    raise UserError("--rounds is required with --sigma (a positive integer)")
  if not (args.sigma > 0 and math.isfinite(args.sigma)):
    raise UserError(f"--sigma must be a finite number > 0, got {args.sigma}")
  with np.errstate(over="ignore", under="ignore"):  # judged below, not warned about
    z = args.sigma * args.ratio ** np.arange(args.rounds)
  if not (np.all(np.isfinite(z)) and np.all(z > 0)):
    raise UserError(f"--ratio {args.ratio:g}: sigma * ratio^t leaves the finite positive "
                    f"numbers within --rounds {args.rounds}")
  return z


def _check_options(args) -> None:
  """Ranges of the numeric options, before anything is accounted."""
  def bad(option: str, value, need: str):
    raise UserError(f"{option} {value}: {need}")

  if not 0 < args.delta < 1:
    bad("--delta", args.delta, "must be in (0, 1)")
  if not 0 < args.q <= 1:
    bad("--q", args.q, "must be in (0, 1]")
  if args.epsilon is not None and not (args.epsilon > 0 and math.isfinite(args.epsilon)):
    bad("--epsilon", args.epsilon, "(target_epsilon) must be finite and > 0")
  if not (args.ratio > 0 and math.isfinite(args.ratio)):
    bad("--ratio", args.ratio, "must be a finite number > 0")
  if args.rounds is not None and not 1 <= args.rounds <= MAX_ROUNDS:
    bad("--rounds", args.rounds, f"must be a positive integer (at most {MAX_ROUNDS})")
  if not (args.pld_discretization > 0 and math.isfinite(args.pld_discretization)):
    bad("--pld-discretization", args.pld_discretization, "must be a finite number > 0")
  if (args.population is None) != (args.sample_size is None):
    raise UserError("--population and --sample-size go together (U and K of fixed_size "
                    "sampling)")
  if args.population is not None and not 1 <= args.sample_size <= args.population:
    bad("--sample-size", args.sample_size, f"must be in [1, --population {args.population}]")


def _event_kwargs(args) -> dict:
  sampling = args.sampling
  if sampling is None:
    if args.population is not None:
      sampling = "fixed_size"
    else:
      sampling = "full" if args.q == 1 else "poisson"
  relation = args.relation or ("replace_one" if sampling == "fixed_size" else "add_remove")
  kw = {"mechanism": args.mechanism, "sampling": sampling, "relation": relation,
        "level": args.level, "fixed_size_method": args.fixed_size_method}
  if sampling == "fixed_size":
    if args.population is not None:
      kw.update(population=args.population, sample_size=args.sample_size)
    else:
      kw.update(q=args.q)
  elif sampling in ("poisson", "selection"):
    kw.update(q=args.q)
  elif args.q != 1:
    raise UserError(f"--q must be 1 with --sampling {sampling}")
  return kw


def _history(kw: dict, z: np.ndarray) -> list:
  from fedjax_dp.privacy import accounting
  # Runs of equal multipliers become one event with a count (fast and exact).
  hist = []
  start = 0
  for i in range(1, z.size + 1):
    if i == z.size or z[i] != z[start]:
      hist.append(accounting.Event(noise_multiplier=float(z[start]), count=i - start, **kw))
      start = i
  return hist


def _formula_claim(name: str, args, z: np.ndarray, q: float) -> dict:
  """The paper formula's epsilon for schedule ``z`` (multiplier units, sensitivity 1)."""
  from fedjax_dp.privacy import formulas as F
  d, t = args.delta, z.size
  with np.errstate(over="ignore", divide="ignore"):  # 1 / z^2 -> 0 or inf at the extremes
    inv = float(np.sum(1.0 / z ** 2))
  if name == "wei10":
    return {"epsilon": float(F.wei_epsilon_claimed(inv, d, q, 1.0)),
            "ref": "Wei et al. eq. (10)/(25)"}
  if name == "wei10-corrected":
    return {"epsilon": float(F.wei_epsilon_claimed_corrected(inv, d, q, 1.0)),
            "ref": "Wei et al. eq. (10), corrected algebra (paper's moment bound)"}
  if name == "yuan8":
    return {"epsilon": float(F.yuan_epsilon_claimed(inv, d, q, 1.0)), "ref": "Yuan et al. eq. (8)"}
  if name == "yuan8-corrected":
    return {"epsilon": float(F.yuan_epsilon_achieved(inv, d, q, 1.0)),
            "ref": "Yuan et al. eq. (16)-(17) minimised exactly (corrected)"}
  if name == "fu-thm1":
    return {"epsilon": float(np.sum(1.0 / z)),
            "ref": "Fu et al. Thm. 1 (basic composition of eps/T_l)"}
  if name == "fu-thm2":
    if np.any(z != z[0]):
      raise UserError("--formula fu-thm2 needs a constant sigma")
    return {"epsilon": float(F.fu_epsilon_thm2(z[0], d, t)),
            "ref": "Fu et al. Thm. 2 with c2 = sqrt(2)"}
  if name == "fu-zcdp":
    return {"epsilon": float(F.zcdp_epsilon(inv / 2, d)), "ref": "Fu et al. Thm. 2, zCDP-corrected"}
  if name == "adpfl":
    return {"epsilon": float(F.adpfl_epsilon_claimed(z, d)),
            "ref": "A-DPFL Sec. 3.1 per step, summed (not in paper)"}
  raise ValueError(f"unknown formula {name!r}")


def _formula_sigma(name: str, args, rounds: int, q: float):
  from fedjax_dp.privacy import formulas as F
  e, d, t = args.epsilon, args.delta, rounds
  if name == "wei10":
    return float(F.wei_sigma_eq10(e, d, q, t, 1.0))
  if name == "wei10-corrected":
    return float(F.wei_sigma_eq10_corrected(e, d, q, t, 1.0))
  theta = args.ratio ** 2
  if name == "yuan8":
    return float(F.yuan_sigma_eq8(e, d, q, t, theta, 1.0))
  if name == "yuan8-corrected":
    return float(F.yuan_sigma_eq8_corrected(e, d, q, t, theta, 1.0))
  if name == "fu-thm1":
    return float(F.fu_laplace_scale_thm1(e, t, 1.0))
  if name == "fu-thm2":
    return float(F.fu_sigma_thm2(e, d, t))
  if name == "fu-zcdp":
    return float(F.fu_sigma_zcdp(e, d, t))
  return None


def _accountants(args) -> list[str]:
  names = [a.strip() for a in args.accountants.split(",") if a.strip()]
  for a in names:
    if a not in ("rdp", "pld", "exact"):
      raise UserError(f"--accountants: unknown {a!r} (choose from rdp, pld, exact)")
  if not names:
    raise UserError(f"--accountants {args.accountants!r}: name at least one of rdp, pld, exact")
  return names


_PLD_MISSING = "dp-accounting is not installed: pip install 'fedjax_dp[pld]'"


def _pld_available() -> bool:
  try:
    import dp_accounting  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return False
  return True


def compute(args) -> dict:
  """Runs the accounting described by ``args``; returns a JSON-able report."""
  from fedjax_dp.privacy import accounting, calibration
  # Bad inputs fail loudly here; per-accountant errors below only mean "not supported".
  _check_options(args)
  kw = _event_kwargs(args)
  try:
    q_eff = float(accounting.Event(noise_multiplier=1.0, **kw).q)
  except ValueError as err:  # a combination of options the accountant does not model
    raise UserError(f"--sampling {kw['sampling']} --relation {kw['relation']} --level "
                    f"{kw['level']}: {err}") from None
  report = {"event": {k: v for k, v in kw.items()}, "q": q_eff, "delta": args.delta}
  names = _accountants(args)
  if args.epsilon is not None:
    if args.sigmas:
      raise UserError("--epsilon calibrates a constant or geometric schedule; drop --sigmas")
    if args.rounds is None or args.rounds < 1:
      raise UserError(f"--rounds must be a positive integer, got {args.rounds}")
    report.update(mode="calibrate", target_epsilon=args.epsilon, rounds=args.rounds,
                  ratio=args.ratio, results={})
    for name in names:
      entry = {}
      try:
        if name == "pld" and not _pld_available():
          raise ImportError(_PLD_MISSING)
        z = calibration.calibrate_noise_multiplier(
            args.epsilon, args.delta, args.rounds, ratio=args.ratio, accountant=name,
            pld_discretization=args.pld_discretization, **_calib_kwargs(kw, args))
        hist = _history(kw, z * args.ratio ** np.arange(args.rounds))
        entry = {"noise_multiplier": z,
                 "epsilon": accounting.epsilon(hist, args.delta, name,
                                               pld_discretization=args.pld_discretization)}
      except (ValueError, ImportError) as err:
        entry = {"unavailable": str(err)}
      report["results"][name] = entry
    if args.formula:
      report["formula"] = {
          "name": args.formula,
          "noise_multiplier": _formula_sigma(args.formula, args, args.rounds, q_eff)}
    return report
  z = _schedule(args)
  # The formula's claim first: a schedule it does not cover fails before any accounting.
  claim = _formula_claim(args.formula, args, z, q_eff) if args.formula else None
  hist = _history(kw, z)
  report.update(mode="epsilon", rounds=int(z.size),
                noise_multipliers=(float(z[0]) if np.all(z == z[0]) else z.tolist()), results={})
  for name in names:
    try:
      if name == "pld" and not _pld_available():
        raise ImportError(_PLD_MISSING)
      entry = {"epsilon": accounting.epsilon(hist, args.delta, name,
                                             pld_discretization=args.pld_discretization)}
      if name == "rdp":
        _, order = accounting.rdp_epsilon_and_order(accounting.history_rdp(hist), args.delta)
        entry["optimal_order"] = float(order)
    except (ValueError, ImportError) as err:
      entry = {"unavailable": str(err)}
    report["results"][name] = entry
  if claim is not None:
    report["formula"] = {"name": args.formula, **claim}
  return report


def _calib_kwargs(kw: dict, args) -> dict:
  out = {"mechanism": kw["mechanism"], "sampling": kw["sampling"], "relation": kw["relation"],
         "level": kw["level"], "fixed_size_method": kw["fixed_size_method"]}
  if "population" in kw:
    out.update(population=kw["population"], sample_size=kw["sample_size"])
  out["q"] = kw.get("q", args.q)
  return out


_LABELS = {"rdp": "RDP (certified)", "pld": "PLD (dp_accounting)",
           "exact": "exact (analytic Gaussian / pure composition)"}


def format_report(r: dict) -> str:
  """Human-readable text for :func:`compute`'s report."""
  ev = r["event"]
  lines = [(f"mechanism {ev['mechanism']}, sampling {ev['sampling']} (q = {r['q']:g}, "
           f"{ev['relation']}, {ev['level']}-level), delta = {r['delta']:g}")]
  if r["mode"] == "calibrate":
    lines.append(f"calibrating for epsilon = {r['target_epsilon']:g} over {r['rounds']} rounds"
                 + (f", sigma_t = sigma * {r['ratio']:g}^t" if r["ratio"] != 1 else ""))
    for name, e in r["results"].items():
      if "unavailable" in e:
        lines.append(f"  noise multiplier  {_LABELS[name]:<46} n/a ({e['unavailable']})")
      else:
        lines.append(f"  noise multiplier  {_LABELS[name]:<46} {e['noise_multiplier']:.6g}"
                     f"   (epsilon {e['epsilon']:.6g})")
    if "formula" in r:
      f = r["formula"]
      val = "n/a" if f["noise_multiplier"] is None else f"{f['noise_multiplier']:.6g}"
      lines.append(f"  noise multiplier  {'paper formula ' + f['name']:<46} {val}")
    return "\n".join(lines)
  nm = r["noise_multipliers"]
  sched = f"{nm:g}" if isinstance(nm, float) else f"{nm[0]:g} .. {nm[-1]:g} (schedule)"
  lines.append(f"noise multiplier {sched}, {r['rounds']} rounds")
  for name, e in r["results"].items():
    if "unavailable" in e:
      lines.append(f"  epsilon  {_LABELS[name]:<46} n/a ({e['unavailable']})")
    else:
      extra = f"   (optimal order {e['optimal_order']:g})" if "optimal_order" in e else ""
      lines.append(f"  epsilon  {_LABELS[name]:<46} {e['epsilon']:.6g}{extra}")
  if "formula" in r:
    f = r["formula"]
    lines.append(f"  epsilon  {'claimed by ' + f['ref']:<46} {f['epsilon']:.6g}")
  return "\n".join(lines)


def run_account(args) -> int:
  """Entry point of ``fedjax-dp account`` (returns the exit code)."""
  report = compute(args)
  if args.json:
    print(json.dumps(report, default=_json_default))
  else:
    print(format_report(report))
  return 0


def _json_default(x):
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  if isinstance(x, float) and math.isinf(x):
    return str(x)
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def main(argv=None) -> int:
  """``python -m fedjax_dp.account_cli ...``."""
  parser = argparse.ArgumentParser(prog="fedjax-dp account", description=help_text(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  add_arguments(parser)
  args = parser.parse_args(argv)
  try:
    return run_account(args)
  except UserError as err:
    print(f"fedjax-dp account: error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
