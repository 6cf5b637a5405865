# SPDX-License-Identifier: Apache-2.0
"""coalesce + gather (the native record copy) + the pread fallback: any extents come back
byte-exact, in order; extents outside a buffer are refused."""

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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-3, 70), st.integers(-2, 20), st.integers(-3, 70)), max_size=12),
    st.booleans(),
)
def test_copy_records_copies_every_record_or_refuses_before_copying(recs, packed):
    """The native copy under every source's gather and the store's scatter: each record
    lands where it should, and any extent outside either buffer is an IndexError naming
    the record, with nothing copied (the output is left as it was)."""
    from feedline import _core

    src = np.arange(64, dtype=np.uint8)
    out = np.full(48, 0xEE, np.uint8)
    off = np.array([r[0] for r in recs], dtype=np.int64)
    ln = np.array([r[1] for r in recs], dtype=np.int64)
    dest = None if packed else np.array([r[2] for r in recs], dtype=np.int64)
    places = np.concatenate([[0], np.cumsum(ln)])[:-1] if packed else dest
    bad = [
        i
        for i in range(len(recs))
        if not (off[i] >= 0 and ln[i] >= 0 and off[i] + ln[i] <= 64)
        or not (places[i] >= 0 and places[i] + max(ln[i], 0) <= 48)
    ]
    want = out.copy()
    if not bad:
        for i in range(len(recs)):
            want[places[i] : places[i] + ln[i]] = src[off[i] : off[i] + ln[i]]
    if bad:
        with pytest.raises(IndexError, match=f"record {bad[0]}:"):
            _core.copy_records(src, off, ln, out, dest)
    else:
        _core.copy_records(src, off, ln, out, dest)
    np.testing.assert_array_equal(out, want)


def test_gather_refuses_a_record_beyond_its_window():
    with pytest.raises(IndexError, match="record 1: 10 bytes at 95 fall outside the source"):
        gather(np.zeros(100, np.uint8), np.array([0, 95]), np.array([10, 10]))


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


def test_dev_gather_ab_compares_both_copies():
    """dev/gather_ab.py (the figure docs/loader.md quotes) runs and checks its copies."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "dev" / "gather_ab.py"
    out = subprocess.run(
        [sys.executable, str(script), "16", "100", "1", "6"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "native" in out.stdout and "numpy" in out.stdout
