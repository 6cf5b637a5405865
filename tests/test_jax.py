# SPDX-License-Identifier: Apache-2.0
"""feedline.jax: host batches and global arrays (single process on the CPU device)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from loader_common import make_records  # noqa: E402

from feedline import ConfigError, Loader  # noqa: E402
from feedline.jax import global_batches, host_batches  # noqa: E402


@pytest.fixture
def records(tmp_path):
    return make_records(str(tmp_path / "ds"), n=100, size=12, files=2)


def test_global_arrays_hold_the_batch(records):
    ds, data = records
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with Loader(ds, 20, preset="tf", seed=1) as ld, Loader(ds, 20, preset="tf", seed=1) as ref:
        got = [np.asarray(x) for x, _ in global_batches(ld, sharding)]
        want = [b.data for b in ref]
    assert len(got) == 5
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert sorted(np.concatenate(got)[:, 0].tolist()) == sorted(data[:, 0].tolist())


def test_unequal_shards_are_refused(records):
    ds, _ = records
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with Loader(ds, 30, preset="tf") as ld, pytest.raises(ConfigError, match="drop_last"):
        next(global_batches(ld, sharding))
    with Loader(ds, 30, preset="tf", drop_last=True) as ld:
        assert len(list(global_batches(ld, sharding))) == 3
        ld.set_epoch(1)
        assert [x.shape for x, _ in host_batches(ld)] == [(30, 12)] * 3
