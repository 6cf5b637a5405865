# SPDX-License-Identifier: Apache-2.0
"""Conformance tests every file format passes (one base class, one subclass per format).

Each subclass writes a small dataset with the real writer of its format (numpy, h5py,
feedline's TFRecord framing, plain bytes) and states what was written; the base class
checks detection, length, raw reads, decoding, the index sidecar and multi-file
datasets against that.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import feedline
from feedline.errors import StaleDatasetError, UnsupportedFormatError
from feedline.formats.tfrecord import crc32c, frame, masked_crc32c, write_tfrecord


@dataclass
class Written:
    """A dataset on disk and what it holds, sample by sample in dataset order."""

    path: Any  # what to pass to open_dataset
    files: list[str]
    records: list[bytes]
    data: np.ndarray | None = None  # expected decoded samples (b, *shape)
    labels: np.ndarray | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _mapped(a: np.ndarray) -> bool:
    """True when *a* is (a view of) a memory-mapped sidecar column."""
    while a is not None:
        if isinstance(a, np.memmap) or type(a).__name__ == "mmap":
            return True
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return False


class FormatConformance:
    """Base class; subclasses set ``format``/``detectable`` and implement ``write``."""

    format: str
    detectable = True

    def write(self, d: Path, n_files: int, seed: int) -> Written:  # pragma: no cover
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    def open(self, w: Written, **kw):
        return feedline.open_dataset(w.path, format=self.format, **w.options, **kw)

    def dataset(self, tmp_path, n_files=1, seed=0):
        d = tmp_path / "data"
        d.mkdir(exist_ok=True)
        return self.write(d, n_files, seed)

    # -------------------------------------------------------------------- tests
    def test_detect(self, tmp_path):
        w = self.dataset(tmp_path)
        if self.detectable:
            ds = feedline.open_dataset(w.path, **w.options)
            assert ds.format == self.format
            assert len(ds) == len(w.records)
        else:
            with pytest.raises(UnsupportedFormatError):
                feedline.open_dataset(w.path, **w.options)

    def test_len_and_read(self, tmp_path):
        w = self.dataset(tmp_path)
        with self.open(w, sidecar=False) as ds:
            assert len(ds) == len(w.records) > 0
            for i, rec in enumerate(w.records):
                assert ds.read(i) == rec
            assert ds.read(-1) == w.records[-1]
            with pytest.raises(IndexError):
                ds.read(len(w.records))

    def test_decode(self, tmp_path):
        w = self.dataset(tmp_path, seed=3)
        with self.open(w, sidecar=False) as ds:
            rng = np.random.default_rng(0)
            ids = rng.permutation(len(ds))[: max(1, len(ds) // 2)]
            raw, lengths = ds.read_many(ids)
            assert raw.tobytes() == b"".join(w.records[i] for i in ids)
            data, labels = ds.decode(raw, lengths, ids)
            if w.data is not None:
                np.testing.assert_array_equal(data, w.data[ids])
                assert data.dtype == w.data.dtype
                out = np.empty_like(w.data[ids])
                got, _ = ds.decode(raw, lengths, ids, out=out)
                assert got is out
                np.testing.assert_array_equal(out, w.data[ids])
            if w.labels is None:
                assert labels is None
            else:
                np.testing.assert_array_equal(labels, w.labels[ids])
            one, _lab = ds[int(ids[0])]
            if w.data is not None:
                np.testing.assert_array_equal(one, w.data[ids[0]])

    def test_sidecar_roundtrip(self, tmp_path):
        w = self.dataset(tmp_path)
        first = self.open(w)
        n = len(first)
        assert first.sidecar_path and os.path.exists(first.sidecar_path)
        second = self.open(w, on_stale="error")
        assert len(second) == n
        assert second.sidecar_path == first.sidecar_path
        assert _mapped(second.index.offsets), "second open must map the sidecar, not rescan"
        np.testing.assert_array_equal(second.index.offsets, first.index.offsets)
        np.testing.assert_array_equal(second.index.lengths, first.index.lengths)
        assert second.index.meta == first.index.meta
        if w.labels is not None:
            np.testing.assert_array_equal(second.index.labels, w.labels)
        assert second.read(n - 1) == w.records[-1]
        first.close()
        second.close()

    def test_modified_file_is_stale(self, tmp_path):
        w = self.dataset(tmp_path, seed=1)
        with self.open(w) as ds:
            len(ds)
        w2 = self.write(tmp_path / "data", 1, seed=2)  # same paths, new contents
        assert w2.records != w.records
        with pytest.raises(StaleDatasetError):
            len(self.open(w2, on_stale="error"))
        with self.open(w2) as ds:  # default: rebuild
            assert [ds.read(i) for i in range(len(ds))] == w2.records
        with self.open(w2, on_stale="error") as ds:  # the rebuilt sidecar is current
            assert len(ds) == len(w2.records)

    def test_multi_file(self, tmp_path):
        w = self.dataset(tmp_path, n_files=3, seed=5)
        assert len(w.files) == 3
        with self.open(w, sidecar=False) as ds:
            assert ds.files == sorted(w.files)
            assert len(ds) == len(w.records)
            assert set(np.unique(ds.index.file_ids)) == {0, 1, 2}
            assert [ds.read(i) for i in range(len(ds))] == w.records
            if w.labels is not None:
                np.testing.assert_array_equal(ds.index.labels, w.labels)
            ids = np.arange(len(ds))
            raw, lengths = ds.read_many(ids)
            data, _labels = ds.decode(raw, lengths, ids)
            if w.data is not None:
                np.testing.assert_array_equal(data, w.data)
        for spec in (list(w.files), os.path.join(os.path.dirname(w.files[0]), "*")):
            with feedline.open_dataset(spec, format=self.format, sidecar=False, **w.options) as ds:
                assert len(ds) == len(w.records)


# ----------------------------------------------------------------------------- formats


class TestRecords(FormatConformance):
    """CIFAR-10-like binary: 1 label byte + 3x4x4 pixels, and a 2-byte label variant."""

    format = "records"
    detectable = False
    label_bytes = 1
    header_bytes = 0
    pixels = 48

    def write(self, d, n_files, seed):
        rng = np.random.default_rng(seed)
        lb, hb = self.label_bytes, self.header_bytes
        ldt = {1: "u1", 2: "<u2", 4: "<u4"}[lb]
        records, data, labels, files = [], [], [], []
        for k in range(n_files):
            n = int(rng.integers(5, 12))
            lab = rng.integers(0, 1000 if lb > 1 else 10, n).astype(ldt)
            px = rng.integers(0, 256, (n, self.pixels), dtype=np.uint8)
            recs = [lab[i : i + 1].tobytes() + px[i].tobytes() for i in range(n)]
            path = d / f"data_batch_{k}.bin"
            path.write_bytes(rng.bytes(hb) + b"".join(recs))
            records += recs
            data.append(px)
            labels.append(lab.astype(ldt[-2:]))
            files.append(str(path))
        (d / "readme.html").write_text("not a record file")  # must be ignored in a directory
        return Written(
            path=str(d) if n_files > 1 else files[0],
            files=files,
            records=records,
            data=np.concatenate(data),
            labels=np.concatenate(labels),
            options={"record_bytes": lb + self.pixels, "label_bytes": lb, "header_bytes": hb},
        )

    def test_multi_file(self, tmp_path):
        # the directory holds a non-.bin file: the glob form must name the .bin files
        w = self.dataset(tmp_path, n_files=3, seed=5)
        with feedline.open_dataset(w.path, format="records", sidecar=False, **w.options) as ds:
            assert len(ds) == len(w.records)
            assert [ds.read(i) for i in range(len(ds))] == w.records
            assert set(np.unique(ds.index.file_ids)) == {0, 1, 2}
        pattern = os.path.join(os.path.dirname(w.files[0]), "*.bin")
        with feedline.open_dataset(pattern, format="records", sidecar=False, **w.options) as ds:
            raw, lengths = ds.read_many(np.arange(len(ds)))
            data, labels = ds.decode(raw, lengths, np.arange(len(ds)))
            np.testing.assert_array_equal(data, w.data)
            np.testing.assert_array_equal(labels, w.labels)


class TestRecordsWideLabelsWithHeader(TestRecords):
    label_bytes = 2
    header_bytes = 16
    pixels = 30


def test_records_cifar100_fine_and_coarse_labels(tmp_path):
    """CIFAR-100 binary: <coarse u8><fine u8><3072 pixels>; label_byte picks one of them
    (as a 2-byte integer they would read coarse + 256 * fine), each its own sidecar."""
    rng = np.random.default_rng(3)
    n = 40
    coarse = rng.integers(0, 20, n).astype(np.uint8)
    fine = rng.integers(0, 100, n).astype(np.uint8)
    px = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    path = tmp_path / "train.bin"
    path.write_bytes(b"".join(bytes([coarse[i], fine[i]]) + px[i].tobytes() for i in range(n)))
    for pick, want in ((1, fine), (0, coarse)):
        with feedline.open_dataset(
            str(path), format="records", record_bytes=3074, label_bytes=2, label_byte=pick
        ) as ds:
            np.testing.assert_array_equal(ds.index.labels, want)
            data, labels = ds.decode(*ds.read_many(np.arange(n)), np.arange(n))
            np.testing.assert_array_equal(data, px)
            np.testing.assert_array_equal(labels, want)
    with feedline.open_dataset(str(path), format="records", record_bytes=3074, label_bytes=2) as ds:
        np.testing.assert_array_equal(ds.index.labels, coarse + 256 * fine.astype(np.uint16))
    with pytest.raises(feedline.ConfigError, match="label_byte=2"):
        feedline.open_dataset(
            str(path), format="records", record_bytes=3074, label_bytes=2, label_byte=2
        )


class TestNpy(FormatConformance):
    format = "npy"
    dtype = np.dtype("<f4")
    row_shape = (3, 5)

    def write(self, d, n_files, seed):
        rng = np.random.default_rng(seed)
        arrays, files = [], []
        for k in range(n_files):
            n = 4 + 2 * k  # counts independent of the seed: rewriting keeps labels.npy valid
            a = (rng.standard_normal((n, *self.row_shape)) * 100).astype(self.dtype)
            path = d / f"part{k}.npy"
            np.save(path, a)
            arrays.append(a)
            files.append(str(path))
        data = np.concatenate(arrays).astype(self.dtype)  # concatenate drops the byte order
        labels = np.arange(len(data), dtype=np.int64)[::-1] % 7
        lp = d / "labels.npy"
        if not lp.exists() or not np.array_equal(np.load(lp), labels):
            np.save(lp, labels)  # left untouched when equal, so only the data file changes
        return Written(
            path=str(d) if n_files > 1 else files[0],
            files=files,
            records=[r.tobytes() for r in data],
            data=data,
            labels=labels,
            options={"labels": "labels.npy"},
        )

    def test_replaced_labels_are_used(self, tmp_path):
        w = self.dataset(tmp_path)
        with self.open(w) as ds:
            np.testing.assert_array_equal(ds.index.labels, w.labels)
        np.save(os.path.join(os.path.dirname(w.files[0]), "labels.npy"), w.labels + 100)
        with self.open(w, on_stale="error") as ds:
            np.testing.assert_array_equal(ds.index.labels, w.labels + 100)


class TestNpyBigEndianNoLabels(TestNpy):
    dtype = np.dtype(">i8")
    row_shape = (2,)

    def write(self, d, n_files, seed):
        w = super().write(d, n_files, seed)
        os.unlink(d / "labels.npy")
        w.labels, w.options = None, {}
        return w

    def test_replaced_labels_are_used(self):
        pass  # no labels here


class TestHDF5(FormatConformance):
    """Contiguous HDF5 with an image dataset and a 'labels' dataset (auto-detected)."""

    format = "hdf5"
    chunks: tuple[int, ...] | None = None

    def write(self, d, n_files, seed):
        rng = np.random.default_rng(seed)
        arrays, labels, files = [], [], []
        for k in range(n_files):
            n = int(rng.integers(4, 10))
            x = rng.integers(0, 60000, (n, 2, 3, 4)).astype("<u2")
            y = rng.integers(-5, 5, n).astype("<i4")
            path = d / f"univ_{k}.h5"
            with h5py.File(path, "w") as f:
                f.create_dataset("meta", data=np.arange(3.0))
                f.create_dataset("x", data=x, chunks=self.chunks)
                f.create_dataset("labels", data=y)
            arrays.append(x)
            labels.append(y)
            files.append(str(path))
        data = np.concatenate(arrays)
        return Written(
            path=str(d) if n_files > 1 else files[0],
            files=files,
            records=[r.tobytes() for r in data],
            data=data,
            labels=np.concatenate(labels),
        )

    def test_layout_meta(self, tmp_path):
        w = self.dataset(tmp_path)
        with self.open(w, sidecar=False) as ds:
            meta = ds.index.meta
            assert meta["dataset"] == "x" and meta["labels"] == "labels"
            assert meta["layout"] == ("chunked" if self.chunks else "contiguous")
            assert meta["sample_shape"] == [2, 3, 4]


class TestHDF5ChunkedWholeSamples(TestHDF5):
    chunks = (3, 2, 3, 4)


class TestTFRecord(FormatConformance):
    format = "tfrecord"

    def write(self, d, n_files, seed):
        rng = np.random.default_rng(seed)
        records, files = [], []
        for k in range(n_files):
            recs = [rng.bytes(int(rng.integers(0, 300))) for _ in range(int(rng.integers(3, 9)))]
            path = d / f"train-{k:05d}-of-{n_files:05d}.tfrecord"
            write_tfrecord(path, recs)
            records += recs
            files.append(str(path))
        return Written(path=str(d) if n_files > 1 else files[0], files=files, records=records)

    def test_crc_helpers(self):
        assert crc32c(b"123456789") == 0xE3069283
        assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283
        c = crc32c(b"abc")
        assert masked_crc32c(b"abc") == ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
        f = frame(b"xyz")
        assert len(f) == 8 + 4 + 3 + 4 and f[12:15] == b"xyz"

    def test_small_scan_buffer_and_no_verify(self, tmp_path):
        w = self.dataset(tmp_path)
        for opts in ({"buffer_bytes": 4096}, {"verify": False}):
            with feedline.open_dataset(w.path, sidecar=False, **opts) as ds:
                assert [ds.read(i) for i in range(len(ds))] == w.records


def test_records_need_record_bytes(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"\0" * 30)
    with pytest.raises(feedline.ConfigError, match="record_bytes"):
        feedline.open_dataset(str(p), format="records")
    with pytest.raises(feedline.ConfigError, match="label_bytes"):
        feedline.open_dataset(str(p), format="records", record_bytes=10, label_bytes=3)
    with pytest.raises(feedline.ConfigError):
        feedline.open_dataset(str(p), format="records", record_bytes=10, bogus=1)


def test_glob_of_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        feedline.open_dataset(str(tmp_path / "*.npy"), format="npy")
    assert not glob.glob(str(tmp_path / "*.npy"))


def test_npy_directory_uses_its_labels_npy_by_default(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 3)).astype("<f4")
    b = rng.standard_normal((4, 3)).astype("<f4")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    labels = np.arange(10) % 3
    np.save(tmp_path / "labels.npy", labels)
    with feedline.open_dataset(str(tmp_path), sidecar=False) as ds:
        assert len(ds) == 10  # labels.npy is not data
        np.testing.assert_array_equal(ds.index.labels, labels)
    with feedline.open_dataset(str(tmp_path), labels=False, sidecar=False) as ds:
        assert len(ds) == 10 and ds.index.labels is None
