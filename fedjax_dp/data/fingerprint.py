"""A content fingerprint of the data a run loaded (part of its noise identity).

The noise stream of a release is derived from what defines it
(:mod:`fedjax_dp.config.noise_identity`): its config AND the data it was computed
on. A config names its data by ``data.name`` and ``data.dir``, but the files at a
path can change between two runs; two releases on different data must not share
noise (a difference of two releases that share noise cancels it). So the identity
also hashes the content the run loaded, never its path:

* data read from files (``Dataset.source`` of kind ``'files'``): the SHA-256 of
  every file read (the loaders already compute them for ``summary.json``), with
  the file names but not their directory, and the array shapes;
* anything else (the embedded ``digits``, tensorflow-datasets, arrays given from
  Python): the arrays themselves (dtype, shape, bytes).

The partition of the data into clients is a deterministic function of the config
(seed included), which the identity holds already. The fingerprint is recorded in
``summary.json`` (``data_fingerprint``) and in the checkpoint, so a run is never
resumed on other data.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

_VERSION = b"fedjax_dp data fingerprint v1\n"


def _update_arrays(digest: Any, arrays) -> None:
  for a in arrays:
    if a is None:
      digest.update(b"none;")
      continue
    a = np.ascontiguousarray(np.asarray(a))
    digest.update(f"{a.dtype.str}{a.shape};".encode())
    digest.update(memoryview(a).cast("B"))


def array_digest(*arrays: Any) -> str:
  """SHA-256 (32 hex digits) of ``arrays``' dtypes, shapes and bytes, in order
  (``None`` entries allowed)."""
  digest = hashlib.sha256(_VERSION)
  _update_arrays(digest, arrays)
  return digest.hexdigest()[:32]


def dataset_fingerprint(ds: Any) -> str:
  """The content fingerprint (32 hex digits) of a loaded
  :class:`fedjax_dp.data.datasets.Dataset` (module docstring)."""
  source = ds.source or {}
  files = source.get("files") if source.get("kind") == "files" else None
  digest = hashlib.sha256(_VERSION)
  digest.update(f"{ds.name}|{int(ds.num_classes)}|".encode())
  if files:
    named = sorted((os.path.basename(path), sha) for path, sha in files.items())
    digest.update(json.dumps(named).encode())
    shapes = [None if a is None else (np.asarray(a).dtype.str, tuple(np.shape(a)))
              for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.train_groups)]
    digest.update(json.dumps(shapes).encode())
  else:
    _update_arrays(digest, (ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.train_groups))
  return digest.hexdigest()[:32]
