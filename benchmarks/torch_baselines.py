"""PyTorch baselines: a Python loop over clients, as the papers' code bases do it.

Each selected client copies the global model, trains locally and uploads; the
server averages. Per-example clipping uses ``torch.func`` (``vmap(grad)``, the
Opacus-style materialised per-sample gradients); update clipping and noise are
plain tensor ops. ``pip install torch==2.13.0`` (benchmark-only extra). Every
round takes ``device`` (``'cpu'`` by default, ``'cuda'`` for the GPU suite): data,
model and random generator live there, and the round waits for the device before
it stops its clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def _torch():
  import torch
  torch.set_num_threads(max(1, torch.get_num_threads()))
  return torch


def mlp(hidden: tuple[int, ...], in_features: int, classes: int):
  torch = _torch()
  layers, width = [], in_features
  for h in hidden:
    layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
    width = h
  layers.append(torch.nn.Linear(width, classes))
  return torch.nn.Sequential(torch.nn.Flatten(), *layers)


def cnn_pfl_cifar10(classes: int = 10):
  """pfl-research's simple_cnn (no dropout), NCHW."""
  torch = _torch()
  nn = torch.nn
  return nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                       nn.MaxPool2d(2), nn.Flatten(), nn.Linear(14 * 14 * 64, 128), nn.ReLU(),
                       nn.Linear(128, classes))


def _sync(torch, device: str) -> None:
  if str(device).startswith("cuda"):
    torch.cuda.synchronize()


def _on(torch, xs, ys, device: str):
  """The clients' tensors on ``device``."""
  xs_t = [torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in xs]
  ys_t = [torch.from_numpy(np.asarray(y, np.int64)).to(device) for y in ys]
  return xs_t, ys_t


def _per_sample_setup(model, xs, ys, seed: int, device: str = "cpu"):
  """What the ``torch.func`` baselines share: the clients' tensors, the model's
  parameters, a seeded generator and ``per_sample(params, x, y)``, the per-example
  gradients by ``vmap(grad)`` (materialised, as Opacus-style code does)."""
  torch = _torch()
  from torch.func import functional_call, grad, vmap

  model.to(device)
  xs_t, ys_t = _on(torch, xs, ys, device)
  params = {k: v.detach() for k, v in model.named_parameters()}
  gen = torch.Generator(device=device).manual_seed(seed)

  def loss_one(p, x, y):
    logits = functional_call(model, p, (x[None],))
    return torch.nn.functional.cross_entropy(logits, y[None])

  return torch, xs_t, ys_t, params, gen, vmap(grad(loss_one), in_dims=(None, 0, 0))


def per_example_clipped_round(model, xs, ys, lr: float, clip: float, noise: float,
                              seed: int = 0, device: str = "cpu") -> Callable[[], float]:
  """Wei et al. UDP round: per client one full-batch step on per-example clipped
  gradients (``torch.func``), Gaussian noise on the upload, weighted average.

  Args:
    model: a ``torch.nn.Module``.
    xs: ``[K, n, ...]`` float32 numpy client data; ys: ``[K, n]`` labels.

  Returns:
    ``round() -> seconds`` running one round over all K clients.
  """
  torch, xs_t, ys_t, params, gen, per_sample = _per_sample_setup(model, xs, ys, seed, device)

  def one_round() -> float:
    start = time.perf_counter()
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    k = len(xs_t)
    with torch.no_grad():
      for x, y in zip(xs_t, ys_t):
        g = per_sample(params, x, y)
        norms = torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in g.values()))
        factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
        for name, p in params.items():
          step = torch.einsum("n,n...->...", factor, g[name]) / x.shape[0]
          upload = p - lr * step + noise * torch.randn(p.shape, generator=gen, device=device)
          total[name] += upload / k
    _sync(torch, device)
    return time.perf_counter() - start

  return one_round


