"""Clients in chunks (a scan over vmapped chunks) give the all-at-once round."""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import toy_federated

from fedjax_dp import config as config_lib
from fedjax_dp import experiment
from fedjax_dp.models import get_model
from fedjax_dp.training import client as client_lib
from fedjax_dp.training import engine, memory

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "quickstart.py"


def _toy(num_clients=9, n=12, shape=(4, 4, 1), classes=3, seed=0):
  return toy_federated(num_clients, n, shape, classes, seed, n_max=n)


def _args(idx, mask, lr, central=0.0):
  k = len(idx)
  return engine.RoundArgs(
      idx=jnp.asarray(idx, jnp.int32), sel_mask=jnp.asarray(mask, jnp.float32),
      lr=jnp.asarray(lr, jnp.float32), clip=jnp.float32(0.8),
      noise=jnp.linspace(0.01, 0.2, k, dtype=jnp.float32), central_noise=jnp.float32(central),
      server_lr=jnp.float32(0.9), round=jnp.int32(2), seed=jnp.uint32(7))


CASES = [
    (client_lib.ClientConfig(1, 0, "per_example_l2", "upload"), "normalized", 0.0, 3),
    (client_lib.ClientConfig(2, 4, "per_example_l2", "step"), "normalized", 0.0, 2),
    (client_lib.ClientConfig(2, 0, "update_l2", "central"), "unnormalized", 0.3, 4),
]


@pytest.mark.parametrize("ccfg,aggregation,central,chunk", CASES)
def test_chunked_round_equals_all_at_once(ccfg, aggregation, central, chunk):
  data = _toy()
  model = get_model("logistic", (4, 4, 1), 3)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  # 7 slots (not a multiple of the chunk), the last two masked out (Poisson padding).
  args = _args([8, 1, 4, 0, 6, 1, 1], [1, 1, 1, 1, 1, 0, 0], [0.3] * ccfg.local_steps,
               central)
  cfg = engine.RoundConfig(ccfg, aggregation)
  want, wm = engine.make_round_fn(model, cfg)(params, data, args)
  got, gm = engine.make_round_fn(model, dataclasses.replace(cfg, client_chunk=chunk))(
      params, data, args)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for a, b in zip(gm, wm):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_stacked_datasets_read_their_own_clients():
  a, b = _toy(seed=1), _toy(seed=2)
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), a, b)
  model = get_model("logistic", (4, 4, 1), 3)
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "per_example_l2", "upload"),
                           "unnormalized", client_chunk=2)
  fn = engine.make_round_fn(model, cfg)
  args = _args([3, 5, 2], [1, 1, 1], [0.5])
  want, _ = fn(params, b, args)
  got, _ = fn(params, stacked, args._replace(data_id=jnp.int32(1)))
  for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_chunk_from_memory():
  data = _toy(num_clients=40)
  model = get_model("mlp_784_32_10_linear", (4, 4, 1), 3)
  cfg = engine.RoundConfig(client_lib.ClientConfig(1, 0, "per_example_l2", "upload"))

  def chunk(memory, **kw):
    return engine.client_chunk_for_memory(model, cfg, data, 40, memory_bytes=memory, **kw)

  assert chunk(1 << 34, cache_bytes=0) == 0  # everything fits: all at once
  small = chunk(400_000, cache_bytes=0)
  assert 1 <= small < 40
  num_chunks = -(-40 // small)
  assert num_chunks * small - 40 < num_chunks  # chunks as even as possible
  assert chunk(400_000, cache_bytes=0, lanes=2) <= small  # a sweep's lanes share memory
  assert chunk(400_000, cache_bytes=0, multiple_of=4) % 4 == 0
  assert 1 <= chunk(1 << 34, cache_bytes=100_000) < 40  # the cache cap binds
  assert engine.available_memory_bytes() > 0


def test_run_with_chunks_equals_run_without():
  base = ["rounds=3", "data.num_clients=7", "data.samples_per_client=20",
          "server.clients_per_round=7", "model.name=logistic", "progress=false",
          "server.client_chunk=0"]
  cfg = config_lib.override(config_lib.load_config(QUICKSTART), base)
  want = experiment.run(cfg).rows
  for chunk in ("3", "-1"):
    got = experiment.run(config_lib.override(cfg, [f"server.client_chunk={chunk}"])).rows
    for g, w in zip(got, want):
      for c in ("train_loss", "test_loss", "update_norm", "epsilon_certified"):
        np.testing.assert_allclose(g[c], w[c], rtol=1e-5, atol=1e-6)


def test_bad_client_chunk_is_reported():
  cfg = config_lib.override(config_lib.base_config(), ["server.client_chunk=-2"])
  with pytest.raises(config_lib.ConfigError, match="server.client_chunk"):
    config_lib.validate(cfg)


def test_default_chunk_is_chosen_from_memory():
  """What `fedjax-dp run` does unless told: the chunk from memory (the benchmarked path)."""
  assert int(config_lib.base_config().server.client_chunk) == experiment.CLIENT_CHUNK_AUTO


def test_chunk_from_memory_leaves_room_for_bandmf_state():
  """BandMF carries b - 1 model copies per lane: the chunk sizer takes them off the
  budget before sizing chunks, so the same memory gives smaller chunks."""
  from fedjax_dp.privacy.correlated import bandmf
  data = _toy(num_clients=40)
  model = get_model("mlp_784_32_10_linear", (4, 4, 1), 3)
  ccfg = client_lib.ClientConfig(1, 0, "update_l2", "central")
  iid = engine.RoundConfig(ccfg, "fixed", expected_fraction=0.5)
  band = engine.RoundConfig(ccfg, "fixed", expected_fraction=0.5,
                            correlated=bandmf.strategy(64, 32))
  copies = 31 * 4 * model.num_params()
  assert memory.carried_state_bytes(model, band) == copies
  assert memory.carried_state_bytes(model, iid) == 0
  budget = 2 * (2 * copies) + 400_000   # at fraction 0.5: the state in and out, then 200 kB
  chunk = lambda cfg: engine.client_chunk_for_memory(model, cfg, data, 40,
                                                     memory_bytes=budget, cache_bytes=0)
  b, i = chunk(band), chunk(iid)
  assert 1 <= b < 40 and (i == 0 or b < i)
