# SPDX-License-Identifier: Apache-2.0
"""Dataset generators (feedline make), Datum encoding, CRC32C and progress bars.

Oracles are real components: liblmdb (py-lmdb) for LMDB contents and commit counts,
h5py for HDF5 layout, the native Datum parser and TFRecord scanner of ``feedline._core``
for wire formats, Pillow for JPEG Datums.
"""

from __future__ import annotations

import ast
import io
import json
import os
import struct

import numpy as np
import pytest

from crc32c_oracle import crc32c, crc32c_rows, mask
from feedline.errors import ConfigError
from feedline.formats.datum_write import (
    datum_prefix,
    encode_datum,
    int32_varint,
    label_suffix,
    varint,
)
from feedline.progress import process_rank, progress, should_show
from feedline_tools.generate import MANIFEST, SPECS, read_manifest, run
from feedline_tools.make import generate

core = pytest.importorskip("feedline._core")
lmdb = pytest.importorskip("lmdb")
h5py = pytest.importorskip("h5py")


# ----------------------------------------------------------------------- Datum wire


def test_varints_follow_protobuf():
    assert varint(0) == b"\x00"
    assert varint(1) == b"\x01"
    assert varint(300) == b"\xac\x02"  # the protobuf documentation's example
    assert varint(3072) == b"\x80\x18"
    assert int32_varint(-1) == b"\xff" * 9 + b"\x01"  # sign-extended: 10 bytes
    assert len(int32_varint(-(1 << 31))) == 10
    with pytest.raises(ValueError):
        int32_varint(1 << 31)


@pytest.mark.parametrize("label", [0, 1, 9, 127, 128, 999, 70000, -1, -(1 << 31), (1 << 31) - 1])
def test_datum_roundtrips_through_native_parser(label):
    rng = np.random.default_rng(label & 0xFFFF)
    pixels = rng.integers(0, 256, size=3 * 5 * 7, dtype=np.uint8)
    rec = encode_datum(3, 5, 7, pixels, label)
    info = core.parse_datum(np.frombuffer(rec, dtype=np.uint8))
    assert (info.channels, info.height, info.width, info.label) == (3, 5, 7, label)
    assert not info.encoded
    assert rec[info.data_offset : info.data_offset + info.data_size] == pixels.tobytes()
    # Caffe field order: 1, 2, 3, 4 (data), 5 (label), 7 (encoded=false)
    head = b"\x08\x03\x10\x05\x18\x07\x22" + varint(105)
    assert rec.startswith(head)
    assert rec == head + pixels.tobytes() + b"\x28" + int32_varint(label) + b"\x38\x00"
    assert rec == datum_prefix(3, 5, 7) + pixels.tobytes() + label_suffix(label)


def test_datum_variants_match_caffe_tools():
    jpeg = b"\xff\xd8fakejpeg\xff\xd9"
    enc = encode_datum(0, 0, 0, jpeg, 4, encoded=True)  # convert_imageset --encoded
    assert enc == b"\x22" + varint(len(jpeg)) + jpeg + b"\x28\x04\x38\x01"
    info = core.parse_datum(np.frombuffer(enc, dtype=np.uint8))
    assert info.encoded and info.label == 4 and info.data_size == len(jpeg)
    cifar = encode_datum(3, 32, 32, bytes(3072), 1, encoded=None)  # convert_cifar_data
    assert cifar.endswith(b"\x28\x01") and len(cifar) == 6 + 3 + 3072 + 2


def test_datum_float_data_unpacked_like_caffe_and_packed_on_request():
    vals = np.array([1.5, -2.0, 0.25], dtype="<f4")
    plain = encode_datum(3, 1, 1, float_data=vals, label=2)
    # proto2 `repeated float` without [packed=true]: tag 0x35 + 4 bytes per value
    assert (
        plain
        == b"\x08\x03\x10\x01\x18\x01\x28\x02"
        + b"".join(b"\x35" + v.tobytes() for v in vals)
        + b"\x38\x00"
    )
    packed = encode_datum(3, 1, 1, float_data=vals, label=2, packed=True)
    assert b"\x32\x0c" + vals.tobytes() in packed
    for rec in (plain, packed):
        info = core.parse_datum(np.frombuffer(rec, dtype=np.uint8))
        assert info.float_count == 3 and info.label == 2


