"""Membership inference against engine runs: one call per config.

:func:`membership_inference` trains the target (or takes a finished
:class:`fedjax_dp.experiment.RunResult`), attacks its final global model on
individual training examples, and returns one flat row: attack accuracies and
advantages, the certified epsilon and the largest advantage it allows
(:mod:`fedjax_dp.attacks.bounds`). Rows of several configs load into
``pandas.DataFrame(rows)``::

  from fedjax_dp.attacks import membership_inference
  from fedjax_dp.config import load_config, override
  cfg = override(load_config("experiments/configs/quickstart.py"), ["privacy.epsilon=inf"])
  row = membership_inference(cfg, attacks=("loss_threshold",))

Membership is example-level: members are the records of the target's clients,
non-members the training records no client holds plus the test set. The shadow
models of Shokri et al. are trained by the target's own federated procedure
(:func:`federated_train_fn`): same config, other seeds, other data.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fedjax_dp import experiment
from fedjax_dp.attacks import bounds, metrics, mia
from fedjax_dp.data import build_federated_data, load_dataset
from fedjax_dp.privacy.plan import make_privacy_plan

ATTACKS = ("loss_threshold", "shadow")


def target_membership(cfg, setup: experiment.Setup | None = None, cache: dict | None = None):
  """The attacker's pool and the target's membership in it.

  Args:
    cfg: the target's config.
    setup: its :func:`experiment.build` result, if already built with ``cache``.
    cache: the build cache holding the partition (built here if absent).

  Returns:
    ``(setup, pool_x, pool_y, member)``: the pool is the training split followed by
    the test split; ``member [N]`` marks the records some client trains on.
  """
  cache = {} if cache is None else cache
  if setup is None or ("clients", experiment.data_key(cfg)) not in cache:
    setup = experiment.build(cfg, cache=cache)
  clients, _ = cache["clients", experiment.data_key(cfg)]
  ds = load_dataset(cfg.data.name, cfg.data.dir)
  pool_x = np.concatenate([np.asarray(ds.x_train), np.asarray(ds.x_test)])
  pool_y = np.concatenate([np.asarray(ds.y_train), np.asarray(ds.y_test)])
  member = np.zeros(len(pool_y), bool)
  member[np.concatenate([np.asarray(c, np.int64) for c in clients])] = True
  return setup, pool_x, pool_y, member


def federated_train_fn(cfg, setup: experiment.Setup | None = None, *,
                       group: int | None = None):
  """The target's federated training procedure as a batched shadow ``train_fn``.

  Returns ``train(seeds [S], x [S, n, ...], y [S, n]) -> params`` (stacked ``[S]``):
  shadow ``s`` is a run of ``cfg`` with ``seed = seeds[s]`` on records
  ``x[s], y[s]``, partitioned over clients by ``cfg``'s partitioner. The runs share
  one compiled, vmapped round (:func:`experiment.run_group`), ``group`` runs at a
  time (default all; lower it when ``S`` copies of the data do not fit in memory).
  Privacy settings are the target's, so a DP target gets DP shadows.

  Raises:
    ValueError: when the partitioner leaves some of the ``n`` records unassigned
      (their membership would be mislabelled): ``n`` must equal what the partition
      uses, e.g. ``data.num_clients * data.samples_per_client`` for ``'iid'``.
  """
  setup = setup or experiment.build(cfg)

  def train(seeds, x, y):
    seeds, x, y = np.asarray(seeds), np.asarray(x), np.asarray(y)
    cfgs, parts = [], []
    for s, sd in enumerate(seeds):
      c = copy.deepcopy(cfg)
      c.seed = int(sd)
      c.name = f"{cfg.name}/shadow{s}"
      c.progress = False
      clients = experiment._partition(c, y[s])  # pylint: disable=protected-access
      used = np.concatenate([np.asarray(i, np.int64) for i in clients])
      if len(np.unique(used)) != len(y[s]):
        raise ValueError(
            f"shadow training: the {cfg.data.partition!r} partition uses "
            f"{len(np.unique(used))} of the {len(y[s])} shadow records; pass as many "
            f"records as it uses (data.num_clients x data.samples_per_client)")
      cfgs.append(c)
      parts.append(clients)
    n_max = max(max((len(i) for i in p), default=1) for p in parts)
    setups = []
    for s, (c, clients) in enumerate(zip(cfgs, parts)):
      counts = np.asarray([len(i) for i in clients])
      setups.append(dataclasses.replace(
          setup, config=c, data=build_federated_data(x[s], y[s], clients, n_max=n_max),
          privacy=make_privacy_plan(c, counts, num_params=setup.model.num_params())))
    step = group or len(cfgs)
    params = []
    for i in range(0, len(cfgs), step):
      params += [r.params for r in experiment.run_group(cfgs[i:i + step], setups[i:i + step])]
    return jax.tree_util.tree_map(lambda *a: np.stack(a), *params)

  return train


def membership_inference(cfg, *, result: experiment.RunResult | None = None,
                         attacks: Sequence[str] = ATTACKS, num_shadow: int = 25,
                         shadow_group: int | None = None, per_class: bool = True,
                         calibration_fraction: float = 0.5, max_per_side: int | None = None,
                         seed: int | None = None) -> dict[str, Any]:
  """Attacks a federated run's final global model and compares with its DP bound.

  Evaluation: equally many members and non-members (:func:`mia.balanced_split`,
  at most ``max_per_side`` each), split into calibration and evaluation parts; every
  attack is reported on the same evaluation part. The loss-threshold attack chooses
  its threshold on the calibration part; the shadow attack uses its classifier's
  0.5, fixed by shadow models alone. Both are therefore held out.

  Args:
    cfg: the target run's config (any privacy setting; ``privacy.epsilon=inf`` for
      no DP).
    result: the finished target run of ``cfg``; trained here when None.
    attacks: a subset of ``('loss_threshold', 'shadow')``.
    num_shadow: shadow models (Yuan et al., Table III: 25).
    shadow_group: shadow runs per compiled group (default all at once).
    per_class: Shokri's per-class attack models (else one for all classes).
    calibration_fraction: fraction of the candidates used to calibrate.
    max_per_side: cap on members (= non-members) drawn.
    seed: attack seed (default ``cfg.seed + 1``); shadow runs use seeds
      ``seed * 1000 + s``, never the target's own.

  Returns:
    A flat dict: ``epsilon_certified`` / ``epsilon_claimed`` / ``delta`` /
    ``accounting_level`` of the target, ``advantage_bound`` and ``accuracy_bound``
    (from the certified epsilon; ``..._claimed`` from the paper formula's epsilon,
    which is not a certificate), the loss gap, and per attack the fields of
    :class:`metrics.AttackResult` prefixed by the attack's name.
  """
  unknown = set(attacks) - set(ATTACKS)
  if unknown:
    raise ValueError(f"attacks: unknown {sorted(unknown)}; choose from {ATTACKS}")
  seed = int(cfg.seed) + 1 if seed is None else int(seed)
  cache: dict = {}
  setup, pool_x, pool_y, member = target_membership(cfg, cache=cache)
  if result is None:
    result = experiment.run(cfg, setup=setup)
  params, apply_fn = result.params, setup.model.apply
  split = mia.balanced_split(np.flatnonzero(member), np.flatnonzero(~member),
                             calibration_fraction=calibration_fraction,
                             max_per_side=max_per_side, seed=seed)
  s = result.summary
  level = ((s.get("privacy") or {}).get("accounting") or {}).get("level", "none")
  eps_cert, eps_claim = float(s["epsilon_certified"]), float(s["epsilon_claimed"])
  delta = float(s["delta"])
  row: dict[str, Any] = {
      "name": cfg.name, "epsilon_target": float(s["epsilon_target"]),
      "epsilon_certified": eps_cert, "epsilon_claimed": eps_claim, "delta": delta,
      "accounting_level": level, "rounds_run": s["rounds_run"],
      "final_test_accuracy": s["final_test_accuracy"],
      "advantage_bound": bounds.advantage_bound(eps_cert, delta),
      "accuracy_bound": bounds.accuracy_bound(eps_cert, delta),
      "advantage_bound_claimed": bounds.advantage_bound(eps_claim, delta),
      "accuracy_bound_claimed": bounds.accuracy_bound(eps_claim, delta),
      "num_members_pool": int(member.sum()), "num_nonmembers_pool": int((~member).sum())}
  loss = {k: mia.per_example_loss(apply_fn, params, pool_x[i], pool_y[i])
          for k, i in split._asdict().items()}
  row["loss_members"] = float(np.mean(loss["eval_members"]))
  row["loss_nonmembers"] = float(np.mean(loss["eval_nonmembers"]))
  if "loss_threshold" in attacks:
    res = metrics.calibrated(-loss["calib_members"], -loss["calib_nonmembers"],
                             -loss["eval_members"], -loss["eval_nonmembers"])
    row.update(res.as_row("loss_threshold"))
  if "shadow" in attacks:
    train = federated_train_fn(cfg, setup, group=shadow_group)
    attack = mia.train_shadow_attack(apply_fn, train, pool_x, pool_y, int(member.sum()),
                                     num_shadow=num_shadow, batched=True,
                                     per_class=per_class, seed=seed)
    m, o = split.eval_members, split.eval_nonmembers
    res = mia.shadow_attack(attack, apply_fn, params, pool_x[m], pool_y[m], pool_x[o],
                            pool_y[o])
    row.update(res.as_row("shadow"))
    row.update(shadow_models=num_shadow, shadow_in_sample_accuracy=attack.shadow_accuracy,
               shadow_per_class=per_class)
  return row
