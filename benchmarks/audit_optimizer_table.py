"""The audit table of the client optimizers (docs/privacy.md, section 10).

  PYTHONPATH=$PWD nice -n 19 python benchmarks/audit_optimizer_table.py [--trials 1000]

Every client optimizer of the registry (``fedjax_dp.optimizers.CLIENT_OPTIMIZERS``,
the audit's ``client.optimizer`` axis, :mod:`fedjax_dp.audit.mechanisms`) on every
clip mode and noise placement the plan accepts it with (Gaussian noise, every client
every round), and a transformation given from Python
(:func:`fedjax_dp.optimizers.from_transformation`), each with the per-round audit's
variants ``none``, ``noise_div10`` and ``no_clip``. Where a bound counts the local
steps (:attr:`fedjax_dp.privacy.clip_modes.Proof.step_weighted`) an optimizer other
than SGD also gets ``sgd_step_weights``: its noise and certificate computed as if it
were SGD (the step weights ``A_j`` replaced by the learning rates); an optimizer the
plan refuses there (Adam, the transformation) is audited with that variant only:
admitted with SGD's bound.

The base: the quickstart's data with one example per client (:data:`OPTIMIZER_SETS`
says why), a logistic model, 10 local steps at lr 0.005 (heavy ball's weights then
sum to 4.14 times the learning rates), a clip of 0.1, every client every round, 4
rounds at epsilon 3. Two kinds of row run at their own settings on top of it, named in
their labels (:func:`row_sets` says why): heavy ball computed as SGD under an L1 clip
(20 local steps at beta 0.99, with the correct mechanism beside it) and Adam clipped
as a whole update (``update_l2``, ``param_l2``: clip 0.01).
Writes ``benchmarks/results/audit_optimizer_table.{csv,md,_meta.json}``. Caught: the
lower bound exceeds the certified epsilon of round 1 (the run's own accountant).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optax

from fedjax_dp import config as config_lib
from fedjax_dp import optimizers
from fedjax_dp.audit import mechanisms as mechanisms_lib
from fedjax_dp.audit import table
from fedjax_dp.privacy import clip_modes

# One example per client: per-example clipping's step-by-step bound,
# 2 C (A_1 / b + sum_{j>=2} A_j), charges 2 C for every step after the first (once the
# runs diverge every example's gradient may differ), which one canary example among b
# cannot reach (it moves each step by 2 C / b): at b = 140 neither noise/10 nor
# clipping off (the canary's own gradient) passes the bound of 10 steps. At b = 1 the
# canary is the whole batch and reaches it.
#
# A clip of 0.1: at lr 0.005 over 10 steps no client's update reaches 1 on the logistic
# model (a canary's logits saturate after a model change of about 10 / its input
# scale, so its update stays below about 0.7 whatever the scale), so clipping it
# off would be no fault at a clip of 1 (measured: update_l2/central no_clip 0.082,
# as the correct mechanism).
OPTIMIZER_SETS = ("rounds=4", "privacy.epsilon=3.0", "client.local_steps=10",
                  "client.lr=0.005", "server.clients_per_round=10",
                  "data.samples_per_client=1", "client.clip=0.1")
# The axes held at one value (the optimizer meets the privacy argument through the
# clip mode and the placement only).
FIXED = {"privacy.mechanism": "gaussian", "client.minibatch": "shuffle",
         "server.selection": "uniform", "server.clip_rule": "fixed",
         "schedule.validation": "server"}
CORE = (mechanisms_lib.OPTIMIZER_AXIS, "privacy.placement")
BROKEN = ("noise_div10", "no_clip")
# A transformation given from Python (its own learning rate; client.lr stays default).
PYTHON_TX = ("optax.adam(0.005)", lambda: optimizers.from_transformation(
    optax.adam(0.005), name="optax.adam(0.005)"))
# Rows audited at their own settings (on top of OPTIMIZER_SETS; the row's label names
# them). An audit searches for the worst case: where the base hides a fault, the row
# runs where it shows, with its correct mechanism beside it.
#
# Heavy ball computed as SGD under an L1 clip: the softmax gradient of the canary's
# feature row, s (p - y), sums to 0 over the classes, so its L2 norm is at most
# 1 / sqrt(2) of its L1 norm (about 0.53 with p near uniform): the canary reaches half
# the bound. 20 steps at beta 0.99 raise heavy ball's weights from 4.14 to 9.86 times
# the learning rates (the variant's noise is 1 / 9.86 of the right one).
L1_MOMENTUM_SETS = ("client.local_steps=20", "client.momentum=0.99")
# Adam clipped as a whole update (update_l2, param_l2): its normalised steps move the
# canary's coordinates by about lr each whatever the gradient, an update of about
# 0.16 after 10 steps at lr 0.005; a clip of 0.01 binds it 16-fold, so clipping it off
# moves the release far beyond the bound (at 0.1, 1.6-fold, it barely does).
BALL_ADAM_SETS = ("client.clip=0.01",)


def row_sets(m: dict[str, str], variants: tuple[str, ...], linear: bool) -> tuple[str, ...]:
  """The row's own settings (:data:`L1_MOMENTUM_SETS`, :data:`BALL_ADAM_SETS`), or ().
  ``linear``: the client optimizer has step weights (a transformation from Python has
  none)."""
  mode = clip_modes.get(m["client.clip_mode"])
  if variants == ("sgd_step_weights",) and linear and mode.canary.sparse:
    return L1_MOMENTUM_SETS
  if "no_clip" in variants and not linear and mode.proof.upload_ball:
    return BALL_ADAM_SETS
  return ()


def with_row_sets(base, m, variants, label, given=None):
  """``(base, variants, label)`` of a row at its :func:`row_sets` (the correct
  mechanism added beside a lone ``sgd_step_weights``); ``given``: the transformation
  from Python the row audits, if any."""
  opt = given or optimizers.CLIENT_OPTIMIZERS[m[mechanisms_lib.OPTIMIZER_AXIS]]
  sets = row_sets(m, variants, opt.step_weights_fn is not None)
  if not sets:
    return base, variants, label
  if variants == ("sgd_step_weights",):
    variants = ("none", *variants)
  return config_lib.override(base, list(sets)), variants, f"{label} [{' '.join(sets)}]"


def step_weighted(m: dict[str, str]) -> bool:
  """Whether the mechanism's bound counts the client optimizer's step weights."""
  return m["privacy.placement"] in clip_modes.get(m["client.clip_mode"]).proof.step_weighted


def plan(base, optimizer_names: tuple[str, ...] | None = None
         ) -> list[tuple[dict[str, str], tuple[str, ...], str]]:
  """``(mechanism, variants, label)`` to audit, in the registries' order: for each
  client optimizer the first mechanism it is accepted on at each placement (correct
  and broken), and on every step-weighted (clip mode, placement) that SGD is accepted
  on, the optimizer admitted with SGD's bound (``sgd_step_weights``; ``(refused)``
  where the plan refuses the optimizer there). ``optimizer_names``: the values of the
  optimizer axis (default the registry's)."""
  axis = mechanisms_lib.OPTIMIZER_AXIS
  names = optimizer_names or mechanisms_lib.axes()[axis]
  found = [m for m in mechanisms_lib.enumerate_mechanisms(base)
           if all(m[a] == v for a, v in FIXED.items())]
  first = {tuple(m[a] for a in CORE): m for m in reversed(found)}
  sgd_pairs = [m for m in found if m[axis] == names[0] and step_weighted(m)]
  out = []
  for opt in names:
    for m in [m for m in found if m[axis] == opt and first[tuple(m[a] for a in CORE)] == m]:
      extra = ("sgd_step_weights",) if opt != names[0] and step_weighted(m) else ()
      out.append((m, ("none", *BROKEN, *extra), table.mechanism_name(m)))
    if opt == names[0]:
      continue
    for p in sgd_pairs:
      m = {**p, axis: opt}
      if any(m == o[0] for o in out):
        continue
      label = table.mechanism_name(m) + ("" if m in found else " (refused)")
      out.append((m, ("sgd_step_weights",), label))
  return out


def python_plan(base) -> list[tuple[dict[str, str], tuple[str, ...], str]]:
  """The transformation from Python where :func:`plan` puts the registry's first
  non-linear optimizer (no step weights: both are refused where the bound counts the
  steps), labelled with its name; the config's optimizer stays SGD (the given one
  replaces it)."""
  axis = mechanisms_lib.OPTIMIZER_AXIS
  names = mechanisms_lib.axes()[axis]
  nonlinear = next(n for n in names if optimizers.CLIENT_OPTIMIZERS[n].step_weights_fn is None)
  return [({**m, axis: names[0]}, variants,
           label.replace(f"opt={nonlinear}", f"opt={PYTHON_TX[0]}"))
          for m, variants, label in plan(base) if m[axis] == nonlinear]




def main(argv=None) -> int:
  args = table.benchmark_parser(__doc__, escalate=1).parse_args(argv)
  table._CODE_COMMIT[0] = table._git_commit()  # pylint: disable=protected-access
  quick = config_lib.load_config("quickstart")
  base = config_lib.override(quick, [*table.BASE_SETS, *OPTIMIZER_SETS])
  # The transformation carries its own learning rate: client.lr stays at its default.
  py_base = config_lib.override(base, [f"client.lr={config_lib.base_config().client.lr}"])
  todo = [(*with_row_sets(base, m, v, label), m, None) for m, v, label in plan(base)]
  # (Admitted with SGD's bound, its plan is SGD's at client.lr, the transformation's
  # own rate: base.)
  given = PYTHON_TX[1]()
  todo += [(*with_row_sets(base if "sgd_step_weights" in v else py_base, m, v, label, given),
            m, given) for m, v, label in python_plan(base)]
  only = args.only.split(",")
  todo = [t for t in todo if any(o in t[2] for o in only)]
  print(f"auditing {len(todo)} mechanisms", flush=True)
  t0, rows = time.time(), []
  for b, variants, label, m, given in todo:
    rows += table.audit_mechanism(b, m, args.trials, args.escalate, 0, False, variants,
                                  name=label, client_optimizer=given)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = "audit_optimizer_table" + ("" if not args.only else "_only")
  table._write_csv(out / f"{stem}.csv", rows)  # pylint: disable=protected-access
  (out / f"{stem}.md").write_text(table.markdown(rows))
  meta = {"command": "PYTHONPATH=$PWD python benchmarks/audit_optimizer_table.py " +
                     " ".join(sys.argv[1:] if argv is None else argv),
          "git_commit": table._git_commit(),  # pylint: disable=protected-access
          "base_sets": [*table.BASE_SETS, *OPTIMIZER_SETS], "fixed_axes": FIXED,
          "row_sets": {"momentum sgd_step_weights under an L1 clip": L1_MOMENTUM_SETS,
                       "adam and optax.adam(0.005) at update_l2, param_l2": BALL_ADAM_SETS},
          "trials": args.trials, "escalate": args.escalate,
          "load_average": os.getloadavg(), "cpus": os.cpu_count(),
          "wall_s": round(time.time() - t0, 1)}
  (out / f"{stem}_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
  print(f"wrote {out}/{stem}.csv: {sum(r['caught'] == 'no' for r in rows)} broken variants "
        "not caught", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