def test_datum_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="channels\\*height\\*width"):
        encode_datum(3, 2, 2, bytes(11))
    with pytest.raises(ValueError):
        encode_datum(-1, 2, 2)
    with pytest.raises(ValueError):
        encode_datum(1, 1, 1, b"x", label=1 << 40)


# --------------------------------------------------------------------------- CRC32C


def test_crc32c_known_answers_and_native_agreement():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4 test vector
    rng = np.random.default_rng(5)
    for length in (1, 3, 100, 4095, 4096, 4097, 10000):
        rows = rng.integers(0, 256, size=(3, length), dtype=np.uint8)
        got = crc32c_rows(rows)
        for r in range(3):
            assert int(got[r]) == core.crc32c(rows[r])
            assert int(mask(got[r : r + 1])[0]) == core.masked_crc32c(rows[r])
            assert mask(int(got[r])) == core.masked_crc32c(rows[r])


# ------------------------------------------------------------------------- progress


def test_progress_visibility_rules(monkeypatch):
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("FEEDLINE_PROGRESS", raising=False)
    assert process_rank() == 0
    buf = io.StringIO()  # not a TTY
    assert not should_show(None, buf)
    assert should_show(True, buf)
    assert not should_show(False, buf)
    with progress(10, "forced-bar", enabled=True, file=buf) as bar:
        bar.update(10)
    assert "forced-bar" in buf.getvalue()
    quiet = io.StringIO()
    assert list(progress(range(5), "hidden-bar", file=quiet)) == [0, 1, 2, 3, 4]
    assert quiet.getvalue() == ""
    monkeypatch.setenv("FEEDLINE_PROGRESS", "2")
    assert should_show(None, io.StringIO())
    monkeypatch.setenv("FEEDLINE_PROGRESS", "0")
    assert not should_show(True, io.StringIO())
    monkeypatch.setenv("FEEDLINE_PROGRESS", "1")
    monkeypatch.setenv("PMI_RANK", "3")
    assert process_rank() == 3
    assert not should_show(True, io.StringIO())


# ----------------------------------------------------------------------- LMDB (Caffe)


def _lmdb_items(path):
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            items = list(txn.cursor())
        return items, env.info(), env.stat()
    finally:
        env.close()


def _parse(rec):
    return core.parse_datum(np.frombuffer(rec, dtype=np.uint8))


@pytest.fixture(scope="module")
def cifar_lmdb(tmp_path_factory):
    base = tmp_path_factory.mktemp("cifar")
    n = 2500
    sorted_ = generate("cifar10-large", base / "sorted", samples=n, seed=3, commit_every=1000)
    shuffled = generate("cifar10-large", base / "shuffled", samples=n, seed=3, shuffle=True)
    return n, sorted_, shuffled


def test_cifar10_large_keys_labels_and_commits(cifar_lmdb):
    n, path, _ = cifar_lmdb
    items, info, stat = _lmdb_items(path)
    assert [k for k, _ in items] == [b"%08d" % i for i in range(n)]
    assert info["last_txnid"] == 3  # 2,500 records committed every 1,000: 3 transactions
    assert stat["entries"] == n
    labels = []
    for _, v in items:
        d = _parse(v)
        assert (d.channels, d.height, d.width, d.data_size, d.encoded) == (3, 32, 32, 3072, False)
        labels.append(d.label)
    assert labels == [i * 10 // n for i in range(n)]  # class-sorted, balanced
    assert len(items[0][1]) == 3072 + 6 + 3 + 2 + 2
    man = read_manifest(path)
    assert man["provenance"]["commit_every"] == 1000 and man["provenance"]["commits"] == 3
    assert man["provenance"]["entries"] == n and man["format"] == "lmdb"
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o700)  # not mkdtemp's private mode


def test_commit_frequency_is_visible_to_liblmdb(tmp_path):
    path = generate("cifar10-large", tmp_path / "c", samples=1001, commit_every=250, image_size=8)
    _, info, _ = _lmdb_items(path)
    assert info["last_txnid"] == 5  # ceil(1001 / 250), the last one partial
    assert read_manifest(path)["provenance"]["last_txnid"] == 5


