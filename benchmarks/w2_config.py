"""W2 as a ``fedjax-dp run`` config: pfl-research's CIFAR-10 benchmark with central DP.

  fedjax-dp run benchmarks/w2_config.py --out runs/w2 --set data.dir=DIR_WITH_CIFAR10

1000 clients x 50 CIFAR-10 images (IID), 50 per round, one local epoch of batch 10
(5 steps), lr 0.1, ``cnn_pfl_cifar10``, each client's update clipped to norm 1 and
Gaussian noise of std 0.01 on the sum (noise multiplier 0.01: pfl's
``GaussianMechanism(1.0, 0.01)``), T = 1500 rounds as pfl's configuration, without
its periodic evaluation (the test set is scored only at the end, as
``benchmarks/pfl_w2.py`` runs pfl without evaluation). ``benchmarks/startup.py`` runs it
on random images written in CIFAR-10's python format (``write_cifar10``) and times
it to the end of round 1 beside pfl.
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "w2_pfl_cifar10"
  c.rounds = 1500
  c.data.name = "cifar10"
  c.data.partition = "iid"
  c.data.num_clients = 1000
  c.data.samples_per_client = 50
  c.model.name = "cnn_pfl_cifar10"
  c.client.local_steps = 5
  c.client.batch_size = 10
  c.client.lr = 0.1
  c.client.clip_mode = "update_l2"
  c.client.clip = 1.0
  c.server.selection = "uniform"
  c.server.clients_per_round = 50
  c.privacy.placement = "central"
  c.privacy.formula = "noise_multiplier"
  c.privacy.noise_multiplier = 0.01
  c.privacy.epsilon = 8.0
  c.privacy.delta = 1e-5
  c.eval.every = 1500
  return c
