"""Quickstart: UDP (Wei et al. Alg. 1) on the embedded `digits` dataset.

10 clients x 140 real handwritten 8x8 digits, all clients every round, Wei's MLP
``mlp_784_256_10`` (on 8x8 digits its layers are 64-256-10) with per-example L2
clipping (C = 1), one full-batch step per round
(eta = 0.5), and Gaussian noise on each uploaded model for epsilon = 8, delta = 1e-3
over T = 100 rounds. The noise is the default ``privacy.formula = 'calibrated'``: the
smallest noise whose certified epsilon is at most 8. (Wei eq. (10) as printed,
``--set privacy.formula=wei_eq10``, claims 8 but certifies 9.26 here.) Runs offline in
well under a minute on 2 CPU cores.

  fedjax-dp run quickstart --out runs/quickstart
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "quickstart"
  c.seed = 0
  c.rounds = 100
  c.data.name = "digits"
  c.data.partition = "iid"
  c.data.num_clients = 10
  c.data.samples_per_client = 140
  c.model.name = "mlp_784_256_10"   # Wei's MLP shape; on 8x8 digits it is 64-256-10
  c.client.local_steps = 1
  c.client.batch_size = 0           # full batch, as Wei Alg. 1
  c.client.lr = 0.5
  c.client.clip_mode = "per_example_l2"
  c.client.clip = 1.0
  c.server.selection = "uniform"
  c.server.clients_per_round = 10
  c.privacy.epsilon = 8.0
  c.privacy.delta = 1e-3
  c.privacy.mechanism = "gaussian"
  c.privacy.placement = "upload"
  return c
