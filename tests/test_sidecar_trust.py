# SPDX-License-Identifier: Apache-2.0
"""Issue 16 item 6: the index sidecar is not trusted.

A sidecar edited in place never yields wrong samples (its CRC32C no longer matches: the
index is rebuilt, or StaleIndexError with on_stale="error"); a file system that refuses
mmap is read instead; sidecars get the umask's permissions and are written atomically; a
user who cannot read a sidecar, or write beside the data, uses the cache directory.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import pickle
import shutil
import stat
import struct
import tempfile

import numpy as np
import pytest

import feedline
from feedline.errors import CorruptDataError, StaleIndexError
from feedline.formats.tfrecord import write_tfrecord
from feedline.index import _HEAD, _crc32c, load_sidecar, read_sidecar_header

NOBODY = 65534


def _payloads(n=50):
    rng = np.random.default_rng(7)
    return [rng.bytes(int(k)) for k in rng.integers(5, 90, n)]


def _dataset(directory, n=50):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "part-0.tfrecord")
    payloads = _payloads(n)
    write_tfrecord(path, payloads)
    return path, payloads


def _column_offset(side, name):
    header, data_start = read_sidecar_header(side)
    return data_start + header["columns"][name]["offset"]


def _read_all(ds):
    return [ds.read(i) for i in range(len(ds))]


def test_sidecar_records_checksum_and_dataset_fingerprint(tmp_path):
    path, _ = _dataset(tmp_path)
    with feedline.open_dataset(path) as ds:
        len(ds)
        side = ds.sidecar_path
        fp = ds.fingerprint
    header, _ = read_sidecar_header(side)
    assert header["dataset"] == fp
    with open(side, "rb") as f:
        _, version, crc, _ = _HEAD.unpack(f.read(_HEAD.size))
    assert version == 2 and crc != 0


@pytest.mark.parametrize("edit", ["swap-offsets", "shift-one", "flip-length", "header-meta"])
def test_edited_sidecar_never_gives_wrong_samples(tmp_path, edit):
    path, payloads = _dataset(tmp_path)
    with feedline.open_dataset(path) as ds:
        assert _read_all(ds) == payloads
        side = ds.sidecar_path
    with open(side, "r+b") as f:
        if edit == "swap-offsets":  # records 0 and 1 exchanged: every offset still valid
            at = _column_offset(side, "offsets")
            f.seek(at)
            a, b = struct.unpack("<qq", f.read(16))
            f.seek(at)
            f.write(struct.pack("<qq", b, a))
        elif edit == "shift-one":
            at = _column_offset(side, "offsets") + 8 * 10
            f.seek(at)
            (v,) = struct.unpack("<q", f.read(8))
            f.seek(at)
            f.write(struct.pack("<q", v + 1))
        elif edit == "flip-length":
            at = _column_offset(side, "lengths") + 8 * 3
            f.seek(at)
            f.write(bytes([f.read(1)[0] ^ 1]))
        else:  # same-length edit of the JSON header
            with open(side, "rb") as g:
                raw = g.read()
            i = raw.index(b'"n": ')
            f.seek(i + 5)
            digit = raw[i + 5 : i + 6]
            f.write(b"9" if digit != b"9" else b"8")
    mtime = os.stat(side).st_mtime_ns
    with pytest.raises(StaleIndexError, match=r"checksum|JSON"):
        len(feedline.open_dataset(path, on_stale="error"))
    with feedline.open_dataset(path) as ds:  # default: rebuilt, right bytes
        assert _read_all(ds) == payloads
        assert ds.sidecar_path == side
    assert os.stat(side).st_mtime_ns != mtime, "the rebuilt index replaced the edited sidecar"
    with feedline.open_dataset(path, on_stale="error") as ds:
        assert _read_all(ds) == payloads


def test_truncated_or_garbage_sidecar(tmp_path):
    path, payloads = _dataset(tmp_path)
    with feedline.open_dataset(path) as ds:
        len(ds)
        side = ds.sidecar_path
    with open(side, "rb") as f:
        data = f.read()
    key = read_sidecar_header(side)[0]["key"]
    for bad in (data[: len(data) - 8], data[:10], b"", os.urandom(len(data))):
        with open(side, "wb") as f:
            f.write(bad)
        with pytest.raises((StaleIndexError, CorruptDataError)) as ei:
            load_sidecar(side, root=str(tmp_path), files=[path], key=key)
        assert side in str(ei.value)
        with feedline.open_dataset(path) as ds:
            assert _read_all(ds) == payloads


def test_sidecar_read_without_mmap(tmp_path, monkeypatch):
    path, payloads = _dataset(tmp_path)
    with feedline.open_dataset(path) as ds:
        len(ds)
        side = ds.sidecar_path
    calls = []

    def refuse(*a, **k):  # what FUSE direct_io / some network mounts answer
        calls.append(a)
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    with feedline.open_dataset(path, on_stale="error") as ds:
        assert _read_all(ds) == payloads
        assert ds.sidecar_path == side
        assert not ds.index.offsets.flags.writeable
        # the index still pickles (node hand-off when no sidecar is shared)
        assert np.array_equal(pickle.loads(pickle.dumps(ds.index)).offsets, ds.index.offsets)
    assert calls, "the mmap path was tried first"


def test_sidecar_permissions_follow_umask(tmp_path):
    path, _ = _dataset(tmp_path)
    old = os.umask(0o022)
    try:
        with feedline.open_dataset(path) as ds:
            len(ds)
            side = ds.sidecar_path
        assert stat.S_IMODE(os.stat(side).st_mode) == 0o644
        os.unlink(side)
        os.umask(0o077)
        with feedline.open_dataset(path) as ds:
            len(ds)
        assert stat.S_IMODE(os.stat(side).st_mode) == 0o600
    finally:
        os.umask(old)
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".fidx-")]
    assert leftovers == [], "no temporary files left behind"


_CHILD = """
import json, os, sys
import feedline  # imported as root: the interpreter lives under /root (0700)
import feedline.formats.tfrecord
path = sys.argv[1]
os.setgroups([])
os.setgid({uid})
os.setuid({uid})
os.umask(0o022)
with feedline.open_dataset(path) as ds:
    got = [ds.read(i).hex() for i in range(len(ds))]
    print(json.dumps([got, ds.sidecar_path]))
