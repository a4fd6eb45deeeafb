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


@pytest.mark.parametrize("per_point", [False, True], ids=["set_per_row", "set_per_point"])
@pytest.mark.parametrize("varied", ["seed", "data.holdout_fold"])
def test_a_batched_sweep_evaluates_each_run_on_its_own_unassigned_split(varied, per_point,
                                                                        monkeypatch):
  # The unassigned examples differ by seed (a partition that leaves some over) and by
  # fold: runs batched into one sweep score what each would score alone. Each run is a
  # row here, so its lanes share the row's set; ``per_point`` forces the fallback that
  # names a set per point (rows whose runs hold different sets).
  from fedjax_dp.host import groups
  if per_point:
    monkeypatch.setattr(groups, "_row_sets", lambda layout, eval_ids: None)
  base = {"data.num_clients": 4, "data.samples_per_client": 100, "rounds": 2,
          "server.clients_per_round": 4, "eval.split": "unassigned", "progress": "false"}
  if varied == "data.holdout_fold":
    base.update({"data.samples_per_client": 300, "data.holdout": 237})
  cfgs = [small_config(base, **{varied: v}) for v in (0, 1)]
  setups = [experiment.build(c) for c in cfgs]
  assert setups[0].eval_key != setups[1].eval_key
  # One compiled group holds both evaluation sets and scores each run on its own.
  assert experiment.same_program(*setups)
  batched = experiment.run_batched(cfgs, [None, None])
  for c, b in zip(cfgs, batched, strict=True):
    alone = experiment.run_batched([c], [None])[0]
    assert b.summary["final_test_loss"] == pytest.approx(alone.summary["final_test_loss"],
                                                         rel=1e-6)
  # The test split is one set for every seed: those runs still share a program.
  same = [experiment.build(small_config({}, seed=s)) for s in (0, 1)]
  assert experiment.same_program(*same)


def test_a_decision_on_the_unassigned_split_does_not_read_the_test_set():
  from fedjax_dp import reproduction as repro
  for sets in ({"schedule.name": "adpfl", "schedule.validation": "server"},
               {"schedule.name": "crd"}):
    on_test = repro.config_decisions(small_config(sets))
    held = repro.config_decisions(small_config({**sets, "eval.split": "unassigned"}))
    assert [d["reads"] for d in on_test] == [repro.READS_TEST]
    assert [d["reads"] for d in held] == [repro.READS_UNASSIGNED]
    assert not held[0]["paper_states"]


# data.holdout: examples set aside before the partition, for a partition that would
# otherwise use every training example (3 x 479 = 1437 digits).
_FULL = {"data.num_clients": 3, "server.clients_per_round": 3}


def test_holdout_sets_aside_the_same_examples_for_every_seed_and_no_client_holds_them():
  from fedjax_dp.data.partition import holdout_indices
  labels = np.arange(1437) % 10
  held = holdout_indices(1437, 137)
  assert held.shape == (137,) and len(set(held.tolist())) == 137
  for seed in (0, 1, 7):
    for partition in ("iid", "sorted", "dirichlet"):
      cfg = small_config({**_FULL, "data.samples_per_client": 400, "data.holdout": 137,
                          "data.partition": partition, "seed": seed})
      parts = experiment.partition_clients(cfg, labels)
      taken = np.concatenate(parts)
      assert len(parts) == 3 and all(len(c) == 400 for c in parts)
      assert len(np.unique(taken)) == taken.size  # disjoint clients
      assert not np.isin(held, taken).any()       # none holds a set-aside example


def test_holdout_folds_are_disjoint_cover_the_pool_and_fold_zero_is_the_set_of_before():
  from fedjax_dp.data.partition import holdout_indices
  folds = [holdout_indices(1437, 479, f) for f in range(3)]
  np.testing.assert_array_equal(folds[0], holdout_indices(1437, 479))
  np.testing.assert_array_equal(np.sort(np.concatenate(folds)), np.arange(1437))
  labels = np.arange(1437) % 10
  for fold in range(3):
    cfg = small_config({**_FULL, "data.samples_per_client": 300, "data.holdout": 479,
                        "data.holdout_fold": fold})
    taken = np.concatenate(experiment.partition_clients(cfg, labels))
    assert taken.size == 900 and not np.isin(folds[fold], taken).any()
  with pytest.raises(ConfigError, match=r"data.holdout_fold=3 needs 0 <= fold < n // "
                                        r"data.holdout \(= 3 folds"):
    holdout_indices(1437, 479, 3)
  with pytest.raises(ConfigError, match="a fold > 0 needs data.holdout > 0"):
    experiment.partition_clients(small_config({"data.holdout_fold": 1}), labels)
  with pytest.raises(ConfigError, match="data.holdout_fold"):
    check_fields(small_config({"data.holdout_fold": -1}))


def test_holdout_zero_is_the_partition_of_before():
  labels = np.arange(1437) % 10
  for partition in ("iid", "sorted", "dirichlet"):
    cfg = small_config({"data.partition": partition, "data.samples_per_client": 100})
    a = experiment.partition_clients(cfg, labels)
    b = experiment.partition_clients(small_config({"data.partition": partition,
                                                   "data.samples_per_client": 100,
                                                   "data.holdout": 0}), labels)
    from fedjax_dp.data.partition import partition as raw
    c = raw(labels, partition, cfg.data.num_clients, cfg.seed,
            **({"alpha": cfg.data.alpha} if partition == "dirichlet" else {}),
            samples_per_client=100)
    for x, y, z in zip(a, b, c, strict=True):
      np.testing.assert_array_equal(x, y)
      np.testing.assert_array_equal(x, z)


def test_unassigned_split_of_a_full_partition_is_the_holdout():
  from fedjax_dp.data import load_dataset
  from fedjax_dp.data.partition import holdout_indices
  ds = load_dataset("digits")
  s = experiment.build(small_config({**_FULL, "data.samples_per_client": 450,
                                     "data.holdout": 87, "eval.split": "unassigned"}))
  # 1437 - 3 x 450 = 87: exactly the set-aside examples, in their order in the pool.
  want = np.asarray(ds.x_train, np.float32)[holdout_indices(1437, 87)]
  np.testing.assert_array_equal(np.asarray(s.x_test).reshape(want.shape), want)


def test_holdout_refusals():
  with pytest.raises(ConfigError, match="data.holdout"):
    check_fields(small_config({"data.holdout": -1}))
  with pytest.raises(ConfigError, match=r"data.holdout=1437 must lie in \[0, 1437\)"):
    experiment.build(small_config({**_FULL, "data.samples_per_client": 1,
                                   "data.holdout": 1437}))
  # A holdout the partition cannot fit around: the partitioner's own error, at build.
  with pytest.raises((ConfigError, ValueError)):
    experiment.build(small_config({**_FULL, "data.samples_per_client": 479,
                                   "data.holdout": 10}))
