"""Cohorts streamed from host memory (data.placement='host', fedjax_dp/data/streaming.py):
bit for bit the device-resident results (on 8 devices: tests/test_sharding.py),
memory-mapped federations, errors before compute, and the prefetch thread's failures."""

import numpy as np
import pytest
from _helpers import small_config, toy_federated

from fedjax_dp import config as config_lib
from fedjax_dp import experiment, sweep
from fedjax_dp.data import streaming
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.host import groups

SMALL = {"rounds": "4", "data.num_clients": "12", "data.samples_per_client": "20",
         "server.clients_per_round": "5", "eval.every": "2", "data.test_samples": "200"}


def _run(tmp_path, name, **sets):
  """A small run; written to ``tmp_path / name`` only with checkpoints (plots cost
  seconds)."""
  cfg = small_config(SMALL, **sets)
  return experiment.run(cfg, str(tmp_path / name) if "checkpoint.every" in sets else None)


def _same(a, b):
  """Same metric rows (every column, exactly) and the same final model, bit for bit."""
  assert [{k: v for k, v in r.items() if k != "wall_s"} for r in a.rows] == \
         [{k: v for k, v in r.items() if k != "wall_s"} for r in b.rows]
  for x, y in zip(_leaves(a.params), _leaves(b.params)):
    np.testing.assert_array_equal(x, y)


def _leaves(tree):
  import jax
  return [np.asarray(v) for v in jax.tree_util.tree_leaves(tree)]


# Uniform K of U, all clients at once, one run: test_resume_with_streamed_data_equals_
# the_uninterrupted_run compares a streamed run with the resident one.
@pytest.mark.parametrize("sets", [
    {"server.selection": "poisson", "server.q": "0.4"},          # padded, masked slots
    {"server.client_chunk": "2", "client.local_steps": "2", "client.batch_size": "5"},
])
def test_streamed_equals_resident_bit_for_bit(sets):
  """A seed sweep's runs (batched as the sweep batches them, without its files): two
  partitions (data_id 0, 1) and two cohorts per round in one call, each streamed from
  its own partition."""
  points = sweep.expand(small_config(SMALL, **sets), {"seed": [0, 1]})
  dev, host = (experiment.run_batched(
      [config_lib.override(p.config, [f"data.placement={placement}"]) for p in points],
      [None] * len(points)) for placement in ("device", "host"))
  assert len(host) == 2 and all(len(r.rows) == 4 for r in host)
  for a, b in zip(host, dev):
    _same(a, b)
  assert host[0].rows[-1]["test_loss"] != host[1].rows[-1]["test_loss"]  # two runs


def test_resume_with_streamed_data_equals_the_uninterrupted_run(tmp_path, monkeypatch):
  sets = {"rounds": "6", "checkpoint.every": "2"}
  full = _run(tmp_path, "full", **sets)
  record, stop = experiment.RunLoop.record, {"at": 3}

  def crashing_record(self, *a, **k):
    record(self, *a, **k)
    if self.t == stop["at"]:
      raise RuntimeError("killed")

  monkeypatch.setattr(experiment.RunLoop, "record", crashing_record)
  with pytest.raises(RuntimeError, match="killed"):
    _run(tmp_path, "resumed", **sets, **{"data.placement": "host"})
  assert (tmp_path / "resumed" / "checkpoint.msgpack").exists()  # of round 2
  monkeypatch.setattr(experiment.RunLoop, "record", record)
  resumed = _run(tmp_path, "resumed", **sets, **{"data.placement": "host"})
  _same(resumed, full)


def test_adpfl_client_validation_reads_the_streamed_cohort(tmp_path):
  # schedule.validation='clients' scores the selected clients' data after each round
  # (evaluation.selected_accuracy), from the streamed cohort's rows.
  sets = {"model.name": "logistic", "server.selection": "round_robin",
          "privacy.formula": "noise_multiplier", "privacy.noise_multiplier": "0.8",
          "schedule.name": "adpfl", "schedule.validation": "clients",
          "schedule.alpha": "0.02", "schedule.val_noise_multiplier": "1.5"}
  resident = _run(tmp_path, "device", **sets)
  streamed = _run(tmp_path, "host", **sets, **{"data.placement": "host"})
  assert all(r["val_accuracy"] != "" for r in streamed.rows)
  _same(streamed, resident)


def test_memmap_federation_round_trips_and_streams_as_resident(tmp_path):
  data = toy_federated(num_clients=7, n=12)
  host = FederatedData(*(np.asarray(a) for a in data))
  streaming.save_federation(tmp_path / "fed", host)
  opened = streaming.open_federation(tmp_path / "fed")
  assert isinstance(opened.x, np.memmap) and streaming.is_host(opened)
  for a, b in zip(opened, host):
    np.testing.assert_array_equal(a, b)
  idx = np.array([5, 1, 5, 0], np.int32)
  cohort = streaming.gather_cohort(opened, idx)
  resident = streaming.to_device(opened)
  for f in ("x", "y", "mask", "counts"):
    np.testing.assert_array_equal(getattr(cohort, f), np.asarray(getattr(resident, f))[idx])
  stream = streaming.CohortStream([opened])
  try:
    stream.prefetch([(0, idx)])
    got, offsets = stream.take([(0, idx), (0, idx[:2])])
    assert offsets == [0, 4] and got.x.shape == (6,) + host.x.shape[1:]
    assert stream.hits == 1 and stream.misses == 1
    np.testing.assert_array_equal(np.asarray(got.x[:4]), cohort.x)
    np.testing.assert_array_equal(np.asarray(got.counts), host.counts)
  finally:
    stream.close()


