"""Do two releases share noise? Round-1 models of two runs, compared.

For each pair of runs it reports the correlation of their standardised round-1
noise (model minus the noiseless round-1 model, divided by the round's noise std)
and how well a linear combination of the two noisy models recovers the noiseless
one: with shared noise n, ``w_a = m + s_a n`` and ``w_b = m + s_b n`` give
``m = (s_b w_a - s_a w_b) / (s_b - s_a)`` exactly; with independent noise the error
is of the order of the noise itself.

  python benchmarks/noise_sharing.py [optimal_t | runs | sweep]

``optimal_t``: the T = 1 and T = 2 candidates of the quickstart's ``optimal_t``
(``schedule.t_grid=1,2``), run as ``fedjax-dp run`` runs them (one batched sweep),
and the certified epsilon that command reports. ``runs``: two ordinary quickstart
runs of seed 0 at epsilon 8 and 4. ``sweep``: point 0 of ``--grid
privacy.epsilon=4,8`` run alone (as the sweep runs it) against an ordinary
epsilon = 4 run.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp import experiment, optimal_t, sweep

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "quickstart.py"


class _Stop(Exception):
  pass


def _round1_models(cfg, stop: bool) -> dict[str, np.ndarray]:
  """``{run name: flat round-1 model}`` of ``cfg`` (its candidates, for optimal_t),
  caught where the run loop checkpoints after round 1."""
  got: dict[str, np.ndarray] = {}
  original = experiment.RunLoop.save_checkpoint

  def capture(self, params, wall):
    if self.t == 1:
      got[self.cfg.name] = np.concatenate(
          [np.ravel(x) for x in jax.tree_util.tree_leaves(jax.device_get(params))])
      if stop:
        raise _Stop
    return original(self, params, wall)

  experiment.RunLoop.save_checkpoint = capture
  try:
    with tempfile.TemporaryDirectory() as out:
      try:
        result = experiment.run(config_lib.override(cfg, ["checkpoint.every=1", "progress=false"]),
                                out)
      except _Stop:
        result = None
  finally:
    experiment.RunLoop.save_checkpoint = original
  return got, result


def _sigma(cfg) -> float:
  """The per-client noise std of round 1 (all quickstart clients alike)."""
  setup = experiment.build(cfg)
  return float(setup.privacy.noise_scale(int(cfg.rounds))[0])


def _compare(name, w_a, s_a, w_b, s_b, clean):
  n_a, n_b = (w_a - clean) / s_a, (w_b - clean) / s_b
  corr = float(np.corrcoef(n_a, n_b)[0, 1])
  recovered = (s_b * w_a - s_a * w_b) / (s_b - s_a)
  err = float(np.max(np.abs(recovered - clean)))
  std = float(np.std(w_a - clean))
  print(f"{name}: correlation of standardised round-1 noise {corr:.6f}; noiseless "
        f"aggregate recovered to max |error| {err:.3g} (noise std of the first model "
        f"{std:.3g})")


def _clean(cfg) -> np.ndarray:
  models, _ = _round1_models(config_lib.override(cfg, ["privacy.placement=none"]), stop=True)
  return next(iter(models.values()))


def main(which: str) -> None:
  base = config_lib.load_config(QUICKSTART)
  if which == "optimal_t":
    cfg = config_lib.override(base, ["schedule.name=optimal_t", "schedule.t_grid=1,2"])
    models, result = _round1_models(cfg, stop=False)
    (_, c_a), (_, c_b) = optimal_t.candidates(cfg)
    clean = _clean(c_a)
    _compare("optimal_t T=1 vs T=2", models[c_a.name], _sigma(c_a), models[c_b.name],
             _sigma(c_b), clean)
    s = result.summary
    print(f"optimal_t summary: epsilon_certified {s['epsilon_certified']:.3f} "
          f"(candidates: {[r['epsilon_certified'] for r in s['optimal_t']]})")
  elif which == "runs":
    a = config_lib.override(base, ["privacy.epsilon=8"])
    b = config_lib.override(base, ["privacy.epsilon=4"])
    w_a, w_b = (next(iter(_round1_models(c, stop=True)[0].values())) for c in (a, b))
    _compare("runs eps=8 vs eps=4 (seed 0)", w_a, _sigma(a), w_b, _sigma(b), _clean(a))
  elif which == "sweep":
    point = sweep.expand(base, {"privacy.epsilon": [4, 8]})[0].config
    plain = config_lib.override(base, ["privacy.epsilon=8"])
    w_a, w_b = (next(iter(_round1_models(c, stop=True)[0].values())) for c in (point, plain))
    _compare("sweep point 0 (eps=4) vs run eps=8", w_a, _sigma(point), w_b, _sigma(plain),
             _clean(plain))
  else:
    raise SystemExit(f"unknown {which!r}: optimal_t | runs | sweep")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "optimal_t")
