# SPDX-License-Identifier: Apache-2.0
"""Bad input for every format: each must end in a typed error naming file and offset.

Mutation sweeps (every truncation, every flipped bit) run in a subprocess with a
timeout, so a crash or a hang in native code fails the test instead of the session.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys

import h5py
import numpy as np
import pytest

import feedline
from feedline.errors import ConfigError, CorruptDataError, UnsupportedFormatError
from feedline.formats.tfrecord import frame, write_tfrecord

_WORKER = r"""
import json, os, sys, tempfile
import numpy as np
import feedline
from feedline.errors import FeedlineError

src, fmt, opts, mode, positions = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
data = open(src, "rb").read()
d = tempfile.mkdtemp(dir=os.path.dirname(src))
path = os.path.join(d, "m" + os.path.splitext(src)[1])
out = []
for pos in positions:
    if mode == "truncate":
        b = data[:pos]
    else:
        bb = bytearray(data)
        bb[pos // 8] ^= 1 << (pos % 8)
        b = bytes(bb)
    with open(path, "wb") as f:
        f.write(b)
    try:
        with feedline.open_dataset(path, format=fmt, sidecar=False, **opts) as ds:
            ids = np.arange(len(ds))
            raw, lengths = ds.read_many(ids)
            ds.decode(raw, lengths, ids)
            out.append(["ok", len(ds)])
    except FeedlineError as e:
        out.append([type(e).__name__, getattr(e, "offset", None), getattr(e, "path", ""), str(e)[:300]])
    except Exception as e:
        out.append(["CRASH", type(e).__name__, None, str(e)[:300]])
print(json.dumps(out))
"""


def sweep(src, fmt, mode, positions, timeout=300, **opts):
    """Mutate *src* at each position in a subprocess; return one outcome per position."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _WORKER,
            str(src),
            fmt,
            json.dumps(opts),
            mode,
            json.dumps(list(positions)),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"worker died ({proc.returncode}): {proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    crashes = [(p, o) for p, o in zip(positions, out, strict=True) if o[0] == "CRASH"]
    assert not crashes, f"untyped errors: {crashes[:5]}"
    return out


# ----------------------------------------------------------------------------- records


def test_records_trailing_partial_record(tmp_path):
    p = tmp_path / "cifar.bin"
    p.write_bytes(b"\1" * (3073 * 2 + 100))
    with pytest.raises(CorruptDataError, match="trailing partial record: 100 bytes") as e:
        len(feedline.open_dataset(str(p), format="records", record_bytes=3073, label_bytes=1))
    assert e.value.path == str(p) and e.value.offset == 2 * 3073


def test_records_header_longer_than_file(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"\1" * 10)
    with pytest.raises(CorruptDataError, match="shorter than header_bytes"):
        len(feedline.open_dataset(str(p), format="records", record_bytes=4, header_bytes=11))


def test_records_every_truncation(tmp_path):
    p = tmp_path / "r.bin"
    p.write_bytes(np.random.default_rng(0).bytes(7 * 11))
    out = sweep(p, "records", "truncate", range(7 * 11), record_bytes=7, label_bytes=1)
    for cut, o in enumerate(out):
        if cut % 7 == 0:
            assert o == ["ok", cut // 7]
        else:
            assert o[0] == "CorruptDataError" and o[1] == cut - cut % 7, (cut, o)


# --------------------------------------------------------------------------------- npy


def test_npy_object_dtype(tmp_path):
    p = tmp_path / "o.npy"
    np.save(p, np.array([{"a": 1}, [2]], dtype=object), allow_pickle=True)
    with pytest.raises(UnsupportedFormatError, match="object dtype") as e:
        len(feedline.open_dataset(str(p)))
    assert e.value.path == str(p)


def test_npy_fortran_order(tmp_path):
    p = tmp_path / "f.npy"
    np.save(p, np.asfortranarray(np.arange(12.0).reshape(3, 4)))
    with pytest.raises(UnsupportedFormatError, match="Fortran"):
        len(feedline.open_dataset(str(p)))


@pytest.mark.parametrize(
    ("header", "error", "match"),
    [
        (b"NUMPY!\x01\x00", CorruptDataError, "bad magic"),
        (b"\x93NUMPY\x09\x00\x10\x00" + b"{}".ljust(16), UnsupportedFormatError, "version 9"),
        (b"\x93NUMPY\x01\x00\x10\x00" + b"{'descr': <f4".ljust(16), CorruptDataError, "literal"),
        (b"\x93NUMPY\x01\x00\x20\x00" + b"{'shape': (2,)}".ljust(32), CorruptDataError, "descr"),
        (
            b"\x93NUMPY\x01\x00\x40\x00"
            + b"{'descr': 'zz', 'fortran_order': False, 'shape': (2,)}".ljust(64),
            CorruptDataError,
            "bad descr",
        ),
        (
            b"\x93NUMPY\x01\x00\x40\x00"
            + b"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}".ljust(64),
            CorruptDataError,
            "bad shape",
        ),
        (b"\x93NUMPY\x02\x00\xff\xff\xff\x7f{", CorruptDataError, "implausible"),
    ],
)
def test_npy_bad_headers(tmp_path, header, error, match):
    p = tmp_path / "b.npy"
    p.write_bytes(header + b"\0" * 64)
    with pytest.raises(error, match=match) as e:
        len(feedline.open_dataset(str(p)))
    assert e.value.path == str(p)


def test_npy_every_truncation(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.arange(24, dtype="<i2").reshape(4, 6))
    size = os.path.getsize(p)
    out = sweep(p, "npy", "truncate", range(size + 1))
    assert out[-1] == ["ok", 4]
    for cut, o in enumerate(out[:-1]):
        assert o[0] == "CorruptDataError", (cut, o)
        assert o[1] <= cut


def test_npy_files_must_agree(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(UnsupportedFormatError, match="row shape and dtype"):
        len(feedline.open_dataset(str(tmp_path)))


def test_npy_labels_length_mismatch(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((5, 3), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(4, np.int64))
    with pytest.raises(ConfigError, match="4 rows for 5 samples"):
        len(feedline.open_dataset(str(tmp_path), labels="y.npy"))
    with pytest.raises(FileNotFoundError):
        feedline.open_dataset(str(tmp_path), labels="missing.npy")


# -------------------------------------------------------------------------------- hdf5


def _h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, kw in datasets.items():
            f.create_dataset(name, **kw)
    return str(path)


def test_hdf5_compressed(tmp_path):
    # gzip/shuffle/lzf are read (tests/test_compressed.py); other filters are refused
    p = _h5(
        tmp_path / "z.h5",
        x={"data": np.zeros((8, 4), "f4"), "chunks": (2, 4), "compression": "gzip"},
    )
    assert feedline.open_dataset(p).read(3) == bytes(16)
    q = _h5(
        tmp_path / "c.h5", x={"data": np.zeros((8, 4), "f4"), "chunks": (2, 4), "fletcher32": True}
    )
    with pytest.raises(UnsupportedFormatError, match=r"'x' uses HDF5 filter 3 .*h5repack") as e:
        len(feedline.open_dataset(q))
    assert e.value.path == q


def test_hdf5_chunks_split_samples(tmp_path):
    p = _h5(tmp_path / "s.h5", x={"data": np.zeros((8, 4, 4), "f4"), "chunks": (8, 2, 4)})
    with pytest.raises(UnsupportedFormatError, match=r"split samples.*h5repack -l x:CONTI"):
        len(feedline.open_dataset(p))


@pytest.mark.parametrize("chunks", [None, (2, 3)])
def test_hdf5_never_written(tmp_path, chunks):
    p = _h5(tmp_path / "u.h5", x={"shape": (6, 3), "dtype": "f4", "chunks": chunks})
    with pytest.raises(UnsupportedFormatError, match="never written"):
        len(feedline.open_dataset(p))


def test_hdf5_partly_written_chunks(tmp_path):
    p = str(tmp_path / "pw.h5")
    with h5py.File(p, "w") as f:
        d = f.create_dataset("x", shape=(6, 3), dtype="f4", chunks=(2, 3))
        d[0:2] = 1.0
    with pytest.raises(UnsupportedFormatError, match="row 2 was never written"):
        len(feedline.open_dataset(p))


def test_hdf5_compact_and_external(tmp_path):
    p = str(tmp_path / "c.h5")
    with h5py.File(p, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple((4, 2))
        h5py.h5d.create(f.id, b"x", h5py.h5t.NATIVE_FLOAT, space, dcpl=dcpl)
        f["x"][...] = 1.0
    with pytest.raises(UnsupportedFormatError, match="compact"):
        len(feedline.open_dataset(p))
    ext = tmp_path / "raw.bin"
    ext.write_bytes(b"\0" * 32)
    q = _h5(tmp_path / "e.h5", x={"shape": (4, 2), "dtype": "f4", "external": [(str(ext), 0, 32)]})
    with pytest.raises(UnsupportedFormatError, match="external"):
        len(feedline.open_dataset(q))


def test_hdf5_rows_beyond_end_of_file(tmp_path):
    """The file is cut inside the data but its superblock agrees (EOA patched): HDF5
    opens it; the dataset's rows lie past the end -> CorruptDataError naming the file
    (HDF5 >= 2 notices when opening the dataset; older HDF5 leaves it to feedline's own
    bounds check, tested directly below)."""
    p = _h5(tmp_path / "t.h5", x={"data": np.arange(40, dtype="<f4").reshape(10, 4)})
    with h5py.File(p, "r") as f:
        base = f["x"].id.get_offset()
    with open(p, "rb") as f:
        raw = bytearray(f.read())
    assert raw[:8] == b"\x89HDF\r\n\x1a\n" and raw[8] == 0  # superblock v0: EOA at byte 40
    assert base + 160 == len(raw)  # data is at the end of this small file
    cut = base + 16 * 5 + 3
    struct.pack_into("<Q", raw, 40, cut)
    with open(p, "wb") as f:
        f.write(bytes(raw[:cut]))
    with pytest.raises(CorruptDataError) as e:
        len(feedline.open_dataset(p))
    assert e.value.path == p
    assert e.value.offset in (0, base + 16 * 5)


def test_hdf5_row_bounds_check(tmp_path):
    from feedline.formats.hdf5 import row_offsets

    p = _h5(tmp_path / "b.h5", x={"data": np.arange(40, dtype="<f4").reshape(10, 4)})
    with h5py.File(p, "r") as f:
        dset = f["x"]
        base = dset.id.get_offset()
        offs, row, _ = row_offsets(p, "x", dset, base + 160)
        assert row == 16 and offs.tolist() == [base + 16 * i for i in range(10)]
        with pytest.raises(
            CorruptDataError, match=r"dataset 'x': row 5 .* ends beyond the end of the file"
        ) as e:
            row_offsets(p, "x", dset, base + 16 * 5 + 3)
    assert e.value.path == p and e.value.offset == base + 16 * 5


def test_hdf5_not_hdf5(tmp_path):
    p = tmp_path / "n.h5"
    p.write_bytes(b"definitely not HDF5" * 10)
    with pytest.raises(CorruptDataError, match="not a readable HDF5 file"):
        len(feedline.open_dataset(str(p)))


def test_hdf5_options(tmp_path):
    p = _h5(
        tmp_path / "o.h5",
        a={"data": np.zeros((3, 2), "f4")},
        b={"data": np.ones((3, 10), "u1")},
        y={"data": np.arange(4, dtype="u1")},
    )
    with pytest.raises(ConfigError, match=r"labels 'y' of shape \(4,\) do not match 3"):
        len(feedline.open_dataset(p))
    ds = feedline.open_dataset(p, labels=False, sidecar=False)
    assert ds.index.meta["dataset"] == "b" and ds.index.labels is None  # the largest
    ds = feedline.open_dataset(p, dataset="a", labels=False, sidecar=False)
    assert ds[1][0].tolist() == [0.0, 0.0]
    with pytest.raises(ConfigError, match="no dataset 'nope'"):
        len(feedline.open_dataset(p, dataset="nope"))


def test_hdf5_truncations(tmp_path):
    p = _h5(
        tmp_path / "h.h5",
        x={"data": np.arange(60, dtype="<i2").reshape(10, 6)},
        labels={"data": np.arange(10)},
    )
    size = os.path.getsize(p)
    cuts = sorted(set(np.linspace(0, size - 1, 120).astype(int).tolist()))
    out = sweep(p, "hdf5", "truncate", cuts)
    for cut, o in zip(cuts, out, strict=True):
        assert o[0] == "CorruptDataError", (cut, o)


@pytest.mark.full
def test_hdf5_bit_flips_full(tmp_path):
    """Flipped metadata bits: HDF5 may read different (valid) metadata, but it must not
    crash or raise untyped errors (data bits carry no checksum and just change data)."""
    p = _h5(tmp_path / "h.h5", x={"data": np.arange(60, dtype="<i2").reshape(10, 6)})
    with h5py.File(p, "r") as f:
        base = f["x"].id.get_offset()
    out = sweep(p, "hdf5", "flip", range(0, base * 8, 3), timeout=1200)
    assert sum(o[0] == "CorruptDataError" for o in out) > 0


# ---------------------------------------------------------------------------- tfrecord


def _tfr(tmp_path, n=5):
    rng = np.random.default_rng(9)
    recs = [rng.bytes(int(rng.integers(0, 40))) for _ in range(n)]
    p = tmp_path / "t.tfrecord"
    write_tfrecord(p, recs)
    return p, recs


def test_tfrecord_every_truncation(tmp_path):
    p, recs = _tfr(tmp_path)
    size = os.path.getsize(p)
    ends = np.cumsum([0] + [16 + len(r) for r in recs]).tolist()
    out = sweep(p, "tfrecord", "truncate", range(size + 1))
    for cut, o in enumerate(out):
        if cut in ends:
            assert o == ["ok", ends.index(cut)]
        else:
            assert o[0] == "CorruptDataError" and o[1] <= cut and o[2].endswith("m.tfrecord"), (
                cut,
                o,
            )


def test_tfrecord_every_bit_flip(tmp_path):
    p, _recs = _tfr(tmp_path, 3)
    nbits = os.path.getsize(p) * 8
    out = sweep(p, "tfrecord", "flip", range(nbits))
    assert all(o[0] == "CorruptDataError" for o in out), [
        o for o in out if o[0] != "CorruptDataError"
    ][:3]


def test_tfrecord_errors_say_where(tmp_path):
    p, recs = _tfr(tmp_path, 3)
    good = p.read_bytes()
    second = 16 + len(recs[0])
    bad = bytearray(good)
    bad[second + 1] ^= 4  # length field of record 1
    p.write_bytes(bytes(bad))
    with pytest.raises(CorruptDataError, match="length CRC mismatch in record 1") as e:
        len(feedline.open_dataset(str(p), sidecar=False))
    assert e.value.offset == second
    bad = bytearray(good)
    bad[second + 12] ^= 1  # first payload byte of record 1
    p.write_bytes(bytes(bad))
    with pytest.raises(CorruptDataError, match="data CRC mismatch in record 1") as e:
        len(feedline.open_dataset(str(p), sidecar=False))
    assert e.value.offset == second + 12
    # verify=False trusts payloads (and still checks lengths)
    assert len(feedline.open_dataset(str(p), sidecar=False, verify=False)) == 3


def test_tfrecord_gzip_and_garbage(tmp_path):
    p = tmp_path / "g.tfrecord"
    p.write_bytes(gzip.compress(frame(b"hello")))  # GZIP TFRecord: read (test_compressed.py)
    assert feedline.open_dataset(str(p), sidecar=False).read(0) == b"hello"
    p.write_bytes(gzip.compress(b"hello, not a TFRecord"))
    with pytest.raises(CorruptDataError, match="length CRC mismatch in record 0"):
        len(feedline.open_dataset(str(p), sidecar=False))
    p.write_bytes(b"this is not a tfrecord at all")
    with pytest.raises(CorruptDataError, match="length CRC mismatch in record 0"):
        len(feedline.open_dataset(str(p), sidecar=False))


def test_tfrecord_missing_file_is_storage_error(tmp_path):
    from feedline import _core

    with pytest.raises(feedline.StorageError) as e:
        _core.scan_tfrecord(str(tmp_path / "nope.tfrecord"))
    assert e.value.errno == 2
