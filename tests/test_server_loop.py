"""The server's round-to-round decisions (fedjax_dp.host.server) as pure functions:
no run directory, no device, only a privacy plan and metrics a test makes up."""

import math
import types

import numpy as np
import optax
import pytest

from fedjax_dp import config as config_lib
from fedjax_dp import optimizers
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.host import checkpoint, server
from fedjax_dp.training.client import ClientConfig
from fedjax_dp.training.rounds import RoundConfig

U, N = 6, 30
METRICS = {"train_loss": 1.0, "grad_norm": 0.5, "update_norm": 0.1, "num_selected": 3}


def _cfg(**sets):
  base = {"data.num_clients": U, "server.clients_per_round": 3, "rounds": 5,
          "privacy.epsilon": 4.0}
  base.update(sets)
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in base.items()])


def _spec(cfg, stream=(1, 2)):
  """A spec from the config and a made-up setup: U clients of N examples."""
  counts = np.full(U, N)
  setup = types.SimpleNamespace(
      privacy=plan_from_config(cfg, counts), num_clients=U, selection_weights=None,
      round_cfg=RoundConfig(), data=types.SimpleNamespace(counts=counts), data_fingerprint=None,
      model=types.SimpleNamespace(is_regression=False))
  return server.spec(cfg, setup, np.asarray(stream, np.uint32))


def _run(spec, state, rounds, metrics=METRICS, test=(0.9, 0.5)):
  rows = []
  for _ in range(rounds):
    state, args = server.plan_round(spec, state)
    if args is None:
      break
    state, row = server.record(spec, state, metrics, test, 0.0)
    rows.append(row)
  return state, rows


def test_plan_round_is_pure_and_deterministic():
  spec = _spec(_cfg())
  state = server.init(spec)
  a_state, a = server.plan_round(spec, state)
  _, b = server.plan_round(spec, state)
  assert state.planned is None and state.t == 0  # the input is untouched
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert a_state.planned is not None and a_state.t == 0
  assert float(a.server_lr) == 1.0 and a.lr.dtype == np.float32
  np.testing.assert_array_equal(a.stream, np.array([1, 2], np.uint32))
  after, row = server.record(spec, a_state, METRICS, (0.9, 0.5), 1.25)
  assert after.t == 1 and after.planned is None and after.test == (0.9, 0.5)
  assert row["round"] == 1 and row["wall_s"] == 1.25 and row["test_accuracy"] == 0.5
  assert row["epsilon_certified"] == a_state.planned.certified > 0


def test_runs_to_the_horizon_then_stops():
  spec = _spec(_cfg(rounds=4))
  state, rows = _run(spec, server.init(spec), 10)
  assert [r["round"] for r in rows] == [1, 2, 3, 4]
  assert state.t == 4 and not state.running and state.status == "completed"
  assert server.plan_round(spec, state) == (state, None)
  # The certified epsilon of the last round meets the target (calibrated formula).
  assert rows[-1]["epsilon_certified"] == pytest.approx(4.0, rel=1e-6)


def test_budget_stops_before_the_round_that_would_pass_it():
  spec = _spec(_cfg(**{"privacy.formula": "noise_multiplier",
                       "privacy.noise_multiplier": 2.0, "privacy.enforce_budget": True,
                       "rounds": 50, "privacy.epsilon": 2.0}))
  state, rows = _run(spec, server.init(spec), 60)
  assert state.status == "budget_exhausted" and not state.running
  assert 0 < len(rows) < 50 and rows[-1]["epsilon_certified"] <= 2.0
  assert spec.privacy.certified_epsilon(state.acct) == rows[-1]["epsilon_certified"]


def test_non_finite_loss_stops_as_diverged_at_that_round():
  spec = _spec(_cfg())
  state, _ = _run(spec, server.init(spec), 2)
  state, _ = server.plan_round(spec, state)
  state, row = server.record(spec, state, {**METRICS, "train_loss": math.nan}, (0.9, 0.5), 0.0)
  assert row["round"] == 3 and state.status == "diverged" and state.diverged_round == 3
  assert state.t == 2 and not state.running


