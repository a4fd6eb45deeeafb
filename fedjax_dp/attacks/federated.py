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
import hashlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fedjax_dp import experiment
from fedjax_dp.attacks import bounds, metrics, mia
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.data import build_federated_data, load_dataset

ATTACKS = ("loss_threshold", "shadow", "reference")


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


def _shadow_runs(cfg, setup: experiment.Setup, seeds, x, y, data_cache: dict | None = None):
  """Configs and setups of shadow runs of ``cfg`` on records ``x[s], y[s]``.

  ``data_cache`` maps (seed, data config, records) to the partitioned client data, so
  shadow runs of several targets on the same draws share one copy
  (:func:`experiment.run_group` stacks only distinct data objects). All shadows are
  padded to the same client size, so they share one compiled round.
  """
  data_cache = {} if data_cache is None else data_cache
  cfgs, keys, parts = [], [], []
  for s, sd in enumerate(seeds):
    c = copy.deepcopy(cfg)
    c.seed = int(sd)
    c.name = f"{cfg.name}/shadow{s}"
    c.progress = False
    key = (int(sd), experiment.data_key(c),
           hashlib.sha1(np.ascontiguousarray(x[s])).hexdigest(),
           hashlib.sha1(np.ascontiguousarray(y[s])).hexdigest())
    if ("clients", key) not in data_cache:
      clients = experiment.partition_clients(c, y[s])
      used = np.concatenate([np.asarray(i, np.int64) for i in clients])
      if len(np.unique(used)) != len(y[s]):
        raise ValueError(
            f"shadow training: the {cfg.data.partition!r} partition uses "
            f"{len(np.unique(used))} of the {len(y[s])} shadow records; pass as many "
            f"records as it uses (data.num_clients x data.samples_per_client)")
      data_cache["clients", key] = clients
    cfgs.append(c)
    keys.append(key)
    parts.append(data_cache["clients", key])
  n_max = max(max((len(i) for i in p), default=1) for p in parts)
  setups = []
  for s, (c, key, clients) in enumerate(zip(cfgs, keys, parts)):
    if ("data", key, n_max) not in data_cache:
      data_cache["data", key, n_max] = build_federated_data(x[s], y[s], clients, n_max=n_max)
    counts = np.asarray([len(i) for i in clients])
    setups.append(dataclasses.replace(
        setup, config=c, data=data_cache["data", key, n_max],
        privacy=plan_from_config(c, counts, num_params=setup.model.num_params())))
  return cfgs, setups


def _run_grouped(cfgs, setups, group: int | None) -> list:
  """Final params of every run, runs sharing a compiled round batched ``group`` at a
  time (all at once by default)."""
  by_key: dict = {}
  for i, st in enumerate(setups):
    by_key.setdefault(experiment.group_key(st), []).append(i)
  params: list = [None] * len(cfgs)
  for idx in by_key.values():
    step = group or len(idx)
    for j in range(0, len(idx), step):
      chunk = idx[j:j + step]
      res = experiment.run_group([cfgs[i] for i in chunk], [setups[i] for i in chunk])
      for i, r in zip(chunk, res):
        params[i] = r.params
  return params


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
    cfgs, setups = _shadow_runs(cfg, setup, np.asarray(seeds), np.asarray(x), np.asarray(y))
    params = _run_grouped(cfgs, setups, group)
    return jax.tree_util.tree_map(lambda *a: np.stack(a), *params)

  return train


def membership_inference(cfg, *, result: experiment.RunResult | None = None,
                         **kwargs) -> dict[str, Any]:
  """Attacks a federated run's final global model and compares with its DP bound.

  One config of :func:`membership_inference_many` (see there for the arguments);
  ``result`` is the finished target run of ``cfg`` (trained here when None).
  """
  return membership_inference_many([cfg], results=None if result is None else [result],
                                    **kwargs)[0]


