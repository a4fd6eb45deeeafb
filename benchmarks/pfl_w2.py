"""W2 in pfl-research and in the PyTorch loop, without JAX (for pfl's own environment).

  python -m venv /tmp/pflvenv && /tmp/pflvenv/bin/pip install torch==2.13.0
  /tmp/pflvenv/bin/pip install 'pfl==0.6.0'
  /tmp/pflvenv/bin/python benchmarks/pfl_w2.py pfl [--quick]     # one JSON line
  /tmp/pflvenv/bin/python benchmarks/pfl_w2.py torch [--quick]

pfl runs in its own virtual environment, where JAX is not installed: torch's CPU
wheel first, then pfl without its ``pytorch`` extra (which would pull a CUDA build of
torch on Linux); torch runs at its default two threads on this machine.
``run_all.py --pfl-python /tmp/pflvenv/bin/python`` runs this script for the
``W2/pfl`` row (and for ``W2/torch`` when the main environment has
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

``--stream --rounds R`` (``benchmarks/startup.py``) runs R central iterations and
prints ``round k`` after each, so that the caller times the process from its start;
``--cifar-dir DIR`` reads W2's images from CIFAR-10 python batches there (as the
``fedjax-dp run`` of ``benchmarks/w2_config.py`` does), 1000 clients x 50 of them
drawn IID. ``quickstart --npz FILE --stream`` is the quickstart's setting in pfl: the
10 clients x 140 digits of FILE (written by ``startup.py`` with fedjax_dp's own split),
the MLP 64-256-10, one full-batch local step of lr 0.5, each client's update clipped
to norm 1 with Gaussian noise on it (pfl's ``GaussianMechanism`` as a local mechanism;
fedjax_dp's quickstart clips per example), and the test set scored every iteration.
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
# (clients, examples per client, cohort): W2's and DP-FedAvg's (W7: W1's 50 x 800 MNIST
# shapes), and the tiny ones of ``--shapes tiny`` (benchmarks/gpu_suite.py --quick).
SHAPES = {"full": {"pfl": (CLIENTS, PER_CLIENT, COHORT), "dpfedavg": (50, 800, 50)},
          "tiny": {"pfl": (8, 10, 2), "dpfedavg": (4, 16, 2)}}


def synthetic_nchw(clients: int, per_client: int):
  """W2's random data as ``workloads._synthetic`` draws it, per client, NCHW."""
  rng = np.random.default_rng(0)
  n = clients * per_client
  x = rng.normal(size=(n, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  return (x.reshape(clients, per_client, 32, 32, 3).transpose(0, 1, 4, 2, 3),
          y.reshape(clients, per_client))


class _Net:
  """A network with the ``loss`` and ``metrics`` methods pfl's PyTorchModel calls."""

  @staticmethod
  def build(make):
    import torch
    from pfl.metrics import Weighted

    class Net(torch.nn.Module):
      def __init__(self):
        super().__init__()
        self.net = make()

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


def cifar_clients(cifar_dir: str, clients: int, per_client: int, seed: int = 0):
  """W2's clients from CIFAR-10 python batches: ``clients x per_client`` training
  images drawn IID (a seeded permutation), NCHW float32 in [0, 1]."""
  import pickle
  xs, ys = [], []
  for i in range(1, 6):
    with open(Path(cifar_dir) / f"data_batch_{i}", "rb") as f:
      batch = pickle.load(f, encoding="bytes")
    get = lambda key, b=batch: b[key.encode()] if key.encode() in b else b[key]
    xs.append(np.asarray(get("data"), np.uint8))
    ys.append(np.asarray(get("labels"), np.int64))
  x, y = np.concatenate(xs), np.concatenate(ys)
  order = np.random.default_rng(seed).permutation(len(y))[:clients * per_client]
  x = x[order].reshape(clients, per_client, 3, 32, 32).astype(np.float32) / 255.0
  return x, y[order].reshape(clients, per_client)


def _stream_callback(stream: bool, stamps: list):
  """A pfl callback that stamps each central iteration (and prints ``round k``)."""
  from pfl.callback.base import TrainingProcessCallback

  class Stamp(TrainingProcessCallback):
    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      stamps.append(time.perf_counter())
      if stream:
        print(f"round {central_iteration + 1}", flush=True)
      return False, type(aggregate_metrics)()

  return Stamp()


def _run_pfl(xs, ys, net, *, rounds: int, cohort: int, lr: float, batch: int | None,
             mechanism, callbacks) -> None:
  """pfl's ``FederatedAveraging`` over the clients ``xs [U, n, ...]``, ``ys [U, n]``;
  ``callbacks()`` is called once the model exists (pfl then knows its framework)."""
  import torch
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.aggregate.weighting import WeightByUser
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
  from pfl.model.pytorch import PyTorchModel

  users = range(len(xs))
  data = {u: [torch.from_numpy(np.ascontiguousarray(xs[u])),
              torch.from_numpy(ys[u].astype(np.int64))] for u in users}
  dataset = FederatedDataset.from_slices(data, get_user_sampler("random", list(users)))
  model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(net.parameters(), 1.0))
  backend = SimulatedBackend(training_data=dataset, val_data=None,
                             postprocessors=[WeightByUser(), mechanism])
  FederatedAveraging().run(
      algorithm_params=NNAlgorithmParams(central_num_iterations=rounds,
                                         evaluation_frequency=10 ** 9,
                                         train_cohort_size=cohort, val_cohort_size=0),
      backend=backend, model=model,
      model_train_params=NNTrainHyperParams(local_learning_rate=lr, local_num_epochs=1,
                                            local_batch_size=batch),
      model_eval_params=NNEvalHyperParams(local_batch_size=batch), callbacks=callbacks())


def pfl_round_seconds(rounds: int, clients: int, cifar_dir: str | None = None,
                      stream: bool = False, per_client: int = PER_CLIENT,
                      cohort: int = COHORT) -> float:
  """Median seconds per central iteration of pfl's FedAvg with central DP on W2."""
  import torch
  from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

  torch.manual_seed(0)
  xs, ys = (cifar_clients(cifar_dir, clients, per_client) if cifar_dir
            else synthetic_nchw(clients, per_client))
  stamps: list = []
  _run_pfl(xs, ys, _Net.build(tb.cnn_pfl_cifar10), rounds=rounds + 1, cohort=cohort, lr=LR,
           batch=BATCH,
           mechanism=CentrallyAppliedPrivacyMechanism(GaussianMechanism(CLIP, CENTRAL / CLIP)),
           callbacks=lambda: [_stream_callback(stream, stamps)])
  return float(np.median(np.diff(stamps)))


def dpfedavg_pfl(rounds: int, clients: int, per_client: int, cohort: int) -> float:
  """DP-FedAvg in W7's shapes (MLP 784-256-10, one full-batch local step of lr 0.5,
  updates clipped to 1, Gaussian noise of std 0.01 on the sum): seconds per iteration."""
  import torch
  from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  xs = rng.normal(size=(clients, per_client, 1, 28, 28)).astype(np.float32)
  ys = rng.integers(0, 10, (clients, per_client))
  stamps: list = []
  _run_pfl(xs, ys, _Net.build(lambda: tb.mlp((256,), 784, 10)), rounds=rounds + 1,
           cohort=cohort, lr=0.5, batch=None,
           mechanism=CentrallyAppliedPrivacyMechanism(GaussianMechanism(CLIP, CENTRAL / CLIP)),
           callbacks=lambda: [_stream_callback(False, stamps)])
  return float(np.median(np.diff(stamps)))


def quickstart_pfl(npz: str, rounds: int, stream: bool = False) -> float:
  """The quickstart's setting in pfl (see the module docstring): seconds per iteration."""
  import torch
  from pfl.callback.central_evaluation import CentralEvaluationCallback
  from pfl.data.dataset import Dataset
  from pfl.hyperparam import NNEvalHyperParams
  from pfl.privacy import GaussianMechanism

  torch.manual_seed(0)
  d = np.load(npz)
  xs, ys = d["x"], d["y"]  # [10, 140, 64], [10, 140]
  test = Dataset(raw_data=[torch.from_numpy(d["x_test"]),
                           torch.from_numpy(d["y_test"].astype(np.int64))])
  stamps: list = []
  _run_pfl(xs, ys, _Net.build(lambda: tb.mlp((256,), xs.shape[-1], 10)), rounds=rounds,
           cohort=len(xs), lr=0.5, batch=None, mechanism=GaussianMechanism(1.0, 1.0),
           callbacks=lambda: [CentralEvaluationCallback(test, NNEvalHyperParams(
               local_batch_size=None)), _stream_callback(stream, stamps)])
  return float(np.median(np.diff(stamps))) if len(stamps) > 1 else float("nan")


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
  parser.add_argument("method", choices=["pfl", "torch", "quickstart", "dpfedavg"])
  parser.add_argument("--shapes", choices=sorted(SHAPES), default="full",
                      help="pfl / dpfedavg: W2's and W7's shapes, or tiny ones")
  parser.add_argument("--quick", action="store_true", help="fewer rounds")
  parser.add_argument("--rounds", type=int, default=0, help="central iterations (pfl)")
  parser.add_argument("--stream", action="store_true", help="print 'round k' after each")
  parser.add_argument("--cifar-dir", default=None, help="W2's images from CIFAR-10 batches")
  parser.add_argument("--npz", default=None, help="quickstart: the clients' digits")
  args = parser.parse_args(argv)
  import torch
  workload = "W2 pfl CIFAR-10 (50 of 1000 x 50, CNN, 5 steps x 10, central DP)"
  if args.method in ("pfl", "dpfedavg"):
    import pfl
    rounds = args.rounds or (2 if args.quick else 4)
    clients, per_client, cohort = SHAPES[args.shapes][args.method]
    if args.method == "pfl":
      sec = pfl_round_seconds(rounds, clients, args.cifar_dir, args.stream, per_client, cohort)
    else:
      sec = dpfedavg_pfl(rounds, clients, per_client, cohort)
      workload = "W7 DP-FedAvg (K=50 x 800, MLP, update clip, central DP)"
    version = f"pfl {pfl.__version__}, torch {torch.__version__}"
  elif args.method == "quickstart":
    import pfl
    sec = quickstart_pfl(args.npz, args.rounds or 3, args.stream)
    workload = "quickstart (10 x 140 digits, MLP, one full-batch step, local DP)"
    version = f"pfl {pfl.__version__}, torch {torch.__version__}"
  else:
    sec = torch_round_seconds(1 if args.quick else 3, CLIENTS)
    version = f"torch {torch.__version__}"
  print(json.dumps({
      "workload": workload,
      "method": args.method, "seconds_per_round": sec, "client_updates_per_s": COHORT / sec,
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
      "versions": version, "torch_threads": torch.get_num_threads(),
      "device": "cuda" if torch.cuda.is_available() else "cpu"}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
