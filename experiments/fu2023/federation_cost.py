"""Fu et al. CNN figures: what a larger federation (N clients, b per round) costs here.

Figs. 2 and 6 run N = 20 writer-like clients, b = 2 (``common.CNN``): the mean of two
uploads carries 175x the paper's noise variance (b = 350), so every DP run sits at
chance. This times a few rounds of Fig. 2's setting (E = 5, eps = 10, one run) at
each federation of ``--federations`` (``N:b``, ``--samples`` images per client, equal
sizes, b / N = 1/10 as in the paper) and projects the wall time of Fig. 2 (the
paper's T_g = 50 rounds, 4 eps x 3 seeds) and of Fig. 6 (T = 240 local steps, the
paper's 8 E x 4 eps x 3 seeds) from the measured CPU seconds per round and lane
(batching the lanes of a figure into one program saves the per-round overhead, which
dominates at small b, so the projection is an upper bound there), so that the
largest federation the CPU can afford is chosen from measurements.

A round's cost grows with b x images x E (every selected client trains E full-batch
steps); N only sets T_l = b T_g / N, the participations per client. Writes
``results/federation_cost.csv`` (the first round, compile included, apart). From the
repository root::

  python experiments/fu2023/federation_cost.py
"""

from __future__ import annotations

import argparse
import os
import time

import common
import pandas as pd

from fedjax_dp import experiment

FIG2_RUN_ROUNDS = 4 * 3 * 50  # eps x seeds x T_g of Fig. 2
# Fig. 6: T = 240 = E T_g for E in {1, 2, 3, 4, 6, 8, 12, 24}; a round of E steps costs
# about E / 5 of Fig. 2's E = 5 round, so every E costs 240 / 5 Fig. 2 rounds per lane.
FIG6_RUN_ROUNDS_E5 = 8 * 4 * 3 * 240 // 5


def _timed_run(cfg, rounds: int) -> tuple[float, float]:
  """(CPU seconds of this process, wall seconds) of a run of ``rounds`` rounds."""
  cfg = cfg.copy_and_resolve_references()
  cfg.rounds = rounds
  cfg.eval.every = rounds
  common.repro.note_configs([cfg])
  cpu, wall = time.process_time(), time.time()
  experiment.run(cfg)
  return time.process_time() - cpu, time.time() - wall


def probe(clients: int, per_round: int, samples: int, rounds: int) -> dict:
  """CPU and wall seconds of the first run of one round (compile included), then per
  round of a run of ``1 + rounds`` rounds reusing the compiled program. CPU seconds
  count every thread of this process: on a shared machine they measure the work, the
  wall seconds the share of the cores it got."""
  cfg = common.cnn_config(num_clients=clients, clients_per_round=per_round,
                          samples_per_client=samples, size_sigma=0.0)
  cfg.name = f"fu_cost_n{clients}_b{per_round}"
  cfg.privacy.epsilon = 10.0
  first_cpu, first_wall = _timed_run(cfg, 1)
  cpu, wall = _timed_run(cfg, 1 + rounds)
  per_cpu, per_wall = cpu / (1 + rounds), wall / (1 + rounds)
  return {"clients": clients, "per_round": per_round, "samples": samples,
          "rounds_timed": 1 + rounds, "first_run_cpu_s": first_cpu,
          "first_run_wall_s": first_wall, "per_round_cpu_s": per_cpu,
          "per_round_wall_s": per_wall,
          "fig2_projected_cpu_h": per_cpu * FIG2_RUN_ROUNDS / 3600,
          "fig6_projected_cpu_h": per_cpu * FIG6_RUN_ROUNDS_E5 / 3600,
          "load_average": os.getloadavg()[0]}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--federations", default="20:2,200:20,350:35,700:70,3500:350",
                  help="N:b pairs")
  ap.add_argument("--samples", type=int, default=17,
                  help="images per client (MNIST's 60k give 17 to 3,500 clients)")
  ap.add_argument("--rounds", type=int, default=4, help="rounds timed per federation")
  args = ap.parse_args(argv)
  start = common.now()
  rows = []
  for pair in args.federations.split(","):
    n, b = (int(v) for v in pair.split(":"))
    rows.append(probe(n, b, args.samples, args.rounds))
    print(rows[-1], flush=True)
  table = pd.DataFrame(rows)
  common.write(table, "federation_cost")
  with pd.option_context("display.width", 200):
    print(table.to_string(index=False))
  common.save_meta("federation_cost", start, samples=args.samples, rounds=args.rounds,
                   note="wall seconds on a shared CPU: load_average is the 1-minute "
                        "load when each federation finished")


if __name__ == "__main__":
  main()
