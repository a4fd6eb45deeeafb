"""Checkpoints of one run: everything its next round depends on, in one checked file.

A run's future is fixed by few things (ARCHITECTURE.md, decision 4: randomness is
derived, never carried): client selection is ``np.random.default_rng([seed, t])``
and every device key is ``fold_in(seed, round, ...)``, so the sampler's state is the
round index ``t``. What does carry state is saved here:

* the model parameters (the lane's pytree, exact float32 bytes) and the server's
  carried states (:class:`fedjax_dp.training.rounds.CarriedParams`: a correlated
  mechanism's noise state, the server optimizer's state; a run that carries neither
  saves the bare model, as before either existed),
* ``t``, the planned horizon, status, the last test ``(loss, accuracy)``,
* the schedule's state (a NamedTuple: CRD's budget, spent budget, horizon, last
  loss, ...) and the accountant's state (:class:`fedjax_dp.privacy.plan.AccountantState`
  with its :class:`~fedjax_dp.privacy.accounting.RdpState`),
* the metric rows so far and the wall time spent (only the wall-clock columns of a
  resumed run differ from an uninterrupted one),
* the config, so that a checkpoint is never resumed under another one, and the
  content fingerprint of the data the run loaded (:mod:`fedjax_dp.data.fingerprint`),
  so that it is never resumed on other data (its noise stream would change mid-run).

Restoring all of it and running on gives the same ``metrics.csv``, ``summary.json``
and final model as a run that was never stopped, bit for bit on the same machine.

Format. One file, ``checkpoint.msgpack``: a magic line, the SHA-256 of the payload
in hex, a newline, and the payload, which is ``flax.serialization`` msgpack of the
state above (NamedTuples through ``to_state_dict``/``from_state_dict`` against a
freshly initialised template). Why msgpack and not orbax-checkpoint: the state of a
run here is a few MB on one host, written every few rounds from the host loop;
orbax's strengths (sharded multi-host arrays, async writes, step directories with
garbage collection) do not apply, while one self-contained file can be written
atomically (temporary name + ``os.replace``, as every run file is) and carries its
own checksum, which is verified before anything is loaded. A file that fails the
check raises :class:`CheckpointError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from flax import serialization

from fedjax_dp import sharding
from fedjax_dp.config import ConfigError, UserError, schema
from fedjax_dp.files import outputs, results
from fedjax_dp.training import rounds

FILENAME = "checkpoint.msgpack"
MODEL_FILENAME = "model.msgpack"
_MAGIC = b"fedjax_dp checkpoint v1\n"
# Config fields that do not change a run's results: a run may resume with them changed.
# data.placement moves the same client data by another route (identical results), so a
# run checkpointed with one placement resumes with the other.
NON_RESULT_FIELDS = ("progress", "checkpoint.every", "data.placement", "compilation_cache")


class CheckpointError(UserError):
  """A checkpoint file is corrupt or unreadable; the message names the file."""


class RunState(NamedTuple):
  """The host state of one run at the end of a round (see the module docstring).

  Attributes:
    t: rounds completed (the next round's index).
    horizon: the schedule's current planned number of rounds.
    status: ``'completed'`` (also while running), ``'diverged'`` or
      ``'budget_exhausted'``.
    running: whether the run plans further rounds.
    diverged_round: the round whose loss was non-finite, or None.
    test: the last evaluated ``(test_loss, test_accuracy)``.
    schedule_state: the schedule's NamedTuple state.
    acct: the accountant's state.
    rows: the metric rows so far (dicts of Python scalars).
    wall: seconds of wall time spent on the run so far.
  """

  t: int
  horizon: int
  status: str
  running: bool
  diverged_round: int | None
  test: tuple[float, float]
  schedule_state: Any
  acct: Any
  rows: list[dict[str, Any]]
  wall: float


def _scalar(v: Any) -> Any:
  return v.item() if isinstance(v, np.generic) else v


def comparable_config(config: dict[str, Any]) -> dict[str, Any]:
  """``config`` (a ``to_dict()``) as JSON types, without :data:`NON_RESULT_FIELDS`."""
  return results.json_without(config, NON_RESULT_FIELDS)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  """Fields whose values differ between a stored config ``old`` and ``new``, as
  ``'key: old -> new'`` (ignoring :data:`NON_RESULT_FIELDS`).

  Both are read in this release's schema (:func:`fedjax_dp.config.schema.upgraded`): a field
  ``old`` was stored without (added by a later release) ran at its default, and only
  the fields both hold are compared.

  Raises:
    config.ConfigError: ``old`` was written by a newer release.
  """
  a = _flatten(comparable_config(schema.upgraded(old)))
  b = _flatten(comparable_config(schema.upgraded(new)))
  return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]


def save(path: str | os.PathLike, state: RunState, params: Any,
         config: dict[str, Any], data_fingerprint: str | None = None) -> None:
  """Writes ``state``, ``params``, ``config`` and the data's fingerprint to ``path``
  atomically, with a checksum."""
  payload = serialization.msgpack_serialize({
      "config": json.dumps(results._jsonable(config), sort_keys=True),
      "data_fingerprint": data_fingerprint,
      "t": int(state.t), "horizon": int(state.horizon), "status": state.status,
      "running": bool(state.running),
      "diverged_round": None if state.diverged_round is None else int(state.diverged_round),
      "test": [float(v) for v in state.test],
      "schedule_state": serialization.to_state_dict(state.schedule_state),
      "acct": serialization.to_state_dict(state.acct),
      "rows": [{k: _scalar(v) for k, v in r.items()} for r in state.rows],
      "wall": float(state.wall),
      "params": rounds.carried_state_dict(params),
  })
  digest = hashlib.sha256(payload).hexdigest().encode()
  outputs.atomic_write(Path(path), _MAGIC + digest + b"\n" + payload, owned=True)


def load(path: str | os.PathLike, *, schedule_template: Any, acct_template: Any,
         params_template: Any) -> tuple[RunState, Any, dict[str, Any]]:
  """Reads a checkpoint written by :func:`save`, verifying its checksum first.

  Args:
    path: the checkpoint file.
    schedule_template, acct_template, params_template: freshly initialised states of
      the same structure (they give the NamedTuple and pytree types back).

  Returns:
    ``(state, params, config)``.

  Raises:
    CheckpointError: the file is truncated, fails its checksum or does not hold
      a checkpoint of these structures; the message names the file.
  """
  path = Path(path)
  payload = verified_payload(path)
  try:
    d = serialization.msgpack_restore(payload)
    state = RunState(
        t=int(d["t"]), horizon=int(d["horizon"]), status=str(d["status"]),
        running=bool(d["running"]), diverged_round=d["diverged_round"],
        test=tuple(float(v) for v in d["test"]),
        schedule_state=serialization.from_state_dict(schedule_template, d["schedule_state"]),
        acct=serialization.from_state_dict(acct_template, d["acct"]),
        rows=[dict(r) for r in d["rows"]], wall=float(d["wall"]))
    params = rounds.carried_from_state_dict(params_template, d["params"])
    config = json.loads(d["config"])
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"unreadable checkpoint {path}: {e}") from e
  return state, params, config


def recorded_fingerprint(path: str | os.PathLike) -> str | None:
  """The data fingerprint a checkpoint recorded (None: written before fingerprints).

  Raises:
    CheckpointError: as :func:`verified_payload`.
  """
  d = serialization.msgpack_restore(verified_payload(path))
  value = d.get("data_fingerprint") if isinstance(d, dict) else None
  return value if isinstance(value, str) else None


def verified_payload(path: str | os.PathLike) -> bytes:
  """The payload of checkpoint file ``path`` once its header and SHA-256 are checked
  (cheap: a run calls it before building anything, to refuse a corrupt file first).

  Raises:
    CheckpointError: not a checkpoint, or a checksum mismatch; the message names the file.
  """
  path = Path(path)
  blob = path.read_bytes()
  head = len(_MAGIC) + 65
  if not blob.startswith(_MAGIC) or len(blob) < head or blob[head - 1:head] != b"\n":
    raise CheckpointError(f"corrupt checkpoint {path}: not a fedjax_dp checkpoint; delete it "
                          "or use --overwrite to start the run afresh")
  digest, payload = blob[len(_MAGIC):head - 1], blob[head:]
  if hashlib.sha256(payload).hexdigest().encode() != digest:
    raise CheckpointError(f"corrupt checkpoint {path}: checksum mismatch; delete it or use "
                          "--overwrite to start the run afresh")
  return payload


def save_model(path: str | os.PathLike, params: Any) -> None:
  """Writes the final model (``flax.serialization.to_bytes``), atomically."""
  outputs.atomic_write(Path(path), serialization.to_bytes(params), owned=True)


def claim_run_dir(path: str | os.PathLike, config: dict[str, Any], *,
                  overwrite: bool = False) -> None:
  """Checks that run directory ``path`` may be written by a run of ``config``, and
  claims it (:func:`fedjax_dp.files.outputs.claim`, kind ``'run'``).

  A new or empty directory, or one whose run wrote nothing but ``config.json`` (it
  failed before its first round), is free; one with the same config (up to
  :data:`NON_RESULT_FIELDS`) is resumed. With ``overwrite``, the files the project
  wrote there are removed first (only those: anything else is refused, named). In a
  multi-host job only the primary process claims; the others return at once.

  Raises:
    config.ConfigError: ``path`` holds a run of another config; the message names
      the differing fields.
    outputs.OutputError: ``path`` is not a run directory of the project's, or cannot
      be written.
  """
  if not sharding.is_primary():
    return

  def same_config(path: Path) -> None:
    found = path / "config.json"
    if not found.exists() or not any((path / name).exists() for name in outputs.RUN_FILES
                                     if name != "config.json"):
      return
    try:
      have = json.loads(found.read_text())
    except ValueError as e:
      raise ConfigError(f"--out {path}: unreadable {found} ({e}); use --overwrite to replace "
                        "it") from e
    diff = config_diff(have, config)
    if diff:
      raise ConfigError(f"--out {path} holds a run of a different config "
                        f"({'; '.join(diff[:4])}{'; ...' if len(diff) > 4 else ''}); use "
                        "--overwrite to replace it, or another --out")

  outputs.claim(path, "run", overwrite=overwrite, check=same_config)
