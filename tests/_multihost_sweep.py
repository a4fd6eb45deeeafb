"""One process of tests/test_multihost.py: a small sweep, either one of several
processes joined by ``jax.distributed`` (gloo collectives between CPU processes) or a
single process; the devices per process come from ``XLA_FLAGS``.

  python tests/_multihost_sweep.py OUT NUM_PROCESSES PROCESS_ID COORDINATOR
"""

import sys
from pathlib import Path

# Timeouts generous enough for a loaded 2-core machine (the defaults of jax 0.10).
INIT_TIMEOUT_S, HEARTBEAT_TIMEOUT_S = 300, 300

GRID = {"privacy.epsilon": [2.0, 8.0], "seed": [0, 1]}
SETS = {"rounds": "2", "data.num_clients": "8", "data.samples_per_client": "20",
        "server.clients_per_round": "4", "model.name": "logistic", "progress": "false"}


def main(out: str, num_processes: int, process_id: int, coordinator: str) -> None:
  import jax
  if num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=INIT_TIMEOUT_S,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  sys.path.insert(0, str(Path(__file__).resolve().parent))
  from _helpers import small_config

  from fedjax_dp import sweep
  print(f"process {jax.process_index()} of {jax.process_count()}: {jax.device_count()} "
        f"devices, {jax.local_device_count()} local", flush=True)
  sweep.run_sweep(small_config(SETS), GRID, out)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