def update_clipped_round(model, xs, ys, lr: float, clip: float, central_noise: float,
                         local_steps: int = 1, batch_size: int = 0,
                         seed: int = 0, device: str = "cpu") -> Callable[[], float]:
  """DP-FedAvg round: each client runs ``local_steps`` SGD steps (minibatches of
  ``batch_size``, 0 = full batch) from the global model, its update is clipped to
  ``clip``; the server averages and adds Gaussian noise.
  """
  torch = _torch()
  model.to(device)
  xs_t, ys_t = _on(torch, xs, ys, device)
  global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
  gen = torch.Generator(device=device).manual_seed(seed)
  loss_fn = torch.nn.CrossEntropyLoss()

  def one_round() -> float:
    start = time.perf_counter()
    total = {k: torch.zeros_like(v) for k, v in global_state.items()}
    k = len(xs_t)
    for x, y in zip(xs_t, ys_t):
      model.load_state_dict(global_state)
      opt = torch.optim.SGD(model.parameters(), lr=lr)
      n = x.shape[0]
      for s in range(local_steps):
        if batch_size:
          sel = torch.randperm(n, generator=gen, device=device)[:batch_size]
          xb, yb = x[sel], y[sel]
        else:
          xb, yb = x, y
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
      with torch.no_grad():
        delta = {name: v - global_state[name] for name, v in model.state_dict().items()}
        norm = torch.sqrt(sum(d.pow(2).sum() for d in delta.values()))
        factor = torch.clamp(clip / (norm + 1e-12), max=1.0)
        for name, d in delta.items():
          total[name] += factor * d / k
    with torch.no_grad():
      for name, v in total.items():
        v += central_noise * torch.randn(v.shape, generator=gen, device=device)
    _sync(torch, device)
    return time.perf_counter() - start

  return one_round


def cnn_adpfl_mnist(classes: int = 10):
  """The A-DPFL CNN as reconstructed (TF "Deep MNIST": SAME convs, SAME pools), NCHW."""
  torch = _torch()
  nn = torch.nn
  return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
                       nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
                       nn.Flatten(), nn.Linear(7 * 7 * 64, 1024), nn.ReLU(),
                       nn.Linear(1024, classes))


def cnn_fu_femnist(classes: int = 62):
  """Fu et al.'s FEMNIST CNN, NCHW."""
  torch = _torch()
  nn = torch.nn
  return nn.Sequential(nn.Conv2d(1, 32, 7, padding=3), nn.ReLU(), nn.MaxPool2d(2),
                       nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                       nn.Flatten(), nn.Linear(7 * 7 * 64, classes))


def dp_sgd_round(model, xs, ys, lr: float, clip: float, local_steps: int, batch_size: int = 0,
                 step_noise: float = 0.0, upload_noise: float = 0.0,
                 seed: int = 0, device: str = "cpu") -> Callable[[], float]:
  """Per client ``local_steps`` steps of per-example clipped SGD (``torch.func``
  ``vmap(grad)``) on minibatches of ``batch_size`` (0 = full batch), Gaussian noise
  of std ``step_noise`` on each step's clipped sum (A-DPFL, DP-SGD) and of std
  ``upload_noise`` on the uploaded model (Wei, Fu); the server averages.
  """
  torch, xs_t, ys_t, global_params, gen, per_sample = _per_sample_setup(model, xs, ys, seed,
                                                                          device)

  def one_round() -> float:
    start = time.perf_counter()
    total = {k: torch.zeros_like(v) for k, v in global_params.items()}
    k = len(xs_t)
    with torch.no_grad():
      for x, y in zip(xs_t, ys_t):
        params = dict(global_params)
        n = x.shape[0]
        for _ in range(local_steps):
          if batch_size:
            sel = torch.randperm(n, generator=gen, device=device)[:batch_size]
            xb, yb = x[sel], y[sel]
          else:
            xb, yb = x, y
          g = per_sample(params, xb, yb)
          norms = torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in g.values()))
          factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
          new = {}
          for name, p in params.items():
            gsum = torch.einsum("n,n...->...", factor, g[name])
            if step_noise:
              gsum = gsum + step_noise * torch.randn(p.shape, generator=gen, device=device)
            new[name] = p - lr * gsum / xb.shape[0]
          params = new
        for name, p in params.items():
          if upload_noise:
            p = p + upload_noise * torch.randn(p.shape, generator=gen, device=device)
          total[name] += p / k
    _sync(torch, device)
    return time.perf_counter() - start

  return one_round
