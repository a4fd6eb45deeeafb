"""W2 in pfl-research and in the PyTorch loop, without JAX (for pfl's own environment).

  python -m venv /tmp/pflvenv && /tmp/pflvenv/bin/pip install 'pfl[pytorch]==0.6.0'
  /tmp/pflvenv/bin/python benchmarks/pfl_w2.py pfl [--quick]     # one JSON line
  /tmp/pflvenv/bin/python benchmarks/pfl_w2.py torch [--quick]

pfl pins its own torch, so its rows run in its own virtual environment, where JAX
is not installed; ``run_all.py --pfl-python /tmp/pflvenv/bin/python`` runs this
script for the ``W2/pfl`` row (and for ``W2/torch`` when the main environment has
no torch). The data are W2's (``workloads.w2``): 1000 clients x 50 random
CIFAR-shaped images (the same numpy draws as ``workloads._synthetic``), 50
clients per round, one local epoch of batch 10 (5 steps), lr 0.1, pfl's
``simple_cnn`` without dropout (``torch_baselines.cnn_pfl_cifar10``), each
client's update clipped to norm 1 and Gaussian noise of std 0.01 on the sum.

``pfl``: pfl's ``FederatedAveraging`` on a ``SimulatedBackend`` with
``CentrallyAppliedPrivacyMechanism(GaussianMechanism(1.0, 0.01))`` and
``WeightByUser``, as pfl-research's ``benchmarks/image_classification/pytorch/
train.py`` sets it up, without its central evaluation (the other rows do not
evaluate either); seconds per round = median time between central iterations after
the first. ``torch``: ``torch_baselines.update_clipped_round``, as ``workloads.py
W2/torch``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch_baselines as tb

CLIENTS, PER_CLIENT, COHORT, STEPS, BATCH, LR, CLIP, CENTRAL = 1000, 50, 50, 5, 10, 0.1, 1.0, 0.01


def synthetic_nchw(clients: int, per_client: int):
  """W2's random data as ``workloads._synthetic`` draws it, per client, NCHW."""
  rng = np.random.default_rng(0)
  n = clients * per_client
  x = rng.normal(size=(n, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  return (x.reshape(clients, per_client, 32, 32, 3).transpose(0, 1, 4, 2, 3),
          y.reshape(clients, per_client))


class _Net:
  """``simple_cnn`` with the ``loss`` and ``metrics`` methods pfl's PyTorchModel calls."""

  @staticmethod
  def build():
    import torch
    from pfl.metrics import Weighted

    class Net(torch.nn.Module):
      def __init__(self):
        super().__init__()
        self.net = tb.cnn_pfl_cifar10()

      def forward(self, x):
        return self.net(x)

      def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return torch.nn.functional.cross_entropy(self(x), y)

      def metrics(self, x, y, eval=False):
        self.eval() if eval else self.train()
        loss = torch.nn.functional.cross_entropy(self(x), y, reduction="sum").item()
        return {"loss": Weighted(loss, len(x))}

    return Net()


def pfl_round_seconds(rounds: int, clients: int) -> float:
  """Median seconds per central iteration of pfl's FedAvg with central DP on W2."""
  import torch
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.aggregate.weighting import WeightByUser
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.callback.base import TrainingProcessCallback
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
  from pfl.model.pytorch import PyTorchModel
  from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

  torch.manual_seed(0)
  xs, ys = synthetic_nchw(clients, PER_CLIENT)
  data = {u: [torch.from_numpy(np.ascontiguousarray(xs[u])), torch.from_numpy(ys[u].astype(np.int64))]
          for u in range(clients)}
  dataset = FederatedDataset.from_slices(data, get_user_sampler("random", list(range(clients))))
  net = _Net.build()
  model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(net.parameters(), 1.0))
  backend = SimulatedBackend(
      training_data=dataset, val_data=None,
      postprocessors=[WeightByUser(),
                      CentrallyAppliedPrivacyMechanism(GaussianMechanism(CLIP, CENTRAL / CLIP))])
  stamps = []

  class Stamp(TrainingProcessCallback):
    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      stamps.append(time.perf_counter())
      return False, type(aggregate_metrics)()

  FederatedAveraging().run(
      algorithm_params=NNAlgorithmParams(central_num_iterations=rounds + 1,
                                         evaluation_frequency=10 ** 9,
                                         train_cohort_size=COHORT, val_cohort_size=0),
      backend=backend, model=model,
      model_train_params=NNTrainHyperParams(local_learning_rate=LR, local_num_epochs=1,
                                            local_batch_size=BATCH),
      model_eval_params=NNEvalHyperParams(local_batch_size=BATCH), callbacks=[Stamp()])
  return float(np.median(np.diff(stamps)))


def torch_round_seconds(repeats: int, clients: int) -> float:
  xs, ys = synthetic_nchw(clients, PER_CLIENT)
  rng = np.random.default_rng(1)
  idx = rng.choice(clients, COHORT, replace=False)
  one = tb.update_clipped_round(tb.cnn_pfl_cifar10(), xs[idx], ys[idx], LR, CLIP, CENTRAL,
                                STEPS, BATCH)
  one()  # warm-up
  return float(np.median([one() for _ in range(repeats)]))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("method", choices=["pfl", "torch"])
  parser.add_argument("--quick", action="store_true", help="fewer rounds")
  args = parser.parse_args(argv)
  import torch
  if args.method == "pfl":
    import pfl
    sec = pfl_round_seconds(2 if args.quick else 4, CLIENTS)
    version = f"pfl {pfl.__version__}, torch {torch.__version__}"
  else:
    sec = torch_round_seconds(1 if args.quick else 3, CLIENTS)
    version = f"torch {torch.__version__}"
  print(json.dumps({
      "workload": "W2 pfl CIFAR-10 (50 of 1000 x 50, CNN, 5 steps x 10, central DP)",
      "method": args.method, "seconds_per_round": sec, "client_updates_per_s": COHORT / sec,
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
      "versions": version}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
