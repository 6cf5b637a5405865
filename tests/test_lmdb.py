# SPDX-License-Identifier: Apache-2.0
"""The native LMDB indexer against liblmdb itself (py-lmdb as the oracle).

Every test writes real LMDB environments with py-lmdb and checks that the keys the
parser reports equal liblmdb's cursor order and that the bytes at each reported
(offset, length) equal liblmdb's value.
"""

from __future__ import annotations

import os
import random
import struct

import lmdb
import numpy as np
import pytest

import feedline
from feedline.errors import CorruptDataError, UnsupportedFormatError
from feedline.formats.base import Decoder
from feedline.formats.lmdb import LmdbFile, index_lmdb

MiB = 1 << 20


def write_lmdb(path, items, *, commit_every=1000, map_size=1 << 30):
    """Write (key, value) pairs with py-lmdb, committing every *commit_every* puts."""
    env = lmdb.open(str(path), map_size=map_size, sync=False, metasync=False)
    txn = env.begin(write=True)
    for i, (k, v) in enumerate(items, 1):
        txn.put(k, v)
        if i % commit_every == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.close()
    return str(path)


def oracle(path):
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        items = list(txn.cursor())
    env.close()
    return items


def assert_matches_liblmdb(path, idx=None):
    idx = idx if idx is not None else index_lmdb(path)
    expected = oracle(path)
    assert len(idx) == len(expected)
    assert list(idx.keys) == [k for k, _ in expected]
    assert (idx.file_ids == 0).all()
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        fd = f.fileno()
        for (_, v), off, n in zip(expected, idx.offsets, idx.lengths, strict=True):
            assert os.pread(fd, int(n), int(off)) == v
    m = idx.meta
    assert m["entries"] == len(expected)
    assert m["payload_bytes"] == sum(len(v) for _, v in expected)
    assert m["unaccounted_pages"] == 0  # liblmdb: every page is used exactly once
    return idx


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def sized_items(sizes, rng, key=lambda i: b"%08d" % i):
    return [(key(i), rng.randbytes(s)) for i, s in enumerate(sizes)]


# ----------------------------------------------------------------- shapes and sizes

SIZES = [1, 2, 100, 1000, 2000, 2030, 2040, 2041, 2100, 4000, 4080, 4081, 8192, 70000, MiB, 4 * MiB]


