"""A-DPFL with Poisson minibatches: certified epsilon under add/remove (before) and
replace-one (now), for ``experiments/configs/adpfl_mnist_cnn.py``.

The top-K rule's assumption (public label histograms and counts) allows no add/remove
neighbour, so the run is accounted under replace-one (``PrivacyPlan.adjacency``).
"Before" is the same plan with ``adjacency='add_remove'``, the earlier accounting; the
lower bound is dp_accounting's optimistic PLD under ``REPLACE_ONE``. A client of the
top-K cohort is selected every round.

  python experiments/privacy_review/adpfl_poisson_relation.py
"""

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedjax_dp.config.privacy_inputs import plan_from_config

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "adpfl_mnist_cnn.py"
# The Fig. 5 noise trajectory up to round 35 (docs/privacy.md).
FIG5 = [1.0] * 20 + [0.7] * 4 + [0.49] * 4 + [0.343] * 7


def _config():
  spec = importlib.util.spec_from_file_location("adpfl_mnist_cnn", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _certified(plan, sigmas, validate):
  state = plan.accountant_init()
  cohort = np.arange(plan.clients_per_round)
  for sigma in sigmas:
    state = plan.accountant_step(state, np.full(plan.num_clients, sigma * plan.sensitivity[0]),
                                 selected=cohort, validate=validate)
  return plan.certified_epsilon(state)


def main():
  cfg = _config()
  plan = plan_from_config(cfg, np.full(int(cfg.data.num_clients), 60))
  before = dataclasses.replace(plan, adjacency="add_remove")
  lower = pld_lib.from_gaussian_mechanism(
      1.0, sampling_prob=1 / 3, neighboring_relation=NeighboringRelation.REPLACE_ONE,
      pessimistic_estimate=False, use_connect_dots=False,
      value_discretization_interval=1e-3).self_compose(150).get_epsilon_for_delta(plan.delta)
  print(f"run adjacency: {plan.adjacency}")
  print(f"lower bound, sigma = 1 x 50 rounds (optimistic PLD, replace-one): {lower:.2f}")
  for name, sigmas in (("sigma = 1 x 50 rounds", [1.0] * 50), ("Fig. 5 to round 35", FIG5)):
    for validate in (False, True):
      label = f"{name}, {'with' if validate else 'without'} the validation score"
      print(f"{label}: before {_certified(before, sigmas, validate):.2f} "
            f"-> now {_certified(plan, sigmas, validate):.2f}")


if __name__ == "__main__":
  main()
