"""Membership-inference attacks on a trained classifier.

Two attacks, both black-box on the model's outputs:

* :func:`loss_threshold_attack` -- Yeom, Giacomelli, Fredrikson & Jha, "Privacy risk
  in machine learning: analyzing the connection to overfitting", CSF 2018: the score
  of a record is minus the target's loss on it; a record is called a member when the
  score clears a threshold. The threshold is chosen on a calibration split and the
  attack is reported on a disjoint evaluation split (``threshold_held_out``).
* :func:`shadow_attack` -- Shokri, Stronati, Song & Shmatikov, "Membership inference
  attacks against machine learning models", S&P 2017: shadow models trained by the
  target's own procedure on data whose membership the attacker knows teach an
  attack classifier to tell members from non-members by the model's output.

The model is given as ``apply_fn(params, x) -> logits [n, C]``
(:meth:`fedjax_dp.models.Model.apply`). Engine runs are wired in
:mod:`fedjax_dp.attacks.federated`; DP upper bounds are in
:mod:`fedjax_dp.attacks.bounds`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.attacks import metrics

Params = Any
ApplyFn = Callable[[Params, jax.Array], jax.Array]


# ----------------------------------------------------------------------------- model outputs


@functools.partial(jax.jit, static_argnums=0)
def _log_probs(apply_fn, params, x):
  return jax.nn.log_softmax(apply_fn(params, x).astype(jnp.float32), axis=-1)


def log_probs(apply_fn: ApplyFn, params: Params, x, batch_size: int = 4096) -> np.ndarray:
  """Log-softmax outputs ``[n, C]`` of the model on ``x [n, ...]``, in batches.

  ``apply_fn`` must be hashable (a bound method of a frozen :class:`Model` is); it is
  a static argument of the jitted call.
  """
  x = np.asarray(x)
  out = [np.asarray(_log_probs(apply_fn, params, x[i:i + batch_size]))
         for i in range(0, len(x), batch_size)]
  return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def per_example_loss(apply_fn: ApplyFn, params: Params, x, y, batch_size: int = 4096
                     ) -> np.ndarray:
  """Softmax cross-entropy ``[n]`` of every record (the loss-threshold attack's score
  is its negative)."""
  lp = log_probs(apply_fn, params, x, batch_size)
  return -np.take_along_axis(lp, np.asarray(y, np.int64)[:, None], axis=1)[:, 0]


# ----------------------------------------------------------------------------- candidates


class Split(NamedTuple):
  """Indices of a balanced membership evaluation.

  Attributes:
    calib_members, calib_nonmembers: records the attacker may use, with their labels,
      to choose a threshold (equal sizes).
    eval_members, eval_nonmembers: disjoint records the attack is reported on (equal
      sizes).
  """

  calib_members: np.ndarray
  calib_nonmembers: np.ndarray
  eval_members: np.ndarray
  eval_nonmembers: np.ndarray


def balanced_split(members, nonmembers, *, calibration_fraction: float = 0.5,
                   max_per_side: int | None = None, seed: int = 0) -> Split:
  """Draws equally many members and non-members and splits them into calibration and
  evaluation parts.

  Args:
    members: candidate member ids (any integers, e.g. indices into a pool).
    nonmembers: candidate non-member ids.
    calibration_fraction: fraction of each side used for calibration, in ``[0, 1)``;
      0 leaves everything for evaluation (for attacks calibrated otherwise).
    max_per_side: cap on the number of members (= non-members) drawn.
    seed: seed of the draw (``numpy.random.default_rng([seed, 0])``).

  Returns:
    A :class:`Split`.
  """
  if not 0.0 <= calibration_fraction < 1.0:
    raise ValueError(f"calibration_fraction must be in [0, 1), got {calibration_fraction}")
  members, nonmembers = np.asarray(members), np.asarray(nonmembers)
  n = min(len(members), len(nonmembers))
  if max_per_side is not None:
    n = min(n, int(max_per_side))
  n_cal = round(calibration_fraction * n)
  if n - n_cal < 1 or (calibration_fraction > 0 and n_cal < 1):
    raise ValueError(f"too few candidates for a balanced split: {len(members)} members, "
                     f"{len(nonmembers)} non-members")
  rng = np.random.default_rng([seed, 0])
  m = rng.permutation(members)[:n]
  o = rng.permutation(nonmembers)[:n]
  return Split(m[:n_cal], o[:n_cal], m[n_cal:], o[n_cal:])


# ----------------------------------------------------------------------------- Yeom et al.


def loss_threshold_attack(member_losses, nonmember_losses, *,
                          calibration_fraction: float = 0.5, seed: int = 0
                          ) -> metrics.AttackResult:
  """Yeom et al. (2018) loss-threshold attack, calibrated on held-out records.

  Score = -loss. Members and non-members are balanced, split into a calibration and
  an evaluation part (:func:`balanced_split`); the threshold maximising TPR - FPR on
  the calibration part is applied to the evaluation part. (Yeom et al. set the
  threshold to the mean training loss, which the attacker is assumed to know; the
  calibrated threshold is at least as strong and needs no such knowledge beyond
  labelled calibration records.)

  Args:
    member_losses: per-example losses ``[n]`` of the target on training records.
    nonmember_losses: losses ``[m]`` on records it was not trained on.
    calibration_fraction: fraction of each side used to choose the threshold.
    seed: seed of the balanced draw.

  Returns:
    The :class:`~fedjax_dp.attacks.metrics.AttackResult` on the evaluation part
    (``threshold`` in score units, i.e. minus a loss).
  """
  ml, nl = np.asarray(member_losses, np.float64), np.asarray(nonmember_losses, np.float64)
  s = balanced_split(np.arange(len(ml)), np.arange(len(nl)),
                     calibration_fraction=calibration_fraction, seed=seed)
  return metrics.calibrated(-ml[s.calib_members], -nl[s.calib_nonmembers],
                            -ml[s.eval_members], -nl[s.eval_nonmembers])


# ----------------------------------------------------------------------------- Shokri et al.


def attack_features(log_p: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Attack-model features of records from the model's log-probabilities.

  ``[log p sorted in decreasing order (C values), logit p_y]``: the sorted prediction
  vector (Salem et al., NDSS 2019, who find sorting loses little against Shokri's
  raw per-class vector) plus the logit of the true label's probability,
  ``log p_y - log(1 - p_y)`` (the score of Carlini et al., S&P 2022). The logit
  carries the loss signal of Yeom et al. on a scale that separates small losses:
  for p_y near 1 it is about ``-log(loss)``, where log p_y itself is flat. Computed
  stably as ``log p_y - logsumexp_{j != y} log p_j`` and clipped to [-50, 50], like
  the log-probabilities, so saturated softmax outputs stay finite.

  Args:
    log_p: ``[n, C]`` log-softmax outputs.
    y: ``[n]`` true labels.

  Returns:
    ``[n, C + 1]`` float64 features.
  """
  log_p = np.asarray(log_p, np.float64)
  y = np.asarray(y, np.int64)
  true = np.take_along_axis(log_p, y[:, None], axis=1)[:, 0]
  others = log_p.copy()
  np.put_along_axis(others, y[:, None], -np.inf, axis=1)
  peak = np.max(others, axis=1, keepdims=True)
  rest = peak[:, 0] + np.log(np.sum(np.exp(others - peak), axis=1))
  logit = np.clip(true - rest, -50.0, 50.0)
  top = -np.sort(-np.maximum(log_p, -50.0), axis=1)
  return np.concatenate([top, logit[:, None]], axis=1)