@pytest.mark.parametrize("commit_every", [1, 7, 1000, 100_000])
@pytest.mark.parametrize("order", ["sorted", "random"])
def test_sizes_commits_orders(tmp_path, commit_every, order):
    rng = random.Random(commit_every)
    n = 600 if commit_every == 1 else 2400
    sizes = [
        SIZES[i % (len(SIZES) - 2)] if i % 150 else SIZES[-2 + (i // 150) % 2] for i in range(n)
    ]
    sizes = sizes[: n - (n // 150) // 2]  # a handful of 1 and 4 MiB records
    items = sized_items(sizes, rng)
    if order == "random":
        rng.shuffle(items)
    idx = assert_matches_liblmdb(write_lmdb(tmp_path / "db", items, commit_every=commit_every))
    assert idx.meta["overflow_records"] == sum(1 for _, v in items if len(v) > 2040 - 16)


def test_every_size_once(tmp_path):
    rng = random.Random(2)
    items = sized_items(SIZES, rng)
    assert_matches_liblmdb(write_lmdb(tmp_path / "db", items, commit_every=3))


def test_random_keys_and_values(tmp_path):
    rng = random.Random(3)
    items = [
        (rng.randbytes(rng.randint(1, 511)), rng.randbytes(rng.randint(0, 6000)))
        for _ in range(8000)
    ]
    idx = assert_matches_liblmdb(write_lmdb(tmp_path / "db", items, commit_every=500))
    assert idx.meta["depth"] >= 3


def test_deletions_and_overwrites_leave_free_pages(tmp_path):
    rng = random.Random(4)
    path = write_lmdb(
        tmp_path / "db",
        sized_items([rng.randint(1, 9000) for _ in range(5000)], rng),
        commit_every=100,
    )
    env = lmdb.open(path, map_size=1 << 30, sync=False)
    for _ in range(6):
        with env.begin(write=True) as txn:
            for i in rng.sample(range(5000), 700):
                if rng.random() < 0.5:
                    txn.delete(b"%08d" % i)
                else:
                    txn.put(b"%08d" % i, rng.randbytes(rng.choice([10, 3000, 20000])))
    env.close()
    idx = assert_matches_liblmdb(path)
    assert idx.meta["free_pages"] > 0
    assert idx.meta["pages_checked"]


def test_overwrite_in_place_with_shorter_overflow_value(tmp_path):
    # liblmdb reuses a dirty overflow run for a smaller value in the same txn, so the
    # run is longer than the value needs: the indexer must read the run headers.
    path = str(tmp_path / "db")
    env = lmdb.open(path, map_size=1 << 28, sync=False)
    with env.begin(write=True) as txn:
        for i in range(50):
            txn.put(b"k%03d" % i, os.urandom(40000))
        for i in range(0, 50, 3):
            txn.put(b"k%03d" % i, os.urandom(9000))
    env.close()
    idx = assert_matches_liblmdb(path)
    assert idx.meta["overflow_verified"]


def test_empty_environment(tmp_path):
    path = str(tmp_path / "db")
    lmdb.open(path, map_size=1 << 20).close()
    idx = assert_matches_liblmdb(path)
    assert len(idx) == 0 and idx.meta["depth"] == 0


def test_emptied_by_deletes(tmp_path):
    path = write_lmdb(tmp_path / "db", [(b"%04d" % i, b"x" * 3000) for i in range(300)])
    env = lmdb.open(path, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(300):
            assert txn.delete(b"%04d" % i)
    env.close()
    idx = assert_matches_liblmdb(path)
    assert len(idx) == 0 and idx.meta["free_pages"] > 0


@pytest.mark.parametrize("size", [0, 5, 5000])
def test_one_record(tmp_path, size):
    idx = assert_matches_liblmdb(write_lmdb(tmp_path / "db", [(b"only", os.urandom(size))]))
    assert idx.meta["depth"] == 1 and idx.meta["leaf_pages"] == 1


def test_fifty_thousand_records(tmp_path):
    rng = random.Random(6)
    items = [
        (b"%010d_%s" % (i, b"k" * (i % 7)), rng.randbytes(rng.randint(50, 1000)))
        for i in range(50_000)
    ]
    path = write_lmdb(tmp_path / "db", items, commit_every=1000)
    idx = assert_matches_liblmdb(path)
    # leaves of inline records written in key order are mostly adjacent: coalesced
    # reads are far fewer than tree pages
    assert idx.meta["read_ops"] < (idx.meta["leaf_pages"] + idx.meta["branch_pages"]) / 4


@pytest.mark.full
def test_one_million_records(tmp_path):
    rng = np.random.default_rng(7)
    blob = rng.integers(0, 256, size=4096 + 64, dtype=np.uint8).tobytes()
    items = ((b"%08d" % i, blob[i % 4096 : i % 4096 + 32]) for i in range(1_000_000))
    path = write_lmdb(tmp_path / "db", items, commit_every=100_000, map_size=1 << 31)
    assert_matches_liblmdb(path)


# ------------------------------------------------------------------ efficiency


def test_overflow_records_read_a_small_fraction(tmp_path):
    rng = random.Random(8)
    items = sized_items([rng.randint(150_000, 200_000) for _ in range(200)], rng)
    path = write_lmdb(tmp_path / "db", items, commit_every=50)
    idx = assert_matches_liblmdb(path)
    assert idx.meta["read_fraction"] < 0.05
    assert not idx.meta["overflow_verified"]
    three_kb = write_lmdb(tmp_path / "c", sized_items([3072] * 3000, rng), commit_every=1000)
    assert assert_matches_liblmdb(three_kb).meta["read_fraction"] < 0.05


# -------------------------------------------------------------------- unsupported


def test_named_subdatabases_are_unsupported(tmp_path):
    path = str(tmp_path / "db")
    env = lmdb.open(path, max_dbs=2, map_size=1 << 24)
    sub = env.open_db(b"images")
    with env.begin(write=True, db=sub) as txn:
        txn.put(b"a", b"1")
    env.close()
    with pytest.raises(UnsupportedFormatError, match="sub-database"):
        index_lmdb(path)


def test_dupsort_is_unsupported(tmp_path):
    # py-lmdb refuses flags on the main database, so set MDB_DUPSORT in both metas
    # (a named DUPSORT database is caught earlier, as a sub-database).
    path = write_lmdb(tmp_path / "db", [(b"a", b"1")])
    f = os.path.join(path, "data.mdb")
    raw = bytearray(_read(f))
    psize = struct.unpack_from("<I", raw, 16 + 24)[0]
    for meta in (0, psize):
        struct.pack_into("<H", raw, meta + 16 + 24 + 48 + 4, 0x04)
    bad = tmp_path / "dup.mdb"
    bad.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedFormatError, match="DUPSORT"):
        index_lmdb(bad)
    env = lmdb.open(str(tmp_path / "named"), max_dbs=2, map_size=1 << 24)
    db = env.open_db(b"d", dupsort=True)
    with env.begin(write=True, db=db) as txn:
        txn.put(b"a", b"1")
        txn.put(b"a", b"2")
    env.close()
    with pytest.raises(UnsupportedFormatError):
        index_lmdb(tmp_path / "named")


def test_32bit_and_big_endian_are_unsupported(tmp_path):
    path = write_lmdb(tmp_path / "db", [(b"a", b"b")])
    f = os.path.join(path, "data.mdb")
    raw = bytearray(_read(f))
    psize = struct.unpack_from("<I", raw, 16 + 24)[0]
    for meta in (0, psize):
        struct.pack_into("<I", raw, meta + 12, 0xBEEFC0DE)  # where a 32-bit header puts it
        struct.pack_into("<I", raw, meta + 16, 0)
    bad = tmp_path / "b32.mdb"
    bad.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedFormatError, match="32-bit"):
        index_lmdb(bad)
    raw = bytearray(_read(f))
    for meta in (0, psize):
        struct.pack_into(">I", raw, meta + 16, 0xBEEFC0DE)
    bad.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedFormatError, match="big-endian"):
        index_lmdb(bad)


def test_not_an_lmdb(tmp_path):
    f = tmp_path / "x.mdb"
    f.write_bytes(b"")
    with pytest.raises(CorruptDataError):
        index_lmdb(f)
    f.write_bytes(os.urandom(10000))
    with pytest.raises(CorruptDataError, match="meta"):
        index_lmdb(f)
    (tmp_path / "d").mkdir()
    with pytest.raises(UnsupportedFormatError):
        index_lmdb(tmp_path / "d")


# ------------------------------------------------------------ dataset integration


def test_open_dataset_and_read(tmp_path):
    rng = random.Random(9)
    items = sized_items([rng.randint(1, 9000) for _ in range(500)], rng)
    path = write_lmdb(tmp_path / "db", items)
    expected = oracle(path)
    for target in (path, os.path.join(path, "data.mdb")):
        with feedline.open_dataset(target, sidecar=False) as ds:
            assert ds.format == "lmdb" and len(ds) == len(expected)
            for i in (0, 17, len(ds) - 1):
                assert ds.read(i) == expected[i][1]
            info = ds.describe()
            for k in (
                "page_size",
                "depth",
                "branch_pages",
                "leaf_pages",
                "overflow_pages",
                "entries",
                "txnid",
                "payload_fraction",
                "file_bytes",
            ):
                assert k in info
            assert info["page_size"] == os.sysconf("SC_PAGE_SIZE")


def test_decoder_reads_caffe_datums(tmp_path):
    from feedline.formats.datum_write import encode_datum

    rng = np.random.default_rng(12)
    pix = rng.integers(0, 256, size=(40, 3, 4, 5), dtype=np.uint8)
    items = [
        (b"%08d" % i, encode_datum(3, 4, 5, pix[i].tobytes(), label=i % 10)) for i in range(40)
    ]
    with feedline.open_dataset(write_lmdb(tmp_path / "db", items), sidecar=False) as ds:
        assert isinstance(ds.decoder, Decoder)
        raw, lengths = ds.read_many([3, 7])
        data, labels = ds.decode(raw, lengths, [3, 7])
        assert np.array_equal(data, pix[[3, 7]]) and list(labels) == [3, 7]


def test_sidecar_roundtrip_keeps_keys_and_meta(tmp_path):
    path = write_lmdb(tmp_path / "db", [(b"%05d" % i, b"v" * (i % 50)) for i in range(2000)])
    a = feedline.open_dataset(path)
    idx = a.index
    assert a.sidecar_path is not None
    b = feedline.open_dataset(path)
    idx2 = b.index
    assert b.sidecar_path == a.sidecar_path
    assert idx2.keys == idx.keys
    assert np.array_equal(idx2.offsets, idx.offsets)
    assert idx2.meta["depth"] == idx.meta["depth"]
    a.close()
    b.close()


# ------------------------------------------------------------------ page-level API


def test_page_api_seek_and_advance(tmp_path):
    rng = random.Random(10)
    items = sized_items([rng.randint(1, 5000) for _ in range(4000)], rng)
    path = write_lmdb(tmp_path / "db", items, commit_every=333)
    idx = index_lmdb(path)
    f = LmdbFile(path)
    assert len(f) == len(idx) and f.meta["page_size"] == idx.meta["page_size"]
    root = f.read_page(f.meta["main_db"]["root"])
    assert root.kind == "branch" and root.nkeys == len(root.children) >= 2
    for i in (0, 1, 77, 1999, len(idx) - 1):
        s = f.seek(i)
        assert (s.value_offset, s.value_length, s.key) == (
            idx.offsets[i],
            idx.lengths[i],
            idx.keys[i],
        )
        assert s.cursor.record == i and len(s.cursor.pages) == idx.meta["depth"]
        assert s.pages_touched[0] == root.pgno
        leaf = f.read_page(s.cursor.leaf)
        assert leaf.kind == "leaf" and leaf.keys[s.cursor.slot] == idx.keys[i]
        assert leaf.value_offsets[s.cursor.slot] == idx.offsets[i]
    # a seek to record i touches the leftmost path plus every leaf up to i's
    far = f.seek(len(idx) - 1)
    assert len(set(far.pages_touched.tolist())) >= idx.meta["leaf_pages"]
    s = f.seek(100)
    t = f.advance(s.cursor, 2500)
    assert t.key == idx.keys[2600] and t.cursor.record == 2600
    assert len(t.pages_touched) < len(f.seek(2600).pages_touched)
    with pytest.raises(IndexError):
        f.seek(len(idx))
    with pytest.raises(IndexError):
        f.advance(t.cursor, len(idx))
    first_ov = int(np.flatnonzero(idx.lengths > 3000)[0])
    ov = f.read_page((int(idx.offsets[first_ov]) - 16) // f.meta["page_size"])
    assert ov.kind == "overflow" and ov.overflow_pages >= 1
    assert f.read_page(0).kind == "meta"
    with pytest.raises(CorruptDataError):
        f.read_page(f.meta["last_pgno"] + 1)
    assert f.bytes_read > 0
    f.close()
