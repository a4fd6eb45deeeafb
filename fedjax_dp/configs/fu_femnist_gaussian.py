"""Fu et al. (Gaussian DP-FedAvg, Alg. 1 / Theorem 2) with their FEMNIST CNN.

MNIST stands in for FEMNIST (``writer_like``: log-normal client sizes, each client
dominated by a few classes), Fu et al.'s CNN (``cnn_fu_femnist``), round robin
reshuffled every pass, E = 5 full-batch local steps whose mean gradient is clipped to
L2 norm zeta = 3 at every step (``step_grad_l2``, the spec's L2 option, A2), and
Gaussian noise on each upload with std ``sigma eta E zeta``, sigma from Theorem 2 with
the spec's c_2 (A6: the zCDP calibration of T_l Gaussian releases,
``privacy.formula = 'fu_thm2'``).

``epsilon_claimed`` is that calibration inverted with the paper's sensitivity
``eta E zeta``; ``epsilon_certified`` is the RDP accountant's, client-level
replace-one with the corrected sensitivity ``2 eta E zeta`` (spec A7).

  fedjax-dp run fu_femnist_gaussian --out runs/fu_femnist_gaussian
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "fu_femnist_gaussian"
  c.seed = 0
  c.rounds = 50                     # T_g; T = E T_g = 250 iterations (Fig. 2)
  c.data.name = "mnist"
  c.data.dir = "../shared/datasets/mnist"
  c.data.partition = "writer_like"
  c.data.num_clients = 100          # N
  c.data.samples_per_client = 60
  c.model.name = "cnn_fu_femnist"
  c.client.local_steps = 5          # E
  c.client.batch_size = 0           # full batch (Alg. 1, q = 1)
  c.client.lr = 0.1                 # constant eta (spec A5)
  c.client.clip_mode = "step_grad_l2"
  c.client.clip = 3.0               # zeta (Sec. VI-B, CNN)
  c.server.selection = "round_robin"
  c.server.clients_per_round = 10   # b; T_l = 5 turns per client
  c.privacy.mechanism = "gaussian"
  c.privacy.placement = "upload"
  c.privacy.formula = "fu_thm2"
  c.privacy.epsilon = 20.0
  c.privacy.delta = 1e-4            # the paper's delta
  return c