def test_shuffle_is_a_permutation_of_the_sorted_dataset(cifar_lmdb):
    n, sorted_path, shuffled_path = cifar_lmdb
    a, _, _ = _lmdb_items(sorted_path)
    b, _, _ = _lmdb_items(shuffled_path)
    assert [k for k, _ in b] == [k for k, _ in a]  # keys stay %08d in write order
    va = [v for _, v in a]
    vb = [v for _, v in b]
    assert va != vb
    assert sorted(va) == sorted(vb)
    labels = np.array([_parse(v).label for v in vb])
    assert np.bincount(labels, minlength=10).tolist() == [n // 10] * 10
    # interleaved: a class-sorted sequence changes label 9 times, a shuffled one ~n*0.9
    assert np.count_nonzero(np.diff(labels)) > n // 2


def test_contents_are_deterministic_from_seed(tmp_path, cifar_lmdb):
    n, path, _ = cifar_lmdb
    again = generate("cifar10-large", tmp_path / "again", samples=n, seed=3)
    other = generate("cifar10-large", tmp_path / "other", samples=n, seed=4)
    a, _, _ = _lmdb_items(path)
    assert _lmdb_items(again)[0] == a
    b = _lmdb_items(other)[0]
    assert sum(x[1] == y[1] for x, y in zip(a, b, strict=True)) == 0


def test_map_size_grows_as_needed(tmp_path):
    path = generate("cifar10-large", tmp_path / "m", samples=1500, map_size=1 << 20)
    items, info, _ = _lmdb_items(path)
    assert len(items) == 1500
    assert info["map_size"] > 1 << 20


def test_images_are_learnable_by_class(cifar_lmdb):
    """Nearest class mean on held-out samples: far above chance (10%)."""
    n, _, path = cifar_lmdb
    items, _, _ = _lmdb_items(path)
    x = np.stack([np.frombuffer(v[11 : 11 + 3072], dtype=np.uint8) for _, v in items]).astype(
        np.float32
    )
    y = np.array([_parse(v).label for _, v in items])
    train, test = slice(0, 2000), slice(2000, n)
    means = np.stack([x[train][y[train] == k].mean(0) for k in range(10)])
    pred = np.argmin(((x[test][:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == y[test]).mean() > 0.6


def test_imagenet_raw_and_encoded(tmp_path):
    n = 8
    raw = generate("imagenet", tmp_path / "raw", samples=n, seed=1, classes=4)
    enc = generate(
        "imagenet", tmp_path / "enc", samples=n, seed=1, classes=4, encoded=True, quality=95
    )
    from PIL import Image

    r_items, _, _ = _lmdb_items(raw)
    e_items, _, _ = _lmdb_items(enc)
    for i, ((_, rv), (_, ev)) in enumerate(zip(r_items, e_items, strict=True)):
        rd, ed = _parse(rv), _parse(ev)
        assert (rd.channels, rd.height, rd.width, rd.data_size) == (3, 256, 256, 196608)
        assert ed.encoded and (ed.channels, ed.height, ed.width) == (0, 0, 0)
        assert rd.label == ed.label == i * 4 // n
        pix = np.frombuffer(rv[rd.data_offset : rd.data_offset + rd.data_size], np.uint8).reshape(
            3, 256, 256
        )
        jpg = ev[ed.data_offset : ed.data_offset + ed.data_size]
        dec = np.asarray(Image.open(io.BytesIO(jpg))).transpose(2, 0, 1).astype(np.int16)
        assert np.abs(dec - pix).mean() < 8  # the same image, through lossy JPEG
    assert read_manifest(enc)["record"].endswith("(encoded JPEG)")


# ------------------------------------------------------------------------------ HDF5


def _h5(path):
    out = []
    for name in sorted(f for f in os.listdir(path) if f.endswith(".h5")):
        with h5py.File(os.path.join(path, name), "r") as f:
            for key in ("x", "y"):
                d = f[key]
                assert d.chunks is None and d.compression is None
                assert d.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS
                assert d.id.get_offset() is not None
            out.append((name, f["x"][...], f["y"][...]))
    return out


def test_cosmoflow_files_shapes_and_targets(tmp_path):
    path = generate("cosmoflow", tmp_path / "c", samples=10, cube=8, files=3, seed=2)
    parts = _h5(path)
    assert [p[1].shape for p in parts] == [(3, 8, 8, 8, 12), (3, 8, 8, 8, 12), (4, 8, 8, 8, 12)]
    x = np.concatenate([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    assert x.dtype == np.uint16 and y.dtype == np.float32 and y.shape == (10, 4)
    assert np.all(np.diff(y[:, 0]) > 0) and np.all(np.abs(y) < 1)  # sorted by target 0
    # targets are functions of the data: the mean count follows target 2
    assert np.corrcoef(x.reshape(10, -1).mean(1), y[:, 2])[0, 1] > 0.9
    sh = generate("cosmoflow", tmp_path / "s", samples=10, cube=8, files=3, seed=2, shuffle=True)
    xs = np.concatenate([p[1] for p in _h5(sh)])
    ys = np.concatenate([p[2] for p in _h5(sh)])
    assert not np.all(np.diff(ys[:, 0]) > 0)
    order = np.argsort(ys[:, 0])
    assert np.array_equal(xs[order], x) and np.array_equal(ys[order], y)


def test_neuron_inverter_targets_are_recoverable(tmp_path):
    path = generate("neuron-inverter", tmp_path / "n", samples=300, files=2, seed=1)
    parts = _h5(path)
    x = np.concatenate([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    assert x.shape == (300, 1600, 3) and x.dtype == np.float32 and y.shape == (300, 19)
    # ridge regression on held-out samples explains most of the target variance
    feats = np.arctanh(np.clip(x.reshape(300, -1), -0.999, 0.999))
    a, b = feats[:200], feats[200:]
    w = np.linalg.solve(a @ a.T + 1e-2 * np.eye(200), y[:200])
    pred = b @ (a.T @ w)
    r2 = 1 - ((pred - y[200:]) ** 2).sum() / ((y[200:] - y[200:].mean(0)) ** 2).sum()
    assert r2 > 0.8


# -------------------------------------------------------------- records, TFRecord, npy


def test_cifar10_bin_records(tmp_path):
    n = 103
    path = generate("cifar10-bin", tmp_path / "b", samples=n, seed=9)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)]
    assert sorted(f for f in os.listdir(path) if not f.startswith(".")) == names
    recs = np.concatenate(
        [np.fromfile(os.path.join(path, f), dtype=np.uint8).reshape(-1, 3073) for f in names]
    )
    assert recs.shape == (n, 3073)
    assert recs[:, 0].tolist() == [i * 10 // n for i in range(n)]
    man = read_manifest(path)
    assert man["open_options"] == {"record_bytes": 3073, "label_bytes": 1, "header_bytes": 0}
    sh = generate("cifar10-bin", tmp_path / "s", samples=n, seed=9, shuffle=True)
    srecs = np.concatenate(
        [np.fromfile(os.path.join(sh, f), dtype=np.uint8).reshape(-1, 3073) for f in names]
    )
    assert sorted(map(bytes, srecs)) == sorted(map(bytes, recs))


def _read_tfrecords(path):
    with open(path, "rb") as f:
        data = f.read()
    pos, out = 0, []
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (lcrc,) = struct.unpack_from("<I", data, pos + 8)
        assert lcrc == core.masked_crc32c(np.frombuffer(data[pos : pos + 8], np.uint8))
        payload = data[pos + 12 : pos + 12 + length]
        (dcrc,) = struct.unpack_from("<I", data, pos + 12 + length)
        assert dcrc == core.masked_crc32c(np.frombuffer(payload, np.uint8))
        out.append(payload)
        pos += 16 + length
    return out


@pytest.mark.parametrize("payload", ["raw", "example"])
def test_tfrecord_frames_and_payloads(tmp_path, payload):
    n = 57
    path = generate(
        "tfrecord", tmp_path / payload, samples=n, seed=4, files=3, payload=payload, classes=200
    )
    files = sorted(f for f in os.listdir(path) if f.endswith(".tfrecord"))
    assert files == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    recs = [r for f in files for r in _read_tfrecords(os.path.join(path, f))]
    assert len(recs) == n
    offs, _lens, _, _ = core.scan_tfrecord(os.path.join(path, files[0]))  # native scanner agrees
    assert len(offs) == n // 3 and int(offs[0]) == 12
    labels = [i * 200 // n for i in range(n)]
    if payload == "raw":
        assert all(len(r) == 4 + 3072 for r in recs)
        assert [struct.unpack_from("<i", r)[0] for r in recs] == labels
    else:
        for r, lab in zip(recs, labels, strict=True):
            assert b"\n\x05image" in r and b"\n\x05label" in r and b"\n\x05shape" in r
            assert (
                b"\x1a"
                + varint(len(varint(lab)) + 2)
                + b"\x0a"
                + varint(len(varint(lab)))
                + varint(lab)
                in r
            )


def test_npy_arrays(tmp_path):
    path = generate("npy", tmp_path / "n", samples=40, seed=1, classes=4, image_size=16, channels=1)
    x = np.load(os.path.join(path, "data.npy"))
    y = np.load(os.path.join(path, "labels.npy"))
    assert x.shape == (40, 1, 16, 16) and x.dtype == np.uint8
    assert y.tolist() == [i * 4 // 40 for i in range(40)]


# ------------------------------------------------------------------- API behaviour


def test_refuses_non_empty_output_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="force"):
        generate("npy", out, samples=5)
    assert (out / "precious.txt").read_text() == "keep me"
    generate("npy", out, samples=5, force=True)
    assert not (out / "precious.txt").exists()
    assert json.loads((out / MANIFEST).read_text())["samples"] == 5
    empty = tmp_path / "empty"
    empty.mkdir()
    generate("npy", empty, samples=5)  # an empty directory is fine
    assert [p for p in os.listdir(tmp_path) if ".making-" in p] == []


def test_failed_run_leaves_nothing(tmp_path):
    with pytest.raises(ConfigError, match="files must be <= samples"):
        generate("cosmoflow", tmp_path / "c", samples=2, files=3, cube=4)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"name": "nope"}, "unknown dataset generator"),
        ({"colour": 1}, "does not take"),
        ({"samples": 0}, "samples"),
        ({"seed": -1}, "seed"),
        ({"classes": 2.5}, "integer"),
        ({"payload": "x"}, "does not take"),
    ],
)
def test_bad_arguments(tmp_path, kw, match):
    name = kw.pop("name", "npy")
    with pytest.raises(ConfigError, match=match):
        generate(name, tmp_path / "x", **kw)


def test_every_generator_has_options_and_defaults():
    assert set(SPECS) == {
        "cifar10-large",
        "imagenet",
        "cosmoflow",
        "neuron-inverter",
        "cifar10-bin",
        "tfrecord",
        "npy",
    }
    for spec in SPECS.values():
        assert spec.default_samples > 0 and spec.summary and spec.mimics


@pytest.mark.full
def test_cifar_200k_is_fast(tmp_path):
    res = run("cifar10-large", tmp_path / "big", samples=200_000, seed=0)
    assert res.samples == 200_000
    assert res.seconds < 60, res.summary()


_MPI_PROGRESS = """
import io, sys
from feedline.progress import process_rank, should_show
env_rank, env_show = process_rank(), should_show(True, io.StringIO())
from mpi4py import MPI
comm = MPI.COMM_WORLD
got = comm.allgather((env_rank, env_show, process_rank(), should_show(True, io.StringIO())))
if comm.rank == 0:
    print("RESULT", got)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_progress_shows_on_rank_zero_only_under_mpiexec(n):
    import shutil
    import subprocess
    import sys

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec not installed")
    r = subprocess.run(
        [mpiexec, "-n", str(n), sys.executable, "-c", _MPI_PROGRESS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    got = ast.literal_eval(r.stdout.split("RESULT", 1)[1].strip())
    assert got == [(k, k == 0, k, k == 0) for k in range(n)]
