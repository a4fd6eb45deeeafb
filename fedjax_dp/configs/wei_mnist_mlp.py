"""Wei et al. (TMC 2021) MNIST setting for UDP (Alg. 1).

U = K = 50 clients (q = 1), 800 IID MNIST samples each, MLP 784-256-10 (ReLU),
per-example L2 gradient clipping, ONE full-batch GD step per round, Gaussian noise
on every uploaded model with sigma_i from eq. (10) and Delta_l = 2 eta C / |D_i|,
T = 200, delta = 1e-3. eta and C are not given by the paper; eta = 0.5 and C = 1
are our choice (the authors' code uses eta = 0.02, C = 1.8 with minibatches, which
the paper's one-step sensitivity does not cover; see specs/wei_udp_crd.md App. A).

  fedjax-dp run wei_mnist_mlp --out runs/wei \
      --set data.dir=../shared/datasets/mnist --set privacy.epsilon=inf
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "wei_mnist_mlp"
  c.rounds = 200
  c.data.name = "mnist"
  c.data.partition = "iid"
  c.data.num_clients = 50
  c.data.samples_per_client = 800
  c.model.name = "mlp_784_256_10"
  c.client.local_steps = 1
  c.client.batch_size = 0
  c.client.lr = 0.5
  c.client.clip_mode = "per_example_l2"
  c.client.clip = 1.0
  c.server.selection = "uniform"
  c.server.clients_per_round = 50
  c.privacy.epsilon = 8.0
  c.privacy.delta = 1e-3
  c.privacy.placement = "upload"
  c.privacy.formula = "wei_eq10"
  c.eval.every = 1
  return c
