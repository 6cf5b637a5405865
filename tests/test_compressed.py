# SPDX-License-Identifier: Apache-2.0
"""Compressed science data: HDF5 filtered chunks (gzip/shuffle/lzf) and gzip TFRecord.

Every preset must deliver exactly the bytes h5py, or a plain TFRecord reader over the
gunzipped stream, give; every sample once per epoch; resume; typed errors for refused
filters and corrupt chunks or segments. The full tier runs the issue's size
(2,000 x 128x128x4 float32, chunks of 16).
"""

from __future__ import annotations

import gzip
import json
import os
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from feedline import CorruptDataError, Loader, UnsupportedFormatError, open_dataset
from feedline.formats.tfrecord import frame, write_tfrecord
from feedline.pipeline.world import LoaderWorld
from feedline.sources.lmdbio import PRESETS as LMDBIO_SOURCE_PRESETS
from feedline_tools.make import generate

PRESETS = ["feedline", "tf", "tf-pre", "async", "async-db"]
#: the LMDBIO / MPI-Caffe presets read other formats located by the index
LMDBIO_PRESETS = list(LMDBIO_SOURCE_PRESETS)


def science(n: int, side: int, seed: int = 0) -> np.ndarray:
    """Smooth-ish float32 fields with few distinct values: compress like simulation data."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 50, size=(n, side, side, 4)).astype(np.float32)
    return (base / 4.0).astype(np.float32)


def write_h5(path, x, chunk: int = 16, **filters) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(chunk, *x.shape[1:]), **filters)
        f.create_dataset("y", data=np.arange(len(x), dtype=np.int64) % 7)


def tfrecord_payloads(path: str) -> list[bytes]:
    """A plain TFRecord reader: gunzip, then walk the frames."""
    data = gzip.decompress(Path(path).read_bytes())
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 12 : pos + 12 + n])
        pos += 12 + n + 4
    return out


def every_batch(ds, preset: str, ranks: int, batch: int, decode: bool = False):
    out = []
    for r in range(ranks):
        with Loader(
            ds, batch, preset=preset, seed=3, comm=LoaderWorld(r, ranks), decode=decode, buffer=8
        ) as ld:
            out.extend(list(ld))
    return out


@pytest.fixture(scope="module")
def h5(tmp_path_factory):
    d = tmp_path_factory.mktemp("h5")
    x = science(200, 32)
    p = str(d / "gz.h5")
    write_h5(p, x, compression="gzip", shuffle=True)
    return p, x


@pytest.fixture(scope="module")
def gzt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gzt")
    rng = np.random.default_rng(1)
    pays = [rng.integers(0, 3, size=int(rng.integers(1, 20000)), dtype=np.uint8).tobytes()
            for _ in range(300)]  # fmt: skip
    members = str(d / "members.tfrecord.gz")
    single = str(d / "single.tfrecord.gz")
    write_tfrecord(members, pays, compression="gzip", records_per_member=16)
    write_tfrecord(single, pays, compression="gzip", records_per_member=0)
    return {"members": members, "single": single, "payloads": pays}


# ----------------------------------------------------------------------------- HDF5


@pytest.mark.parametrize(
    "filters",
    [
        {"compression": "gzip", "shuffle": True},
        {"compression": "gzip", "compression_opts": 9},
        {"shuffle": True},
        {"compression": "lzf"},
        {"compression": "lzf", "shuffle": True},
    ],
    ids=["gzip-shuffle", "gzip9", "shuffle", "lzf", "lzf-shuffle"],
)
def test_hdf5_filters_read_exactly_what_h5py_reads(tmp_path, filters):
    x = science(70, 16, seed=2)  # 70 rows: the last chunk is partial
    p = str(tmp_path / "d.h5")
    write_h5(p, x, chunk=16, **filters)
    ds = open_dataset(p)
    assert ds.packed and ds.index.meta["chunk_rows"] == 16
    with h5py.File(p) as f:
        ref = f["x"][...]
    for i in (0, 15, 16, 69):
        assert ds.read(i) == ref[i].tobytes()
    order = np.random.default_rng(0).permutation(70)
    raw, lengths = ds.read_many(order)
    assert raw.tobytes() == ref[order].tobytes()
    assert (lengths == ref[0].nbytes).all()
    data, label = ds[33]
    np.testing.assert_array_equal(data, ref[33])
    assert label == 33 % 7


def test_incompressible_chunks_skipped_by_lzf_are_read_as_stored(tmp_path):
    # LZF fails on random bytes; HDF5 then stores the chunk unfiltered and says so in its
    # filter mask, which the index keeps per chunk
    x = np.random.default_rng(5).integers(0, 256, size=(40, 64), dtype=np.uint8)
    p = str(tmp_path / "rand.h5")
    write_h5(p, x, chunk=8, compression="lzf")
    ds = open_dataset(p)
    assert (ds.index.packed.span_arg == 1).any()
    assert ds.read_many(np.arange(40))[0].tobytes() == x.tobytes()


@pytest.mark.parametrize("preset", PRESETS + LMDBIO_PRESETS)
@pytest.mark.parametrize("ranks", [1, 3])
def test_every_preset_delivers_h5py_bytes_once(h5, preset, ranks):
    p, x = h5
    ds = open_dataset(p)
    batches = every_batch(ds, preset, ranks, batch=24)
    ids = np.concatenate([b.ids for b in batches])
    assert sorted(ids.tolist()) == list(range(len(x)))
    for b in batches:
        assert b.data.shape == (len(b.ids), x[0].nbytes)
        assert b.data.tobytes() == x[b.ids].tobytes()
        assert (b.lengths == x[0].nbytes).all()
    dec = every_batch(ds, preset, 1, batch=24, decode=True)
    for b in dec:
        np.testing.assert_array_equal(b.data, x[b.ids])
        np.testing.assert_array_equal(b.labels, b.ids % 7)


def test_a_chunk_is_unpacked_once_when_its_samples_share_a_batch(h5):
    p, _x = h5
    ds = open_dataset(p)
    with Loader(ds, 32, preset="feedline", shuffle=False) as ld:
        list(ld)
    st = ds._unpacker.stats()
    chunks = len(ds.index.packed.span_out)
    assert st["spans_unpacked"] == chunks  # 200 rows / 16 = 13 chunks, each once


def test_resume_mid_epoch_completes_exactly_once(h5):
    p, x = h5
    ds = open_dataset(p)
    with Loader(ds, 16, preset="feedline", seed=9) as ld:
        seen = []
        for b in ld:
            seen.extend(b.ids.tolist())
            if ld.step == 4:
                state = ld.state_dict()
                break
    with Loader(ds, 16, preset="feedline", seed=9) as ld2:
        ld2.load_state_dict(state)
        for b in ld2:
            assert b.data.tobytes() == x[b.ids].tobytes()
            seen.extend(b.ids.tolist())
    assert sorted(seen) == list(range(len(x)))


def test_sidecar_keeps_the_chunk_map(h5):
    p, x = h5
    first = open_dataset(p)
    idx = first.index
    again = open_dataset(p)
    assert again.index.packed is not None and again.sidecar_path == first.sidecar_path
    for name in ("span", "at", "size", "span_out", "span_arg"):
        np.testing.assert_array_equal(getattr(again.index.packed, name), getattr(idx.packed, name))
    assert again.index.packed.params == idx.packed.params
    assert again.read(77) == x[77].tobytes()


def test_other_filters_are_refused_naming_filter_and_file(tmp_path):
    p = str(tmp_path / "f32.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.zeros((8, 4), "f4"), chunks=(2, 4), fletcher32=True)
    with pytest.raises(UnsupportedFormatError, match=r"f32\.h5.*filter 3 \(fletcher32\)"):
        len(open_dataset(p))
    p2 = str(tmp_path / "so.h5")
    with h5py.File(p2, "w") as f:
        f.create_dataset("x", data=np.zeros((8, 4), "i4"), chunks=(2, 4), scaleoffset=0)
    with pytest.raises(UnsupportedFormatError, match=r"so\.h5.*filter 6"):
        len(open_dataset(p2))


def test_chunks_splitting_samples_are_refused(tmp_path):
    p = str(tmp_path / "split.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.zeros((8, 4, 4), "f4"), chunks=(2, 2, 4), compression="gzip")
    with pytest.raises(UnsupportedFormatError, match="split samples"):
        len(open_dataset(p))


def _stored_chunk(p: str, row: int) -> tuple[int, int]:
    with h5py.File(p) as f:
        info = f["x"].id.get_chunk_info_by_coord((row, 0, 0, 0))
        return info.byte_offset, info.size


def test_corrupt_chunk_is_corrupt_data_naming_file_and_offset(tmp_path):
    x = science(64, 16, seed=4)
    p = str(tmp_path / "bad.h5")
    write_h5(p, x, compression="gzip", shuffle=True)
    ds = open_dataset(p)
    assert len(ds) == 64
    off, size = _stored_chunk(p, 32)
    with open(p, "r+b") as f:  # garbage in the middle of the deflate stream
        f.seek(off + size // 2)
        f.write(b"\xff" * 64)
    ds = open_dataset(p, sidecar=False)
    assert ds.read(0) == x[0].tobytes()  # other chunks still read
    with pytest.raises(CorruptDataError) as e:
        ds.read(40)
    assert e.value.path == p and e.value.offset == off and "sample 40" in str(e.value)
    with pytest.raises(CorruptDataError, match="chunk"), Loader(ds, 16, preset="feedline") as ld:
        list(ld)


# ------------------------------------------------------------------------- TFRecord


@pytest.mark.parametrize("kind", ["members", "single"])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_delivers_plain_reader_bytes_once(gzt, kind, preset):
    ref = tfrecord_payloads(gzt[kind])
    assert ref == gzt["payloads"]
    ds = open_dataset(gzt[kind], restart_bytes=64 << 10)
    batches = every_batch(ds, preset, 2, batch=32)
    ids = np.concatenate([b.ids for b in batches])
    assert sorted(ids.tolist()) == list(range(len(ref)))
    for b in batches:
        assert b.data.tobytes() == b"".join(ref[i] for i in b.ids)
        assert b.lengths.tolist() == [len(ref[i]) for i in b.ids]


def test_restart_points_bound_the_inflate_per_record(gzt):
    ds = open_dataset(gzt["single"], restart_bytes=64 << 10)
    meta, packed = ds.index.meta, ds.index.packed
    # restart points come at the first deflate block boundary after each 64 KiB of output,
    # so a record costs at most 64 KiB + one block (zlib's hold tens of KB) + its own size
    longest = max(len(p) for p in gzt["payloads"]) + 16
    bound = (64 << 10) + (64 << 10) + longest
    assert meta["gzip_members"] == 1
    assert meta["restart_windows"] >= meta["decompressed_bytes"] // bound
    assert packed.span_out.max() <= bound
    members = open_dataset(gzt["members"], restart_bytes=64 << 10)
    assert members.index.meta["gzip_members"] == 300 // 16 + 1
    assert members.read(299) == gzt["payloads"][299]


def test_gzip_detected_by_magic_and_suffix(tmp_path, gzt):
    odd = tmp_path / "train.gz"
    odd.write_bytes(Path(gzt["members"]).read_bytes())
    ds = open_dataset(str(odd))
    assert ds.format == "tfrecord" and ds.read(5) == gzt["payloads"][5]
    named = tmp_path / "plain-name.tfrecord"  # TensorFlow writes GZIP files under any name
    named.write_bytes(Path(gzt["single"]).read_bytes())
    assert open_dataset(str(named)).read(7) == gzt["payloads"][7]
    d = tmp_path / "dir"
    d.mkdir()
    (d / "a.tfrecord.gz").write_bytes(Path(gzt["members"]).read_bytes())
    assert open_dataset(str(d)).format == "tfrecord"


def test_mixed_gzip_and_plain_files_are_refused(tmp_path, gzt):
    plain = tmp_path / "b.tfrecord"
    write_tfrecord(str(plain), [b"x"])
    with pytest.raises(UnsupportedFormatError, match="uncompressed TFRecord among"):
        len(open_dataset([gzt["members"], str(plain)], format="tfrecord"))


def test_bad_gzip_tfrecords_are_corrupt_data(tmp_path, gzt):
    blob = Path(gzt["single"]).read_bytes()
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CorruptDataError, match="truncated") as e:
        len(open_dataset(str(cut), sidecar=False))
    assert e.value.path == str(cut)
    flipped = bytearray(blob)
    flipped[len(blob) // 3] ^= 0x40
    bad = tmp_path / "flip.tfrecord.gz"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(CorruptDataError):
        len(open_dataset(str(bad), sidecar=False))
    notrec = tmp_path / "text.tfrecord.gz"
    notrec.write_bytes(gzip.compress(b"hello world, not a TFRecord at all"))
    with pytest.raises(CorruptDataError, match="length CRC mismatch"):
        len(open_dataset(str(notrec), sidecar=False))
    trailing = tmp_path / "trail.tfrecord.gz"
    trailing.write_bytes(gzip.compress(frame(b"ok")) + b"garbage!")
    with pytest.raises(CorruptDataError, match="not gzip"):
        len(open_dataset(str(trailing), sidecar=False))


def test_damage_after_indexing_is_corrupt_data_at_the_segment(tmp_path, gzt):
    p = tmp_path / "later.tfrecord.gz"
    p.write_bytes(Path(gzt["single"]).read_bytes())
    ds = open_dataset(str(p), sidecar=False, restart_bytes=64 << 10)
    idx = ds.index
    i = 200
    off, n = int(idx.offsets[i]), int(idx.lengths[i])
    with open(p, "r+b") as f:
        f.seek(off + n // 2)
        f.write(b"\x00" * 256)
    with pytest.raises(CorruptDataError) as e:
        ds.read(i)
    assert e.value.path == str(p) and e.value.offset == off and "gzip segment" in str(e.value)


# --------------------------------------------------------------------------- make


def test_make_writes_compressed_hdf5_and_seekable_gzip_tfrecord(tmp_path):
    cf = generate("cosmoflow", str(tmp_path / "cf"), samples=20, cube=4, files=2,
                  compression="gzip-shuffle", chunk_samples=4, progress=False)  # fmt: skip
    ds = open_dataset(cf, format="hdf5", dataset="x", labels="y")
    assert ds.index.meta["filters"] == ["shuffle", "deflate"]
    files = sorted(f for f in os.listdir(cf) if f.endswith(".h5"))
    ref = []
    for name in files:
        with h5py.File(os.path.join(cf, name)) as f:
            assert f["x"].compression == "gzip" and f["x"].shuffle and f["x"].chunks[0] == 4
            ref.append(f["x"][...])
    assert ds.read_many(np.arange(20))[0].tobytes() == np.concatenate(ref).tobytes()
    tf = generate("tfrecord", str(tmp_path / "tf"), samples=40, files=2, compression="gzip",
                  records_per_member=8, progress=False)  # fmt: skip
    manifest = json.loads(Path(tf, ".feedline-make.json").read_text())
    assert manifest["compression"] == "gzip" and all(
        f.endswith(".tfrecord.gz") for f in manifest["files"]
    )
    ds = open_dataset(tf)
    assert ds.index.meta["gzip_members"] == 2 * (20 // 8 + 1)
    ref = [r for f in manifest["files"] for r in tfrecord_payloads(os.path.join(tf, f))]
    assert ds.read_many(np.arange(40))[0].tobytes() == b"".join(ref)
    one = generate("tfrecord", str(tmp_path / "tf1"), samples=40, files=1, compression="gzip",
                   records_per_member=0, progress=False)  # fmt: skip
    assert open_dataset(one).index.meta["gzip_members"] == 1
    # files smaller than a chunk (7 or 8 samples each, chunks of 16): one chunk size for
    # every file, the smallest file's (HDF5 refuses larger chunks, and feedline files
    # whose chunks differ; make raised ValueError)
    ni = generate("neuron-inverter", str(tmp_path / "ni"), samples=30, files=4,
                  compression="gzip-shuffle", progress=False)  # fmt: skip
    for name in sorted(f for f in os.listdir(ni) if f.endswith(".h5")):
        with h5py.File(os.path.join(ni, name)) as f:
            assert f["x"].chunks[0] == 7 and len(f["x"]) in (7, 8)
    nds = open_dataset(ni)
    assert len(nds.index) == 30 and nds.read_many(np.arange(30))[0].nbytes == 30 * 1600 * 3 * 4


# ----------------------------------------------------------------------- full tier


@pytest.mark.full
def test_issue_size_gzip_shuffle_hdf5_every_preset(tmp_path):
    """2,000 x 128x128x4 float32, chunks of 16, gzip + shuffle (the issue's file)."""
    n = 2000
    p = str(tmp_path / "big.h5")
    with h5py.File(p, "w") as f:
        d = f.create_dataset("x", shape=(n, 128, 128, 4), dtype="f4", chunks=(16, 128, 128, 4),
                             compression="gzip", shuffle=True)  # fmt: skip
        for a in range(0, n, 200):
            d[a : a + 200] = science(200, 128, seed=a)
    ds = open_dataset(p)
    with h5py.File(p) as f:
        ref = f["x"][...]  # 524 MB, read once by h5py
    for preset in PRESETS:
        seen = 0
        for b in every_batch(ds, preset, 2, batch=64):
            assert b.data.tobytes() == ref[b.ids].tobytes()
            seen += len(b.ids)
        assert seen == n


# ---------------------------------------------------------------------- mpiexec

MPI_PRESETS = "feedline,tf,tf-pre,async,async-db,deepio-ordered,deepio-opportunistic"


@pytest.fixture(scope="module")
def made_compressed(tmp_path_factory):
    root = tmp_path_factory.mktemp("made-compressed")
    cf = generate("cosmoflow", str(root / "cf"), samples=40, cube=8, files=2,
                  compression="gzip-shuffle", chunk_samples=4, progress=False)  # fmt: skip
    tf = generate("tfrecord", str(root / "tf"), samples=60, files=2, compression="gzip",
                  records_per_member=8, progress=False)  # fmt: skip
    return {"cf": cf, "tf": tf}


def reference_records(path: str) -> list[bytes]:
    """Each sample's bytes as h5py / a plain TFRecord reader give them, in index order."""
    m = json.loads(Path(path, ".feedline-make.json").read_text())
    out: list[bytes] = []
    for name in m["files"]:
        f = os.path.join(path, name)
        if m["format"] == "hdf5":
            with h5py.File(f) as h:
                out.extend(row.tobytes() for row in h["x"][...])
        else:
            out.extend(tfrecord_payloads(f))
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_mpiexec_every_preset_exact_bytes_once(made_compressed, tmp_path, n):
    import hashlib

    from test_loader_mpi import check_once, mpirun

    data = ",".join(made_compressed.values())
    res = mpirun(n, tmp_path / "o.json", "--data", data, "--presets", MPI_PRESETS, "--batch", "8")
    check_once(res, n)
    for path in made_compressed.values():
        ref = reference_records(path)
        for preset in MPI_PRESETS.split(","):
            for rank in res[f"{path}|{preset}"]["ranks"]:
                for _, _, ids, digest in rank:
                    want = hashlib.sha256(b"".join(ref[i] for i in ids)).hexdigest()[:16]
                    assert digest == want, (path, preset, ids)


@pytest.mark.mpi
def test_mpiexec_resume_at_another_world_size(made_compressed, tmp_path):
    from test_loader_mpi import mpirun

    data = made_compressed["cf"]  # 40 samples, batch 8: 5 steps
    presets = "feedline,async,deepio-ordered"
    head = mpirun(2, tmp_path / "h.json", "--data", data, "--presets", presets, "--batch", "8",
                  "--stop", "2")  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps({k: v["state"] for k, v in head.items()}))
    tail = mpirun(4, tmp_path / "t.json", "--data", data, "--presets", presets, "--batch", "8",
                  "--state", str(tmp_path / "s.json"))  # fmt: skip
    for key in head:
        seen = [i for rank in head[key]["ranks"] for x in rank if x[1] < 2 for i in x[2]]
        seen += [i for rank in tail[key]["ranks"] for x in rank for i in x[2]]
        assert sorted(seen) == list(range(40)), key
