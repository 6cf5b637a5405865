# SPDX-License-Identifier: Apache-2.0
"""StorageBackend conformance: every backend (and every method of the POSIX backend)
passes the same tests. A new backend subclasses :class:`StorageBackendTests`."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from feedline import ConfigError, CorruptDataError, StorageError
from feedline.io import BACKENDS, IOStats, PosixBackend, StorageBackend, backend


class StorageBackendTests:
    """Subclass and define :meth:`make` (a new, uninitialised backend)."""

    def make(self) -> StorageBackend:
        raise NotImplementedError

    @pytest.fixture
    def dataset(self, tmp_path):
        rng = np.random.default_rng(21)
        blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (70_001, 5_000)]
        paths = []
        for i, b in enumerate(blobs):
            p = tmp_path / f"d{i}.bin"
            p.write_bytes(b)
            paths.append(str(p))
        return paths, blobs

    def test_is_a_storage_backend(self):
        assert isinstance(self.make(), StorageBackend)

    def test_read_into_one_buffer_back_to_back(self, dataset):
        paths, blobs = dataset
        fid = np.array([1, 0, 0, 1])
        off = np.array([4_000, 3, 65_000, 0])
        ln = np.array([1_000, 20_000, 5_001, 0])
        b = self.make()
        b.init(paths)
        try:
            buf = np.zeros(int(ln.sum()), np.uint8)
            st = b.read((fid, off, ln), buf)
            want = b"".join(blobs[f][o : o + n] for f, o, n in zip(fid, off, ln, strict=True))
            assert buf.tobytes() == want
            assert isinstance(st, IOStats) and st.bytes == len(want)
        finally:
            b.close()

    def test_read_into_one_buffer_per_extent(self, dataset):
        paths, blobs = dataset
        fid, off, ln = [0, 1, 0], [10, 4_999, 69_000], [100, 1, 1_001]
        b = self.make()
        b.init(paths)
        try:
            bufs = [bytearray(n) for n in ln]
            st = b.read((fid, off, ln), bufs)
            for f, o, n, got in zip(fid, off, ln, bufs, strict=True):
                assert bytes(got) == blobs[f][o : o + n]
            assert st.bytes == sum(ln) and st.extents == 3
            with pytest.raises(ValueError):
                b.read((fid, off, ln), bufs[:2])
        finally:
            b.close()

    def test_typed_errors(self, dataset, tmp_path):
        paths, _ = dataset
        b = self.make()
        b.init([*paths, str(tmp_path / "absent")])
        try:
            with pytest.raises(CorruptDataError):
                b.read(([1], [4_990], [20]), np.zeros(20, np.uint8))
            with pytest.raises(StorageError) as ei:
                b.read(([2], [0], [20]), np.zeros(20, np.uint8))
            assert ei.value.err == errno.ENOENT
        finally:
            b.close()

    def test_close_is_idempotent_and_reinit_works(self, dataset):
        paths, blobs = dataset
        b = self.make()
        b.init(paths)
        b.close()
        b.close()
        b.init(paths[1:])
        buf = np.zeros(10, np.uint8)
        b.read(([0], [0], [10]), buf)
        assert buf.tobytes() == blobs[1][:10]
        b.close()


class TestPosixPread(StorageBackendTests):
    def make(self):
        return PosixBackend(method="pread", threads=2)


class TestPosixODirect(StorageBackendTests):
    def make(self):
        return PosixBackend(method="odirect", threads=2)


class TestPosixMmap(StorageBackendTests):
    def make(self):
        return backend("posix", method="mmap", threads=1)


def test_registry_and_errors():
    assert BACKENDS["posix"] is PosixBackend
    b = backend()
    assert b.supports_direct_io and b.supports_raw_buffers
    with pytest.raises(ConfigError):
        b.read(([0], [0], [1]), bytearray(1))
    with pytest.raises(ConfigError):
        backend("s3")


class TestFiles(StorageBackendTests):
    def make(self):
        return backend("files")


def test_native_is_the_engine_and_files_is_plain_pread():
    from feedline.io import FilesBackend

    assert BACKENDS["native"] is PosixBackend and BACKENDS["files"] is FilesBackend
    assert not FilesBackend().supports_direct_io
