# SPDX-License-Identifier: Apache-2.0
"""Hostile input for the LMDB indexer: truncations and bit flips.

A real LMDB (written by liblmdb) is damaged in thousands of ways — truncated at many
offsets, single bits flipped in both meta pages, in branch and leaf pages (headers,
slot arrays, node headers, keys) and anywhere else. For each damaged file the indexer
must raise CorruptDataError / UnsupportedFormatError, or return exactly the index of
the current snapshot or of the previous one (LMDB keeps it intact; a damaged newest
meta page selects it), where a flipped bit inside a key is allowed to show up in that
key (keys are data); or, for damage the format cannot reveal (LMDB has no checksums:
an overflow value's length lives only in its leaf node), exactly what liblmdb itself
reads from the damaged file. The mutations run in a child process with a time limit, so a
crash or a hang fails the test instead of killing the suite.

Test data uses even key and value sizes: LMDB has no checksums, and a one-bit change in
a size field that stays inside a node's 2-byte padding cannot be detected (see
docs/lmdb.md).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from feedline.formats.lmdb import LmdbFile, index_lmdb

# liblmdb's view of a (damaged) file: SHA-256 over its cursor's (key, value) pairs.
# Run in its own process because liblmdb may crash on damaged files.
LIBLMDB = r"""
import hashlib, sys
import lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False, subdir=False)
h = hashlib.sha256()
with env.begin() as txn:
    for k, v in txn.cursor():
        h.update(len(k).to_bytes(8, "little") + k + len(v).to_bytes(8, "little") + v)
print(h.hexdigest())
"""

CHILD = r"""
import hashlib, json, os, subprocess, sys
import numpy as np
from feedline.errors import CorruptDataError, UnsupportedFormatError
from feedline.formats.lmdb import index_lmdb

work, spec_path, exp_path = sys.argv[1:4]
spec = json.load(open(spec_path))
exp = np.load(exp_path)
snaps = [{k: exp[f"{s}_{k}"] for k in ("offsets", "lengths", "key_blob", "key_starts")}
         for s in ("cur", "prev")]
orig = open(work, "rb").read()
out = {}


def classify(idx):
    cols = {"offsets": idx.offsets, "lengths": idx.lengths,
            "key_blob": idx.keys.blob, "key_starts": idx.keys.starts}
    for name, snap in zip(("cur", "prev"), snaps):
        if all(len(cols[k]) == len(snap[k]) for k in snap) and all(
                np.array_equal(cols[k], snap[k]) for k in ("offsets", "lengths", "key_starts")):
            diff = np.flatnonzero(cols["key_blob"] != snap["key_blob"])
            if len(diff) == 0:
                return name
            x = int(cols["key_blob"][diff[0]]) ^ int(snap["key_blob"][diff[0]])
            if len(diff) == 1 and x & (x - 1) == 0:
                return name + "+keyflip"
    return "WRONG"


def agrees_with_liblmdb(idx):
    # Damage the format cannot reveal (e.g. an overflow value's length changed within
    # its run): the result must then be what liblmdb itself reads from the same file.
    h = hashlib.sha256()
    with open(work, "rb") as f:
        for i in range(len(idx)):
            k = idx.keys[i]
            v = os.pread(f.fileno(), int(idx.lengths[i]), int(idx.offsets[i]))
            h.update(len(k).to_bytes(8, "little") + k + len(v).to_bytes(8, "little") + v)
    p = subprocess.run([sys.executable, "-c", LIBLMDB, work], capture_output=True, text=True,
                       timeout=60)
    return p.returncode == 0 and p.stdout.strip() == h.hexdigest()


fd = os.open(work, os.O_RDWR)
for m in spec:
    kind, pos, bit = m
    if kind == "flip":
        os.pwrite(fd, bytes([orig[pos] ^ (1 << bit)]), pos)
    else:
        os.ftruncate(fd, pos)
    try:
        idx = index_lmdb(work)
        res = classify(idx)
        if res == "WRONG" and agrees_with_liblmdb(idx):
            res = "liblmdb-agrees"
    except CorruptDataError:
        res = "corrupt"
    except UnsupportedFormatError:
        res = "unsupported"
    except Exception as e:
        res = "OTHER " + type(e).__name__ + ": " + str(e)[:200]
    if kind == "flip":
        os.pwrite(fd, orig[pos:pos + 1], pos)
    else:
        os.pwrite(fd, orig[pos:], pos)
    out[f"{kind}:{pos}:{bit}"] = res
