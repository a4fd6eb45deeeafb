"""From a config to a finished run: build the pieces, run the thin round loop, save.

``run(config, out_dir)`` is what ``fedjax-dp run`` calls; notebooks call it too and
get a :class:`RunResult` back (metrics rows load into ``pandas.DataFrame(rows)``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import client as client_lib
from fedjax_dp import config as config_lib
from fedjax_dp import engine
from fedjax_dp.data import build_federated_data, load_dataset, partition
from fedjax_dp.models import get_model
from fedjax_dp.privacy.plan import PrivacyPlan, make_privacy_plan
from fedjax_dp.results import RunDir
from fedjax_dp.schedules import NoiseContext, get_schedule

METRIC_COLUMNS = (
    "round", "test_loss", "test_accuracy", "train_loss", "grad_norm", "update_norm",
    "num_selected", "noise_mean", "horizon", "epsilon_claimed", "epsilon_certified",
    "wall_s")


@dataclasses.dataclass
class Setup:
  """Everything a run needs, built from a config (host and device objects)."""

  config: Any
  model: Any
  data: Any                 # FederatedData on the device
  x_test: jax.Array
  y_test: jax.Array
  round_cfg: engine.RoundConfig
  privacy: PrivacyPlan
  num_clients: int
  k_slots: int


@dataclasses.dataclass
class RunResult:
  rows: list[dict[str, Any]]
  summary: dict[str, Any]
  params: Any


def _partition(cfg, labels):
  d = cfg.data
  kwargs: dict[str, Any] = {}
  if d.partition == "iid":
    kwargs = dict(samples_per_client=d.samples_per_client)
  elif d.partition == "k_classes":
    kwargs = dict(k=d.classes_per_client, samples_per_client=d.samples_per_client)
  elif d.partition == "dirichlet":
    kwargs = dict(alpha=d.alpha, samples_per_client=d.samples_per_client or None)
  elif d.partition == "unbalanced":
    sizes = list(d.group_sizes)
    if d.num_clients % len(sizes):
      raise config_lib.ConfigError(
          f"data.num_clients ({d.num_clients}) must be a multiple of the number of "
          f"data.group_sizes ({len(sizes)})")
    per = d.num_clients // len(sizes)
    return partition(labels, "unbalanced", d.num_clients, cfg.seed,
                     sizes=[s for s in sizes for _ in range(per)])
  elif d.partition == "label_skew":
    kwargs = dict(s=d.skew, samples_per_client=d.samples_per_client)
  return partition(labels, d.partition, d.num_clients, cfg.seed, **kwargs)


def build(cfg) -> Setup:
  """Validates ``cfg`` and builds data, model and privacy plan (before any training)."""
  config_lib.validate(cfg)
  ds = load_dataset(cfg.data.name, cfg.data.dir)
  clients = _partition(cfg, np.asarray(ds.y_train))
  model = get_model(cfg.model.name, ds.x_train.shape[1:], ds.num_classes)
  data = build_federated_data(ds.x_train, ds.y_train, clients)
  ccfg = client_lib.ClientConfig(
      local_steps=cfg.client.local_steps, batch_size=cfg.client.batch_size,
      clip_mode=cfg.client.clip_mode, noise_placement=cfg.privacy.placement,
      mechanism=cfg.privacy.mechanism, l2_reg=cfg.client.l2_reg,
      chunk_size=cfg.client.chunk_size)
  round_cfg = engine.RoundConfig(ccfg, cfg.server.aggregation)
  u = len(clients)
  k_slots = engine.cohort_size(cfg.server.selection, u, cfg.server.clients_per_round,
                               cfg.server.q)
  counts = np.asarray([len(c) for c in clients])
  privacy = make_privacy_plan(cfg, counts)
  return Setup(cfg, model, data, jnp.asarray(ds.x_test), jnp.asarray(ds.y_test), round_cfg,
               privacy, u, k_slots)


def _lr_steps(cfg, scale: float) -> np.ndarray:
  steps = np.arange(cfg.client.local_steps)
  return (cfg.client.lr * scale * cfg.client.lr_decay ** steps).astype(np.float32)


def run(cfg, out_dir: str | None = None, setup: Setup | None = None) -> RunResult:
  """Runs one experiment and (if ``out_dir``) writes its run directory.

  The loop is thin: per round, the schedule plans noise on the host, one jitted call
  trains the cohort, one jitted call evaluates, and the accountant composes the
  round's event. Stops at the schedule's horizon, on a non-finite loss (marked
  ``diverged`` in the summary), or -- with ``privacy.enforce_budget`` -- before a
  round whose release would push the certified epsilon past the target.
  """
  from tqdm.auto import tqdm

  setup = setup or build(cfg)
  run_dir = RunDir(out_dir) if out_dir else None
  if run_dir:
    run_dir.write_config(cfg.to_dict())
  privacy = setup.privacy
  schedule = get_schedule(cfg.schedule.name)
  ctx = NoiseContext(privacy.epsilon, privacy.delta, privacy.q, privacy.sensitivity,
                     int(cfg.rounds), privacy.noise_scale, float(cfg.client.lr),
                     params=dict(cfg.schedule))
  state = schedule.init(ctx)
  acct = privacy.accountant_init()
  round_fn = engine.make_round_fn(setup.model, setup.round_cfg)
  eval_fn = engine.make_eval_fn(setup.model, cfg.eval.batch_size)
  params = setup.model.init(jax.random.PRNGKey(cfg.seed))

  rows: list[dict[str, Any]] = []
  status, diverged_round = "completed", None
  start = time.time()
  max_rounds = int(cfg.rounds) * 4 + 10  # schedules may only shorten T; guard anyway
  bar = tqdm(total=int(cfg.rounds), disable=not cfg.progress, desc=cfg.name, unit="round")
  test_loss = test_acc = float("nan")
  t = 0
  while t < max_rounds:
    plan = schedule.plan(state, t)
    if plan.stop:
      break
    if bar.total != plan.horizon:
      bar.total = plan.horizon
      bar.refresh()
    client_noise, central_noise = privacy.device_noise(plan.noise, plan.central_noise)
    new_acct = privacy.accountant_step(acct, client_noise, central_noise)
    certified = privacy.certified_epsilon(new_acct)
    if cfg.privacy.enforce_budget and certified > privacy.target_epsilon * (1 + 1e-9):
      status = "budget_exhausted"
      break
    idx, sel = engine.select_clients(cfg.server.selection, setup.num_clients,
                                     cfg.server.clients_per_round, cfg.server.q, cfg.seed, t)
    args = engine.RoundArgs(
        idx=jnp.asarray(idx), sel_mask=jnp.asarray(sel),
        lr=jnp.asarray(_lr_steps(cfg, plan.lr_scale)),
        clip=jnp.float32(cfg.client.clip),
        noise=jnp.asarray(client_noise[idx], jnp.float32),
        central_noise=jnp.float32(central_noise),
        server_lr=jnp.float32(cfg.server.lr),
        round=jnp.int32(t), seed=jnp.uint32(cfg.seed))
    params, m = round_fn(params, setup.data, args)
    acct = new_acct
    evaluated = (t + 1) % cfg.eval.every == 0 or t + 1 >= plan.horizon
    if evaluated:
      test_loss, test_acc = (float(v) for v in eval_fn(params, setup.x_test, setup.y_test))
    m = jax.device_get(m)
    row = dict(
        round=t + 1, test_loss=test_loss if evaluated else "",
        test_accuracy=test_acc if evaluated else "",
        train_loss=float(m.train_loss), grad_norm=float(m.grad_norm),
        update_norm=float(m.update_norm), num_selected=int(m.num_selected),
        noise_mean=float(np.mean(plan.noise[idx][sel > 0])) if sel.any() else 0.0,
        horizon=plan.horizon, epsilon_claimed=privacy.claimed_epsilon(acct),
        epsilon_certified=certified, wall_s=round(time.time() - start, 3))
    rows.append(row)
    bar.update(1)
    bar.set_postfix(acc=f"{test_acc:.3f}", eps=f"{certified:.2f}")
    if not (math.isfinite(row["train_loss"]) and (not evaluated or math.isfinite(test_loss))):
      status, diverged_round = "diverged", t + 1
      bar.write(f"[{cfg.name}] loss became non-finite at round {t + 1}: stopping (diverged)")
      break
    state = schedule.observe(state, t, {k: v for k, v in row.items()
                                        if isinstance(v, (int, float))})
    t += 1
    if run_dir and (t % 25 == 0):
      run_dir.write_metrics(rows, METRIC_COLUMNS)  # partial progress, still atomic
  bar.close()
  wall = time.time() - start
  last_eval = next((r for r in reversed(rows) if r["test_loss"] != ""), None)
  summary = dict(
      name=cfg.name, status=status, diverged=status == "diverged",
      diverged_round=diverged_round, rounds_run=len(rows),
      final_test_loss=last_eval["test_loss"] if last_eval else None,
      final_test_accuracy=last_eval["test_accuracy"] if last_eval else None,
      epsilon_target=privacy.target_epsilon, delta=privacy.delta,
      epsilon_claimed=rows[-1]["epsilon_claimed"] if rows else 0.0,
      epsilon_certified=rows[-1]["epsilon_certified"] if rows else 0.0,
      privacy=privacy.describe(), wall_seconds=round(wall, 3),
      seconds_per_round=round(wall / max(len(rows), 1), 5),
      device=str(jax.devices()[0].platform), num_params=setup.model.num_params())
  if run_dir:
    run_dir.write_metrics(rows, METRIC_COLUMNS)
    run_dir.write_plot(rows, title=f"{cfg.name}: {cfg.model.name} on {cfg.data.name}, "
                       f"eps={privacy.target_epsilon:g}")
    run_dir.write_summary(summary)
  return RunResult(rows, summary, params)
