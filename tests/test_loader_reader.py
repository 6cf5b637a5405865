# SPDX-License-Identifier: Apache-2.0
"""coalesce + gather + the pread fallback: any extents come back byte-exact, in order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline import CorruptDataError, StorageError
from feedline.pipeline.reader import ExtentReader, coalesce, gather

FILES = [np.random.default_rng(i).integers(0, 256, 400, dtype=np.uint8) for i in range(3)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 380), st.integers(0, 20)),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 64),
    st.booleans(),
    st.booleans(),
)
def test_coalesced_reads_gather_every_record(extents, gap, per_sample, fixed):
    fid = np.array([e[0] for e in extents])
    off = np.array([e[1] for e in extents])
    ln = np.array([e[2] for e in extents])
    if fixed:
        ln[:] = max(1, int(ln[0]))
    c = coalesce(fid, off, ln, gap=gap, per_sample=per_sample)
    if not per_sample:  # merged reads never overlap within a file
        r = c.reads
        for f in range(3):
            m = r.file_ids == f
            o, e = r.offsets[m], r.offsets[m] + r.lengths[m]
            assert (o[1:] > e[:-1]).all()
    buf = np.zeros(c.buffer_bytes, np.uint8)
    for f, o, n, d in zip(
        c.reads.file_ids, c.reads.offsets, c.reads.lengths, c.reads.dest, strict=True
    ):
        buf[d : d + n] = FILES[f][o : o + n]
    want = np.concatenate([FILES[f][o : o + n] for f, o, n in zip(fid, off, ln, strict=True)])
    np.testing.assert_array_equal(gather(buf, c.src, c.lengths), want)


def test_reader_reads_and_reports(tmp_path):
    paths = []
    for i, data in enumerate(FILES):
        p = tmp_path / f"f{i}"
        p.write_bytes(data.tobytes())
        paths.append(str(p))
    reader = ExtentReader(paths, threads=3)
    fid, off, ln = np.array([2, 0, 1, 0]), np.array([10, 0, 300, 50]), np.array([30, 20, 100, 5])
    c = coalesce(fid, off, ln, gap=0)
    buf = np.empty(c.buffer_bytes, np.uint8)
    reader.read(c.reads, buf)
    want = np.concatenate([FILES[f][o : o + n] for f, o, n in zip(fid, off, ln, strict=True)])
    np.testing.assert_array_equal(gather(buf, c.src, c.lengths), want)
    st_ = reader.stats()
    assert st_["storage_bytes"] == int(ln.sum()) and st_["storage_ops"] == 4
    with pytest.raises(CorruptDataError):  # beyond the end of the file
        c = coalesce(np.array([0]), np.array([390]), np.array([20]), gap=0)
        reader.read(c.reads, np.empty(20, np.uint8))
    with pytest.raises(ValueError):
        reader.read(c.reads, np.empty(5, np.uint8))
    reader.close()
    try:
        gone = ExtentReader([str(tmp_path / "missing")], threads=1)
    except StorageError:  # the native engine may open files eagerly
        return
    with pytest.raises(StorageError):
        gone.read(
            coalesce(np.array([0]), np.array([0]), np.array([4]), gap=0).reads,
            np.empty(4, np.uint8),
        )
    gone.close()