os.close(fd)
json.dump(out, sys.stdout)
"""


def _write(path, rng, n, commit_every):
    env = lmdb.open(str(path), map_size=1 << 28, sync=False, metasync=False)
    txn = env.begin(write=True)
    for i in range(n):
        txn.put(b"%08d" % i, rng.randbytes(rng.choice([2, 40, 400, 1200, 3000, 9000])))
        if (i + 1) % commit_every == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.close()


def _columns(idx, prefix):
    return {
        f"{prefix}_offsets": idx.offsets,
        f"{prefix}_lengths": idx.lengths,
        f"{prefix}_key_blob": idx.keys.blob,
        f"{prefix}_key_starts": idx.keys.starts,
    }


def _tree_pages(f):
    """Branch and leaf page numbers of the main tree, by walking it."""
    branches, leaves = [], []
    level = [f.meta["main_db"]["root"]]
    while level:
        nxt = []
        for pg in level:
            page = f.read_page(pg)
            if page.kind == "branch":
                branches.append(pg)
                nxt.extend(int(c) for c in page.children)
            else:
                leaves.append(pg)
        level = nxt
    return branches, leaves


@pytest.fixture(scope="module")
def damaged_db(tmp_path_factory):
    """A 3-level LMDB with inline and overflow values, free pages, two snapshots."""
    root = tmp_path_factory.mktemp("mut")
    rng = random.Random(11)
    db = root / "db"
    _write(db, rng, 1500, 250)
    prev_idx = index_lmdb(db)
    env = lmdb.open(str(db), map_size=1 << 28, sync=False)
    with env.begin(write=True) as txn:  # the last snapshot: deletes and overwrites
        for i in rng.sample(range(1500), 120):
            if i % 2:
                txn.delete(b"%08d" % i)
            else:
                txn.put(b"%08d" % i, rng.randbytes(rng.choice([10, 5000])))
    env.close()
    cur_idx = index_lmdb(db)
    env = lmdb.open(str(db), readonly=True, lock=False)
    with env.begin() as txn:
        assert list(cur_idx.keys) == [k for k, _ in txn.cursor()]
    env.close()
    assert cur_idx.meta["depth"] >= 2 and cur_idx.meta["free_pages"] > 0
    exp = root / "expected.npz"
    np.savez(exp, **_columns(cur_idx, "cur"), **_columns(prev_idx, "prev"))
    return db / "data.mdb", exp


def _mutations(data, seed, n_random):
    rng = random.Random(seed)
    f = LmdbFile(data)
    ps = f.meta["page_size"]
    size = f.meta["file_bytes"]
    branches, leaves = _tree_pages(f)
    muts = set()
    for meta in (0, ps):  # every byte of both meta pages' header + MDB_meta
        for b in range(16 + 136):
            muts.add(("flip", meta + b, rng.randrange(8)))
    for pages, per_page in ((branches, 150), (rng.sample(leaves, min(12, len(leaves))), 80)):
        for pg in pages:
            page = f.read_page(pg)
            base = pg * ps
            for _ in range(per_page):
                r = rng.random()
                if r < 0.4:  # header and slot array
                    pos = rng.randrange(page.lower)
                elif r < 0.8:  # node headers and keys
                    pos = page.upper + rng.randrange(ps - page.upper)
                else:
                    pos = rng.randrange(ps)
                muts.add(("flip", base + pos, rng.randrange(8)))
    for _ in range(n_random):
        muts.add(("flip", rng.randrange(size), rng.randrange(8)))
    for pg in branches + leaves[:20]:
        muts.add(("trunc", pg * ps + rng.randrange(ps), 0))
    for _ in range(150):
        muts.add(("trunc", rng.randrange(size), 0))
    f.close()
    return sorted(muts)


def _run(damaged_db, tmp_path, seed, n_random, timeout):
    data, exp = damaged_db
    work = tmp_path / "work.mdb"
    shutil.copyfile(data, work)
    muts = _mutations(str(data), seed, n_random)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(muts))
    proc = subprocess.run(
        [sys.executable, "-c", f"LIBLMDB = {LIBLMDB!r}\n{CHILD}", str(work), str(spec), str(exp)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-2000:]}"
    results = json.loads(proc.stdout)
    assert len(results) == len(muts)
    bad = {k: v for k, v in results.items() if v == "WRONG" or v.startswith("OTHER")}
    assert not bad, (
        f"{len(bad)} mutations gave wrong data or untyped errors: {list(bad.items())[:10]}"
    )
    kinds = {v for v in results.values()}
    # the damage really was detected, and harmless flips (payload) gave the right index
    assert "corrupt" in kinds and "cur" in kinds
    truncs = [v for k, v in results.items() if k.startswith("trunc")]
    assert truncs.count("corrupt") > len(truncs) // 2
    return results


def test_truncations_and_bit_flips(damaged_db, tmp_path):
    results = _run(damaged_db, tmp_path, seed=1, n_random=400, timeout=300)
    assert len(results) > 1500


@pytest.mark.full
@pytest.mark.parametrize("seed", [2, 3, 4, 5])
def test_truncations_and_bit_flips_long(damaged_db, tmp_path, seed):
    _run(damaged_db, tmp_path, seed=seed, n_random=5000, timeout=1800)


def test_cycle_and_shared_pages_are_corrupt(damaged_db, tmp_path):
    """Point a branch's second child at its first (shared subtree) and at the root
    (cycle): both must be CorruptDataError, in the indexer and in a cursor walk."""
    data, _ = damaged_db
    f = LmdbFile(str(data))
    root = f.read_page(f.meta["main_db"]["root"])
    assert root.kind == "branch"
    raw = root.raw
    slot1 = int.from_bytes(raw[16 + 2 : 16 + 4], "little")  # node of child 1
    ps = f.meta["page_size"]
    for target in (int(root.children[0]), root.pgno):
        img = bytearray(data.read_bytes())
        node = root.pgno * ps + slot1
        img[node : node + 4] = (target & 0xFFFFFFFF).to_bytes(4, "little")
        img[node + 4 : node + 6] = (target >> 32).to_bytes(2, "little")
        bad = tmp_path / f"cyc{target}.mdb"
        bad.write_bytes(bytes(img))
        with pytest.raises(Exception) as ei:
            index_lmdb(bad)
        assert type(ei.value).__name__ == "CorruptDataError"
        g = LmdbFile(bad)
        with pytest.raises(Exception) as ei:
            g.seek(len(g) - 1)
        assert type(ei.value).__name__ == "CorruptDataError"
        g.close()
    f.close()
