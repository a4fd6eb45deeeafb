"""Certified epsilon before and after the privacy review's fixes (B1-B4, defaults).

For each example of the review, prints the epsilon the earlier plan certified, the
epsilon that its noise really gives (the honest one), and what the plan certifies
now. "Before" is recomputed here from the earlier plan's rules (its sensitivity and
accounting event), so the script runs on the current code only.

  python experiments/privacy_review/certified_before_after.py
"""

import math

import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.privacy import accounting, calibration

DELTA = 1e-3


def _cfg(**sets):
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in sets.items()])


def _run_plan(plan, rounds, cohorts):
  state = plan.accountant_init()
  noise, central = plan.device_noise(plan.noise_scale(rounds))
  for t in range(rounds):
    state = plan.accountant_step(state, noise, central, selected=cohorts(t))
  return plan.certified_epsilon(state)


def _gauss(z, count, **kw):
  kw.setdefault("sampling", "full")
  return float(accounting.epsilon(
      [accounting.Event(noise_multiplier=z, relation="replace_one", count=count, **kw)], DELTA))


def b1():
  """Linear SVM, n = 100, eta = 0.5, C = 1, E = 2, q = 1, T = 200, target 4; the
  active-set flip moves the upload by 0.48 (tests/test_trust.py measures it)."""
  old_sens, moved, t = 2 * 1.0 * (0.5 + 0.5) / 100, 0.48, 200
  z_old = float(calibration.calibrate(lambda z: [accounting.Event(
      noise_multiplier=z, relation="replace_one", count=t)], 4.0, DELTA))
  honest = _gauss(z_old * old_sens / moved, t)
  plan = plan_from_config(_cfg(**{"client.local_steps": 2, "client.lr": 0.5,
                                   "data.num_clients": 1, "server.clients_per_round": 1,
                                   "rounds": t, "privacy.epsilon": 4}), np.array([100]))
  after = _run_plan(plan, t, lambda _: np.array([0]))
  return ("B1 E=2 upload, per-example clip", 4.0, honest, after,
          f"Delta {old_sens:.3f} -> {plan.sensitivity[0]:.3f}")


def b2():
  """Round robin, U = 1000, K = 1, T = 1, target 1."""
  z_old = float(calibration.calibrate(lambda z: [accounting.Event(
      noise_multiplier=z, relation="replace_one", sampling="selection", q=0.001)], 1.0, DELTA))
  honest = _gauss(z_old, 1)
  plan = plan_from_config(_cfg(**{"data.num_clients": 1000, "server.selection": "round_robin",
                                   "server.clients_per_round": 1, "rounds": 1,
                                   "privacy.epsilon": 1}), np.full(1000, 10))
  after = _run_plan(plan, 1, lambda _: np.array([0]))
  return ("B2 round robin", 1.0, honest, after, "per-client, no amplification")


def b3():
  """Central noise, Poisson q = 0.01 of U = 1000, normalized, T = 200, target 4.
  Honest (an upper bound): the normalized aggregate of a cohort of one moves by 2C,
  against the planned 2C / (qU) = 0.2 (equal clients)."""
  u, q, t = 1000, 0.01, 200
  old_sens = 2.0 / (q * u)
  z_old = float(calibration.calibrate(lambda z: [accounting.Event(
      noise_multiplier=z, relation="replace_one", sampling="poisson", q=q, level="client",
      count=t)], 4.0, DELTA))
  worst = _gauss(z_old * old_sens / 2.0, t, sampling="poisson", q=q, level="client")
  cfg = _cfg(**{"data.num_clients": u, "server.selection": "poisson", "server.q": q,
                "privacy.placement": "central", "client.clip_mode": "update_l2",
                "rounds": t, "privacy.epsilon": 4})
  try:
    plan_from_config(cfg, np.full(u, 10))
    refused = False
  except ValueError:
    refused = True
  fixed = plan_from_config(config_lib.override(cfg, ["server.aggregation=fixed"]),
                            np.full(u, 10))
  after = _run_plan(fixed, t, lambda _: None)
  note = (f"honest: bound with Delta = 2C (a cohort of one); normalized refused={refused}; "
          f"after: aggregation=fixed, Delta {fixed.sensitivity[0]:.3f}")
  return ("B3 central + Poisson + normalized", 4.0, worst, after, note)


def b4():
  """privacy.client_epsilons = (1, inf), 10 rounds, both clients every round."""
  cfg = _cfg(**{"data.num_clients": 2, "server.clients_per_round": 2, "rounds": 10})
  cfg.privacy.client_epsilons = (1.0, math.inf)
  plan = plan_from_config(cfg, np.array([100, 100]))
  after = _run_plan(plan, 10, lambda _: np.arange(2))
  return ("B4 client_epsilons=(1, inf)", 1.0, math.inf, after, "noiseless client charged inf")


def defaults():
  """The quickstart (U = K = 10 x 140, eta = 0.5, T = 100, eps = 8): Wei eq. (10) was
  the default formula; now 'calibrated' is."""
  cfg = config_lib.load_config("experiments/configs/quickstart.py")
  counts = np.full(10, 140)
  wei = plan_from_config(config_lib.override(cfg, ["privacy.formula=wei_eq10"]), counts)
  before = _run_plan(wei, 100, lambda _: np.arange(10))
  after = _run_plan(plan_from_config(cfg, counts), 100, lambda _: np.arange(10))
  return ("quickstart default formula", before, before, after, "wei_eq10 -> calibrated")


def main():
  print(f"{'example':36s} {'certified before':>16s} {'honest before':>14s} "
        f"{'certified after':>16s}  note")
  for fn in (b1, b2, b3, b4, defaults):
    name, cert_before, honest, after, note = fn()
    print(f"{name:36s} {cert_before:16.3f} {honest:14.3f} {after:16.3f}  {note}")


if __name__ == "__main__":
  main()