def membership_inference_many(cfgs: Sequence[Any], *,
                              results: Sequence[experiment.RunResult] | None = None,
                              attacks: Sequence[str] = ATTACKS, num_shadow: int = 25,
                              shadow_group: int | None = None, per_class: bool = True,
                              calibration_fraction: float = 0.5,
                              max_per_side: int | None = None,
                              seed: int | None = None) -> list[dict[str, Any]]:
  """Attacks the final global models of several federated runs (e.g. the cells of a
  privacy grid), each beside its DP bound.

  The targets that share a compiled round run as one vmapped program, and so do all
  their shadow runs (``len(cfgs) x num_shadow`` runs, ``shadow_group`` at a time):
  a grid over epsilon, theta or seeds costs a few compiled programs, not one per run.
  All configs must draw the same records (same data, partition and seed), so the
  shadow draws and the evaluation split are shared.

  Evaluation: equally many members and non-members (:func:`mia.balanced_split`,
  at most ``max_per_side`` each), split into calibration and evaluation parts; every
  attack is reported on the same evaluation part. Both attacks that threshold a
  score (``loss_threshold``: minus the loss; ``reference``: the offline-LiRA
  z-score of :func:`mia.reference_scores`) choose the threshold on the calibration
  part; ``shadow`` uses its classifier's 0.5, fixed by shadow models alone. All are
  therefore held out.

  Args:
    cfgs: the target runs' configs (any privacy setting; ``privacy.epsilon=inf`` for
      no DP).
    results: their finished runs, in order; trained here when None.
    attacks: a subset of ``('loss_threshold', 'shadow', 'reference')``; the last two
      share the same shadow models.
    num_shadow: shadow models per target (Yuan et al., Table III: 25).
    shadow_group: shadow runs per compiled group (default all at once).
    per_class: Shokri's per-class attack models (else one for all classes).
    calibration_fraction: fraction of the candidates used to calibrate.
    max_per_side: cap on members (= non-members) drawn.
    seed: attack seed (default ``cfgs[0].seed + 1``); shadow runs use seeds
      ``seed * 1000 + s``, never the target's own.

  Returns:
    One flat dict per config: ``epsilon_certified`` / ``epsilon_claimed`` /
    ``delta`` / ``accounting_level`` of the target, ``advantage_bound`` and
    ``accuracy_bound`` (from the certified epsilon; ``..._claimed`` from the paper
    formula's epsilon, which is not a certificate), the loss gap, the final train
    accuracy on members, and per attack the fields of :class:`metrics.AttackResult`
    prefixed by the attack's name.
  """
  unknown = set(attacks) - set(ATTACKS)
  if unknown:
    raise ValueError(f"attacks: unknown {sorted(unknown)}; choose from {ATTACKS}")
  if not cfgs:
    return []
  keys = {(experiment.data_key(c), int(c.seed)) for c in cfgs}
  if len(keys) > 1:
    raise ValueError("membership_inference_many: the configs must share data, partition "
                     f"and seed (one membership); got {sorted(keys)}")
  seed = int(cfgs[0].seed) + 1 if seed is None else int(seed)
  cache: dict = {}
  setups, pool_x, pool_y, member = [], None, None, None
  for c in cfgs:
    st, pool_x, pool_y, member = target_membership(c, cache=cache)
    setups.append(st)
  if results is None:
    by_key: dict = {}
    for i, st in enumerate(setups):
      by_key.setdefault(experiment.group_key(st), []).append(i)
    results = [None] * len(cfgs)
    for idx in by_key.values():
      for i, r in zip(idx, experiment.run_group([cfgs[i] for i in idx],
                                                [setups[i] for i in idx])):
        results[i] = r
  split = mia.balanced_split(np.flatnonzero(member), np.flatnonzero(~member),
                             calibration_fraction=calibration_fraction,
                             max_per_side=max_per_side, seed=seed)
  shadow_params: list = [None] * len(cfgs)
  ins = None
  if {"shadow", "reference"} & set(attacks):
    ins, seeds = mia.shadow_draws(len(pool_y), int(member.sum()), num_shadow, seed)
    all_cfgs, all_setups, data_cache = [], [], {}
    for c, st in zip(cfgs, setups):
      cs, ss = _shadow_runs(c, st, seeds, pool_x[ins], pool_y[ins], data_cache)
      all_cfgs += cs
      all_setups += ss
    flat = _run_grouped(all_cfgs, all_setups, shadow_group)
    for i in range(len(cfgs)):
      shadow_params[i] = jax.tree_util.tree_map(
          lambda *a: np.stack(a), *flat[i * num_shadow:(i + 1) * num_shadow])
  rows = []
  for c, st, res, sp in zip(cfgs, setups, results, shadow_params):
    rows.append(_attack_row(c, st.model.apply, res, pool_x, pool_y, member, split, attacks,
                            sp, ins, per_class=per_class, seed=seed))
  return rows


def _attack_row(cfg, apply_fn, result, pool_x, pool_y, member, split, attacks,
                shadow_params, ins, *, per_class, seed) -> dict[str, Any]:
  """One target's row of :func:`membership_inference_many`."""
  params, s = result.params, result.summary
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
  lp = {k: mia.log_probs(apply_fn, params, pool_x[i]) for k, i in split._asdict().items()}
  loss = {k: -np.take_along_axis(v, np.asarray(pool_y[split._asdict()[k]], np.int64)[:, None],
                                 axis=1)[:, 0] for k, v in lp.items()}
  row["loss_members"] = float(np.mean(loss["eval_members"]))
  row["loss_nonmembers"] = float(np.mean(loss["eval_nonmembers"]))
  row["train_accuracy_members"] = float(np.mean(
      np.argmax(lp["eval_members"], 1) == pool_y[split.eval_members]))
  if "loss_threshold" in attacks:
    res = metrics.calibrated(-loss["calib_members"], -loss["calib_nonmembers"],
                             -loss["eval_members"], -loss["eval_nonmembers"])
    row.update(res.as_row("loss_threshold"))
  if shadow_params is not None:
    attack = mia.fit_shadow_attack(apply_fn, shadow_params, pool_x, pool_y, ins,
                                   per_class=per_class, seed=seed)
    row.update(shadow_models=attack.num_shadow,
               shadow_in_sample_accuracy=attack.shadow_accuracy, shadow_per_class=per_class)
    if "shadow" in attacks:
      m, o = split.eval_members, split.eval_nonmembers
      res = metrics.evaluate(0.5, attack.predict(lp["eval_members"], pool_y[m]),
                             attack.predict(lp["eval_nonmembers"], pool_y[o]), held_out=True)
      row.update(res.as_row("shadow"))
    if "reference" in attacks:
      sc = {k: mia.reference_scores(attack, lp[k], pool_y[i], i)
            for k, i in split._asdict().items()}
      res = metrics.calibrated(sc["calib_members"], sc["calib_nonmembers"],
                               sc["eval_members"], sc["eval_nonmembers"])
      row.update(res.as_row("reference"))
  return row