def test_schedule_observes_the_rows():
  """CRD (Wei Alg. 2) reads the test loss: a loss that stops falling changes its
  state, a falling one does not trigger."""
  cfg = _cfg(**{"schedule.name": "crd", "schedule.zeta": 0.05, "rounds": 6})
  spec = _spec(cfg)
  flat, _ = _run(spec, server.init(spec), 3, test=(0.9, 0.5))
  falling = server.init(spec)
  for t in range(3):
    falling, _ = server.plan_round(spec, falling)
    falling, _ = server.record(spec, falling, METRICS, (1.0 - 0.2 * t, 0.5), 0.0)
  assert flat.schedule.triggers > 0 and falling.schedule.triggers == 0
  assert flat.schedule.last_loss == 0.9 and falling.schedule.last_loss == pytest.approx(0.6)


def test_private_median_moves_the_clip_bound_from_the_released_count():
  cfg = _cfg(**{"client.clip_mode": "update_l2", "privacy.placement": "central",
                "server.clip_rule": "private_median", "server.clip_count_std": 10.0,
                "server.clients_per_round": 3})
  spec = _spec(cfg)
  state, args = server.plan_round(spec, server.init(spec))
  assert float(args.clip) == 1.0 and float(args.count_noise) == 10.0
  metrics = {**METRICS, "clip_bound": 1.0, "clip_count": 3.0}
  state, row = server.record(spec, state, metrics, (0.9, 0.5), 0.0)
  want = math.exp(-0.2 * (3.0 / 3.0 - 0.5))
  assert state.clip_bound == pytest.approx(want) and row["clip_count"] == 3.0
  _, args = server.plan_round(spec, state)
  assert float(args.clip) == pytest.approx(want)


def test_restored_state_continues_as_the_uninterrupted_one():
  """A checkpoint's RunState and rows give back the state of the run that was never
  stopped (the private median's S_t recomputed from the last row)."""
  cfg = _cfg(**{"client.clip_mode": "update_l2", "privacy.placement": "central",
                "server.clip_rule": "private_median", "server.clip_count_std": 10.0,
                "rounds": 6})
  spec = _spec(cfg)
  metrics = {**METRICS, "clip_bound": 1.0, "clip_count": 1.0}
  state, rows = _run(spec, server.init(spec), 3, metrics)
  saved = checkpoint.RunState(state.t, state.horizon, state.status, state.running,
                              state.diverged_round, state.test, state.schedule, state.acct,
                              rows, 0.0)
  back = server.restored(spec, saved, rows)
  assert back == state
  _, rest_a = _run(spec, state, 10, metrics)
  _, rest_b = _run(spec, back, 10, metrics)
  assert rest_a == rest_b and [r["round"] for r in rest_a] == [4, 5, 6]


def test_learning_rates_of_an_optimizer_with_its_own_rate():
  """A transformation from Python carries its learning rate: the round's rates are
  the unit (times the local decay), the server's 1."""
  cfg = _cfg(**{"client.local_steps": 3, "client.lr_decay": 0.5})
  user = optimizers.from_transformation(optax.sgd(0.1))
  counts = np.full(U, N)
  setup = types.SimpleNamespace(
      privacy=plan_from_config(cfg, counts), num_clients=U, selection_weights=None,
      round_cfg=RoundConfig(ClientConfig(local_steps=3, optimizer=user), server_optimizer=user),
      data=None, data_fingerprint=None,
      model=types.SimpleNamespace(is_regression=False))
  spec = server.spec(cfg, setup, np.zeros(2, np.uint32))
  _, args = server.plan_round(spec, server.init(spec))
  np.testing.assert_array_equal(args.lr, np.array([1.0, 0.5, 0.25], np.float32))
  assert float(args.server_lr) == 1.0