class LogisticModel(NamedTuple):
  """A standardised logistic regression ``sigmoid(w . (f - mean) / std + b)``."""

  mean: np.ndarray
  std: np.ndarray
  w: np.ndarray
  b: float

  def predict(self, f: np.ndarray) -> np.ndarray:
    z = ((np.asarray(f, np.float64) - self.mean) / self.std) @ self.w + self.b
    return 1.0 / (1.0 + np.exp(-z))


def fit_logistic(f: np.ndarray, labels: np.ndarray, *, l2: float = 1e-3) -> LogisticModel:
  """Fits an L2-regularised logistic regression on standardised features.

  scikit-learn's L-BFGS solver (a dependency already): the problem is small and
  convex, and a host solver avoids compiling one program per class size.

  Args:
    f: features ``[n, F]``.
    labels: 0/1 labels ``[n]`` (1 = member), both values present.
    l2: ridge penalty: the objective is mean log-loss + ``l2 * |w|^2``.

  Returns:
    The fitted :class:`LogisticModel`.
  """
  from sklearn.linear_model import LogisticRegression

  f = np.asarray(f, np.float64)
  labels = np.asarray(labels).astype(bool)
  mean, std = f.mean(0), f.std(0) + 1e-8
  # sklearn minimises |w|^2 / 2 + C sum log-loss, i.e. C = 1 / (2 n l2).
  clf = LogisticRegression(C=1.0 / (2.0 * len(labels) * l2), max_iter=1000)
  clf.fit((f - mean) / std, labels)
  return LogisticModel(mean, std, clf.coef_[0].astype(np.float64), float(clf.intercept_[0]))


