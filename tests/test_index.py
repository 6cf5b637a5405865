# SPDX-License-Identifier: Apache-2.0
"""Index columns, sidecar round trip, fingerprints and staleness."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from feedline.errors import CorruptDataError, StaleDatasetError
from feedline.index import Index, Keys, fingerprint, load_sidecar, write_sidecar


def _index(tmp_path, n=100):
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(n * 10))
    keys = Keys.from_list([b"%08d" % i for i in range(n)])
    idx = Index(
        files=[str(f)],
        file_ids=np.zeros(n),
        offsets=np.arange(n) * 10,
        lengths=np.full(n, 10),
        labels=np.arange(n) % 7,
        keys=keys,
        meta={"shape": [10]},
    )
    return f, idx


def test_roundtrip(tmp_path):
    f, idx = _index(tmp_path)
    side = tmp_path / "x.fidx"
    write_sidecar(str(side), idx, root=str(tmp_path), fingerprints=[fingerprint(str(f))], key="k")
    got = load_sidecar(str(side), root=str(tmp_path), files=[str(f)], key="k")
    assert np.array_equal(got.offsets, idx.offsets)
    assert np.array_equal(got.labels, idx.labels)
    assert got.keys == idx.keys and got.keys[5] == b"00000005"
    assert got.meta == {"shape": [10]}
    assert got.fixed_length == 10


def test_stale_on_change(tmp_path):
    f, idx = _index(tmp_path)
    side = tmp_path / "x.fidx"
    write_sidecar(str(side), idx, root=str(tmp_path), fingerprints=[fingerprint(str(f))], key="k")
    with pytest.raises(StaleDatasetError):
        load_sidecar(str(side), root=str(tmp_path), files=[str(f)], key="other")
    data = bytearray(f.read_bytes())
    data[3] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(StaleDatasetError, match="changed"):
        load_sidecar(str(side), root=str(tmp_path), files=[str(f)], key="k")


def test_damaged_sidecar(tmp_path):
    f, idx = _index(tmp_path)
    side = tmp_path / "x.fidx"
    write_sidecar(str(side), idx, root=str(tmp_path), fingerprints=[fingerprint(str(f))], key="k")
    raw = side.read_bytes()
    side.write_bytes(b"XXXX" + raw[4:])
    with pytest.raises(CorruptDataError):
        load_sidecar(str(side), root=str(tmp_path), files=[str(f)], key="k")
    side.write_bytes(raw[: len(raw) // 2])
    with pytest.raises((CorruptDataError, StaleDatasetError)):
        load_sidecar(str(side), root=str(tmp_path), files=[str(f)], key="k")


def test_concurrent_writers_never_tear(tmp_path):
    f, idx = _index(tmp_path, n=20000)
    side = str(tmp_path / "x.fidx")
    fps = [fingerprint(str(f))]
    errors = []

    def writer():
        try:
            for _ in range(5):
                write_sidecar(side, idx, root=str(tmp_path), fingerprints=fps, key="k")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    reads = 0
    while any(t.is_alive() for t in threads):
        if os.path.exists(side):
            got = load_sidecar(side, root=str(tmp_path), files=[str(f)], key="k")
            assert np.array_equal(got.offsets, idx.offsets)
            reads += 1
    for t in threads:
        t.join()
    assert not errors
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".fidx-")]


def test_validate_against_sizes(tmp_path):
    _f, idx = _index(tmp_path)
    idx.validate_against_sizes([1000])
    with pytest.raises(CorruptDataError, match="beyond"):
        idx.validate_against_sizes([995])


def test_open_dataset_expands_node(tmp_path, monkeypatch):
    import feedline

    for node in (0, 1):
        d = tmp_path / f"node{node}"
        d.mkdir()
        (d / "r.bin").write_bytes(bytes([node]) * 40)
    ds = feedline.open_dataset(
        str(tmp_path / "node{node}" / "r.bin"), format="records", record_bytes=4, sidecar=False
    )
    assert ds.files == [str(tmp_path / "node0" / "r.bin")]
    assert ds.read(3) == b"\0" * 4
