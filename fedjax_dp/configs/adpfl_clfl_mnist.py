"""CL-FL (Geyer, Klein & Nabi 2017, client-level DP-FL), the A-DPFL paper's baseline
as its spec reconstructs it (adpfl.md section 4 item 3), on A-DPFL's MNIST setting.

Same data, model and local training as ``adpfl_mnist_cnn.py`` but without privacy
inside the clients: N = 1000 label-skewed clients of 60 images, K = m_t = 100 drawn
uniformly without replacement per round, 3 local SGD steps of B = 20 (uniform without
replacement), eta = 0.05, 50 rounds. The server clips every update Delta_i to
S = median of the cohort's update norms (``server.clip_rule = 'median'``), adds
N(0, sigma^2 S^2) to the sum and divides by m_t = K (``normalized`` aggregation with
equal |D_i| is exactly 1/K; with uniform K-of-U selection the cohort size is fixed, so
central_sensitivity's bound 2 S max p_i = 2 S / K holds).

Noise: Geyer's sigma = 1 on the sum is ``privacy.noise_multiplier = 0.5`` here, because
our multiplier is measured against the replace-one sensitivity 2 S / K of the mean
(add/remove would be S / K), so the noise is the same N(0, S^2) on the sum.

Privacy: client-level, delta = 1e-5. With the median rule the clip bound is a function
of the data, so no sensitivity holds: ``epsilon_certified`` is inf (the plan says why)
and ``epsilon_claimed`` is the RDP moments accountant's value for a FIXED S (K-of-U
sampling without replacement, replace-one), the paper-style claim. Certified variants:
``--set server.clip_rule=fixed`` (S = client.clip) or ``private_median`` (Andrew et
al. 2021: S_t follows the median privately; the count noise, std K / 20 by default, is
taken out of the same budget).

  fedjax-dp run adpfl_clfl_mnist --out runs/clfl \
      --set data.dir=../shared/datasets/mnist
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "adpfl_clfl_mnist"
  c.rounds = 50
  c.data.name = "mnist"
  c.data.partition = "label_skew"
  c.data.skew_scheme = "adpfl_uniform"
  c.data.skew_remainder = "all"
  c.data.num_clients = 1000
  c.data.samples_per_client = 60
  c.model.name = "cnn_adpfl_mnist"
  c.client.local_steps = 3
  c.client.batch_size = 20
  c.client.minibatch = "shuffle"
  c.client.lr = 0.05
  c.client.clip_mode = "update_l2"
  c.client.clip = 4.0                  # S for clip_rule=fixed; S_0 for private_median
  c.server.selection = "uniform"       # m_t = K of N, without replacement
  c.server.clients_per_round = 100
  c.server.aggregation = "normalized"
  c.server.clip_rule = "median"        # Geyer et al. as printed (certified inf)
  c.privacy.placement = "central"
  c.privacy.mechanism = "gaussian"
  c.privacy.formula = "noise_multiplier"
  c.privacy.noise_multiplier = 0.5     # Geyer's sigma = 1 on the sum (see above)
  c.privacy.epsilon = 1e4              # no target: the noise is fixed by sigma
  c.privacy.delta = 1e-5
  c.schedule.name = "constant"
  c.eval.every = 1
  c.checkpoint.every = 10
  return c