class ReferenceStats(NamedTuple):
  """How the shadow models that did not train on a record score it (offline LiRA).

  Attributes:
    out_mean: ``[N]`` mean over the shadow models without pool record ``i`` of the
      logit of its true label's probability (:func:`attack_features`' last column);
      NaN where every shadow model trained on it.
    out_count: ``[N]`` number of such shadow models.
    out_std: the pooled standard deviation of that logit around ``out_mean`` (one
      global value: with few shadow models per record a per-record variance is
      too noisy, Carlini et al. 2022, section VI-A).
  """

  out_mean: np.ndarray
  out_count: np.ndarray
  out_std: float


class ShadowAttack(NamedTuple):
  """A trained attack classifier and how it was trained.

  Attributes:
    models: one :class:`LogisticModel` per class (``per_class``) or a single one
      under key ``-1``.
    per_class: whether the true label picks the model (Shokri et al.).
    num_shadow: shadow models trained.
    shadow_train_size: records each shadow model was trained on.
    shadow_accuracy: the attack classifier's balanced accuracy on its own (shadow)
      training records: an optimistic in-sample figure, for diagnostics.
    reference: per-record statistics of the shadow models that did NOT train on each
      pool record (:class:`ReferenceStats`), for :func:`reference_scores`.
  """

  models: dict[int, LogisticModel]
  per_class: bool
  num_shadow: int
  shadow_train_size: int
  shadow_accuracy: float
  reference: ReferenceStats | None = None

  def predict(self, log_p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(member) ``[n]`` for records with outputs ``log_p [n, C]`` and labels ``y``."""
    return _predict_features(self, attack_features(log_p, y), np.asarray(y))


@functools.partial(jax.jit, static_argnums=0)
def _stacked_log_probs(apply_fn, stacked_params, x):
  return jax.vmap(lambda p: jax.nn.log_softmax(apply_fn(p, x).astype(jnp.float32)))(
      stacked_params)


def _stack_log_probs(apply_fn, stacked_params, x, num):
  """Log-probabilities ``[S, n, C]`` of ``num`` stacked models on the same records."""
  x = np.asarray(x)
  parts = [np.asarray(_stacked_log_probs(apply_fn, stacked_params, x[i:i + 2048]))
           for i in range(0, len(x), 2048)]
  out = np.concatenate(parts, axis=1)
  assert out.shape[0] == num, (out.shape, num)
  return out


def vectorize(train_fn: Callable[[jax.Array, jax.Array, jax.Array], Params]):
  """Turns a pure JAX ``train_fn(seed, x [n, ...], y [n]) -> params`` into the batched
  form :func:`train_shadow_attack` accepts: one jitted, vmapped program training all
  shadow models, ``(seeds [S], x [S, n, ...], y [S, n]) -> params`` with a leading
  ``[S]`` axis."""
  return jax.jit(jax.vmap(train_fn))


def train_shadow_attack(apply_fn: ApplyFn, train_fn: Callable, pool_x, pool_y,
                        train_size: int, *, num_shadow: int = 25, batched: bool = False,
                        per_class: bool = True, seed: int = 0, l2: float = 1e-3
                        ) -> ShadowAttack:
  """Trains Shokri et al.'s attack classifier from shadow models.

  Choices the papers leave open (Yuan et al., Table III, give only "25 shadow
  models"; spec yuan_amplitude_varying.md section 7.3 item 15):

  * Shadow data: shadow model ``s`` trains on ``train_size`` records drawn without
    replacement from the attacker's ``pool`` (``default_rng([seed, 1, s])``); the rest
    of the pool are its non-members. ``train_size`` should equal the target's number
    of training records. The pool is data from the target's distribution and may
    overlap the target's training set (Shokri et al.'s disjoint sets are the harder
    case for the attacker; small datasets leave no room for them). The attack's labels
    come only from the shadow models' own membership, so the target's membership
    never leaks into the attack.
  * Shadow training: ``train_fn`` is the target's training procedure (the caller's:
    e.g. the same federated DP or non-private run, see
    :func:`fedjax_dp.attacks.federated.federated_train_fn`), seeded per shadow model.
  * Features: :func:`attack_features` (sorted log-probability vector + logit of p_y).
  * Attack classifier: per true class (Shokri et al.'s per-class attack models) or a
    single one (``per_class=False``); each an L2-regularised logistic regression on
    standardised features (:func:`fit_logistic`). Every shadow model contributes
    equally many members and non-members (the smaller side, drawn at random), so the
    classifier's 0.5 threshold targets balanced accuracy.

  Args:
    apply_fn: ``apply_fn(params, x) -> logits``.
    train_fn: ``train_fn(seed: int, x [n, ...], y [n]) -> params``; with ``batched``,
      ``train_fn(seeds [S], x [S, n, ...], y [S, n]) -> params`` stacked on a leading
      ``[S]`` axis (e.g. :func:`vectorize` of a pure JAX function: all shadow models
      in one compiled program). Unbatched functions are called in a loop.
    pool_x: the attacker's records ``[N, ...]``.
    pool_y: their labels ``[N]``.
    train_size: records per shadow model, ``0 < train_size < N``.
    num_shadow: number of shadow models (Yuan et al.: 25).
    batched: whether ``train_fn`` trains all shadow models in one call.
    per_class: one attack model per true class.
    seed: seed of the shadow data draws; shadow ``s`` trains with seed ``seed * 1000 + s``.
    l2: ridge penalty of the attack classifier.

  Returns:
    The trained :class:`ShadowAttack`.
  """
  pool_x, pool_y = np.asarray(pool_x), np.asarray(pool_y)
  ins, seeds = shadow_draws(len(pool_y), train_size, num_shadow, seed)
  if batched:
    stacked = train_fn(seeds, pool_x[ins], pool_y[ins])
  else:
    stacked = [train_fn(int(seeds[s]), pool_x[ins[s]], pool_y[ins[s]])
               for s in range(num_shadow)]
  return fit_shadow_attack(apply_fn, stacked, pool_x, pool_y, ins, per_class=per_class,
                           seed=seed, l2=l2)


def shadow_draws(n_pool: int, train_size: int, num_shadow: int, seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
  """The shadow models' training sets and seeds (see :func:`train_shadow_attack`).

  Returns:
    ``(ins [S, train_size], seeds [S])``: shadow ``s`` trains on pool records
    ``ins[s]`` (drawn without replacement by ``default_rng([seed, 1, s])``) with
    training seed ``seeds[s] = seed * 1000 + s``.
  """
  if not 0 < train_size < n_pool:
    raise ValueError(f"train_size must be in (0, {n_pool}) (the pool size), got {train_size}")
  if num_shadow < 1:
    raise ValueError(f"num_shadow must be >= 1, got {num_shadow}")
  ins = np.stack([np.random.default_rng([seed, 1, s]).permutation(n_pool)[:train_size]
                  for s in range(num_shadow)])
  seeds = np.asarray([seed * 1000 + s for s in range(num_shadow)], np.uint32)
  return ins, seeds


def reference_stats(logit: np.ndarray, ins: np.ndarray) -> ReferenceStats:
  """Per-record "out" statistics of shadow models (see :class:`ReferenceStats`).

  Args:
    logit: ``[S, N]`` logit of the true label's probability of every shadow model on
      every pool record.
    ins: ``[S, n]`` pool indices each shadow model trained on.
  """
  num_shadow, n_pool = logit.shape
  out = np.ones((num_shadow, n_pool), bool)
  out[np.arange(num_shadow)[:, None], ins] = False
  count = out.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = np.where(count > 0, np.sum(np.where(out, logit, 0.0), 0) / count, np.nan)
  dev = np.where(out, logit - np.nan_to_num(mean)[None], 0.0)
  dof = max(int(np.sum(np.maximum(count - 1, 0))), 1)
  std = float(np.sqrt(np.sum(dev ** 2) / dof))
  return ReferenceStats(mean, count, max(std, 1e-6))


def reference_scores(attack: ShadowAttack, log_p: np.ndarray, y: np.ndarray,
                     pool_index: np.ndarray) -> np.ndarray:
  """Difficulty-calibrated membership scores: offline LiRA (Carlini, Chien, Nasr,
  Song, Terzis & Tramer, "Membership inference attacks from first principles",
  S&P 2022, section VI-A; the per-example calibration of Watson et al., ICLR 2022).

  The loss-threshold attack compares every record with one threshold, so an easy
  non-member (small loss anywhere) looks like a member and a hard member like a
  non-member. Here the target's logit of p_y on a record is compared with what
  shadow models that did NOT train on that record give it:
  ``score = (logit_target - out_mean[i]) / out_std``, a one-sided z-score (the
  likelihood ratio of the paper's offline variant, which has no "in" models,
  is monotone in it). Records every shadow model trained on get score 0.

  Args:
    attack: a :class:`ShadowAttack` with ``reference`` (from
      :func:`fit_shadow_attack` / :func:`train_shadow_attack`).
    log_p: ``[n, C]`` the target's log-probabilities on the records.
    y: ``[n]`` their labels.
    pool_index: ``[n]`` their indices in the shadow models' pool.

  Returns:
    Scores ``[n]`` (higher = member); threshold them on calibration records.
  """
  if attack.reference is None:
    raise ValueError("reference_scores: the shadow attack kept no reference statistics")
  ref = attack.reference
  logit = attack_features(log_p, y)[:, -1]
  mean = ref.out_mean[np.asarray(pool_index)]
  return np.where(np.isnan(mean), 0.0, (logit - np.nan_to_num(mean)) / ref.out_std)


def fit_shadow_attack(apply_fn: ApplyFn, stacked_params, pool_x, pool_y, ins, *,
                      per_class: bool = True, seed: int = 0, l2: float = 1e-3
                      ) -> ShadowAttack:
  """Fits the attack classifier on trained shadow models (see
  :func:`train_shadow_attack`, which trains them and calls this).

  Args:
    apply_fn: ``apply_fn(params, x) -> logits``.
    stacked_params: the shadow models' params stacked on a leading ``[S]`` axis, or
      a list of ``S`` params.
    pool_x, pool_y: the attacker's pool ``[N, ...]``, ``[N]``.
    ins: ``[S, n]`` pool indices each shadow model trained on
      (:func:`shadow_draws`).
    per_class, seed, l2: as in :func:`train_shadow_attack`.

  Returns:
    The :class:`ShadowAttack`, with the ``reference`` statistics of every pool record.
  """
  pool_x, pool_y, ins = np.asarray(pool_x), np.asarray(pool_y), np.asarray(ins)
  num_shadow, train_size = ins.shape
  n_pool = len(pool_y)
  if isinstance(stacked_params, list):
    lp = np.stack([log_probs(apply_fn, p, pool_x) for p in stacked_params])
  else:
    lp = _stack_log_probs(apply_fn, stacked_params, pool_x, num_shadow)
  logit = np.stack([attack_features(lp[s], pool_y)[:, -1] for s in range(num_shadow)])
  reference = reference_stats(logit, ins)
  feats, labels, ys = [], [], []
  for s in range(num_shadow):
    member = np.zeros(n_pool, bool)
    member[ins[s]] = True
    split = balanced_split(np.flatnonzero(member), np.flatnonzero(~member),
                           calibration_fraction=0.0, seed=seed * 1000 + s)
    idx = np.concatenate([split.eval_members, split.eval_nonmembers])
    feats.append(attack_features(lp[s, idx], pool_y[idx]))
    labels.append(member[idx])
    ys.append(pool_y[idx])
  f, lab, yy = np.concatenate(feats), np.concatenate(labels), np.concatenate(ys)
  models: dict[int, LogisticModel] = {}
  if per_class:
    for c in np.unique(yy):
      sel = yy == c
      if lab[sel].all() or not lab[sel].any():
        continue  # one-sided class: predict() leaves it at 0.5
      models[int(c)] = fit_logistic(f[sel], lab[sel], l2=l2)
  else:
    models[-1] = fit_logistic(f, lab, l2=l2)
  attack = ShadowAttack(models, per_class, num_shadow, train_size, float("nan"), reference)
  scores = _predict_features(attack, f, yy)
  acc = 0.5 * (np.mean(scores[lab] >= 0.5) + np.mean(scores[~lab] < 0.5))
  return attack._replace(shadow_accuracy=float(acc))


def _predict_features(attack: ShadowAttack, f: np.ndarray, y: np.ndarray) -> np.ndarray:
  if not attack.per_class:
    return attack.models[-1].predict(f)
  out = np.full(len(y), 0.5)
  for c, m in attack.models.items():
    out[y == c] = m.predict(f[y == c])
  return out


def shadow_attack(attack: ShadowAttack, apply_fn: ApplyFn, target_params: Params,
                  member_x, member_y, nonmember_x, nonmember_y) -> metrics.AttackResult:
  """Applies a trained shadow attack to the target on balanced members / non-members.

  The decision threshold is the attack classifier's 0.5, fixed by the shadow models
  alone, so the reported accuracy is held out (no target labels were used).

  Returns:
    The :class:`~fedjax_dp.attacks.metrics.AttackResult` (scores = P(member)).
  """
  s_in = attack.predict(log_probs(apply_fn, target_params, member_x), member_y)
  s_out = attack.predict(log_probs(apply_fn, target_params, nonmember_x), nonmember_y)
  return metrics.evaluate(0.5, s_in, s_out, held_out=True)
