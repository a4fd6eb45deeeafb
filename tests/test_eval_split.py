"""``eval.split='unassigned'``: the run evaluates on the training examples no client
holds (a held-out split for choosing hyperparameters without the test set); the
federation itself, and so the training, is the test split's run's."""

import numpy as np
import pytest
from _helpers import small_config

from fedjax_dp import experiment
from fedjax_dp.config import ConfigError, check_fields


def _setup(**sets):
  return experiment.build(small_config({"data.num_clients": 10, "data.samples_per_client": 100},
                                       **sets))


def test_unassigned_examples_are_the_pool_minus_every_client_s():
  from fedjax_dp.data import load_dataset
  test, held = _setup(), _setup(**{"eval.split": "unassigned"})
  ds = load_dataset("digits")
  assert held.data.x.shape == test.data.x.shape
  np.testing.assert_array_equal(np.asarray(held.data.x), np.asarray(test.data.x))
  # 1437 digits in the training split, 10 x 100 of them held by clients.
  assert held.x_test.shape[0] == len(ds.y_train) - 1000
  rows = {r.tobytes() for r in np.asarray(ds.x_train, np.float32).reshape(len(ds.y_train), -1)}
  client_rows = np.asarray(held.data.x)[np.asarray(held.data.mask) > 0]
  held_rows = np.asarray(held.x_test).reshape(held.x_test.shape[0], -1)
  assert all(r.tobytes() in rows for r in held_rows)  # training examples ...
  taken = {r.tobytes() for r in client_rows.reshape(client_rows.shape[0], -1)}
  assert not any(r.tobytes() in taken for r in held_rows)  # ... that no client holds
  np.testing.assert_array_equal(np.asarray(test.x_test), np.asarray(ds.x_test, np.float32))


def test_unassigned_with_a_subset_and_the_refusals():
  held = _setup(**{"eval.split": "unassigned", "data.test_samples": 100})
  assert held.x_test.shape[0] == 100
  with pytest.raises(ValueError, match="gives all 1437 training examples"):
    experiment.build(small_config({"data.num_clients": 3, "data.samples_per_client": 479,
                                   "server.clients_per_round": 3,
                                   "eval.split": "unassigned"}))
  with pytest.raises(ConfigError, match="eval.split"):
    check_fields(small_config({"eval.split": "validation"}))


def test_a_decision_on_the_unassigned_split_does_not_read_the_test_set():
  from fedjax_dp import reproduction as repro
  for sets in ({"schedule.name": "adpfl", "schedule.validation": "server"},
               {"schedule.name": "crd"}):
    on_test = repro.config_decisions(small_config(sets))
    held = repro.config_decisions(small_config({**sets, "eval.split": "unassigned"}))
    assert [d["reads"] for d in on_test] == [repro.READS_TEST]
    assert [d["reads"] for d in held] == [repro.READS_UNASSIGNED]
    assert not held[0]["paper_states"]
