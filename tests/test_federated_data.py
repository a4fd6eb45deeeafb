"""Device-resident federated data: padding, masks, counts and on-device client gathers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedjax_dp.data import FederatedData, build_federated_data, partition
from fedjax_dp.data.federated import gather_clients


def toy(n=30, shape=(3, 2, 1), seed=0):
  rng = np.random.default_rng(seed)
  return rng.uniform(0.1, 1.0, (n, *shape)).astype(np.float32), rng.integers(1, 10, n)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5), extra=st.integers(0, 3),
       seed=st.integers(0, 1000))
def test_padding_mask_counts(sizes, extra, seed):
  x, y = toy(seed=seed)
  perm = np.random.default_rng(seed).permutation(len(x))
  indices = np.split(perm[:sum(sizes)], np.cumsum(sizes)[:-1])
  n_max = max(max(sizes), 1) + extra
  fd = build_federated_data(x, y, indices, n_max=n_max)
  assert isinstance(fd.x, jax.Array)
  fd = jax.tree_util.tree_map(np.asarray, fd)  # inspect on the host: fast, no dispatch
  assert fd.x.shape == (len(sizes), n_max, 3, 2, 1) and fd.x.dtype == np.float32
  assert fd.y.shape == (len(sizes), n_max) and fd.y.dtype == np.int32
  assert fd.counts.dtype == np.int32 and fd.mask.dtype == np.float32
  np.testing.assert_array_equal(fd.counts, sizes)
  for u, idx in enumerate(indices):
    c = len(idx)
    np.testing.assert_array_equal(fd.x[u, :c], x[idx])
    np.testing.assert_array_equal(fd.y[u, :c], y[idx])
    np.testing.assert_array_equal(fd.mask[u], (np.arange(n_max) < c).astype(np.float32))
    assert np.all(fd.x[u, c:] == 0) and np.all(fd.y[u, c:] == 0)


def test_default_n_max_is_largest_client():
  x, y = toy()
  fd = build_federated_data(x, y, [np.arange(4), np.arange(4, 11), np.arange(0)])
  assert fd.x.shape[1] == 7
  np.testing.assert_array_equal(fd.counts, [4, 7, 0])
  np.testing.assert_array_equal(fd.mask.sum(axis=1), [4, 7, 0])


def test_errors():
  x, y = toy()
  with pytest.raises(ValueError, match=r"data\.n_max=3.*5 examples"):
    build_federated_data(x, y, [np.arange(5)], n_max=3)
  with pytest.raises(ValueError, match=r"\[0, 30\)"):
    build_federated_data(x, y, [np.array([1, 30])])
  with pytest.raises(ValueError, match="same number"):
    build_federated_data(x, y[:-1], [np.arange(3)])


def test_gather_clients_under_jit_matches_numpy():
  x, y = toy(n=60)
  parts = partition(y, "unbalanced", 6, seed=0, sizes=[3, 9, 5, 1, 7, 4])
  fd = build_federated_data(x, y, parts)
  traces = []

  @jax.jit
  def gather(data, idx):
    traces.append(1)  # runs only while tracing
    return gather_clients(data, idx)

  host = jax.tree_util.tree_map(np.asarray, fd)
  for idx in ([4, 0, 4], [5, 2, 1], [3, 3, 0]):
    got = gather(fd, jnp.asarray(idx, jnp.int32))
    assert isinstance(got, FederatedData)
    for g, h in zip(got, host):
      np.testing.assert_array_equal(g, h[np.asarray(idx)])
  assert len(traces) == 1, "new client ids must not recompile"
