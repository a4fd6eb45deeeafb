"""Which random stream a run's noise comes from: a hash of what the run releases.

Two releases that draw the same noise at different scales give away the noiseless
aggregate: ``w_a = m + s_a n`` and ``w_b = m + s_b n`` solve for ``m``. So the noise
(and minibatch) stream of a run is derived from its identity, a hash of its
resolved config and of the content of the data it loaded (:func:`stream`; the data's
fingerprint, :mod:`fedjax_dp.data.fingerprint`): runs whose configs differ in anything
that can change their release, or that read different data under the same config
(files changed at the same path), draw independent noise, and the same config on the
same data draws the same noise again, so a resumed run, a sweep point re-run alone and
a lane of a batched sweep all reproduce the single run bit for bit.

The fields in :data:`EXCLUDED_FIELDS` are left out of the hash because they cannot
change what is released (a label, display, when state is saved, how the same
arithmetic is laid out in memory); two configs that differ only there are the same
release and may share its noise. Every other field is in, ``data.dir`` included
(another directory may hold other data). A field a later release added
(:data:`fedjax_dp.config.schema.ADDED_FIELDS`) is left out while it holds its default, so
runs from before it keep their noise.

Opt-ins:

* ``privacy.common_random_numbers=True``: common random numbers. The stream is
  ``(seed, privacy.noise_stream)`` only, shared by every run of that seed and
  stream that also opts in (sweep points that differ in epsilon draw the same noise
  at different scales: a variance-reduction device for comparing configs, never for
  releasing more than one of them).
* ``privacy.noise_seed='os'``: fresh entropy from the operating system
  (:func:`secrets.token_hex`, 128 bits) for a real release. It is drawn once and
  written into the run directory's ``config.json`` (and ``summary.json``) in
  place of ``'os'``, and the same command run again on that directory reads it back
  (:func:`resolve`), so a resume continues the same release. Deterministic noise
  (the default) is a simulation convenience: anyone with the config can redraw it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp import config as config_lib
from fedjax_dp.config import schema
from fedjax_dp.files import results

# Config fields that do not change the release (see the module docstring): the
# run's label (sweeps and optimal_t rename their runs), display, when a checkpoint
# is written (a resume is bit-exact), and how the same round is laid out: client
# chunks (keys are per client id), the convolution lowering, the per-example
# gradient chunk and the evaluation batch change only the float summation order;
# where the client data live (data.placement) and where compiled programs are kept
# (compilation_cache) change nothing.
EXCLUDED_FIELDS = ("name", "progress", "checkpoint.every", "server.client_chunk",
                   "server.conv_impl", "client.chunk_size", "eval.batch_size",
                   "data.placement", "compilation_cache")
OS = "os"
# The top bit of the first word marks a hashed identity, so it never equals a
# common-random-numbers stream ``(0, noise_stream)``.
_HASHED = np.uint32(0x80000000)


def _release_fields(config: dict[str, Any]) -> dict[str, Any]:
  """A config dict as canonical JSON values (integral floats as ints: ``8`` and
  ``8.0`` are one config), without :data:`EXCLUDED_FIELDS`."""
  return results.json_without(config, EXCLUDED_FIELDS + schema.defaulted_added_fields(config),
                              integral_floats_as_ints=True)


def identity(cfg) -> dict[str, Any]:
  """The fields of ``cfg`` that define its release (all but :data:`EXCLUDED_FIELDS`)."""
  return _release_fields(cfg.to_dict())


def stream(cfg, data_fingerprint: str | None = None) -> np.ndarray:
  """``uint32 [2]``: the run's noise stream (:attr:`engine.RoundArgs.stream`).

  64 bits of SHA-256 of :func:`identity` and ``data_fingerprint`` (the content of the
  data the run loaded, :func:`fedjax_dp.data.fingerprint.dataset_fingerprint`; two
  releases collide with probability 2^-63), or ``(0, privacy.noise_stream)`` with
  ``privacy.common_random_numbers`` (shared on purpose, whatever the data).

  Args:
    cfg: the run's resolved config.
    data_fingerprint: the data's content fingerprint; every run passes it (None only
      for callers that have no data, such as a test of the config part alone).

  Raises:
    config.ConfigError: ``privacy.noise_seed='os'`` not yet drawn (:func:`resolve`).
  """
  seed = cfg.privacy.get("noise_seed", "")
  if seed == OS:
    raise config_lib.ConfigError("privacy.noise_seed='os' must be drawn before the run "
                                 "(noise_identity.resolve; experiment.run does it)")
  if cfg.privacy.get("common_random_numbers", False):
    return np.array([0, int(cfg.privacy.noise_stream)], np.uint32)
  blob: dict[str, Any] = {"config": identity(cfg)}
  if data_fingerprint is not None:
    blob["data"] = str(data_fingerprint)
  text = json.dumps(blob, sort_keys=True, separators=(",", ":"))
  words = np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], ">u4").astype(np.uint32)
  words[0] |= _HASHED
  return words


def stream_hex(words: np.ndarray) -> str:
  """The stream as 16 hex digits (``summary.json``'s ``noise_stream_id``)."""
  return "".join(f"{int(w):08x}" for w in np.asarray(words, np.uint32))


def draw() -> str:
  """Fresh entropy for ``privacy.noise_seed`` (128 bits from the OS)."""
  return secrets.token_hex(16)


def agree(seed: str) -> str:
  """Process 0's ``seed`` (32 hex digits) on every process of a multi-host job, whose
  processes run one release and must draw the same noise."""
  if jax.process_count() == 1:
    return seed
  from jax.experimental import multihost_utils
  words = np.frombuffer(bytes.fromhex(seed), np.uint32)
  return np.asarray(multihost_utils.broadcast_one_to_all(words), np.uint32).tobytes().hex()


def resolve(cfg, recorded: dict[str, Any] | None = None):
  """``cfg`` with ``privacy.noise_seed='os'`` replaced by entropy (else ``cfg`` itself).

  Args:
    cfg: a config.
    recorded: the ``config.json`` (a dict) of an earlier invocation of this run, if
      any: its entropy is reused when it is otherwise the same config, so a resume
      continues the same release; else fresh entropy is drawn.
  """
  if cfg.privacy.get("noise_seed", "") != OS:
    return cfg
  seed = None
  if recorded is not None:
    have = recorded.get("privacy", {}).get("noise_seed")
    if isinstance(have, str) and len(have) == 32 and config_lib.NOISE_SEED_HEX.fullmatch(have):
      candidate = config_lib.override(cfg, [f"privacy.noise_seed={have}"])
      if identity(candidate) == _release_fields(schema.upgraded(recorded)):
        seed = have
  return config_lib.override(cfg, [f"privacy.noise_seed={agree(seed or draw())}"])


def recorded_config(run_dir: str | Path | None) -> dict[str, Any] | None:
  """The ``config.json`` of ``run_dir`` (None if there is none or it is unreadable)."""
  if run_dir is None:
    return None
  path = Path(run_dir) / "config.json"
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None