"""


def _as_nobody(path):
    """Open *path* in a fresh interpreter that drops to uid/gid nobody after its imports
    (a fork of pytest would inherit its threads); return (payloads, sidecar used)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(uid=NOBODY), path],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, used = json.loads(proc.stdout.strip().splitlines()[-1])
    return [bytes.fromhex(h) for h in got], used


@pytest.fixture
def shared_dir():
    """A dataset directory every user can read but only root can write (0755)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    d = tempfile.mkdtemp(prefix="feedline-shared-")
    os.chmod(d, 0o755)
    cache = tempfile.mkdtemp(prefix="feedline-cache-nobody-")
    os.chown(cache, NOBODY, NOBODY)
    yield d, cache
    shutil.rmtree(d)
    shutil.rmtree(cache)


@pytest.mark.parametrize("mode", [0o644, 0o600, None])
def test_foreign_user(shared_dir, monkeypatch, mode):
    d, cache = shared_dir
    path, payloads = _dataset(os.path.join(d, "ds"))
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o644)
    local = None
    if mode is not None:  # the owner built the sidecar first
        with feedline.open_dataset(path) as ds:
            len(ds)
            local = ds.sidecar_path
        os.chmod(local, mode)
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", cache)

    got, used = _as_nobody(path)
    assert got == payloads
    if mode == 0o644:
        assert used == local, "a readable sidecar is shared"
    else:
        assert used is not None and used.startswith(cache), "unreadable/unwritable -> cache dir"
        assert os.stat(used).st_uid == NOBODY
        assert stat.S_IMODE(os.stat(used).st_mode) == 0o644


@pytest.mark.parametrize("dtype", ["4u1", "(2,)<i8", "V8", "[('a', '<i8')]", "O", "(,u1", "i8,("])
def test_resealed_sidecar_with_odd_column_dtype(tmp_path, dtype):
    """Fuzz finding (py_sidecar): a column dtype with a sub-array shape, re-sealed with a
    valid CRC, raised a raw ValueError from numpy; it is a CorruptDataError."""
    path, _ = _dataset(tmp_path)
    with feedline.open_dataset(path) as ds:
        len(ds)
        side = ds.sidecar_path
        key = read_sidecar_header(side)[0]["key"]
    with open(side, "rb") as f:
        raw = bytearray(f.read())
    magic, version, _, hlen = _HEAD.unpack_from(raw, 0)
    old_start = (_HEAD.size + hlen + 63) // 64 * 64
    header = json.loads(raw[_HEAD.size : _HEAD.size + hlen])
    header["columns"]["offsets"]["dtype"] = dtype
    hbytes = json.dumps(header, sort_keys=True).encode()
    start = (_HEAD.size + len(hbytes) + 63) // 64 * 64
    body = hbytes + bytes(start - _HEAD.size - len(hbytes)) + bytes(raw[old_start:])
    with open(side, "wb") as f:  # re-sealed: a valid CRC around the odd dtype
        f.write(_HEAD.pack(magic, version, _crc32c(body), len(hbytes)) + body)
    with pytest.raises(CorruptDataError, match="offsets"):
        load_sidecar(side, root=str(tmp_path), files=[path], key=key)
