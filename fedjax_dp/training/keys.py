"""Every random key of a round, derived from (seed, round, stream, client id, tag).

Randomness is derived, never carried (ARCHITECTURE.md, decision 4): a round's key is
``fold_in(PRNGKey(seed), t)`` (moved to the run's noise stream,
:func:`fedjax_dp.config.noise_identity.stream`), a client's is that key folded with
:data:`CLIENT_TAG` and its id, and the server's draws (central noise, aggregated
upload noise, the clip rule's count, the validation release) fold in a tag of their
own. So results never depend on chunking, padding, lanes or device count, and two
draws never share a key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SERVER_TAG = 1  # round_key -> fold_in(round_key, SERVER_TAG) for server-side noise
AGGREGATE_NOISE_TAG = 2  # server_key -> fold_in(., 2): the aggregated upload noise
CLIENT_TAG = 0  # round_key -> fold_in(fold_in(round_key, CLIENT_TAG), client_id)
STREAM_TAG = 3  # stream s != 0: round_key -> fold_in(fold_in(round_key, STREAM_TAG), s_0)...
COUNT_NOISE_TAG = 4  # server_key -> fold_in(., 4): noise of the clip rule's count
# round_key -> fold_in(., 5): noise of the released validation score on the selected
# clients' data (schedule.validation='clients', A-DPFL eq. (15))
VALIDATION_NOISE_TAG = 5
# round_key(seed, 0) -> fold_in(., 6): the correlated mechanisms' noise (tree nodes,
# BandMF's Z_t), which is indexed by node or round itself (correlated_key)
CORRELATED_TAG = 6


def round_key(seed: jax.Array, t: jax.Array, stream: jax.Array | int = 0) -> jax.Array:
  """``fold_in(PRNGKey(seed), t)``, moved to stream ``s`` by
  ``fold_in(fold_in(., STREAM_TAG), s_0), ..., s_n)`` when some word of ``s`` is not 0.

  ``stream`` is a scalar or a vector of uint32 words (a run's
  :func:`fedjax_dp.config.noise_identity.stream` is two); all zeros is the seed's own stream.
  """
  key = jax.random.fold_in(jax.random.PRNGKey(seed), t)
  words = jnp.atleast_1d(jnp.asarray(stream)).astype(jnp.uint32)
  moved = jax.random.fold_in(key, STREAM_TAG)
  for i in range(words.shape[0]):  # static: the words of one run's stream
    moved = jax.random.fold_in(moved, words[i])
  return jnp.where(jnp.any(words != 0), moved, key)


def client_keys(seed: jax.Array, t: jax.Array, ids: jax.Array,
                stream: jax.Array | int = 0) -> jax.Array:
  """Keys ``fold_in(fold_in(round_key(seed, t, stream), CLIENT_TAG), id)`` for ``ids [K]``."""
  base = jax.random.fold_in(round_key(seed, t, stream), CLIENT_TAG)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(ids)


def server_key(seed: jax.Array, t: jax.Array, stream: jax.Array | int = 0) -> jax.Array:
  """The server's key for round ``t``."""
  return jax.random.fold_in(round_key(seed, t, stream), SERVER_TAG)


def correlated_key(seed: jax.Array, stream: jax.Array | int = 0) -> jax.Array:
  """``fold_in(round_key(seed, 0, stream), CORRELATED_TAG)``: the base key of a correlated
  mechanism's noise (:mod:`fedjax_dp.privacy.correlated`), which folds in the round
  (BandMF's ``Z_t``) or the tree node itself. Round 0's own draws fold in other tags."""
  return jax.random.fold_in(round_key(seed, jnp.int32(0), stream), CORRELATED_TAG)
