"""Yuan et al. (amplitude-varying perturbation), Algorithm 1 on MNIST.

U = 100 clients of 600 IID MNIST samples (q = K / U = 0.1, K = 10 drawn without
replacement every round), the MLP 784-32-10 with linear activation, tau = 5 full-batch
GD steps per round with the whole parameter vector projected onto the L2 ball of
radius C = 5 after every step (``param_l2``), and Gaussian noise on every uploaded
model with variance Theta(m) = theta^(m-1) sigma^2 (eq. (6)), sigma from eq. (8) with
the paper's Delta_s = 2 C / |D_k| (``privacy.formula = 'yuan_eq8'``; theta = 1 is
Remark 3), M = 30 rounds, epsilon = 10, delta = 1e-3. eta is not given by the paper:
0.1 is our choice.

metrics.csv's ``epsilon_claimed`` is the paper's claim (eq. (16) inverted on the
realised amplitudes, Delta_s = 2 C / |D_k|; it reaches epsilon at m = M) and
``epsilon_certified`` the RDP accountant's with the TRUE sensitivity of a param_l2
upload, 2 C (spec E7): the paper's noise certifies no useful epsilon.

Variants (``--set``): ``privacy.formula=yuan_eq8_corrected`` (spec E4),
``schedule.theta=0.95|1.05``, ``schedule.refine=1`` (Theorem 2, eq. (9)); the Laplace
baseline of spec section 6 ``schedule.name=constant privacy.mechanism=laplace
privacy.formula=yuan_laplace`` (b = M Delta_s / eps) or ``yuan_laplace_matched``
(2 b^2 = sigma^2 of Remark 3; certified with the L1 sensitivity 2 C sqrt(d)); no DP
``privacy.epsilon=inf``.

  fedjax-dp run yuan_mnist_mlp --out runs/yuan \
      --set data.dir=../shared/datasets/mnist --set schedule.theta=1.05
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "yuan_mnist_mlp"
  c.rounds = 30                       # M
  c.data.name = "mnist"
  c.data.partition = "iid"
  c.data.num_clients = 100            # U
  c.data.samples_per_client = 600
  c.model.name = "mlp_784_32_10_linear"
  c.client.local_steps = 5            # tau
  c.client.batch_size = 0             # full batch (Delta_s = 2 C / |D_k| assumes it)
  c.client.lr = 0.1
  c.client.clip_mode = "param_l2"
  c.client.clip = 5.0                 # C
  c.server.selection = "uniform"
  c.server.clients_per_round = 10     # K
  c.server.aggregation = "normalized"  # p_k = |D_k| / sum_{j in K} |D_j|
  c.privacy.epsilon = 10.0
  c.privacy.delta = 1e-3
  c.privacy.mechanism = "gaussian"
  c.privacy.placement = "upload"
  c.privacy.formula = "yuan_eq8"
  c.schedule.name = "geometric"
  c.schedule.theta = 1.0
  c.eval.every = 1
  return c
