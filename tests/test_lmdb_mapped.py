# SPDX-License-Identifier: Apache-2.0
"""Issue 16 item 7 (lmdb preset): liblmdb maps the file, so a truncated or damaged LMDB
must become a CorruptDataError naming file, offset and reason — never a SIGBUS or a raw
``lmdb.Error`` — including when the damage happens after the index was built."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

from feedline import Loader, open_dataset
from feedline.errors import CorruptDataError
from feedline.formats.lmdb import LmdbFile, check_mappable

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
from test_presets_lmdbio import write_lmdb  # noqa: E402


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("mapped") / "db")
    os.makedirs(d)
    write_lmdb(d, 300, -1)  # mixed inline and overflow values, depth 2
    return d


@pytest.fixture
def db(pristine, tmp_path):
    d = str(tmp_path / "db")
    shutil.copytree(pristine, d)
    return d


def _run(code: str) -> subprocess.CompletedProcess:
    """In a child: a SIGBUS there is a failed test, not a dead pytest."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("cut", ["half", "one-page-short", "meta-only"])
@pytest.mark.parametrize("when", ["before-open", "after-index", "mid-epoch"])
def test_truncated_file_is_corrupt_data_not_sigbus(db, cut, when):
    data = os.path.join(db, "data.mdb")
    size = os.path.getsize(data)
    at = {"half": size // 2, "one-page-short": size - 4096, "meta-only": 8192}[cut]
    r = _run(f"""
        import os
        from feedline import Loader, open_dataset
        from feedline.errors import CorruptDataError
        try:
            if {when!r} == "before-open":
                os.truncate({data!r}, {at})
            ds = open_dataset({db!r}, sidecar=False)
            len(ds)
            if {when!r} == "after-index":
                os.truncate({data!r}, {at})
            with Loader(ds, 16, preset="lmdb", decode=False) as ld:
                it = iter(ld)
                next(it)
                if {when!r} == "mid-epoch":
                    os.truncate({data!r}, {at})
                for _ in it:
                    pass
        except CorruptDataError as e:
            print("CORRUPT", e.path, e.offset, e.reason)
        """)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith(f"CORRUPT {data} "), line
    if when != "before-open":
        assert "truncated" in line and str(at) in line


def test_check_mappable(db):
    data = os.path.join(db, "data.mdb")
    meta = check_mappable(data)
    assert (meta["last_pgno"] + 1) * meta["page_size"] <= os.path.getsize(data)
    os.truncate(data, os.path.getsize(data) - 1)
    with pytest.raises(CorruptDataError, match="SIGBUS") as ei:
        check_mappable(db)
    assert ei.value.offset == os.path.getsize(data)


def test_liblmdb_corrupted_error_is_typed(db):
    """A branch page whose flags are damaged after the index was built: liblmdb says
    MDB_CORRUPTED (lmdb.CorruptedError); the Loader raises CorruptDataError."""
    data = os.path.join(db, "data.mdb")
    ds = open_dataset(db, sidecar=False)
    n = len(ds)
    with LmdbFile(data) as lf:
        root = lf.meta["main_db"]["root"]
        ps = lf.meta["page_size"]
        assert lf.read_page(root).kind == "branch"
    with open(data, "r+b") as f:  # flags: neither branch nor leaf
        f.seek(root * ps + 10)
        f.write(struct.pack("<H", 0x40))
    with pytest.raises(CorruptDataError) as ei, Loader(ds, 16, preset="lmdb", decode=False) as ld:
        assert sum(len(b.ids) for b in ld) == n
    assert ei.value.path == data and "liblmdb" in ei.value.reason
    ds.close()