def test_a_cohort_read_again_next_round_stays_on_the_device():
  host = FederatedData(*(np.asarray(a) for a in toy_federated(6)))
  stream, ids = streaming.CohortStream([host]), np.arange(6, dtype=np.int32)
  try:
    for _ in range(3):  # server.selection='all': the same cohort every round
      stream.begin_round()
      _ = stream.take([(0, ids)])
      stream.prefetch([(0, ids)])
    assert stream.misses == 1 and stream.hits == 0
    stream.begin_round()
    stream.prefetch([])  # the next round reads another cohort: this one is dropped
    stream.begin_round()
    stream.take([(0, ids)])
    assert stream.misses == 2
  finally:
    stream.close()


def test_uint8_memmap_written_piece_by_piece(tmp_path):
  x, y, counts = streaming.create_federation(tmp_path / "u8", 5, 3, (2, 2))
  rng = np.random.default_rng(0)
  x[:] = rng.integers(0, 256, x.shape, dtype=np.uint8)
  y[:] = rng.integers(0, 10, y.shape)
  counts[:] = [3, 1, 0, 2, 3]
  for a in (x, y, counts):
    a.flush()
  fed = streaming.open_federation(tmp_path / "u8")
  np.testing.assert_array_equal(fed.mask.sum(1), [3, 1, 0, 2, 3])
  c = streaming.gather_cohort(fed, np.array([4, 2]))
  assert c.x.dtype == np.float32 and c.y.dtype == np.int32
  np.testing.assert_array_equal(c.x, x[[4, 2]].astype(np.float32))


def test_bad_federations_are_named_before_compute(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    streaming.open_federation(tmp_path / "nowhere")
  (tmp_path / "half").mkdir()
  np.save(tmp_path / "half" / "x.npy", np.zeros((2, 3, 1), np.uint8))
  with pytest.raises(FileNotFoundError, match="lacks y.npy, counts.npy"):
    streaming.open_federation(tmp_path / "half")
  np.save(tmp_path / "half" / "y.npy", np.zeros((2, 3), np.int32))
  np.save(tmp_path / "half" / "counts.npy", np.array([1, 4], np.int32))
  with pytest.raises(ValueError, match=r"counts must lie in \[0, n_max=3\]"):
    streaming.open_federation(tmp_path / "half")
  np.save(tmp_path / "half" / "y.npy", np.zeros((3, 3), np.int32))
  with pytest.raises(ValueError, match="must agree on U"):
    streaming.open_federation(tmp_path / "half")
  (tmp_path / "half" / "y.npy").write_text("not numpy")
  with pytest.raises(ValueError, match="federation directory"):
    streaming.open_federation(tmp_path / "half")
  with pytest.raises(IndexError, match=r"cohort ids must lie in \[0, 7\)"):
    streaming.gather_cohort(FederatedData(*(np.asarray(a) for a in toy_federated(7))),
                            np.array([0, 7]))


def test_bad_placement_is_a_config_error_naming_the_field():
  cfg = small_config(SMALL, **{"data.placement": "disk"})
  with pytest.raises(config_lib.ConfigError, match="data.placement"):
    config_lib.validate(cfg)


def test_a_failing_prefetch_surfaces_in_the_round_that_needs_it():
  host = FederatedData(*(np.asarray(a) for a in toy_federated(6)))
  stream = streaming.CohortStream([host])
  calls = []

  def broken(cohort):
    calls.append(1)
    raise OSError("disk gone")

  stream._put = broken
  try:
    stream.prefetch([(0, np.array([1, 2], np.int32))])
    with pytest.raises(streaming.PrefetchError, match="clients \\[1, 2\\]\\) failed: "
                       "OSError: disk gone") as info:
      stream.take([(0, np.array([1, 2], np.int32))])
    assert isinstance(info.value.__cause__, OSError) and calls
  finally:
    stream.close()


def test_a_failing_prefetch_stops_the_run(tmp_path, monkeypatch):
  load = streaming.CohortStream._load

  def failing_after_first(self, key):
    if getattr(self, "_loaded", 0) >= 1:
      raise OSError("read error")
    self._loaded = getattr(self, "_loaded", 0) + 1
    return load(self, key)

  monkeypatch.setattr(streaming.CohortStream, "_load", failing_after_first)
  with pytest.raises(streaming.PrefetchError, match="read error"):
    _run(tmp_path, "fails", **{"data.placement": "host"})


def test_host_and_device_runs_never_share_a_group(tmp_path):
  from fedjax_dp.host import building
  a = building.build(small_config(SMALL))
  b = building.build(small_config(SMALL, **{"data.placement": "host"}))
  assert isinstance(b.data.x, np.ndarray) and not isinstance(a.data.x, np.ndarray)
  assert not building.same_program(a, b)
  assert groups.cohort_key(a.config) != groups.cohort_key(b.config)
